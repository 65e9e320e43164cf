"""The sandbox manager: one long-lived container per key, created lazily, adopted after a
supervisor restart, recreated when it died or could no longer serve (a heal). It holds the
registry, one lock per key and the tenants' quotas, and hands out leases: a call takes its
sandbox once, with `async with manager.lease(key) as lease`, and reaches the agent through
the lease (lease.py). No gRPC and no SDK here: engines are behind ContainerBackend and every
blocking call goes through asyncio.to_thread. Its helpers get its parts (parts.py), never
the manager: none of them imports this module.

    manager       leases, ensure (create, re-create, take over), start and close
    ├── parts         what the helpers share: registry, per-key locks, layout, quotas, ...
    ├── lease         one call's hold: agent calls, agent faults -> domain errors
    ├── health        fault diagnosis, marking, heals (healing.py judges the facts)
    ├── containers    one start (keyed and pooled), one stop, the container spec
    ├── layout        the host folder: workspace, agent socket, mounts, uid hand-over
    ├── network_modes the network a sandbox gets, its egress link
    ├── pool          warm containers with no key yet
    ├── pausing       pause and resume (the engine's freezer), a call's resume
    ├── adoption      this instance's containers taken back at start, or taken over
    ├── inventory     Get, List and Destroy; a key's settings
    ├── housekeeping  idle/age prune, workspace retention, orphan reaping
    ├── quarantine    an alarm's reaction: frozen, cut off, calls refused until released
    ├── snapshots/operations  snapshots of files (two-pass capture, brief freeze), restore, fork
    └── snapshots/checkpoints  a capture before a risky call; undo
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from stockade.supervisor.config import Config, SecretConfig
from stockade.supervisor.engines import isolation, seccomp
from stockade.supervisor.engines.backends.base import (
    LABEL_KEY,
    LABEL_SANDBOX_ID,
    LABEL_TENANT,
    ContainerBackend,
)
from stockade.supervisor.keys import sandbox_id, split
from stockade.supervisor.keys import validate_scoped as validate_key
from stockade.supervisor.models import NetworkRequest, SandboxInfo, SandboxState
from stockade.supervisor.network.egress import EgressHooks
from stockade.supervisor.network.proxy import EgressDecision
from stockade.supervisor.observe.alarms import Alarm
from stockade.supervisor.policy.honeytokens import Honeytokens
from stockade.supervisor.sandboxes import adoption, layers, owner, pressure, workspaces
from stockade.supervisor.sandboxes.agent_link import AgentConnection
from stockade.supervisor.sandboxes.brokering import SecretChanges
from stockade.supervisor.sandboxes.containers import (
    WORKSPACE,
    AddressOf,
    Connect,
    Containers,
    socket_address,
)
from stockade.supervisor.sandboxes.decoys import Planter
from stockade.supervisor.sandboxes.health import SILENCE_S, Clinic, Recorder
from stockade.supervisor.sandboxes.housekeeping import Housekeeping
from stockade.supervisor.sandboxes.inspection import isolation_report
from stockade.supervisor.sandboxes.inventory import Inventory
from stockade.supervisor.sandboxes.layout import Layout
from stockade.supervisor.sandboxes.lease import Lease
from stockade.supervisor.sandboxes.network_modes import Networks
from stockade.supervisor.sandboxes.parts import Parts
from stockade.supervisor.sandboxes.pausing import Pausing
from stockade.supervisor.sandboxes.pool import WarmPool
from stockade.supervisor.sandboxes.profiles import (
    Profiles,
    SandboxProfile,
    SandboxShell,
    shell_of,
)
from stockade.supervisor.sandboxes.quarantine import Quarantines
from stockade.supervisor.sandboxes.quotas import Quotas
from stockade.supervisor.sandboxes.replies import ReplyLimits
from stockade.supervisor.sandboxes.runtime import decide_runtime
from stockade.supervisor.sandboxes.sandbox import (
    Sandbox,
    SandboxNetwork,
    born,
)
from stockade.supervisor.sandboxes.snapshots.checkpoints import Checkpoints
from stockade.supervisor.sandboxes.snapshots.operations import Snapshots
from stockade.supervisor.state.base import SharedState

log = logging.getLogger("stockade")

__all__ = ["WORKSPACE", "SandboxManager"]


class SandboxManager:
    def __init__(
        self,
        config: Config,
        backend: ContainerBackend,
        *,
        instance_id: str,
        image: str,
        connect: Connect | None = None,
        address_of: AddressOf = socket_address,
        record_egress: Callable[[EgressDecision], None] | None = None,
        egress_hooks: EgressHooks | None = None,
        host_mounts: bool = True,
        record_event: Recorder | None = None,
        lock: owner.InstanceLock | None = None,
        silence_s: float = SILENCE_S,
        state: SharedState | None = None,
        replica: str = "",
        honeytokens: Honeytokens | None = None,
    ) -> None:
        """host_mounts: whether a mount the supervisor makes reaches the engine (not from
        the supervisor's own container). `lock`: this instance's lock on the state directory,
        when the caller took it already (before starting an engine service); else it is
        taken here. `silence_s`: how long a silent agent is waited for (healing).
        `address_of`: where a container's agent is reached (the host kind's choice: a unix
        socket by default), `connect` what reaches it there (AgentConnection). `state`: the
        state shared with other supervisors (supervisor/state): its key lock is held across
        a key's create, and its ledger counts the tenants' sandboxes across supervisors.
        `replica`: this supervisor's id in the shared state (app.replica_id; default the
        instance id): whose warm-pool pods are whose.
        `egress_hooks`: where the egress proxies report alarms and brokered injections."""
        self.backend = backend
        self._host_mounts = host_mounts
        self.registry: dict[str, Sandbox] = {}
        self._starting: set[str] = set()
        self.state = state
        self.quotas = Quotas(config, self.registry, self._starting, self.profile_of, state)
        self.held = self.quotas.held
        record: Recorder = record_event or (lambda _key, _action, _reason: None)
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = lock or owner.InstanceLock(config.state_dir)
        self.owner = owner.this_process(self._lock)
        limits = ReplyLimits(config.tools.max_output_bytes, config.tools.process_log_bytes)
        self.layout = Layout(config)
        self.networks = Networks(config, instance_id, record_egress, egress_hooks)
        self.profiles = Profiles(config, image)
        self.decoys = Planter(config, honeytokens)  # honeytokens: decoys.py
        self.containers = Containers(
            config, backend, self.layout, self.networks,
            connect or partial(AgentConnection, limits=limits), address_of=address_of,
            instance_id=instance_id, image=image, owner_label=lambda: self.owner.label(),
            decoy_env=self.decoys.environment,
        )  # fmt: skip
        self.clinic = Clinic(config, backend, self.registry, record, silence_s)
        refuse = config.sandbox.paused_call == "refuse"
        self.pausing = Pausing(backend, record, refuse)
        self.pool = WarmPool(
            config, self.containers, self.layout, self.networks, self.profiles,
            backend=backend, replica=replica, replicas=self._replicas,
        )  # fmt: skip
        self.parts = Parts(
            config, backend, self.registry, self._starting, self.layout, self.networks,
            self.profiles, self.containers, self.clinic, self.pausing, self.quotas, self.pool,
            self.owner, record, self.create,
        )  # fmt: skip
        self.quarantines = Quarantines(self.parts)
        self.inventory = Inventory(self.parts, self.quarantines)
        self.housekeeping = Housekeeping(self.parts, self.quarantines)
        self.snapshots = Snapshots(self.parts, self.quarantines, self.inventory, self.decoys.plant)
        self.checkpoints = Checkpoints(self.parts, self.snapshots)

    async def _replicas(self) -> frozenset[str] | None:
        return await self.state.replicas() if self.state is not None else None

    @property
    def config(self) -> Config:
        return self.parts.config

    @config.setter
    def config(self, config: Config) -> None:
        self.parts.config = config

    @property
    def record(self) -> Recorder:
        """(key, action, reason): a housekeeping event for the audit log."""
        return self.parts.record

    @record.setter
    def record(self, record: Recorder) -> None:
        self.parts.record = record

    @property
    def engine(self) -> str:
        return self.backend.engine

    @property
    def image(self) -> str:
        return self.containers.image

    @property
    def starts(self) -> int:
        """Containers started (and answered by their agent) since this supervisor started."""
        return self.containers.starts

    @property
    def start_failures(self) -> int:
        return self.containers.start_failures

    @property
    def heal_counts(self) -> dict[str, int]:
        return self.clinic.heal_counts

    def state_counts(self) -> dict[str, int]:
        """How many sandboxes held now are in each state (RUNNING, PAUSED, BROKEN, EXITED),
        every state named; the ones with only a workspace are not counted."""
        held = (SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.BROKEN, SandboxState.EXITED)
        counts = {state.name: 0 for state in held}
        for sandbox in self.registry.values():
            counts[sandbox.state.name] += 1
        return counts

    def lock(self, key: str) -> asyncio.Lock:
        return self.parts.lock(key)

    def container_name(self, key: str) -> str:
        return self.parts.container_name(key)

    async def start(self) -> list[str]:
        """Check the engine and adopt this instance's running containers; return adopted keys.
        A container made from another image than the configured one is re-created instead."""
        await asyncio.to_thread(self.backend.ping)
        runtime, self.parts.daemon_maps = await asyncio.to_thread(
            decide_runtime, self.config, self.backend, self.layout, self._host_mounts
        )
        self.containers.runtime = runtime
        if self.config.sandbox.workspace_size_mb:
            await asyncio.to_thread(workspaces.check_support)
        self.layout.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.layout.root, 0o700)
        await self._decide_layers()
        target = self.config.state_dir / "seccomp.json"
        profile = seccomp.write_profile(target, gvisor=self.containers.runtime.gvisor)
        self.containers.runtime.seccomp = str(profile) if profile else ""
        found = await asyncio.to_thread(self.backend.list, self.containers.labels())
        image_ids = {
            image: await asyncio.to_thread(self.backend.image_id, image)
            for image in sorted(self.profiles.images)
        }
        adopted = await adoption.adopt_all(self.parts, found, image_ids)
        await self.quarantines.restore()
        await self.decoys.know((k, self.profiles.kept(p.root)) for k, p in self.layout.folders())
        await asyncio.to_thread(self.layout.drop_pool_folders)
        await self.networks.egress.prune({s.sid for s in self.registry.values()})
        await self.networks.serve_pods(self.backend.list, self.containers.labels())
        return adopted

    async def _decide_layers(self) -> None:
        """Layered workspaces where configured and this host can mount them (layers.py)."""
        self.layout.layered = False
        if not (self.config.snapshots.copy_on_write and self.parts.host.snapshots):
            return
        why = await asyncio.to_thread(layers.probe, self.layout.root)
        if why:
            log.warning("forks and restores copy every file: %s", why)
            return
        self.layout.layered = True

    def start_housekeeping(self) -> None:
        """The sweeper (health, idle and age prune, workspace retention, orphan reaping) and
        the warm pool's filler, as background tasks until close()."""
        self.housekeeping.start()
        self.pool.start()

    async def close(self) -> None:
        """Stop the background tasks, remove the unassigned pool containers, close agent
        channels; sandboxes' containers keep running for the next start to adopt."""
        await self.housekeeping.close()
        await self.pool.close()
        for sandbox in self.registry.values():
            await sandbox.agent.close()
        await self.networks.close()
        self._lock.release()

    @asynccontextmanager
    async def lease(self, key: str, network: NetworkRequest | None = None) -> AsyncIterator[Lease]:
        """The call's hold on the key's sandbox (made ready, created when needed): taken once
        per call; the sandbox counts a call in flight until it is given back."""
        sandbox = await self.ensure(key, network)
        sandbox.last_used_at = datetime.now(UTC)
        sandbox.in_flight += 1  # no await since ensure returned: housekeeping cannot slip in
        lease = Lease(sandbox, self.clinic, partial(self.ensure, key))
        try:
            yield lease
        finally:
            lease.sandbox.in_flight -= 1
            lease.sandbox.idle_since = time.monotonic()

    def profile_of(self, sandbox: Sandbox) -> SandboxProfile:
        return self.parts.profile_of(sandbox)

    def shell_of(self, key: str) -> SandboxShell:
        """The shell of the key's commands: its profile's, its tenant's or [sandbox]'s."""
        _, profile = self.inventory.settings_of(key)
        return shell_of(self.config, profile.name, split(key)[0])

    async def ensure(
        self, key: str, network: NetworkRequest | None = None, profile: str | None = None
    ) -> Sandbox:
        """The running sandbox for key, created (or re-created) when needed, a paused one
        resumed (or the call refused: pausing.py). With a network request or a profile
        (profiles.py), a sandbox whose network or profile differs is re-created (the
        workspace is kept); both are the key's from then on. Quarantined: refused."""
        self.quarantines.refuse(key)
        sandbox = self.registry.get(key)
        wanted = self.networks.choose(network) if network is not None else None
        shape = self.profiles.get(profile) if profile is not None else None
        if (
            sandbox is not None
            and sandbox.usable
            and not sandbox.paused
            and sandbox.greeted
            and sandbox.agent.is_ready()
            and (wanted is None or wanted == sandbox.network)
            and (shape is None or shape == self.profile_of(sandbox))
        ):
            sandbox.idle_since = time.monotonic()
            return sandbox
        validate_key(key)
        async with self.lock(key):
            self.quarantines.refuse(key)  # quarantined while this call waited for the lock
            old = self.registry.get(key)
            if old is not None:
                await self.pausing.for_call(old)
            trouble = None
            if (
                old is not None
                and (wanted is None or wanted == old.network)
                and (shape is None or shape == self.profile_of(old))
            ):
                trouble = await self.clinic.trouble(old, self.config.sandbox.start_timeout_s)
                if trouble is None:
                    old.idle_since = time.monotonic()
                    await self.decoys.plant(old)  # adopted: its first call
                    return old
            if old is not None:
                self.registry.pop(key, None)
                await self.containers.stop(old.container, keep_workspace_mounted=True)
            folder = self.layout.of(key).root
            await asyncio.to_thread(self._keep, folder, wanted, shape)
            chosen = wanted or (old.network if old is not None else self.networks.kept(folder))
            made = shape or (
                self.profile_of(old) if old is not None else self.profiles.kept(folder)
            )
            self.quotas.admit(key, made.memory_mb)
            self._starting.add(key)
            try:
                async with self.quotas.shared_lock(key):
                    # another replica may have made (or re-made) the key's container meanwhile
                    # (it held the key's shared lock while it did)
                    taken = None
                    if self.backend.host.shared:
                        taken = await adoption.take_over(self.parts, key, wanted, shape)
                    if taken is not None:
                        self.registry[key] = taken
                        await self.decoys.plant(taken)
                        return taken
                    await self.quotas.admit_shared(key, made.memory_mb)
                    # a pool container has no placeholders of a key's brokered secrets
                    pooled = self.decoys.poolable(
                        key, made, *self.pool.profiles
                    ) and not self.networks.brokering.applying(key, made.name)
                    sandbox = await self.pool.take(key, chosen, made) if pooled else None
                    if sandbox is not None:
                        sandbox.profile = made
                    else:
                        if self.backend.host.host_room:  # a pod's: its node's (the scheduler's)
                            hk, state_dir = self.config.housekeeping, self.config.state_dir
                            await asyncio.to_thread(pressure.check, hk, state_dir)
                        sandbox = await self.create(key, chosen, made)
            finally:
                self._starting.discard(key)
            self.registry[key] = sandbox
            if trouble is not None:
                self.clinic.healed(key, trouble)
            await self.decoys.plant(sandbox)
            return sandbox

    def _keep(
        self, folder: Path, network: SandboxNetwork | None, profile: SandboxProfile | None
    ) -> None:
        """What a request chose for the key, kept in its folder (network.py, profiles.py)."""
        if network is None and profile is None:
            return
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if network is not None:
            self.networks.remember(folder, network)
        if profile is not None:
            self.profiles.remember(folder, profile)

    async def create(
        self, key: str, network: SandboxNetwork, profile: SandboxProfile | None = None
    ) -> Sandbox:
        paths = await asyncio.to_thread(self.layout.prepare, key)
        if network.mode == "open":
            log.warning("sandbox %r gets network mode open: the engine's bridge network", key)
        tenant, plain = split(key)
        sid = sandbox_id(key)
        labels = {LABEL_KEY: plain, LABEL_SANDBOX_ID: sid}
        if tenant:
            labels[LABEL_TENANT] = tenant
        made = profile or self.profiles.default
        container = await self.containers.start(
            self.containers.name(sid), labels, paths, network, key=key, sid=sid, profile=made
        )
        return Sandbox(key, sid, container, network, born=born(container.info), profile=made)

    async def inspect_isolation(self, key: str) -> isolation.IsolationReport:
        """The sandbox's isolation from inside and outside (inspection.py). Never creates a
        container: an unknown key or one without a container is SandboxNotFound."""
        validate_key(key)
        if key not in self.registry:
            raise self.inventory.no_container(key)
        async with self.lease(key) as lease:
            return await isolation_report(lease, self.backend)

    def reload_secrets(self, secrets: Mapping[str, SecretConfig]) -> SecretChanges:
        """A reload's `[secrets]` (cli/reloading.py): containers made from now on get them,
        running sandboxes' proxies their reloaded Brokers (network_modes.py)."""
        running = [(s.key, s.container) for s in self.registry.values()]
        return self.networks.reload_secrets(secrets, running)

    async def quarantine(self, key: str, alarm: Alarm) -> None:
        """The reaction to an alarm (observe/alarms.py): quarantine.py."""
        await self.quarantines.quarantine(key, alarm)

    async def pause(
        self, key: str, reason: str, *, recorded: bool = True
    ) -> tuple[SandboxInfo, bool]:
        """Freeze the key's sandbox (pausing.py): its info, and False when it was paused
        already. Never creates a container: SandboxNotFound when it has none. `recorded`:
        False when the caller audits the change itself (calls/lifecycle.py)."""
        act = partial(self.pausing.pause, reason=reason, recorded=recorded)
        return await self._pausing(key, act)

    async def resume(
        self, key: str, reason: str, *, recorded: bool = True
    ) -> tuple[SandboxInfo, bool]:
        """Thaw the key's sandbox: its info, and False when it was not paused."""
        act = partial(self.pausing.resume, reason=reason, recorded=recorded)
        return await self._pausing(key, act)

    async def _pausing(
        self, key: str, act: Callable[[Sandbox], Awaitable[bool]]
    ) -> tuple[SandboxInfo, bool]:
        validate_key(key)
        async with self.lock(key):
            self.quarantines.refuse(key)
            sandbox = self.registry.get(key)
            if sandbox is None:
                raise self.inventory.no_container(key)
            changed = await act(sandbox)
        return self.inventory.describe(sandbox), changed

    # Get, List and Destroy (inventory.py).

    async def get(self, key: str) -> SandboxInfo:
        return await self.inventory.get(key)

    async def list(self) -> list[SandboxInfo]:
        return await self.inventory.list()

    async def destroy(self, key: str, *, delete_workspace: bool) -> tuple[bool, bool]:
        """Remove the container; keep the workspace unless asked. (removed, deleted)"""
        return await self.inventory.destroy(key, delete_workspace=delete_workspace)

    # Housekeeping, for tests and tools that drive it by hand (housekeeping.py).

    async def sweep(self) -> None:
        await self.housekeeping.sweep()

    async def prune(self) -> int:
        return await self.housekeeping.prune()

    async def expire_workspaces(self) -> int:
        return await self.housekeeping.expire_workspaces()

    async def reap_orphans(self) -> int:
        return await self.housekeeping.reap_orphans()
