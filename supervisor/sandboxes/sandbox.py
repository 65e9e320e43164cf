"""What the manager holds of each sandbox: its container, the agent link to it, its network,
and how it fares (calls in flight, lost, broken and why); the key a container's labels name."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from stockade.supervisor.engines.backends.base import (
    LABEL_KEY,
    LABEL_NETWORK,
    LABEL_NETWORK_ALLOW,
    LABEL_TENANT,
    ContainerInfo,
)
from stockade.supervisor.errors import InvalidRequest
from stockade.supervisor.keys import scope
from stockade.supervisor.models import SandboxInfo, SandboxState
from stockade.supervisor.sandboxes import healing
from stockade.supervisor.sandboxes.agent_link import AgentLink
from stockade.supervisor.sandboxes.layout import Paths
from stockade.supervisor.sandboxes.profiles import SandboxProfile


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
    agent: AgentLink
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
    paused_at: datetime | None = None
    """Set while every process of it is frozen (pausing.py): its agent does not answer, and
    nothing may take that silence for a wedge."""
    pauses: int = 0
    """Pauses since it was made: a call or probe that saw this change met a pause on its
    way, and its silence says nothing about the sandbox's health."""
    profile: SandboxProfile | None = None
    """The profile its container was made with (profiles.py); None: the default."""
    decoys_planted: bool = False
    """Its container has its decoy files (decoys.py), or needs none."""

    @property
    def info(self) -> ContainerInfo:
        return self.container.info

    @property
    def agent(self) -> AgentLink:
        return self.container.agent

    @property
    def usable(self) -> bool:
        return not (self.lost or self.broken)

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def state(self) -> SandboxState:
        if self.lost:
            return SandboxState.EXITED
        if self.broken:
            return SandboxState.BROKEN
        return SandboxState.PAUSED if self.paused else SandboxState.RUNNING


def born(info: ContainerInfo) -> float:
    return info.created_at.timestamp() if info.created_at is not None else time.time()


def describe(
    sandbox: Sandbox, engine: str, image: str, workspace: str, health: dict[str, Any]
) -> SandboxInfo:
    """What Get and List tell of a held sandbox; `health`: the Clinic's fields."""
    return SandboxInfo(
        key=sandbox.key,
        container_id=sandbox.info.id,
        container_name=sandbox.info.name,
        engine=engine,
        image=image,
        state=sandbox.state,
        created_at=sandbox.info.created_at,
        last_used_at=sandbox.last_used_at,
        workspace_path=workspace,
        network_mode=sandbox.network.mode,
        network_allow=sandbox.network.allow,
        paused_at=sandbox.paused_at if sandbox.state is SandboxState.PAUSED else None,
        **health,
        **profiled(sandbox.profile),
    )


def profiled(profile: SandboxProfile | None) -> dict[str, Any]:
    """SandboxInfo's profile fields (no profile: none are known, as for a key without a
    container)."""
    if profile is None:
        return {}
    return {"profile": profile.shown, "cpus": profile.cpus, "memory_mb": profile.memory_mb}


def absent(key: str, engine: str, image: str, workspace: str) -> SandboxInfo:
    """What Get and List tell of a key that has only a workspace."""
    return SandboxInfo(
        key=key,
        container_id="",
        container_name="",
        engine=engine,
        image=image,
        state=SandboxState.ABSENT,
        created_at=None,
        last_used_at=None,
        workspace_path=workspace,
    )


def labelled_key(labels: Mapping[str, str]) -> str:
    """The scoped key a container's labels name ("" when they name none that is valid)."""
    key = labels.get(LABEL_KEY, "")
    try:
        return scope(labels.get(LABEL_TENANT, ""), key) if key else ""
    except InvalidRequest:
        return ""
