"""The container-engine boundary: one protocol, one module per engine.

Backends are synchronous (the engines' SDKs are); the sandbox manager calls them
through asyncio.to_thread so that no SDK call stalls the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from stockade.supervisor.engines.hosts import HostKind
from stockade.supervisor.engines.userns import IdMap, IdMaps

LABEL_MANAGED = "io.stockade.managed"
LABEL_INSTANCE = "io.stockade.instance"
LABEL_KEY = "io.stockade.key"
LABEL_TENANT = "io.stockade.tenant"
LABEL_SANDBOX_ID = "io.stockade.sandbox-id"
LABEL_NETWORK = "io.stockade.network"
LABEL_NETWORK_ALLOW = "io.stockade.network-allow"
LABEL_PROFILE = "io.stockade.profile"
LABEL_STATE_DIR = "io.stockade.state-dir"
"""The owning supervisor's state directory (absolute): where its instance id lives."""
LABEL_OWNER = "io.stockade.owner"
"""The owning supervisor process: boot id, pid and mount namespaces, pid, start time (what
the orphan reaper needs to prove the owner has ended; supervisor/sandboxes/owner.py)."""
LABEL_POOL = "io.stockade.pool"
"""A warm-pool container's pool id; it has no key label (labels are fixed at creation), except
on a pod: a pod is claimed by relabeling (it keeps this label: its agent's certificate names
the pool id)."""
LABEL_REPLICA = "io.stockade.replica"
"""An unclaimed warm-pool pod's maker (its replica id): only that replica claims it, and
another reaps it once that replica is gone from the shared state."""


@dataclass(frozen=True)
class BindMount:
    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """Everything an engine needs to create one sandbox container."""

    name: str
    image: str
    command: tuple[str, ...]
    labels: Mapping[str, str]
    mounts: tuple[BindMount, ...]
    user: str
    read_only_root: bool
    drop_all_capabilities: bool
    no_new_privileges: bool
    memory_bytes: int
    nano_cpus: int
    pids_limit: int
    nofile: int
    nproc: int
    """RLIMIT_NPROC counts all processes of the uid on the host, so it cannot be a per-sandbox
    cap (that is pids_limit); it is set only because Podman's API otherwise asks for more than
    the host's hard limit allows."""
    fsize: int = 0
    """RLIMIT_FSIZE in bytes, the largest file a process may write; 0: unlimited."""
    tmpfs: Mapping[str, int] = field(default_factory=dict)
    """Mount point -> size in bytes."""
    tmpfs_inodes: int = 0
    """Inode cap of each tmpfs (nr_inodes); 0: the kernel's default. Only for a backend whose
    tmpfs_inodes is True."""
    runtime: str = ""
    """OCI runtime name (or, for Podman, path); "": the engine's default."""
    environment: Mapping[str, str] = field(default_factory=dict)
    secret_names: frozenset[str] = frozenset()
    """The names in `environment` whose values are secrets ([sandbox] secrets): a backend
    that can keep them out of the container's own description does (a pod: its Secret,
    referenced from the pod, so that who may read pods does not read them)."""
    network: str = "none"
    """"none", or "bridge" (the engine's default network)."""
    seccomp_profile: str = ""
    """Path of a seccomp profile (JSON) on the engine's host; "": the engine's default."""
    user_namespace: bool = False
    """A user namespace of the container's own (Podman: --userns=auto). Docker's is the
    daemon's (userns-remap), never per container."""
    cap_add: tuple[str, ...] = ()
    """Capabilities kept although drop_all_capabilities drops the others."""
    entrypoint: tuple[str, ...] = ()
    """Replaces the image's entry point when given."""


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    running: bool
    """Its processes exist: it runs, or it is paused (Podman's inspect says Running false for
    a paused container, Docker's true; both are running here)."""
    status: str
    labels: Mapping[str, str]
    image: str
    created_at: datetime | None = None
    image_id: str = ""
    """The id of the image the container was made from (no "sha256:" prefix)."""
    exit_code: int | None = None
    oom_killed: bool = False
    pid: int = 0
    """The main process on the host (0 when not running)."""
    own_userns: bool = False
    """The engine gave it id maps of its own (Podman's --userns=auto)."""
    paused: bool = False
    """Every process of it is frozen (the engine's pause)."""
    address: str = ""
    """Where its agent is reached over the network (a pod's IP); "" for the host kinds,
    whose agent listens on a unix socket in the sandbox's host folder."""


@dataclass(frozen=True)
class EngineView:
    """The security-relevant part of the engine's inspect of one container."""

    runtime: str = ""
    privileged: bool = False
    cap_drop: tuple[str, ...] = ()
    cap_add: tuple[str, ...] = ()
    read_only_root: bool = False
    user: str = ""
    network_mode: str = ""
    security_options: tuple[str, ...] = ()
    no_new_privileges: bool = False
    seccomp_profile: str = ""
    memory_bytes: int = 0
    memory_swap_bytes: int = 0
    nano_cpus: int = 0
    cpu_quota_us: int = 0
    cpu_period_us: int = 0
    pids_limit: int = 0
    userns_mode: str = ""
    """"host", "private" (a map of the container's own) or "remap" (Docker's daemon-wide)."""
    cgroupns_mode: str = ""
    host_pid: int = 0
    uid_map: IdMap = ()
    gid_map: IdMap = ()


@dataclass(frozen=True)
class RuntimeFacts:
    """The engine's OCI runtime as the engine describes it."""

    name: str = ""
    version: str = ""
    """The runtime's own version ("1.1.5+ds1")."""
    package_version: str = ""
    """A Debian package version when the engine tells one ("1.1.5+ds1-1+deb12u1")."""
    package_source: str = ""
    path: str = ""


class ContainerBackend(Protocol):
    engine: str
    """"podman", "docker" or "kubernetes"."""
    tmpfs_inodes: bool
    """Whether the engine's tmpfs mounts take an inode cap (Podman 4.3 refuses nr_inodes)."""
    host: HostKind
    """Where its sandboxes run, and what follows (engines/hosts.py): on this machine through
    host folders (LOCAL), or pods reached over the network by any supervisor of the
    installation (KUBERNETES)."""

    def ping(self) -> str:
        """Return the engine's version; raise EngineUnavailable when it cannot be reached."""
        ...

    def image_exists(self, ref: str) -> bool: ...

    def image_id(self, ref: str) -> str | None:
        """The id `ref` names now (no "sha256:" prefix); None when there is no such image."""
        ...

    def check_user_namespace(self, wanted: bool) -> IdMaps | None:
        """Raise ConfigError when `wanted` and the engine cannot give sandboxes a user
        namespace; return the daemon-wide id maps when the engine remaps every container
        (Docker's userns-remap, whatever `wanted` says), None otherwise."""
        ...

    def run(self, spec: ContainerSpec, prepare: Callable[[IdMaps], None]) -> ContainerInfo:
        """Create a container, call `prepare` with its id maps (identity ones without a user
        namespace) while it has not started, then start it. A failure removes it."""
        ...

    def inspect(self, name_or_id: str) -> ContainerInfo | None: ...

    def list(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        """Containers (running or not) carrying all of these labels."""
        ...

    def remove(self, name_or_id: str) -> bool:
        """Force-remove (a paused container too); False when there was no such container."""
        ...

    def remove_workspace(self, sandbox_id: str) -> bool:
        """Delete the sandbox's workspace where the engine keeps it apart from the container
        (a pod's claim), once the sandbox is destroyed with its workspace; False when it
        keeps none (the host kinds: the workspace is the sandbox's host folder, which the
        manager deletes itself)."""
        ...

    def workspace_of(self, sandbox_id: str) -> str | None:
        """Where the sandbox's workspace is, in the engine's words, when it is not its host
        folder (what SandboxInfo.workspace_path shows: a pod's claim); None for the host
        kinds. Names only: no engine call."""
        ...

    def relabel(self, name_or_id: str, labels: Mapping[str, str | None]) -> ContainerInfo | None:
        """Set (None: remove) labels of a container and of what the engine keeps with it (a
        pod's claim and Secret): how a warm-pool pod is claimed for a key. None when there is
        no such container. Unsupported by the host kinds (labels are fixed at creation)."""
        ...

    def has_workspace(self, sandbox_id: str) -> bool:
        """Whether the engine keeps a workspace of the sandbox apart from any container (a
        pod's claim, found by its sandbox-id label); False for the host kinds (their
        workspace is the host folder, which the manager checks itself)."""
        ...

    def pause(self, name_or_id: str) -> bool:
        """Freeze every process of the container (the cgroup freezer): no CPU, memory kept.
        True once it is paused (also when it was already); False when there is no such
        container or it does not run. EngineUnavailable when the engine fails otherwise."""
        ...

    def unpause(self, name_or_id: str) -> bool:
        """Thaw a paused container. True once it runs unpaused (also when it was not
        paused); False when there is no such container or it does not run."""
        ...

    def set_connected(self, name_or_id: str, connected: bool) -> bool:
        """Connect a container of network mode open to the engine's default network, or
        disconnect it (a quarantine cuts it off). True once it is as wanted; False when there
        is no such container. Unsupported where the engine cannot (pods)."""
        ...

    def mounts(self, name_or_id: str) -> tuple[BindMount, ...] | None:
        """The container's bind mounts as the engine made them (source: the host path);
        None when the engine knows no such container."""
        ...

    def security_view(self, name_or_id: str) -> EngineView | None:
        """What the engine says about the container's isolation; None when it is gone."""
        ...

    def runtime_facts(self) -> RuntimeFacts:
        """The engine's default OCI runtime: name, version, package version."""
        ...

    def runtimes(self) -> dict[str, str]:
        """The OCI runtimes the engine knows: name -> path ("" when not told)."""
        ...

    def close(self) -> None: ...
