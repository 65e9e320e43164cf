"""The Kubernetes objects a sandbox is made of, as plain dicts (what the API takes as JSON and
`podman kube play` as YAML): its Pod, its agent's TLS Secret and its workspace claim. Pure
functions: no API calls here (the backend sends them).

[sandbox] secrets travel in the agent's Secret (as env.NAME) and the pod names them with
valueFrom.secretKeyRef: a pod object is readable by anyone who may list pods in the
namespace, a Secret only by whom RBAC lets read Secrets. The Secret's volume projects its TLS
files alone (`items`), so those values are not files in the agent's TLS folder as well.

The pod meets Pod Security "restricted" in full, so it runs in a namespace that enforces it:
non-root, no capabilities at all, no privilege escalation, a seccomp profile, only the
restricted volume kinds. That standard forbids the SETUID/SETGID the host kinds give the agent
to keep a user of its own (agent/identity.py), so in a pod the agent and the tools share one
non-root uid; nothing the agent says is trusted anyway (sandboxes/agent_link.py), and its port
admits supervisors only (agent/tls.py).

Labels: a value that is a valid label value goes to metadata.labels (so the backend can select
on it); one that is not (a key with '/' or over 63 characters, the state folder, the owner) to
metadata.annotations under the same name. `carried_labels` puts both back together.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

from stockade.supervisor.config.sandbox import KubernetesConfig, SandboxConfig
from stockade.supervisor.engines.backends.base import LABEL_SANDBOX_ID, ContainerSpec
from stockade.supervisor.engines.backends.kubernetes.pki import Issued

AGENT_CONTAINER = "sandbox"
TLS_DIR = "/run/stockade/tls"
WORKSPACE = "/workspace"
SANDBOX_UID = 65532
"""The image's `sandbox` user: in a pod, the agent's uid and the tools' (no second one)."""
TINI = "/usr/bin/tini"
AGENT_MODULE = ("python3", "-P", "-m", "stockade.agent")
"""`-P`: the working folder (the workspace) is never on the agent's sys.path (the image's
entry point does the same)."""
TLS_FILES = ("ca.crt", "tls.crt", "tls.key")
"""What the agent's Secret volume holds (agent/tls.py reads these)."""
ENV_KEY_PREFIX = "env."
"""A [sandbox] secret's key in the agent's Secret: env.NAME (a valid environment name is a
valid Secret key after it: config/checks.py)."""
SECRET_MODE = 0o440
"""The Secret's files: readable by root (their owner) and the fsGroup, which is the agent's."""
TERMINATION_GRACE_S = 10
"""The agent stops its server with 2 s of grace and then kills its processes."""
COMPONENT_LABELS: Mapping[str, str] = {
    "app.kubernetes.io/name": "stockade",
    "app.kubernetes.io/component": "sandbox",
}
"""What the installation's NetworkPolicies select sandbox pods by (deploy/kubernetes)."""
STOCKADE_PREFIX = "io.stockade."
_LABEL_NAME = re.compile(
    r"([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")
_MI = 1024 * 1024


def pod_name(instance_id: str, sandbox_id: str) -> str:
    """The container name scheme of the host kinds (Containers.name)."""
    return f"stockade-{instance_id[:8]}-{sandbox_id}"


def claim_name(sandbox_id: str) -> str:
    """A key's workspace claim: named by the sandbox alone, so it outlives pods and
    supervisors."""
    return f"stockade-ws-{sandbox_id}"


def secret_name(sandbox_id: str) -> str:
    """A sandbox's agent certificate, key and the CA's certificate."""
    return f"stockade-agent-{sandbox_id}"


def pool_ident(pool_id: str) -> str:
    """What names a warm-pool pod's objects and its agent's certificate in place of a sandbox
    id ("pool-<pool id>": sandbox ids are hex, so none is one). A claimed pool pod keeps its
    objects' names (a pod's volumes cannot change): its key finds them by label."""
    return f"pool-{pool_id}"


def is_label(name: str, value: str) -> bool:
    """Whether name=value can be a Kubernetes label (else it travels as an annotation)."""
    prefix, _, short = name.rpartition("/")
    return (
        bool(_LABEL_NAME.fullmatch(name))
        and len(prefix) <= 253
        and len(short) <= 63
        and bool(_LABEL_VALUE.fullmatch(value))
    )


def split_labels(labels: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations): each pair where Kubernetes can hold it."""
    as_labels = {k: v for k, v in labels.items() if is_label(k, v)}
    return as_labels, {k: v for k, v in labels.items() if k not in as_labels}


def carried_labels(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The engine labels an object was made with: its labels and its io.stockade.*
    annotations, together again (split_labels' inverse, for what Stockade put there)."""
    annotations = metadata.get("annotations") or {}
    carried = {k: v for k, v in annotations.items() if k.startswith(STOCKADE_PREFIX)}
    return {**(metadata.get("labels") or {}), **carried}


def _metadata(name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    as_labels, annotations = split_labels(labels)
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": as_labels}
    if annotations:
        meta["annotations"] = annotations
    return meta


def quantity(size_bytes: int) -> str:
    """A byte count as a Kubernetes quantity: whole mebibytes as Mi, else plain bytes."""
    if size_bytes <= 0:
        raise ValueError(f"a size must be positive, got {size_bytes}")
    return f"{size_bytes // _MI}Mi" if size_bytes % _MI == 0 else str(size_bytes)


def cpu_quantity(nano_cpus: int) -> str:
    """Nano-CPUs as millicores (at least 1m)."""
    if nano_cpus <= 0:
        raise ValueError(f"a CPU limit must be positive, got {nano_cpus} nano-CPUs")
    return f"{max(1, round(nano_cpus / 1_000_000))}m"


def agent_command(port: int, agent_args: tuple[str, ...]) -> list[str]:
    """tini as PID 1, the agent under it on the pod's port with mutual TLS, as itself."""
    return [
        *(TINI, "--", *AGENT_MODULE),
        *("--listen", f"0.0.0.0:{port}", "--tls-dir", TLS_DIR, "--workspace", WORKSPACE),
        *agent_args,
    ]


def _memory(size_bytes: int) -> dict[str, str]:
    """A tmpfs as the pod has it: an emptyDir in memory (counted in the memory limit)."""
    return {"medium": "Memory", "sizeLimit": quantity(size_bytes)}


def _secret_volume(name: str) -> dict[str, Any]:
    """`optional: false` is Kubernetes' default, said aloud: Podman 4.3's `kube play` crashes
    on a Secret volume without it (podman#16636), and the test kubelet plays pods with it.
    `items`: the TLS files only, not the environment the Secret also carries."""
    return {
        "secretName": name,
        "defaultMode": SECRET_MODE,
        "optional": False,
        "items": [{"key": key, "path": key} for key in TLS_FILES],
    }


def env_key(name: str) -> str:
    """The key of environment variable `name` in the agent's Secret."""
    return ENV_KEY_PREFIX + name


def secret_environment(spec: ContainerSpec) -> dict[str, str]:
    """The spec's secret environment (name -> value): what the agent's Secret carries."""
    return {name: spec.environment[name] for name in sorted(spec.secret_names)}


def _env(spec: ContainerSpec, agent_secret: str) -> list[dict[str, Any]]:
    """The container's environment: plain values, but secrets by reference to the Secret."""
    env: list[dict[str, Any]] = []
    for name, value in sorted(spec.environment.items()):
        if name in spec.secret_names:
            ref = {"name": agent_secret, "key": env_key(name), "optional": False}
            env.append({"name": name, "valueFrom": {"secretKeyRef": ref}})
        else:
            env.append({"name": name, "value": value})
    return env


def _seccomp(kube: KubernetesConfig) -> dict[str, str]:
    if kube.seccomp_profile:
        return {"type": "Localhost", "localhostProfile": kube.seccomp_profile}
    return {"type": "RuntimeDefault"}


def sandbox_pod(
    spec: ContainerSpec,
    kube: KubernetesConfig,
    *,
    sandbox_id: str,
    agent_secret: str,
    workspace_claim: str | None,
    agent_args: tuple[str, ...],
    sandbox_uid: int = SANDBOX_UID,
) -> dict[str, Any]:
    """The Pod of one sandbox, from the same ContainerSpec the host kinds get. `workspace_claim`
    None: an emptyDir workspace (lost with the pod). What a pod cannot take from the spec:
    bind mounts and the engine's user and entry point (the pod's own replace them), pids and
    rlimits (the kubelet's podPidsLimit and the runtime's defaults govern those).
    `sandbox_id` "": a warm-pool pod, which gets one when a key claims it (relabeled)."""
    if sandbox_uid <= 0:
        raise ValueError(f"the sandbox uid must not be root, got {sandbox_uid}")
    if spec.labels.get(LABEL_SANDBOX_ID, sandbox_id) != sandbox_id:
        raise ValueError(f"the spec is labelled for another sandbox than {sandbox_id}")
    tmp_bytes = spec.tmpfs.get("/tmp") or SandboxConfig().tmp_size_mb * _MI
    limits = {
        "cpu": cpu_quantity(spec.nano_cpus),
        "memory": quantity(spec.memory_bytes),
        "ephemeral-storage": quantity(kube.ephemeral_storage_mb * _MI),
    }
    workspace: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": workspace_claim}}
        if workspace_claim
        else {"emptyDir": {"sizeLimit": quantity(kube.workspace_size_mb * _MI)}}
    )
    volumes = [
        {"name": "workspace", **workspace},
        {"name": "tmp", "emptyDir": _memory(tmp_bytes)},
        {"name": "tls", "secret": _secret_volume(agent_secret)},
    ]
    mounts = [
        {"name": "workspace", "mountPath": WORKSPACE},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
    ]
    for index, (target, size) in enumerate(sorted(spec.tmpfs.items())):
        if target == "/tmp":
            continue
        volumes.append({"name": f"tmpfs-{index}", "emptyDir": _memory(size)})
        mounts.append({"name": f"tmpfs-{index}", "mountPath": target})
    container: dict[str, Any] = {
        "name": AGENT_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": kube.image_pull_policy,
        "command": agent_command(kube.agent_port, agent_args),
        "workingDir": WORKSPACE,
        "ports": [{"name": "agent", "containerPort": kube.agent_port, "protocol": "TCP"}],
        "env": _env(spec, agent_secret),
        "resources": {"limits": limits, "requests": dict(limits)},
        "volumeMounts": mounts,
        "readinessProbe": {
            "tcpSocket": {"port": kube.agent_port},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": sandbox_uid,
            "runAsGroup": sandbox_uid,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": spec.read_only_root,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": _seccomp(kube),
        },
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "hostname": "sandbox",  # as the host kinds name it (the pod's name is no one's business)
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": sandbox_uid,
            "runAsGroup": sandbox_uid,
            "fsGroup": sandbox_uid,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": _seccomp(kube),
        },
        "containers": [container],
        "volumes": volumes,
    }
    if kube.runtime_class:
        pod_spec["runtimeClassName"] = kube.runtime_class
    labels = {**COMPONENT_LABELS, **spec.labels}
    if sandbox_id:
        labels[LABEL_SANDBOX_ID] = sandbox_id
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(spec.name, kube.namespace, labels),
        "spec": pod_spec,
    }


def agent_secret(
    name: str,
    issued: Issued,
    ca_pem: bytes,
    labels: Mapping[str, str],
    namespace: str = "",
    environment: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Secret mounted at TLS_DIR: the agent's certificate and key and the CA's
    certificate (which checks the supervisors' certificates); and `environment`, the
    sandbox's secret variables (secret_environment), which the pod references by key."""
    data = {"ca.crt": ca_pem, "tls.crt": issued.cert_pem, "tls.key": issued.key_pem}
    data.update({env_key(k): v.encode() for k, v in (environment or {}).items()})
    metadata = _metadata(name, namespace, labels)
    if not namespace:
        del metadata["namespace"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": metadata,
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def volume_of(pod: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The pod's volume of that name ({} when it has none)."""
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return next((v for v in volumes if isinstance(v, dict) and v.get("name") == name), {})


def claim_of(pod: Mapping[str, Any]) -> str:
    """The workspace claim a pod mounts ("" for an emptyDir workspace)."""
    return str(
        (volume_of(pod, "workspace").get("persistentVolumeClaim") or {}).get("claimName") or ""
    )


def secret_of(pod: Mapping[str, Any]) -> str:
    """The agent Secret a pod mounts."""
    return str((volume_of(pod, "tls").get("secret") or {}).get("secretName") or "")


def relabeling(labels: Mapping[str, str | None]) -> dict[str, Any]:
    """The merge patch of an object's metadata that sets `labels` (None: removes), each as a
    label or an annotation as split_labels would put it, and removes it from the other place
    (a null for a key that is not there changes nothing): no read of the object is needed,
    so a Secret is relabeled without being read."""
    as_labels: dict[str, str | None] = {}
    notes: dict[str, str | None] = {}
    for name, value in labels.items():
        if value is None:
            as_labels[name] = notes[name] = None
        elif is_label(name, value):
            as_labels[name], notes[name] = value, None
        else:
            as_labels[name], notes[name] = None, value
    return {"metadata": {"labels": as_labels, "annotations": notes}}


def workspace_claim(name: str, kube: KubernetesConfig, labels: Mapping[str, str]) -> dict[str, Any]:
    """A key's workspace: ReadWriteOnce (one pod at a time), the configured size and class."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": quantity(kube.workspace_size_mb * _MI)}},
    }
    if kube.storage_class:
        spec["storageClassName"] = kube.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(name, kube.namespace, labels),
        "spec": spec,
    }
