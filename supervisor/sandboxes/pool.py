"""The warm pool: started containers with no key yet (housekeeping.warm_pool). A new key (no
folder yet) with the default network takes one: its folder is renamed to the key's (the bind
mounts follow the folder) and the key is written there, with the pool id, so that adoption
after a restart finds the key.

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
import os
import secrets
from collections.abc import Awaitable, Callable

from stockade.supervisor.config import Config
from stockade.supervisor.engines.backends.base import (
    LABEL_KEY,
    LABEL_POOL,
    LABEL_REPLICA,
    LABEL_SANDBOX_ID,
    LABEL_TENANT,
    ContainerBackend,
    ContainerInfo,
)
from stockade.supervisor.errors import SandboxBroken, StockadeError
from stockade.supervisor.keys import sandbox_id, shown, split
from stockade.supervisor.sandboxes import hostfs, pressure
from stockade.supervisor.sandboxes.containers import Containers
from stockade.supervisor.sandboxes.layout import POOL_PREFIX, Layout, write_key
from stockade.supervisor.sandboxes.network_modes import Networks
from stockade.supervisor.sandboxes.sandbox import Container, Sandbox, SandboxNetwork, born

log = logging.getLogger("stockade")

POOL_CLOSE_S = 30.0
"""At close, how long a pool container being made may take beyond start_timeout_s."""
POOL_PROBE_S = 2.0
"""How long a pool container's agent may take to answer before it is replaced."""


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
        self.ready: list[Container] = []
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        if self._config.housekeeping.warm_pool:
            self._task = asyncio.create_task(self._fill(), name="stockade-pool")
            self._wanted.set()

    def want(self) -> None:
        """Ask the filler to top the pool up (and replace what failed or died)."""
        if self._config.housekeeping.warm_pool:
            self._wanted.set()

    async def close(self) -> None:
        """Let a container being made join first, then remove every pool container."""
        if self._task is not None:
            self._closing = True
            self._wanted.set()
            limit = self._config.sandbox.start_timeout_s + POOL_CLOSE_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), limit)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while self.ready:
            await self._drop(self.ready.pop())

    async def take(self, key: str, network: SandboxNetwork) -> Sandbox | None:
        """A pool container for a new key (no folder yet) with the default network; None
        when there is none to take (the caller then makes a container)."""
        paths, sid = self._layout.of(key), sandbox_id(key)
        if not self.ready or network != self._networks.choose(None) or paths.root.exists():
            return None
        if self._shared and await asyncio.to_thread(self._backend.has_workspace, sid):
            return None  # the key's claim is its workspace: its pod is made on it
        pooled = self.ready.pop(0)
        self._wanted.set()
        if not await pooled.agent.answers(POOL_PROBE_S):
            log.warning("warm pool: container %s does not answer; dropped", pooled.info.name)
            await self._drop(pooled)
            return None
        info = await self._claim(pooled, key, network) if self._shared else pooled.info
        if info is None:
            return None
        write_key(pooled.paths.key_file, key)
        os.rename(pooled.paths.root, paths.root)
        await pooled.agent.close()
        container = Container(info, self._containers.link(info, paths), paths, sid)
        try:
            await self._containers.ready(container, network, key, None)
        except SandboxBroken as exc:
            log.warning("sandbox %r: the pool container failed (%s); making one", key, exc)
            await self._containers.stop(container, keep_workspace_mounted=True)
            return None
        log.info("sandbox %r took warm-pool container %s", key, pooled.info.name)
        sandbox = Sandbox(key, sid, container, network)
        sandbox.born = born(pooled.info)
        return sandbox

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
        size = self._config.housekeeping.warm_pool
        while not self._closing:
            await self._wanted.wait()
            self._wanted.clear()
            for pooled in list(self.ready):
                if not await pooled.agent.answers(POOL_PROBE_S) and pooled in self.ready:
                    self.ready.remove(pooled)
                    await self._drop(pooled)
            while len(self.ready) < size and not self._closing:
                try:
                    hk, state_dir = self._config.housekeeping, self._config.state_dir
                    if self._host_room:  # a pod's room is its node's: the scheduler's
                        await asyncio.to_thread(pressure.check, hk, state_dir)
                    pooled = await self._make()
                    self.ready.append(pooled)
                    log.info("warm pool: container %s ready", pooled.info.name)
                except (StockadeError, OSError) as exc:
                    log.warning("warm pool: no container added: %s", exc)
                    break  # the next sweep asks again

    async def _make(self) -> Container:
        pool_id = secrets.token_hex(8)
        paths = self._layout.prepare_pool(pool_id)
        name = self._containers.name(f"{POOL_PREFIX}{pool_id}")
        network = self._networks.choose(None)
        labels = {LABEL_POOL: pool_id}
        if self._shared:
            labels[LABEL_REPLICA] = self.replica
        try:
            return await self._containers.start(name, labels, paths, network)
        except SandboxBroken:
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(hostfs.remove_tree, paths.root)
            raise

    async def _drop(self, pooled: Container) -> None:
        await self._containers.stop(pooled)
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(hostfs.remove_tree, pooled.paths.root)
