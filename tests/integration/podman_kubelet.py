"""A kubelet's part, played by `podman kube play` (Podman 4.3) on this host, for tests of
sandbox pods without a Kubernetes cluster.

Podman 4.3 plays most of a Pod as Kubernetes would (command, env, runAsUser/runAsGroup,
capabilities, allowPrivilegeEscalation, readOnlyRootFilesystem, resources, ports with hostIP),
but not its volumes:

- a Secret volume crashes 4.3 unless `optional` is set (podman#16636; the manifests set it to
  false, the Kubernetes default), and then its files hold the Secret's base64 text, not the
  decoded bytes; the volume also outlives the pod, under the Secret's name;
- an emptyDir becomes a named volume called after the pod's volume ("workspace", "tmp"),
  shared by every pod that names a volume so, kept after the pod, with neither `medium:
  Memory` nor `sizeLimit` applied; and a tmpfs volume with a size cannot be made either (4.3
  takes `size` for an XFS project quota).

So this plays the kubelet's part for volumes, as a kubelet does it: each Secret volume and
each memory emptyDir is a tmpfs on the host (a Secret's files written decoded, with its
defaultMode, group fsGroup), a disk emptyDir a host folder, all bind-mounted into the pod
(hostPath) and removed with it; persistentVolumeClaims stay Podman named volumes (4.3 plays
them as such). Everything else in the Pod goes to Podman unchanged.

Environment from a Secret (valueFrom.secretKeyRef) Podman 4.3 resolves itself, from a Podman
secret of the name referenced whose content is the JSON of the Secret's `data` (key -> base64
value): this makes one of each Secret a pod references so, under a name of its own (Podman's
secrets are the host's, not a namespace's), points the reference at it, and removes it with
the pod. A Secret volume's `items` project only the keys they name, as Kubernetes does.

A disk emptyDir's sizeLimit is not applied (a kubelet enforces it by evicting the pod).

What 4.3 ignores and this does not make up for: securityContext.seccompProfile (Podman's own
default profile applies, which is what RuntimeDefault means on a Podman node; a Localhost
profile is not loaded), runtimeClassName, the ephemeral-storage limit (a kubelet's eviction),
and the pod has no pids limit (a kubelet's podPidsLimit).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


def size_bytes(quantity: str) -> int:
    """A Kubernetes quantity of bytes ("64Mi", "1000") as a number."""
    for suffix, factor in _UNITS.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


@dataclass
class PlayedPod:
    """A pod Podman runs, and what this kubelet made on the host for it."""

    name: str
    root: Path
    mounts: list[Path] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    """The Podman secrets made for its environment."""
    container: str = ""

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        """A command in the pod's container, through the engine (not the agent)."""
        return podman("exec", self.container, *command)

    def logs(self) -> str:
        done = podman("logs", self.container)
        return done.stdout + done.stderr


def _tmpfs(path: Path, size: int, mode: int, gid: int) -> None:
    path.mkdir(parents=True)
    options = f"size={size},mode={mode:o},uid=0,gid={gid},nodev,nosuid"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)


def _materialize(
    pod: dict[str, Any], secrets: Mapping[str, dict[str, Any]], played: PlayedPod
) -> dict[str, Any]:
    """The pod with its Secret and emptyDir volumes as hostPath volumes this made."""
    pod = copy.deepcopy(pod)
    # Podman 4.3's kube play holds annotation values to a label's 63 characters (the API
    # server takes 256 KiB); annotations play no part in running the pod
    annotations = pod["metadata"].get("annotations") or {}
    pod["metadata"]["annotations"] = {k: v for k, v in annotations.items() if len(v) <= 63}
    spec = pod["spec"]
    fs_group = int(spec.get("securityContext", {}).get("fsGroup", 0))
    for volume in spec.get("volumes", []):
        path = played.root / volume["name"]
        if "secret" in volume:
            source = volume.pop("secret")
            secret = secrets[source["secretName"]]
            _tmpfs(path, 1 << 20, 0o755, 0)
            played.mounts.append(path)
            mode = int(source.get("defaultMode", 0o644))
            data = secret.get("data", {})
            items = source.get("items") or [{"key": key, "path": key} for key in data]
            for projected in items:
                item = path / projected["path"]
                item.write_bytes(base64.b64decode(data[projected["key"]]))
                os.chown(item, 0, fs_group)
                item.chmod(int(projected.get("mode", mode)))
        elif "emptyDir" in volume:
            source = volume.pop("emptyDir")
            if source.get("medium") == "Memory":
                size = size_bytes(source.get("sizeLimit", "64Mi"))
                _tmpfs(path, size, 0o2777 if fs_group else 0o777, fs_group)
                played.mounts.append(path)
            else:
                path.mkdir(parents=True)
                os.chown(path, 0, fs_group)
                path.chmod(0o2777 if fs_group else 0o777)
        else:
            continue
        volume["hostPath"] = {"path": str(path), "type": "Directory"}
    for container in spec.get("containers", []):
        _secret_env(container, secrets, played)
    return pod


def _secret_env(
    container: dict[str, Any], secrets: Mapping[str, dict[str, Any]], played: PlayedPod
) -> None:
    """Point each secretKeyRef of the container's env at a Podman secret holding the
    Secret's data (made once per Secret), which `kube play` reads the value from."""
    made: dict[str, str] = {}
    for env in container.get("env", []):
        ref = (env.get("valueFrom") or {}).get("secretKeyRef")
        if ref is None:
            continue
        name = ref["name"]
        if name not in made:
            made[name] = f"{played.root.name}-{name}"
            content = json.dumps(secrets[name].get("data", {}))
            done = subprocess.run(
                ["podman", "secret", "create", made[name], "-"],
                input=content, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"podman secret create failed: {done.stderr.strip()}")
            played.secrets.append(made[name])
        ref["name"] = made[name]


def publish(pod: dict[str, Any], host_ip: str, host_port: int) -> dict[str, Any]:
    """The pod with its first container's first port published on host_ip:host_port (a
    hostPort: for tests on loopback only; the manifests publish none)."""
    pod = copy.deepcopy(pod)
    pod["spec"]["containers"][0]["ports"][0].update(hostPort=host_port, hostIP=host_ip)
    return pod


def remove_claim(name: str) -> None:
    """A workspace claim's volume (Podman plays a persistentVolumeClaim as a named volume of
    the claim's name, made at first use and kept after the pod, as a claim is)."""
    podman("volume", "rm", "--force", name)


def play(pod: dict[str, Any], secrets: Mapping[str, dict[str, Any]] | None = None) -> PlayedPod:
    """Run `pod` (one container) with the Secrets it mounts; down() undoes it all."""
    name = pod["metadata"]["name"]
    played = PlayedPod(name, Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp")))
    try:
        spec_path = played.root / "pod.json"
        spec_path.write_text(json.dumps(_materialize(pod, secrets or {}, played)))
        done = podman("kube", "play", str(spec_path))
        if done.returncode != 0:
            raise RuntimeError(f"podman kube play failed: {done.stderr.strip()}")
        container = pod["spec"]["containers"][0]["name"]
        played.container = f"{name}-{container}"
    except BaseException:
        down(played)
        raise
    return played


def down(played: PlayedPod) -> None:
    """Remove the pod and what this kubelet made for it (also after a failed play)."""
    podman("pod", "rm", "--force", "--time", "2", played.name)
    for secret in played.secrets:
        podman("secret", "rm", secret)
    for path in reversed(played.mounts):
        subprocess.run(["umount", "--lazy", str(path)], check=False)
    shutil.rmtree(played.root, ignore_errors=True)


@contextlib.contextmanager
def running(
    pod: dict[str, Any], secrets: Mapping[str, dict[str, Any]] | None = None
) -> Iterator[PlayedPod]:
    played = play(pod, secrets)
    try:
        yield played
    finally:
        down(played)
