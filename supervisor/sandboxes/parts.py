"""The manager's parts that its helpers share: the registry, the per-key locks, the keys being
made, the layout, the networks, the profiles, the containers, pausing, health, quotas, the
warm pool, what this process owns, the audit recorder and the one manager action a helper
calls back (making a key's container). The manager builds one Parts and hands it to each
helper (adoption, housekeeping, quarantine, inventory, snapshots.operations), so that none of
them imports the manager: this module, and the helpers, must never import
sandboxes/manager.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from stockade.supervisor.config import Config
from stockade.supervisor.engines import userns
from stockade.supervisor.engines.backends.base import ContainerBackend
from stockade.supervisor.engines.hosts import HostKind
from stockade.supervisor.keys import sandbox_id
from stockade.supervisor.sandboxes.containers import Containers
from stockade.supervisor.sandboxes.health import Clinic, Recorder
from stockade.supervisor.sandboxes.layout import Layout
from stockade.supervisor.sandboxes.network_modes import Networks
from stockade.supervisor.sandboxes.owner import Owner
from stockade.supervisor.sandboxes.pausing import Pausing
from stockade.supervisor.sandboxes.pool import WarmPool
from stockade.supervisor.sandboxes.profiles import Profiles, SandboxProfile
from stockade.supervisor.sandboxes.quotas import Quotas
from stockade.supervisor.sandboxes.sandbox import Sandbox, SandboxNetwork

Create = Callable[[str, SandboxNetwork, SandboxProfile | None], Awaitable[Sandbox]]
"""(key, network, profile): a new container for the key, its sandbox (not registered yet):
SandboxManager.create."""


@dataclass
class Parts:
    config: Config
    backend: ContainerBackend
    registry: dict[str, Sandbox]
    """The sandboxes held, by scoped key."""
    starting: set[str]
    """Keys whose container is being made (quotas count them)."""
    layout: Layout
    networks: Networks
    profiles: Profiles
    containers: Containers
    clinic: Clinic
    pausing: Pausing
    quotas: Quotas
    pool: WarmPool
    owner: Owner
    record: Recorder
    create: Create
    daemon_maps: userns.IdMaps | None = None
    """The engine's own user namespace maps, known at start (runtime.decide_runtime)."""
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def lock(self, key: str) -> asyncio.Lock:
        """The key's lock in this supervisor (quotas.shared_lock is every replica's)."""
        return self.locks.setdefault(key, asyncio.Lock())

    @property
    def host(self) -> HostKind:
        """Where the sandboxes run, and what follows from it (engines/hosts.py)."""
        return self.backend.host

    @property
    def engine(self) -> str:
        return self.backend.engine

    def profile_of(self, sandbox: Sandbox) -> SandboxProfile:
        return sandbox.profile or self.profiles.default

    def container_name(self, key: str) -> str:
        return self.containers.name(sandbox_id(key))
