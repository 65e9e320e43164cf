"""What a pod object says, in the engines' words: its ContainerInfo (state, labels, address)
and its EngineView (the isolation its spec asks for). Pure functions of the pod's JSON."""

from __future__ import annotations

from typing import Any

from kubernetes.utils.quantity import parse_quantity

from stockade.supervisor.engines.backends._common import parse_time
from stockade.supervisor.engines.backends.base import ContainerInfo, EngineView
from stockade.supervisor.engines.backends.kubernetes import manifests
from stockade.supervisor.engines.backends.kubernetes.api import Obj

STATUS = {"Pending": "created", "Running": "running", "Succeeded": "exited", "Failed": "exited"}
"""Pod phases in the engines' words (what SandboxInfo shows)."""


def _agent(pod: Obj) -> tuple[Obj, Obj]:
    """(the agent container's spec, its status)."""
    empty: Obj = {}
    spec: Obj = next(iter((pod.get("spec") or {}).get("containers") or []), empty)
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    status: Obj = next((s for s in statuses if s.get("name") == spec.get("name")), empty)
    return spec, status


def info_of(pod: Obj) -> ContainerInfo:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    container, state = _agent(pod)
    phase = str(status.get("phase") or "")
    ended = (state.get("state") or {}).get("terminated") or {}
    address = str(status.get("podIP") or "")
    return ContainerInfo(
        id=str(meta.get("name", "")),
        name=str(meta.get("name", "")),
        running=phase == "Running" and bool(address) and not meta.get("deletionTimestamp"),
        status=STATUS.get(phase, phase.lower() or "unknown"),
        labels=manifests.carried_labels(meta),
        image=str(container.get("image") or ""),
        created_at=parse_time(meta.get("creationTimestamp")),
        image_id=str(state.get("imageID") or "").rpartition("sha256:")[2],
        exit_code=ended.get("exitCode"),
        oom_killed=ended.get("reason") == "OOMKilled",
        own_userns=(pod.get("spec") or {}).get("hostUsers") is False,
        address=address,
    )


def view_of(pod: Obj) -> EngineView:
    """The pod's isolation as its spec asks for it (what the kubelet and runtime were told)."""
    spec = pod.get("spec") or {}
    container, _ = _agent(pod)
    pod_sc, sc = spec.get("securityContext") or {}, container.get("securityContext") or {}

    def setting(name: str) -> Any:
        return sc.get(name, pod_sc.get(name))

    seccomp = setting("seccompProfile") or {}
    profile = str(seccomp.get("localhostProfile") or seccomp.get("type") or "")
    limits = (container.get("resources") or {}).get("limits") or {}
    caps = sc.get("capabilities") or {}
    escalation = sc.get("allowPrivilegeEscalation")
    return EngineView(
        runtime=str(spec.get("runtimeClassName") or ""),
        privileged=bool(sc.get("privileged")),
        cap_drop=tuple(caps.get("drop") or ()),
        cap_add=tuple(caps.get("add") or ()),
        read_only_root=bool(sc.get("readOnlyRootFilesystem")),
        user=f"{setting('runAsUser') or ''}:{setting('runAsGroup') or ''}",
        network_mode="host" if spec.get("hostNetwork") else "pod",
        security_options=(f"seccomp={profile}",) if profile else (),
        no_new_privileges=escalation is False,
        seccomp_profile=profile,
        memory_bytes=_bytes(limits.get("memory")),
        nano_cpus=int(_quantity(limits.get("cpu")) * 1_000_000_000),
        userns_mode="private" if spec.get("hostUsers") is False else "host",
    )


def _quantity(value: Any) -> float:
    try:
        return float(parse_quantity(value)) if value is not None else 0.0
    except ValueError:
        return 0.0


def _bytes(value: Any) -> int:
    return int(_quantity(value))
