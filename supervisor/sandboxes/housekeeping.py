"""Housekeeping: one sweep probes the sandboxes' health (paused ones are left alone: their
agent is frozen), pauses idle sandboxes (idle_action = "pause"), removes idle and old
containers, deletes workspaces past their retention and reaps other instances' orphans;
each step logs and records what it did. Never touches a sandbox while a lease on it is held,
nor a quarantined one (sandboxes/quarantine.py: kept as it is for inspection)."""

from __future__ import annotations

import asyncio
import logging
import time

from stockade.supervisor.engines.backends.base import LABEL_INSTANCE, LABEL_KEY, LABEL_MANAGED
from stockade.supervisor.errors import StockadeError
from stockade.supervisor.keys import sandbox_id, shown
from stockade.supervisor.sandboxes import adoption, hostfs, layout, owner
from stockade.supervisor.sandboxes.layout import Paths
from stockade.supervisor.sandboxes.parts import Parts
from stockade.supervisor.sandboxes.quarantine import Quarantines
from stockade.supervisor.sandboxes.sandbox import Sandbox

log = logging.getLogger("stockade")


class Housekeeping:
    def __init__(self, parts: Parts, quarantines: Quarantines) -> None:
        self._parts = parts
        self._quarantines = quarantines
        self._config = parts.config
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._forever(), name="stockade-sweeper")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _forever(self) -> None:
        while True:
            await asyncio.sleep(self._config.housekeeping.sweep_interval_s)
            try:
                await self.sweep()
            except StockadeError as exc:  # e.g. the engine is down: the next sweep retries
                log.warning("housekeeping sweep failed: %s", exc)
            except Exception:  # a bug must not end housekeeping for good
                log.exception("housekeeping sweep failed")

    async def sweep(self) -> None:
        sandboxes = [s for s in self._kept_up() if s.usable]
        await asyncio.gather(*(self._parts.clinic.check(s) for s in sandboxes))
        await self.pause_idle()
        await self.prune()
        await self.expire_workspaces()
        if self._config.housekeeping.reap_orphans:
            await self.reap_orphans()
            try:  # pool pods of replicas that are gone
                await self._parts.pool.reap()
            except StockadeError as exc:  # the database or the API: the next sweep retries
                log.warning("warm pool: the pods of gone replicas not reaped: %s", exc)
        self._parts.pool.want()  # replaces pool containers that failed or died

    async def prune(self) -> int:
        """Remove the containers of sandboxes idle or old past their limits (never one with
        a call in flight); their workspaces stay. How many were removed."""
        hk = self._config.housekeeping
        idle_now, now = time.monotonic(), time.time()
        due: list[tuple[Sandbox, str]] = []
        idle_here: list[tuple[Sandbox, str]] = []
        for sandbox in self._kept_up():
            idle, age = idle_now - sandbox.idle_since, now - sandbox.born
            if hk.idle_timeout_s and idle >= hk.idle_timeout_s:
                why = f"idle for {idle:.0f} s (idle_timeout_s {hk.idle_timeout_s:g})"
                (idle_here if self._replicated else due).append((sandbox, why))
            elif hk.max_age_s and age >= hk.max_age_s:
                due.append((sandbox, f"{age:.0f} s old (max_age_s {hk.max_age_s:g})"))
        for sandbox, why in idle_here:
            if await self._idle_everywhere(sandbox):
                due.append((sandbox, f"{why}, and no replica called it meanwhile"))
            else:
                await self._let_go(sandbox, why)
        return sum([await self._retire(sandbox, why) for sandbox, why in due])

    async def _idle_everywhere(self, sandbox: Sandbox) -> bool:
        """Whether the agent itself has served no replica a call for idle_timeout_s: it
        counts every supervisor's calls, which this replica's own clock cannot."""
        idle = await sandbox.agent.idle_s()
        return idle is not None and idle >= self._config.housekeeping.idle_timeout_s

    async def pause_idle(self) -> int:
        """With idle_action = "pause": pause the sandboxes idle past idle_pause_s (never one
        with a call in flight, nor one that cannot serve). How many were paused."""
        hk = self._config.housekeeping
        if hk.idle_action != "pause":
            return 0
        paused, now = 0, time.monotonic()
        for sandbox in self._kept_up():
            idle = now - sandbox.idle_since
            if idle < hk.idle_pause_s or sandbox.paused or not sandbox.usable:
                continue
            async with self._parts.lock(sandbox.key):
                if self._parts.registry.get(sandbox.key) is not sandbox or sandbox.in_flight:
                    continue  # used or replaced while we waited for the lock
                if now - sandbox.idle_since < hk.idle_pause_s or not sandbox.usable:
                    continue
                why = f"idle for {idle:.0f} s (idle_pause_s {hk.idle_pause_s:g})"
                try:
                    paused += await self._parts.pausing.pause(sandbox, why)
                except StockadeError as exc:  # gone meanwhile: the next call re-creates it
                    log.warning("could not pause idle sandbox %r: %s", shown(sandbox.key), exc)
        return paused

    def _kept_up(self) -> list[Sandbox]:
        """The sandboxes housekeeping looks after: all but the quarantined ones."""
        held = self._quarantines.held
        return [s for s in self._parts.registry.values() if s.key not in held]

    async def _retire(self, sandbox: Sandbox, why: str) -> bool:
        async with self._parts.lock(sandbox.key), self._parts.quotas.shared_lock(sandbox.key):
            if sandbox.key in self._quarantines.held:
                return False
            if self._parts.registry.get(sandbox.key) is not sandbox or sandbox.in_flight:
                return False  # used or replaced while we waited for the lock
            del self._parts.registry[sandbox.key]  # from here a new call waits, then makes anew
            await self._parts.containers.stop(sandbox.container)
            layout.stamp(sandbox.container.paths.retired)
        log.info("removed the container of sandbox %r, %s; the workspace is kept", sandbox.key, why)
        self._parts.record(sandbox.key, "remove container", why)
        return True

    @property
    def _replicated(self) -> bool:
        """Replicas share the sandboxes (pods, with state.url): one replica's idle view says
        nothing of the others' calls, so an idle sandbox is removed only when its agent says
        no replica called it for as long (else this replica lets it go: the one that calls
        it next removes it once idle), and no workspace whose pod runs is deleted."""
        return self._parts.host.shared and bool(self._config.state.url)

    async def _let_go(self, sandbox: Sandbox, why: str) -> None:
        async with self._parts.lock(sandbox.key):
            if self._parts.registry.get(sandbox.key) is not sandbox or sandbox.in_flight:
                return
            del self._parts.registry[sandbox.key]  # a call here later takes it over again
            await sandbox.agent.close()
        log.info("let go of sandbox %r here, %s (other replicas may use it)", sandbox.key, why)

    async def expire_workspaces(self) -> int:
        """Delete workspaces that have had no container for workspace_retention_s. A
        workspace found without a container and without a stamp gets one now."""
        keep = self._config.housekeeping.workspace_retention_s
        if not keep:
            return 0
        expired = 0
        for key, paths in self._parts.layout.folders():
            if key in self._parts.registry or sandbox_id(key) != paths.root.name:
                continue
            if key in self._quarantines.held:
                continue  # kept for inspection, however long
            try:
                since = paths.retired.stat().st_mtime
            except FileNotFoundError:
                layout.stamp(paths.retired)
                continue
            if time.time() - since >= keep:
                expired += await self._expire(key, paths, f"no container for {keep:g} s")
        return expired

    async def _expire(self, key: str, paths: Paths, why: str) -> bool:
        async with self._parts.lock(key):
            if (
                key in self._parts.registry
                or not paths.retired.exists()
                or key in self._quarantines.held
            ):
                return False  # a call made a container meanwhile
            if self._replicated and await adoption.elsewhere(self._parts, key):
                layout.stamp(paths.retired)  # another replica's pod uses it: not retired
                return False
            await asyncio.to_thread(layout.unmount, paths)
            await asyncio.to_thread(self._parts.backend.remove_workspace, sandbox_id(key))
            await asyncio.to_thread(hostfs.remove_tree, paths.root)
        log.info("deleted the workspace of sandbox %r: %s", key, why)
        self._parts.record(key, "delete workspace", why)
        return True

    async def reap_orphans(self) -> int:
        """Remove containers (and egress links) of other instances that have provably
        ended (owner.py says what counts as proof); how many containers."""
        backend, mine = self._parts.backend, self._parts.containers.instance_id
        found = await asyncio.to_thread(backend.list, {LABEL_MANAGED: "1"})
        theirs = [i for i in found if i.labels.get(LABEL_INSTANCE) != mine]
        if not theirs:
            return 0
        locked = await asyncio.to_thread(owner.locked_inodes)
        reaped, ended, alive = 0, set(), {mine[:8]}
        for info in theirs:
            labels = dict(info.labels)
            why = await asyncio.to_thread(owner.gone_because, labels, self._parts.owner, locked)
            if why is None:
                alive.add(labels.get(LABEL_INSTANCE, "")[:8])
                continue
            instance = labels[LABEL_INSTANCE]
            ended.add(instance)
            if await asyncio.to_thread(backend.remove, info.id):
                reaped += 1
                log.warning("reaped container %s of instance %s: %s", info.name, instance, why)
                self._parts.record(labels.get(LABEL_KEY, ""), "reap orphan", f"{info.name}: {why}")
        for instance in ended:
            if instance[:8] not in alive:  # links are named by the id's first 8 characters
                await self._parts.networks.egress.remove_instance(instance)
        return reaped
