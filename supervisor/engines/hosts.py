"""Host kinds: where sandboxes run, and what follows from it. Two today: LOCAL (Podman and
Docker: containers on the supervisor's machine, reached through its host folders) and
KUBERNETES (pods in a cluster, engines/backends/kubernetes/: reached over the network by every
supervisor of the installation). A backend names its kind (ContainerBackend.host); the code
above asks the kind by capability (`backend.host.snapshots`), never "is it Kubernetes?".
A new kind is one more HostKind here, and its backend. Imports nothing of the supervisor."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostKind:
    name: str
    engines: tuple[str, ...]
    """The engine.kind values of this host kind."""
    on_this_machine: bool
    """Sandboxes run on the supervisor's machine: mounts the supervisor makes, the
    supervisor's container (incontainer.py), user namespaces and the engine's service (Podman)
    are this machine's. False: nothing of this machine runs sandboxes."""
    shared: bool
    """Any supervisor of the installation reaches a sandbox (replicas): a key's container found
    at its first call here is taken over (adoption.take_over), adoption at start removes or
    re-makes nothing, an idle sandbox is let go rather than removed while another replica may
    call it, the warm pool's pods are claimed by relabeling and reaped per replica."""
    agent_over_network: bool
    """The agent is reached over TCP with mutual TLS at the container's address, not on the
    unix socket in its host folder."""
    host_folders: bool
    """A sandbox's files are reached in its host folder (workspace, /tmp); False: its
    workspace is a volume in the cluster, not readable here."""
    snapshots: bool
    """Snapshots, restores and forks (they read and write workspaces on this host)."""
    host_room: bool
    """New containers are refused when this host's memory or disk runs low (pressure.py);
    False: a pod's room is its node's, the scheduler's."""
    rlimits: bool
    """The agent's limits (nofile, nproc, fsize) are checked against sandbox.*; False: the
    node runtime sets them."""
    shared_egress_proxy: bool
    """Egress goes through one proxy all sandboxes connect to (kubernetes.egress_proxy),
    which knows a sandbox by its address; False: a proxy and link per sandbox."""


LOCAL = HostKind(
    name="local",
    engines=("podman", "docker"),
    on_this_machine=True,
    shared=False,
    agent_over_network=False,
    host_folders=True,
    snapshots=True,
    host_room=True,
    rlimits=True,
    shared_egress_proxy=False,
)
KUBERNETES = HostKind(
    name="kubernetes",
    engines=("kubernetes",),
    on_this_machine=False,
    shared=True,
    agent_over_network=True,
    host_folders=False,
    snapshots=False,
    host_room=False,
    rlimits=False,
    shared_egress_proxy=True,
)
KINDS = (LOCAL, KUBERNETES)


def of_engine(engine: str) -> HostKind:
    """The host kind of an engine.kind (config.engine.kind, ContainerBackend.engine); an
    unknown one is LOCAL's (config/checks.py refuses it at load)."""
    for kind in KINDS:
        if engine in kind.engines:
            return kind
    return LOCAL
