"""Podman through the `podman` SDK, over its REST service socket."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import podman
import podman.errors
import requests

from stockade.supervisor.engines.backends._common import (
    HostFolderWorkspaces,
    bare_id,
    debian_package_version,
    id_maps,
    info_from_inspect,
    label_filters,
    mounts_from_inspect,
    parse_runc_version,
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
    AUTO_SIZE,
    SUBGID,
    SUBUID,
    IdMaps,
    check_podman_subids,
    read_host_file,
)
from stockade.supervisor.errors import ConfigError, EngineUnavailable

_ENGINE_ERRORS = (podman.errors.PodmanError, requests.RequestException)
DEFAULT_NETWORK = "podman"
"""The network of network_mode "bridge" (sandbox network mode open)."""
_BUSY = "device or resource busy"
_REMOVE_TRIES = 5
_EXITING = "no such process"
"""Podman 4.3 answers an inspect with a 500 "read /proc/PID/cgroup: no such process" when
the container's main process exits under it (an agent killed from outside): asked again, it
finds the container stopped."""
_INSPECT_TRIES = 5
CPU_PERIOD_US = 100_000


class PodmanBackend(HostFolderWorkspaces):
    engine = "podman"
    tmpfs_inodes = False
    host = LOCAL
    """Podman 4.3 refuses nr_inodes on its tmpfs mounts ("invalid mount option")."""

    def __init__(self, base_url: str) -> None:
        self._base_url = base_url
        self._client = podman.PodmanClient(base_url=base_url, timeout=60)

    def ping(self) -> str:
        try:
            return str(self._client.version().get("Version", "?"))
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(
                f"Podman at {self._base_url} does not answer: {exc}. "
                "Start it with `podman system service --time=0 unix:///PATH`, "
                "or leave engine.socket empty so that `stockade serve` starts it."
            ) from exc

    def image_exists(self, ref: str) -> bool:
        try:
            return bool(self._client.images.exists(ref))
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Podman: cannot look up image {ref}: {exc}") from exc

    def image_id(self, ref: str) -> str | None:
        try:
            return bare_id(self._client.images.get(ref).id)
        except podman.errors.ImageNotFound:
            return None
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Podman: cannot look up image {ref}: {exc}") from exc

    def check_user_namespace(self, wanted: bool) -> IdMaps | None:
        """Podman maps per container; its automatic ranges come from /etc/subuid and
        /etc/subgid of its host (the supervisor's: it bind-mounts host directories)."""
        if wanted:
            check_podman_subids(read_host_file(SUBUID), read_host_file(SUBGID))
        return None

    def run(self, spec: ContainerSpec, prepare: Callable[[IdMaps], None]) -> ContainerInfo:
        try:
            container = self._client.containers.create(**_create_kwargs(spec))
        except _ENGINE_ERRORS as exc:
            # the image is looked up only when the create failed: a round trip less a start
            if not self.image_exists(spec.image):
                raise EngineUnavailable(
                    f"Podman has no image {spec.image}; build it with "
                    "`stockade image build --engine podman`"
                ) from exc
            raise EngineUnavailable(f"Podman could not create {spec.name}: {exc}") from exc
        try:
            attrs = self._client.containers.get(container.id).attrs
            actual = str(attrs.get("OCIRuntime") or "")
            if spec.runtime and actual != spec.runtime:
                self.remove(container.id)
                raise ConfigError(self._other_runtime(spec.runtime, actual))
            prepare(id_maps(attrs))
            container.start()
            attrs = self._client.containers.get(container.id).attrs
        except _ENGINE_ERRORS as exc:
            self.remove(container.id)
            raise EngineUnavailable(f"Podman could not start {spec.name}: {exc}") from exc
        except BaseException:
            self.remove(container.id)
            raise
        return info_from_inspect(attrs)

    def _other_runtime(self, wanted: str, actual: str) -> str:
        return (
            f"sandbox.runtime is {wanted!r}, but Podman at {self._base_url} made the container "
            f"for runtime {actual or '?'!r} (Podman 4.3's API ignores the runtime asked for per "
            "container: its service's default applies). Leave engine.socket empty so that the "
            f"supervisor starts Podman's service with --runtime {wanted}, or start the service "
            f"as `podman --runtime {wanted} system service`; the runtime must be an absolute "
            "path or a name listed under [engine.runtimes] in containers.conf "
            f'(e.g. {Path(wanted).name} = ["/usr/bin/{Path(wanted).name}"] in '
            "/etc/containers/containers.conf.d/runtimes.conf)"
        )

    def _attrs(self, name_or_id: str) -> dict[str, Any] | None:
        """The engine's inspect document; None when there is no such container."""
        attempt = 1
        while True:
            try:
                attrs: dict[str, Any] = self._client.containers.get(name_or_id).attrs
                return attrs
            except podman.errors.NotFound:
                return None
            except _ENGINE_ERRORS as exc:
                if "no such container" in str(exc):  # a 500 while it is being removed
                    return None
                if _EXITING not in str(exc) or attempt == _INSPECT_TRIES:
                    raise EngineUnavailable(f"Podman: cannot inspect {name_or_id}: {exc}") from exc
            time.sleep(0.1 * attempt)
            attempt += 1

    def inspect(self, name_or_id: str) -> ContainerInfo | None:
        attrs = self._attrs(name_or_id)
        return None if attrs is None else info_from_inspect(attrs)

    def list(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        try:
            # podman-py turns a dict's list value into its repr; the list form is encoded right
            filters = [f"label={item}" for item in label_filters(labels)]
            found = self._client.containers.list(all=True, filters=filters)
            infos = [self.inspect(c.id) for c in found]
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Podman: cannot list containers: {exc}") from exc
        return [i for i in infos if i is not None]

    def remove(self, name_or_id: str) -> bool:
        """Podman 4.3 often fails a forced remove of a container with a user namespace with
        "unlinkat .../userdata/shm: device or resource busy" (its processes are still on their
        way out; containers/podman#11594), mostly having removed it: asked again, after a
        pause, it finishes or finds nothing left."""
        attempt = 1
        while True:
            try:
                self._client.containers.remove(name_or_id, force=True)
                return True
            except podman.errors.NotFound:
                return attempt > 1  # an attempt that failed removed it
            except _ENGINE_ERRORS as exc:
                if _BUSY not in str(exc) or attempt == _REMOVE_TRIES:
                    raise EngineUnavailable(f"Podman: cannot remove {name_or_id}: {exc}") from exc
            time.sleep(0.2 * attempt)
            attempt += 1

    def pause(self, name_or_id: str) -> bool:
        return set_paused(
            self.inspect, lambda c: self._client.containers.get(c).pause(), _ENGINE_ERRORS,
            name_or_id, True,
        )  # fmt: skip

    def unpause(self, name_or_id: str) -> bool:
        return set_paused(
            self.inspect, lambda c: self._client.containers.get(c).unpause(), _ENGINE_ERRORS,
            name_or_id, False,
        )  # fmt: skip

    def set_connected(self, name_or_id: str, connected: bool) -> bool:
        def act(container: str, network: str, connect: bool) -> None:
            found = self._client.networks.get(network)
            (found.connect if connect else found.disconnect)(container)

        attrs = self._attrs(name_or_id)
        return set_connected(attrs, DEFAULT_NETWORK, act, _ENGINE_ERRORS, connected)

    def mounts(self, name_or_id: str) -> tuple[BindMount, ...] | None:
        attrs = self._attrs(name_or_id)
        return None if attrs is None else mounts_from_inspect(attrs)

    def security_view(self, name_or_id: str) -> EngineView | None:
        attrs = self._attrs(name_or_id)
        if attrs is None:
            return None
        return view_from_inspect(attrs, "not reported by Podman's inspect")

    def runtime_facts(self) -> RuntimeFacts:
        """Podman's info names the runtime, its `--version` output and, on Debian, the
        package it came from ("runc_1.1.5+ds1-1+deb12u1_amd64")."""
        try:
            oci = (self._client.info().get("host") or {}).get("ociRuntime") or {}
        except _ENGINE_ERRORS as exc:
            raise EngineUnavailable(f"Podman: cannot read its info: {exc}") from exc
        name = str(oci.get("name") or "")
        version, commit = parse_runc_version(str(oci.get("version") or ""))
        parts = str(oci.get("package") or "").split("_")
        package, source = "", ""
        if len(parts) == 3 and parts[0] == Path(name).name and parts[1]:
            package, source = parts[1], "engine (package)"
        elif debian_package_version(version, commit):
            package, source = commit, "engine (runc commit)"
        return RuntimeFacts(name, version, package, source, str(oci.get("path") or ""))

    def runtimes(self) -> dict[str, str]:
        """The service's runtime (its API tells no other), and the runtimes listed in this
        host's containers.conf files whose program exists (a service started with --runtime
        may use those by name)."""
        from stockade.supervisor.engines.services import configured_runtimes

        found = configured_runtimes()
        facts = self.runtime_facts()
        if facts.name:
            found[facts.name] = facts.path
        return found

    def close(self) -> None:
        self._client.close()


def _create_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    mounts: list[dict[str, Any]] = [
        {"type": "bind", "source": m.source, "target": m.target, "read_only": m.read_only}
        for m in spec.mounts
    ]
    mounts += [
        {"type": "tmpfs", "source": "tmpfs", "target": path, "size": str(size), "mode": "1777"}
        for path, size in spec.tmpfs.items()
    ]
    kwargs: dict[str, Any] = {
        "image": spec.image,
        "command": list(spec.command),
        "name": spec.name,
        "labels": dict(spec.labels),
        "user": spec.user,
        "environment": dict(spec.environment),
        "read_only": spec.read_only_root,
        "mem_limit": spec.memory_bytes,
        "memswap_limit": spec.memory_bytes,
        # podman-py ignores nano_cpus without a word; quota over period is what it passes on
        "cpu_period": CPU_PERIOD_US,
        "cpu_quota": spec.nano_cpus * CPU_PERIOD_US // 1_000_000_000,
        "pids_limit": spec.pids_limit,
        "ulimits": [
            {"Name": name, "Soft": value, "Hard": value} for name, value in ulimits(spec).items()
        ],
        "network_mode": spec.network,
        "mounts": mounts,
        "hostname": "sandbox",
    }
    if spec.runtime:  # honoured by later Podman versions; 4.3 ignores it (run() checks)
        kwargs["runtime"] = spec.runtime
    if spec.drop_all_capabilities:
        kwargs["cap_drop"] = ["ALL"]
    if spec.cap_add:
        kwargs["cap_add"] = list(spec.cap_add)
    if spec.entrypoint:
        kwargs["entrypoint"] = list(spec.entrypoint)
    if spec.no_new_privileges:
        kwargs["no_new_privileges"] = True  # podman-py maps security_opt to SELinux options
    if spec.seccomp_profile:
        kwargs["seccomp_profile_path"] = spec.seccomp_profile
    if spec.user_namespace:
        # libpod 4.3 takes `--userns=auto:size=N` as this pair: the mode alone (podman-py's
        # userns_mode) creates no namespace; the id mappings carry "auto" and its size
        kwargs["userns_mode"] = "auto"
        kwargs["idmappings"] = {"AutoUserNs": True, "AutoUserNsOpts": {"Size": AUTO_SIZE}}
    return kwargs
