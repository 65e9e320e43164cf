"""Pieces both SDK backends share: reading inspect data, and HostFolderWorkspaces (the
workspace methods of a host kind whose workspace is the sandbox's host folder)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from stockade.supervisor.engines.backends.base import (
    BindMount,
    ContainerInfo,
    ContainerSpec,
    EngineView,
)
from stockade.supervisor.engines.userns import IDENTITY, IdMaps, is_identity, parse_engine_map
from stockade.supervisor.errors import EngineUnavailable, Unsupported


class HostFolderWorkspaces:
    """ContainerBackend's workspace methods for a host kind whose workspace is the sandbox's
    host folder (Docker, Podman): the manager names and deletes it; the engine keeps none and
    cannot relabel a container."""

    def remove_workspace(self, sandbox_id: str) -> bool:
        return False  # the workspace is the sandbox's host folder: the manager deletes it

    def workspace_of(self, sandbox_id: str) -> str | None:
        return None  # the sandbox's host folder: the manager names it

    def relabel(self, name_or_id: str, labels: Mapping[str, str | None]) -> ContainerInfo | None:
        raise Unsupported("a container's labels are fixed at creation (the warm pool's are too)")

    def has_workspace(self, sandbox_id: str) -> bool:
        return False  # the workspace is the sandbox's host folder


def parse_time(value: Any) -> datetime | None:
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value).astimezone()
    if not isinstance(value, str) or not value:
        return None
    text = value.rstrip("Z")
    head, _, frac = text.partition(".")
    digits = "".join(c for c in frac if c.isdigit())[:6]
    zone = frac[len(digits) :] if digits else ""
    try:
        stamp = datetime.fromisoformat(f"{head}.{digits or '0'}{zone}")
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.astimezone()


def info_from_inspect(attrs: Mapping[str, Any]) -> ContainerInfo:
    """ContainerInfo from an engine's inspect document (Docker and libpod agree here)."""
    state = attrs.get("State") or {}
    config = attrs.get("Config") or {}
    paused = bool(state.get("Paused"))
    return ContainerInfo(
        id=str(attrs.get("Id", "")),
        name=str(attrs.get("Name", "")).lstrip("/"),
        running=bool(state.get("Running")) or paused,  # libpod: Running is false when paused
        status=str(state.get("Status", "")),
        labels=dict(config.get("Labels") or {}),
        image=str(attrs.get("ImageName") or config.get("Image") or ""),
        created_at=parse_time(attrs.get("Created")),
        image_id=bare_id(attrs.get("Image")),
        exit_code=state.get("ExitCode"),
        oom_killed=bool(state.get("OOMKilled")),
        pid=int(state.get("Pid") or 0),
        own_userns=not is_identity(id_maps(attrs).uids),
        paused=paused,
    )


def set_connected(
    attrs: dict[str, Any] | None,
    network: str,
    act: Callable[[str, str, bool], object],
    errors: tuple[type[BaseException], ...],
    connected: bool,
) -> bool:
    """ContainerBackend.set_connected from the container's inspect (`attrs`) and the
    engine's call `act(container id, network, connect)`."""
    if attrs is None:
        return False
    networks = (attrs.get("NetworkSettings") or {}).get("Networks") or {}
    if (network in networks) == connected:
        return True
    try:
        act(str(attrs["Id"]), network, connected)
    except errors as exc:
        verb = "connect" if connected else "disconnect"
        raise EngineUnavailable(f"cannot {verb} container {attrs.get('Name', '?')}: {exc}") from exc
    return True


def set_paused(
    inspect: Callable[[str], ContainerInfo | None],
    act: Callable[[str], object],
    errors: tuple[type[BaseException], ...],
    name_or_id: str,
    wanted: bool,
) -> bool:
    """Pause (`wanted`) or unpause a container through `act`, the engine's call; what
    ContainerBackend.pause and unpause return. A failed call is judged by the state the
    engine reports afterwards (a container paused meanwhile, or removed), not by its words."""
    info = inspect(name_or_id)
    if info is None or not info.running:
        return False
    if info.paused == wanted:
        return True
    try:
        act(info.id)
    except errors as exc:
        after = inspect(info.id)
        if after is None or not after.running:
            return False
        if after.paused != wanted:
            verb = "pause" if wanted else "unpause"
            raise EngineUnavailable(f"cannot {verb} container {info.name}: {exc}") from exc
    return True


def bare_id(value: Any) -> str:
    """An image id as both engines can compare it: Docker writes "sha256:HEX", libpod HEX."""
    return str(value or "").removeprefix("sha256:")


def mounts_from_inspect(attrs: Mapping[str, Any]) -> tuple[BindMount, ...]:
    """The bind mounts of an inspect document (Docker and libpod agree: Type, Source,
    Destination, RW); volumes and tmpfs are left out."""
    return tuple(
        BindMount(str(m.get("Source", "")), str(m.get("Destination", "")), not m.get("RW", True))
        for m in attrs.get("Mounts") or []
        if m.get("Type") == "bind"
    )


def label_filters(labels: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in labels.items()]


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _short_option(option: str) -> str:
    """An inline seccomp profile (Docker keeps the whole JSON) becomes its digest."""
    name, sep, value = option.partition("=")
    if name == "seccomp" and sep and value.lstrip().startswith("{"):
        return f"seccomp=custom (sha256:{hashlib.sha256(value.encode()).hexdigest()[:16]})"
    return option


def _seccomp(options: tuple[str, ...], otherwise: str) -> str:
    for option in options:
        name, sep, value = option.partition("=")
        if name == "seccomp" and sep:
            return value
    return otherwise


def engine_maps(attrs: Mapping[str, Any]) -> IdMaps:
    """The id maps libpod's inspect gives (HostConfig.IDMappings: "0:2147483647:65536"
    strings); empty ones when it gives none (Docker never does)."""
    mappings = (attrs.get("HostConfig") or {}).get("IDMappings") or {}
    if not isinstance(mappings, dict):
        return IdMaps((), ())
    return IdMaps(
        parse_engine_map(mappings.get("UidMap")), parse_engine_map(mappings.get("GidMap"))
    )


def id_maps(attrs: Mapping[str, Any]) -> IdMaps:
    """The container's id maps: identity ones when the engine gives none (no user namespace
    of its own)."""
    maps = engine_maps(attrs)
    return IdMaps(maps.uids or IDENTITY, maps.gids or IDENTITY)


def view_from_inspect(attrs: Mapping[str, Any], seccomp_otherwise: str) -> EngineView:
    """EngineView from an inspect document; libpod names its runtime at the top level
    (HostConfig.Runtime is "oci" there), Docker in HostConfig. `seccomp_otherwise` is the
    profile to report when the security options name none."""
    host = attrs.get("HostConfig") or {}
    config = attrs.get("Config") or {}
    state = attrs.get("State") or {}
    options = tuple(_short_option(o) for o in _strings(host.get("SecurityOpt")))
    maps = engine_maps(attrs)
    nnp = any(
        o.replace(":", "=") in ("no-new-privileges", "no-new-privileges=true") for o in options
    )
    return EngineView(
        runtime=str(attrs.get("OCIRuntime") or host.get("Runtime") or ""),
        privileged=bool(host.get("Privileged")),
        cap_drop=_strings(host.get("CapDrop")),
        cap_add=_strings(host.get("CapAdd")),
        read_only_root=bool(host.get("ReadonlyRootfs")),
        user=str(config.get("User") or ""),
        network_mode=str(host.get("NetworkMode") or ""),
        security_options=options,
        no_new_privileges=nnp,
        seccomp_profile=_seccomp(options, seccomp_otherwise),
        memory_bytes=_int(host.get("Memory")),
        memory_swap_bytes=_int(host.get("MemorySwap")),
        nano_cpus=_int(host.get("NanoCpus")),
        cpu_quota_us=_int(host.get("CpuQuota")),
        cpu_period_us=_int(host.get("CpuPeriod")),
        pids_limit=_int(host.get("PidsLimit")),
        userns_mode=_userns_mode(str(host.get("UsernsMode") or ""), maps),
        cgroupns_mode=str(host.get("CgroupnsMode") or ""),
        host_pid=_int(state.get("Pid")),
        uid_map=maps.uids,
        gid_map=maps.gids,
    )


def _userns_mode(mode: str, maps: IdMaps) -> str:
    """Podman 4 leaves UsernsMode empty even for --userns=auto: its maps tell."""
    if mode or not (maps.uids or maps.gids):
        return mode
    return "host" if is_identity(maps.uids) and is_identity(maps.gids) else "private"


def debian_package_version(version: str, candidate: str) -> str:
    """`candidate` when it reads as a Debian package version of runc `version` (Debian's runc
    reports its package version as its commit: "1.1.5+ds1-1+deb12u1" for "1.1.5+ds1")."""
    candidate = candidate.strip()
    if version and candidate.startswith(f"{version}-") and " " not in candidate:
        return candidate
    return ""


def parse_runc_version(text: str) -> tuple[str, str]:
    """(version, commit) from `runc --version` output (or another runtime's that starts the
    same way: "runsc version 0.0~20221219.0")."""
    version = commit = ""
    for line in text.splitlines():
        name, sep, rest = line.partition(" version ")
        if sep and not version and name and " " not in name:
            version = rest.strip()
        elif line.startswith("commit:"):
            commit = line.removeprefix("commit:").strip()
    return version, commit


def ulimits(spec: ContainerSpec) -> dict[str, int]:
    """The container's rlimits (soft = hard), in the engines' names and units (bytes)."""
    limits = {"nofile": spec.nofile, "nproc": spec.nproc}
    if spec.fsize > 0:
        limits["fsize"] = spec.fsize
    return limits
