"""What the supervisor decides once, at start, from the engine and the configured runtime:
gVisor or not, user namespaces or not, and who mounts /tmp; with the warning each choice
owes the operator."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stockade.supervisor.config import Config
from stockade.supervisor.engines import userns
from stockade.supervisor.engines.backends.base import ContainerBackend
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.sandboxes.layout import Layout

log = logging.getLogger("stockade")


@dataclass
class Runtime:
    """Fixed for the supervisor's life once start() decided it."""

    gvisor: bool = False
    userns: bool = False
    """sandbox.user_namespace as resolved (unset: where the engine can)."""
    seccomp: str = ""
    """The seccomp profile's path ("" for the engine's default)."""


def decide_runtime(
    config: Config, backend: ContainerBackend, layout: Layout, host_mounts: bool
) -> tuple[Runtime, userns.IdMaps | None]:
    """The runtime, and the engine's daemon-wide id maps (Docker's userns-remap) if any;
    sets layout.host_tmp. Blocking: run it in a thread."""
    sb = config.sandbox
    runtime = Runtime(gvisor=runs_gvisor(sb.runtime, backend.runtimes()))
    if runtime.gvisor and sb.network != "none":
        log.warning(
            "sandbox.runtime %r is gVisor, which runs with --network=none here: sandboxes "
            "get no network, whatever their mode", sb.runtime,
        )  # fmt: skip
    runtime.userns = _wants_userns(config, backend.engine, runtime.gvisor, host_mounts, layout)
    daemon_maps = backend.check_user_namespace(runtime.userns)
    if daemon_maps is not None and not runtime.userns:
        log.warning(
            "%s remaps user namespaces for every container (userns-remap): the sandbox "
            "user is %s:%s on the host, and workspaces are handed to it",
            backend.engine, *daemon_maps.host_ids(layout.uid, layout.gid),
        )  # fmt: skip
    # gVisor makes an engine's tmpfs in its own kernel, where nr_inodes has no effect (`df -i`
    # shows 0 inodes); Podman 4.3 refuses an inode cap
    engine_caps_inodes = backend.tmpfs_inodes and not runtime.gvisor
    wants_tmp = bool(sb.tmp_inodes) and not engine_caps_inodes
    if wants_tmp and not host_mounts:
        log.warning(
            "sandbox.tmp_inodes is not enforced: %s's tmpfs takes no inode cap here, and a "
            "tmpfs this supervisor mounts in its container would not reach the engine",
            "gVisor" if runtime.gvisor else backend.engine,
        )
    # never from the supervisor's own container: its mount would not reach the engine, which
    # would bind-mount the plain directory under it (no cap at all)
    layout.host_tmp = wants_tmp and host_mounts
    if layout.host_tmp and os.geteuid() != 0:
        raise ConfigError(
            "sandbox.tmp_inodes: the engine's tmpfs mounts take no inode cap here (Podman "
            "4.3 refuses one; gVisor ignores it), so the supervisor mounts /tmp's tmpfs "
            "itself, which needs it to run as root; set sandbox.tmp_inodes = 0 for the "
            "engine's default"
        )
    return runtime, daemon_maps


def _wants_userns(
    config: Config, engine: str, gvisor: bool, host_mounts: bool, layout: Layout
) -> bool:
    """sandbox.user_namespace, or when unset: on for Podman on the host (a range of ids per
    sandbox), unless under gVisor or without a `containers` range; else off, with a warning
    naming the uid sandboxes then share with the host."""
    configured = config.sandbox.user_namespace
    if configured is not None:
        return configured
    why = userns.auto_refusal(engine, gvisor, host_mounts)
    if why is None:
        return True
    log.warning(
        "sandboxes run without a user namespace (%s): every sandbox runs as uid %s:%s on "
        "the host (no host account's, see `stockade doctor`), shared by all of them",
        why, layout.uid, layout.gid,
    )  # fmt: skip
    return False


def runs_gvisor(runtime: str, known: Mapping[str, str]) -> bool:
    """Whether sandbox.runtime is gVisor's runsc: by name or path, or (Docker) a name
    registered for a runsc program."""
    if not runtime:
        return False
    path = known.get(runtime) or runtime
    return "runsc" in (Path(runtime).name, Path(path).name)
