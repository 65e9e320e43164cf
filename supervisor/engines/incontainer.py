"""The supervisor running in a container (the supervisor image), driving the host's engine
through its mounted API socket.

The paths the supervisor gives the engine (each sandbox's workspace and agent socket
directory, the seccomp profile) are read by the engine on the host. They are paths in the
state directory, so the state directory must be the same directory at the same path inside
the supervisor's container and on the host: a bind mount whose source is its destination.
At start the supervisor finds its own container through the engine (by the container id in
its own mount table or cgroup) and refuses to start unless the engine's record of its mounts
proves that. Parts that act on the host itself (egress links in host network namespaces,
loop-mounted workspaces, starting a Podman service) cannot work from a container and are
refused with the reason.

When to check: STOCKADE_IN_CONTAINER=1 (the image sets it) always; else when a container
marker exists (/.dockerenv, /run/.containerenv) and the engine knows the container the ids
point at. A marker alone proves little: a machine that is itself a container may run its
engine inside (our CI does), and then the paths line up by construction.
STOCKADE_IN_CONTAINER=0 turns the check off.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath

from stockade.supervisor.config import Config
from stockade.supervisor.engines.backends.base import BindMount, ContainerBackend
from stockade.supervisor.errors import ConfigError

log = logging.getLogger("stockade")

ENV = "STOCKADE_IN_CONTAINER"
MARKERS = (Path("/.dockerenv"), Path("/run/.containerenv"))
_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
_ID_FILES = ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/run/.containerenv")
RUN_HINT = "see the README, 'The supervisor image', for the run line"


def declared(environ: Mapping[str, str] = os.environ) -> bool | None:
    """STOCKADE_IN_CONTAINER as a decision: True, False, or None (not set: look)."""
    value = environ.get(ENV, "").strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    return None


def may_be_in_container(environ: Mapping[str, str] = os.environ) -> bool:
    wanted = declared(environ)
    return wanted if wanted is not None else any(m.exists() for m in MARKERS)


def config_problems(config: Config) -> list[str]:
    """What in config cannot work with the supervisor in a container; empty when all can."""
    problems = []
    if config.engine.kind == "podman" and not config.engine.socket:
        problems.append(
            "engine.socket is empty, so the supervisor would start a Podman service of its "
            "own, which cannot run in its container: run `podman system service --time=0 "
            "unix:///run/podman/podman.sock` on the host, mount that socket and set "
            "STOCKADE_ENGINE_SOCKET=unix:///run/podman/podman.sock"
        )
    if config.sandbox.network == "egress":
        problems.append(
            'sandbox.network = "egress" builds links in the host\'s network namespaces, '
            "which a supervisor in a container cannot reach: use none or open, or run the "
            "supervisor on the host"
        )
    if config.sandbox.workspace_size_mb:
        problems.append(
            "sandbox.workspace_size_mb loop-mounts a file system per workspace on the host, "
            "which a mount made in the supervisor's container is not: set it to 0, or run "
            "the supervisor on the host"
        )
    if config.sandbox.user_namespace is True:
        problems.append(
            "sandbox.user_namespace reads the host's /etc/subuid and /etc/subgid and checks "
            "each container's /proc/PID/uid_map, which a supervisor in a container does not "
            "see: set it to false, or run the supervisor on the host"
        )
    return problems


def candidate_ids(mountinfo: str, cgroup: str) -> list[str]:
    """Container ids this process may be in, best evidence first: the engine's per-container
    files mounted at /etc/hostname and the like (their host path names the id), then the
    cgroup path. Not the hostname: the engines accept id prefixes, and a hostname that
    happened to prefix another container's id would check that container's mounts."""
    found: list[str] = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] in _ID_FILES:
            found += _ID.findall(fields[3])
    found += _ID.findall(cgroup)
    return list(dict.fromkeys(found))


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def check_same_path(state_dir: Path, mounts: Sequence[BindMount]) -> None:
    """Raise ConfigError unless state_dir is, on the host, the same path: the mount holding
    it (the one with the longest destination above it) has its source at its destination,
    and so does every mount inside it."""
    state = PurePosixPath(os.path.normpath(state_dir))
    holding = [m for m in mounts if _under(state, m.target)]
    if not holding:
        raise ConfigError(
            f"the state directory {state} is not mounted from the host (it lives in the "
            "supervisor's container, where the engine cannot see it): mount it at the same "
            f"path inside and outside, e.g. -v {state}:{state}; {RUN_HINT}"
        )
    outer = max(holding, key=lambda m: len(PurePosixPath(m.target).parts))
    if not _same(outer):
        host = PurePosixPath(outer.source) / state.relative_to(outer.target)
        raise ConfigError(
            f"the state directory {state} is {host} on the host ({outer.target} is mounted "
            f"from {outer.source}): workspaces and agent sockets are paths the engine "
            "resolves on the host, so the state directory must be mounted at the same path "
            f"inside and outside, e.g. -v {host}:{host} -e STOCKADE_STATE_DIR={host} "
            f"-e STOCKADE_LISTEN=unix:{host}/api.sock; {RUN_HINT}"
        )
    for mount in mounts:
        if mount != outer and _under(PurePosixPath(mount.target), str(state)) and not _same(mount):
            raise ConfigError(
                f"{mount.target}, inside the state directory {state}, is mounted from "
                f"{mount.source}: the engine would find other files at that path on the "
                f"host; mount only the state directory, at the same path; {RUN_HINT}"
            )


def _same(mount: BindMount) -> bool:
    return os.path.normpath(mount.source) == os.path.normpath(mount.target)


def _under(path: PurePosixPath, top: str) -> bool:
    return path == PurePosixPath(top) or PurePosixPath(top) in path.parents


def own_mounts(backend: ContainerBackend, ids: Iterable[str]) -> tuple[str, list[BindMount]]:
    """(container id, its mounts) of the first id the engine knows; ("", []) when none."""
    for candidate in ids:
        mounts = backend.mounts(candidate)
        if mounts is not None:
            return candidate, list(mounts)
    return "", []


def check(config: Config, backend: ContainerBackend) -> bool:
    """The start-up check (blocking: engine calls). Raise ConfigError when the supervisor
    runs in a container of this engine and what it needs does not line up; True when it
    runs in one (then mounts it makes do not reach the engine)."""
    wanted = declared()
    if wanted is False or not may_be_in_container():
        return False
    ids = candidate_ids(_read("/proc/self/mountinfo"), _read("/proc/self/cgroup"))
    container, mounts = own_mounts(backend, ids)
    if not container:
        if wanted:
            raise ConfigError(
                f"{ENV}=1 but the {backend.engine} engine at the configured socket does not "
                "know this container (ids tried: "
                f"{', '.join(i[:12] for i in ids) or 'none found'}): mount the socket of the "
                "engine that runs this container; set "
                f"{ENV}=0 only when the engine runs inside this container; {RUN_HINT}"
            )
        log.info("in a container the engine does not know: its paths are taken as they are")
        return False
    problems = config_problems(config)
    if problems:
        raise ConfigError("in a container: " + "; ".join(problems))
    check_same_path(config.state_dir, mounts)
    log.info("in container %s; the state directory %s is the host's", container[:12],
             config.state_dir)  # fmt: skip
    return True
