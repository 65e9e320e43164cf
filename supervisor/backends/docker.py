"""Docker Engine through the `docker` SDK."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
import requests

from stockade.supervisor.backends._common import info_from_inspect, label_filters, ulimits
from stockade.supervisor.backends.base import ContainerInfo, ContainerSpec
from stockade.supervisor.errors import EngineUnavailable

_ENGINE_ERRORS = (docker.errors.DockerException, requests.RequestException)


class DockerBackend:
    engine = "docker"

    def __init__(self, base_url: str) -> None:
        self._base_url = base_url
        try:
            self._client = docker.DockerClient(base_url=base_url, timeout=60)
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"cannot reach Docker at {base_url}: {exc}") from exc

    def ping(self) -> str:
        try:
            return str(self._client.version().get("Version", "?"))
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(
                f"Docker at {self._base_url} does not answer: {exc}. "
                "Is dockerd running? (start it with /usr/sbin/dockerd)"
            ) from exc

    def image_exists(self, ref: str) -> bool:
        try:
            self._client.images.get(ref)
        except docker.errors.ImageNotFound:
            return False
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Docker: cannot look up image {ref}: {exc}") from exc
        return True

    def run(self, spec: ContainerSpec) -> ContainerInfo:
        try:
            container = self._client.containers.create(**_run_kwargs(spec))
        except docker.errors.ImageNotFound as exc:
            raise EngineUnavailable(
                f"Docker has no image {spec.image}; build it with "
                "`stockade image build --engine docker`"
            ) from exc
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Docker could not create {spec.name}: {exc}") from exc
        try:
            container.start()
            container.reload()
        except _ENGINE_ERRORS as exc:
            self.remove(container.id)
            raise EngineUnavailable(f"Docker could not start {spec.name}: {exc}") from exc
        return info_from_inspect(container.attrs)

    def inspect(self, name_or_id: str) -> ContainerInfo | None:
        try:
            return info_from_inspect(self._client.api.inspect_container(name_or_id))
        except docker.errors.NotFound:
            return None
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Docker: cannot inspect {name_or_id}: {exc}") from exc

    def list(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        try:
            found = self._client.api.containers(all=True, filters={"label": label_filters(labels)})
            infos = [self.inspect(c["Id"]) for c in found]
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Docker: cannot list containers: {exc}") from exc
        return [i for i in infos if i is not None]

    def remove(self, name_or_id: str) -> bool:
        try:
            self._client.api.remove_container(name_or_id, force=True)
        except docker.errors.NotFound:
            return False
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Docker: cannot remove {name_or_id}: {exc}") from exc
        return True

    def close(self) -> None:
        self._client.close()


def _security_opt(spec: ContainerSpec) -> list[str]:
    options = ["no-new-privileges"] if spec.no_new_privileges else []
    if spec.seccomp_profile:  # Docker takes the profile itself, not a path
        options.append("seccomp=" + Path(spec.seccomp_profile).read_text())
    return options


def _run_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    return {
        "image": spec.image,
        "command": list(spec.command),
        "name": spec.name,
        "labels": dict(spec.labels),
        "user": spec.user,
        "environment": dict(spec.environment),
        "read_only": spec.read_only_root,
        "cap_drop": ["ALL"] if spec.drop_all_capabilities else None,
        "security_opt": _security_opt(spec) or None,
        "mem_limit": spec.memory_bytes,
        "memswap_limit": spec.memory_bytes,
        "nano_cpus": spec.nano_cpus,
        "pids_limit": spec.pids_limit,
        "ulimits": [
            docker.types.Ulimit(name=name, soft=value, hard=value)
            for name, value in ulimits(spec).items()
        ],
        "network_mode": spec.network,
        "tmpfs": {
            path: f"rw,nosuid,nodev,size={size},mode=1777" for path, size in spec.tmpfs.items()
        },
        "mounts": [
            docker.types.Mount(target=m.target, source=m.source, type="bind", read_only=m.read_only)
            for m in spec.mounts
        ],
        "hostname": "sandbox",
    }
