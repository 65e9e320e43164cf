"""Docker Engine through the `docker` SDK."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
import requests

from stockade.supervisor.engines.backends._common import (
    HostFolderWorkspaces,
    bare_id,
    debian_package_version,
    info_from_inspect,
    label_filters,
    mounts_from_inspect,
    set_connected,
    set_paused,
    ulimits,
    view_from_inspect,
)
from stockade.supervisor.engines.backends.base import (
    BindMount,
    ContainerInfo,
    ContainerSpec,
    EngineView,
    RuntimeFacts,
)
from stockade.supervisor.engines.hosts import LOCAL
from stockade.supervisor.engines.userns import (
    NO_USERNS,
    SUBGID,
    SUBUID,
    IdMaps,
    docker_remap,
    read_host_file,
)
from stockade.supervisor.errors import ConfigError, EngineUnavailable

_ENGINE_ERRORS = (docker.errors.DockerException, requests.RequestException)


class DockerBackend(HostFolderWorkspaces):
    engine = "docker"
    tmpfs_inodes = True
    host = LOCAL

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

    def image_id(self, ref: str) -> str | None:
        try:
            return bare_id(self._client.images.get(ref).id)
        except docker.errors.ImageNotFound:
            return None
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Docker: cannot look up image {ref}: {exc}") from exc

    def check_user_namespace(self, wanted: bool) -> IdMaps | None:
        maps = self._remap()
        if wanted and maps is None:
            raise ConfigError(
                f"sandbox.user_namespace is on, but Docker at {self._base_url} does not remap "
                "user namespaces (Docker's are daemon-wide, not per container): add "
                '"userns-remap": "default" to /etc/docker/daemon.json (or start dockerd with '
                "--userns-remap=default) and restart dockerd; it creates the 'dockremap' user "
                "and its /etc/subuid range. Or set sandbox.user_namespace = false"
            )
        return maps

    def _remap(self) -> IdMaps | None:
        """The daemon's userns-remap maps (its info lists "name=userns" among the security
        options and keeps its data under a root named after the remapped root's ids)."""
        try:
            info = self._client.info()
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Docker: cannot read its info: {exc}") from exc
        if "name=userns" not in (info.get("SecurityOptions") or []):
            return None
        root = str(info.get("DockerRootDir") or "")
        return docker_remap(root, read_host_file(SUBUID), read_host_file(SUBGID))

    def run(self, spec: ContainerSpec, prepare: Callable[[IdMaps], None]) -> ContainerInfo:
        maps = self._remap() or NO_USERNS
        try:
            container = self._client.containers.create(**_run_kwargs(spec))
        except docker.errors.ImageNotFound as exc:
            raise EngineUnavailable(
                f"Docker has no image {spec.image}; build it with "
                "`stockade image build --engine docker`"
            ) from exc
        except docker.errors.APIError as exc:
            if spec.runtime and "unknown runtime" in str(exc.explanation or exc).lower():
                raise ConfigError(self._unknown_runtime(spec.runtime)) from exc
            raise EngineUnavailable(f"Docker could not create {spec.name}: {exc}") from exc
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Docker could not create {spec.name}: {exc}") from exc
        try:
            prepare(maps)
            container.start()
            container.reload()
        except _ENGINE_ERRORS as exc:
            self.remove(container.id)
            raise EngineUnavailable(f"Docker could not start {spec.name}: {exc}") from exc
        except BaseException:
            self.remove(container.id)
            raise
        return info_from_inspect(container.attrs)

    def _attrs(self, name_or_id: str) -> dict[str, Any] | None:
        """The engine's inspect document; None when there is no such container."""
        try:
            attrs: dict[str, Any] = self._client.api.inspect_container(name_or_id)
        except docker.errors.NotFound:
            return None
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Docker: cannot inspect {name_or_id}: {exc}") from exc
        return attrs

    def inspect(self, name_or_id: str) -> ContainerInfo | None:
        attrs = self._attrs(name_or_id)
        return None if attrs is None else info_from_inspect(attrs)

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

    def pause(self, name_or_id: str) -> bool:
        return set_paused(self.inspect, self._client.api.pause, _ENGINE_ERRORS, name_or_id, True)

    def unpause(self, name_or_id: str) -> bool:
        api = self._client.api
        return set_paused(self.inspect, api.unpause, _ENGINE_ERRORS, name_or_id, False)

    def set_connected(self, name_or_id: str, connected: bool) -> bool:
        api = self._client.api

        def act(container: str, network: str, connect: bool) -> None:
            if connect:
                api.connect_container_to_network(container, network)
            else:
                api.disconnect_container_from_network(container, network)

        attrs = self._attrs(name_or_id)
        return set_connected(attrs, "bridge", act, _ENGINE_ERRORS, connected)

    def mounts(self, name_or_id: str) -> tuple[BindMount, ...] | None:
        attrs = self._attrs(name_or_id)
        return None if attrs is None else mounts_from_inspect(attrs)

    def security_view(self, name_or_id: str) -> EngineView | None:
        attrs = self._attrs(name_or_id)
        if attrs is None:
            return None
        view = view_from_inspect(attrs, "default")  # Docker lists only a non-default one
        if (attrs.get("HostConfig") or {}).get("UsernsMode") == "host":  # opted out of remap
            return view
        maps = self._remap()
        if maps is None:
            return view
        return replace(view, userns_mode="remap", uid_map=maps.uids, gid_map=maps.gids)

    def runtime_facts(self) -> RuntimeFacts:
        """Docker names its runc among the server's components; Debian's build gives the
        package version as runc's commit."""
        try:
            components = self._client.version().get("Components") or []
            info = self._client.info()
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Docker: cannot read its version: {exc}") from exc
        name = str(info.get("DefaultRuntime") or "runc")
        path = str(((info.get("Runtimes") or {}).get(name) or {}).get("path") or "")
        for component in components:
            if str(component.get("Name", "")).lower() == "runc" and "runc" in name:
                version = str(component.get("Version") or "")
                commit = str((component.get("Details") or {}).get("GitCommit") or "")
                package = debian_package_version(version, commit)
                source = "engine (runc commit)" if package else ""
                return RuntimeFacts(name, version, package, source, path)
        return RuntimeFacts(name=name, path=path)

    def runtimes(self) -> dict[str, str]:
        try:
            found = self._client.info().get("Runtimes") or {}
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Docker: cannot read its info: {exc}") from exc
        return {str(name): str((v or {}).get("path") or "") for name, v in found.items()}

    def _unknown_runtime(self, runtime: str) -> str:
        try:
            known = ", ".join(sorted(self.runtimes())) or "none"
        except EngineUnavailable:
            known = "(cannot ask)"
        name = Path(runtime).name if runtime.startswith("/") else runtime
        path = runtime if runtime.startswith("/") else f"/usr/bin/{runtime}"
        how = (
            f'register it in /etc/docker/daemon.json, e.g. {{"runtimes": {{"{name}": '
            f'{{"path": "{path}"}}}}}}, then reload dockerd (SIGHUP)'
        )
        if runtime.startswith("/"):
            how = f"Docker takes a registered name, not a path: {how} and set {name!r}"
        return (
            f"sandbox.runtime {runtime!r} is not a runtime Docker knows (it knows: {known}): "
            f"{how}; or change sandbox.runtime (empty: Docker's default)"
        )

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
        "cap_add": list(spec.cap_add) or None,
        **({"entrypoint": list(spec.entrypoint)} if spec.entrypoint else {}),
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
            path: _tmpfs_options(size, spec.tmpfs_inodes) for path, size in spec.tmpfs.items()
        },
        "mounts": [
            docker.types.Mount(target=m.target, source=m.source, type="bind", read_only=m.read_only)
            for m in spec.mounts
        ],
        "hostname": "sandbox",
        **({"runtime": spec.runtime} if spec.runtime else {}),
    }


def _tmpfs_options(size: int, inodes: int) -> str:
    return (
        f"rw,nosuid,nodev,size={size}" + (f",nr_inodes={inodes}" if inodes else "") + ",mode=1777"
    )
