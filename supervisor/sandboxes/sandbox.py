"""What the manager holds of each sandbox: its container, the agent link to it, its network,
and how it fares (calls in flight, lost, broken and why)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime

from stockade.supervisor.engines.backends.base import (
    LABEL_NETWORK,
    LABEL_NETWORK_ALLOW,
    ContainerInfo,
)
from stockade.supervisor.models import SandboxState
from stockade.supervisor.sandboxes import healing
from stockade.supervisor.sandboxes.agent_link import AgentConnection
from stockade.supervisor.sandboxes.layout import Paths


@dataclass(frozen=True)
class SandboxNetwork:
    mode: str
    """none, egress or open."""
    allow: tuple[str, ...] = ()
    """egress: the canonical allowlist patterns of this sandbox."""

    def labels(self) -> dict[str, str]:
        return {LABEL_NETWORK: self.mode, LABEL_NETWORK_ALLOW: ",".join(self.allow)}


@dataclass
class Container:
    """A started container and the link to its agent; `sid` names its egress link (a
    sandbox id, or "" for a warm-pool container, which has none yet)."""

    info: ContainerInfo
    agent: AgentConnection
    paths: Paths
    sid: str = ""


@dataclass
class Sandbox:
    key: str
    sid: str
    container: Container
    network: SandboxNetwork
    last_used_at: datetime | None = None
    in_flight: int = 0
    """Leases held now; housekeeping never removes a sandbox while above 0."""
    idle_since: float = field(default_factory=time.monotonic)
    born: float = field(default_factory=time.time)
    """When the container was made (wall clock: an adopted container's age counts too)."""
    greeted: bool = True
    """Its agent passed the handshake (Hello with our protocol version) on this connection; an
    adopted container's has not yet, and is not used before it has."""
    lost: bool = False
    broken: bool = False
    """The agent misbehaved or the sandbox is wedged: nothing more is asked of it; the next
    call recreates the sandbox."""
    trouble: healing.Trouble | None = None
    """Why it is broken (healing.py)."""

    @property
    def info(self) -> ContainerInfo:
        return self.container.info

    @property
    def agent(self) -> AgentConnection:
        return self.container.agent

    @property
    def usable(self) -> bool:
        return not (self.lost or self.broken)

    @property
    def state(self) -> SandboxState:
        if self.lost:
            return SandboxState.EXITED
        return SandboxState.BROKEN if self.broken else SandboxState.RUNNING


def born(info: ContainerInfo) -> float:
    return info.created_at.timestamp() if info.created_at is not None else time.time()
