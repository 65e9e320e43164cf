"""The warm pool: started containers with no key yet, for each profile that keeps some
(housekeeping.warm_pool for the default one, [profiles.NAME] warm_pool for the others). A new
key (no folder yet, or one holding only its request's choices) with the default network takes
one of its profile's: its folder is renamed to the key's (the bind mounts follow the folder,
the choices are carried over) and the key is written there, with the pool id, so that
adoption after a restart finds the key.

Pods (a shared host kind) are claimed by relabeling instead: the pod and its claim get the
key's labels (backend.relabel), so any replica finds the key's pod by its sandbox-id label.
A pool pod carries its maker's replica id: only that replica claims it (no two replicas
race for one), and another reaps it once that replica is gone from the shared state (reap).
A key whose workspace claim exists (its pod ended, or another replica made it) never takes
one: its claim is its workspace."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

from stockade.supervisor.config import Config
from stockade.supervisor.engines.backends.base import (
    LABEL_KEY,
    LABEL_POOL,
    LABEL_PROFILE,
    LABEL_REPLICA,
    LABEL_SANDBOX_ID,
    LABEL_TENANT,
    ContainerBackend,
    ContainerInfo,
)
from stockade.supervisor.errors import SandboxBroken, StockadeError
from stockade.supervisor.keys import sandbox_id, shown, split
from stockade.supervisor.sandboxes import hostfs, network_modes, pressure
from stockade.supervisor.sandboxes.containers import Containers
from stockade.supervisor.sandboxes.layout import POOL_PREFIX, Layout, write_key
from stockade.supervisor.sandboxes.network_modes import Networks
from stockade.supervisor.sandboxes.profiles import KEPT as PROFILE_KEPT
from stockade.supervisor.sandboxes.profiles import Profiles, SandboxProfile
from stockade.supervisor.sandboxes.sandbox import Container, Sandbox, SandboxNetwork, born

log = logging.getLogger("stockade")

POOL_CLOSE_S = 30.0
"""At close, how long a pool container being made may take beyond start_timeout_s."""
POOL_PROBE_S = 2.0
"""How long a pool container's agent may take to answer before it is replaced."""
REFILL_AFTER_S = 0.5
"""How long after a key took a container the pool waits before it makes the next: the key's
first calls run meanwhile without sharing the CPU with an engine's create and start (on two
cores that made a key's first call ~2 ms slower, and its second: docs/benchmarks.md)."""
CHOICES = (network_modes.KEPT, PROFILE_KEPT)
"""What a request's choices leave in a new key's folder before its container is made
(manager._keep): a folder holding only these is still a new key's."""


Replicas = Callable[[], Awaitable[frozenset[str] | None]]
"""The replicas alive now (SharedState.replicas); None: this supervisor is alone."""


async def _alone() -> frozenset[str] | None:
    return None


class WarmPool:
    def __init__(
        self,
        config: Config,
        containers: Containers,
        layout: Layout,
        networks: Networks,
        profiles: Profiles,
        *,
        backend: ContainerBackend,
        replica: str = "",
        replicas: Replicas = _alone,
    ) -> None:
        self._config = config
        self._containers = containers
        self._layout = layout
        self._networks = networks
        self._backend = backend
        self._shared = backend.host.shared
        self._host_room = backend.host.host_room
        self.replica = replica or containers.instance_id
        self._replicas = replicas
        self.sizes = sizes(config, profiles)
        """How many containers are kept for each profile that keeps any."""
        self.ready: list[Container] = []
        self._wanted = asyncio.Event()
        self._taken_at = -math.inf
        """The loop's time of the last take (the filler waits REFILL_AFTER_S past it)."""
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        """Set by close(): the filler stops, its wait after a take ended at once."""

    @property
    def profiles(self) -> tuple[SandboxProfile, ...]:
        """The profiles the pool keeps containers for."""
        return tuple(self.sizes)

    def start(self) -> None:
        if self.sizes:
            self._task = asyncio.create_task(self._fill(), name="stockade-pool")
            self._wanted.set()

    def want(self) -> None:
        """Ask the filler to top the pool up (and replace what failed or died)."""
        if self.sizes:
            self._wanted.set()

    async def close(self) -> None:
        """Let a container being made join first, then remove every pool container."""
        if self._task is not None:
            self._closing.set()
            self._wanted.set()
            limit = self._config.sandbox.start_timeout_s + POOL_CLOSE_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), limit)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while self.ready:
            await self._drop(self.ready.pop())

    async def take(
        self, key: str, network: SandboxNetwork, profile: SandboxProfile
    ) -> Sandbox | None:
        """A pool container of `profile` for a new key (no folder yet, or only its
        request's choices in it) with the default network; None when there is none to take
        (the caller then makes a container)."""
        paths, sid = self._layout.of(key), sandbox_id(key)
        if not self._has(profile) or network != self._networks.choose(None):
            return None
        if not await asyncio.to_thread(is_new, paths.root):
            return None
        if self._shared and await asyncio.to_thread(self._backend.has_workspace, sid):
            return None  # the key's claim is its workspace: its pod is made on it
        # chosen after the awaits: the filler may have dropped one meanwhile
        pooled = next((c for c in self.ready if profile_of(c) == profile.name), None)
        if pooled is None:
            return None
        self.ready.remove(pooled)
        self._taken_at = asyncio.get_running_loop().time()
        self._wanted.set()
        if not await pooled.agent.answers(POOL_PROBE_S):
            log.warning("warm pool: container %s does not answer; dropped", pooled.info.name)
            await self._drop(pooled)
            return None
        info = await self._claim(pooled, key, network) if self._shared else pooled.info
        if info is None:
            return None
        write_key(pooled.paths.key_file, key)
        await asyncio.to_thread(carry_choices, paths.root, pooled.paths.root)
        os.rename(pooled.paths.root, paths.root)
        # the probe's connection stays the key's: no new link to greet (folder renamed)
        agent = await self._containers.carry(pooled.agent, info, paths)
        container = Container(info, agent, paths, sid)
        try:
            await self._containers.ready(container, network, key, None, greeted=agent.is_ready())
        except SandboxBroken as exc:
            log.warning("sandbox %r: the pool container failed (%s); making one", key, exc)
            await self._containers.stop(container, keep_workspace_mounted=True)
            return None
        log.info("sandbox %r took warm-pool container %s", key, pooled.info.name)
        sandbox = Sandbox(key, sid, container, network)
        sandbox.born = born(pooled.info)
        return sandbox

    def _has(self, profile: SandboxProfile) -> bool:
        return any(profile_of(c) == profile.name for c in self.ready)

    async def _claim(
        self, pooled: Container, key: str, network: SandboxNetwork
    ) -> ContainerInfo | None:
        """The pool pod relabeled as the key's (its maker's mark removed); None when that
        failed (the pod is dropped: the caller makes the key's pod instead)."""
        tenant, plain = split(key)
        labels: dict[str, str | None] = {
            **network.labels(),
            LABEL_KEY: plain,
            LABEL_SANDBOX_ID: sandbox_id(key),
            LABEL_TENANT: tenant or None,
            LABEL_REPLICA: None,
        }
        try:
            info = await asyncio.to_thread(self._backend.relabel, pooled.info.id, labels)
        except StockadeError as exc:
            log.warning(
                "warm pool: pod %s not claimed for %r: %s", pooled.info.name, shown(key), exc
            )
            info = None
        if info is None or not info.running:
            await self._drop(pooled)
            # a patch may have been applied though its answer was lost: the pool pod's claim,
            # labelled as the key's, is no workspace yet (the key had none: take())
            await asyncio.to_thread(self._backend.remove_workspace, sandbox_id(key))
            return None
        return info

    async def reap(self) -> int:
        """Remove the unclaimed pool pods of replicas that are gone (their heartbeat stale in
        the shared state; without shared state this supervisor is alone, so every other's
        are a past run's). Never a claimed one: that is a key's sandbox. How many."""
        if not self._shared:
            return 0
        live = await self._replicas()
        found = await asyncio.to_thread(self._backend.list, self._containers.labels())
        reaped = 0
        for info in found:
            maker = info.labels.get(LABEL_REPLICA, "")
            if not info.labels.get(LABEL_POOL) or info.labels.get(LABEL_SANDBOX_ID):
                continue
            if maker == self.replica or (live is not None and maker in live):
                continue
            if await asyncio.to_thread(self._backend.remove, info.id):
                reaped += 1
                log.warning("warm pool: reaped pod %s of replica %s (gone)", info.name, maker)
        return reaped

    async def _fill(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing.is_set():
            await self._wanted.wait()
            while (wait := self._taken_at + REFILL_AFTER_S - loop.time()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), wait)
                if self._closing.is_set():
                    return
            self._wanted.clear()
            for pooled in list(self.ready):
                if not await pooled.agent.answers(POOL_PROBE_S) and pooled in self.ready:
                    self.ready.remove(pooled)
                    await self._drop(pooled)
            for profile, size in self.sizes.items():
                if not await self._top_up(profile, size):
                    break  # the next sweep asks again

    async def _top_up(self, profile: SandboxProfile, size: int) -> bool:
        """Make containers of `profile` until it has `size`; False when one failed."""
        while sum(profile_of(c) == profile.name for c in self.ready) < size:
            if self._closing.is_set():
                return False
            try:
                hk, state_dir = self._config.housekeeping, self._config.state_dir
                if self._host_room:  # a pod's room is its node's: the scheduler's
                    await asyncio.to_thread(pressure.check, hk, state_dir)
                pooled = await self._make(profile)
                self.ready.append(pooled)
                log.info("warm pool: container %s (%s) ready", pooled.info.name, profile.shown)
            except (StockadeError, OSError) as exc:
                log.warning("warm pool: no container added (%s): %s", profile.shown, exc)
                return False
        return True

    async def _make(self, profile: SandboxProfile) -> Container:
        pool_id = secrets.token_hex(8)
        paths = self._layout.prepare_pool(pool_id)
        name = self._containers.name(f"{POOL_PREFIX}{pool_id}")
        network = self._networks.choose(None)
        labels = {LABEL_POOL: pool_id}
        if self._shared:
            labels[LABEL_REPLICA] = self.replica
        try:
            shape = profile if profile.name else None  # the default: [sandbox]'s, as a key's
            return await self._containers.start(name, labels, paths, network, profile=shape)
        except SandboxBroken:
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(hostfs.remove_tree, paths.root)
            raise

    async def _drop(self, pooled: Container) -> None:
        await self._containers.stop(pooled)
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(hostfs.remove_tree, pooled.paths.root)


def sizes(config: Config, profiles: Profiles) -> dict[SandboxProfile, int]:
    """The pool's size for each profile that keeps containers (the default one first)."""
    wanted = {profiles.default: config.housekeeping.warm_pool}
    wanted |= {profiles.get(name): p.warm_pool for name, p in config.profiles.items()}
    return {profile: size for profile, size in wanted.items() if size}


def profile_of(pooled: Container) -> str:
    """The name of the profile a pool container was made with ("" for the default)."""
    return pooled.info.labels.get(LABEL_PROFILE, "")


def is_new(root: Path) -> bool:
    """Whether a key's folder is a new key's: absent, or holding only CHOICES."""
    try:
        with os.scandir(root) as entries:
            return all(entry.name in CHOICES for entry in entries)
    except FileNotFoundError:
        return True


def carry_choices(root: Path, pooled_root: Path) -> None:
    """Move a new key's kept choices into its pool container's folder, and remove the key's
    folder (the pool's is then renamed to it)."""
    if not root.exists():
        return
    for name in CHOICES:
        with contextlib.suppress(FileNotFoundError):
            os.rename(root / name, pooled_root / name)
    root.rmdir()
