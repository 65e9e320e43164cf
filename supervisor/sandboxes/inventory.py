"""Get, List and Destroy: the sandboxes the manager holds (and the keys with only a
workspace), described as SandboxInfo, and a key's removal; what settings (network, profile) a
key's next container gets. Takes the manager's parts (parts.py), never the manager."""

from __future__ import annotations

import asyncio
import contextlib

from stockade.supervisor.errors import EngineUnavailable, SandboxNotFound
from stockade.supervisor.keys import sandbox_id, shown
from stockade.supervisor.keys import validate_scoped as validate_key
from stockade.supervisor.models import SandboxInfo
from stockade.supervisor.sandboxes import adoption, hostfs, layout
from stockade.supervisor.sandboxes.network_modes import KEPT as KEPT_NETWORK
from stockade.supervisor.sandboxes.parts import Parts
from stockade.supervisor.sandboxes.profiles import KEPT as KEPT_PROFILE
from stockade.supervisor.sandboxes.profiles import SandboxProfile
from stockade.supervisor.sandboxes.quarantine import Quarantines
from stockade.supervisor.sandboxes.sandbox import Sandbox, SandboxNetwork, absent, describe


class Inventory:
    def __init__(self, parts: Parts, quarantines: Quarantines) -> None:
        self._parts = parts
        self._quarantines = quarantines

    async def get(self, key: str) -> SandboxInfo:
        validate_key(key)
        parts = self._parts
        sandbox = parts.registry.get(key)
        if sandbox is not None:
            await self._notice_deaths((sandbox,))
            await parts.clinic.check(sandbox)
            return self.describe(sandbox)
        taken = await adoption.held_elsewhere(parts, key) if parts.host.shared else None
        if taken is not None:
            return self.describe(taken)
        if parts.layout.of(key).root.is_dir():
            return self.absent(key)
        raise SandboxNotFound(f"no sandbox for key {shown(key)!r}")

    async def list(self) -> list[SandboxInfo]:
        registry = self._parts.registry
        await self._notice_deaths(tuple(registry.values()))
        infos = {k: self.describe(s) for k, s in registry.items()}
        for key, _ in self._parts.layout.folders():
            if key not in infos:
                infos[key] = self.absent(key)
        return sorted(infos.values(), key=lambda i: i.key)

    async def destroy(self, key: str, *, delete_workspace: bool) -> tuple[bool, bool]:
        """Remove the container; keep the workspace unless asked. (removed, deleted)"""
        validate_key(key)
        parts = self._parts
        paths = parts.layout.of(key)
        async with parts.lock(key):
            sandbox = parts.registry.pop(key, None)
            here = paths.root.is_dir()  # a replica may serve a pod without a folder of its own
            if sandbox is None and not here and not await adoption.elsewhere(parts, key):
                raise SandboxNotFound(f"no sandbox for key {shown(key)!r}")
            if sandbox is not None:
                await sandbox.agent.close()
            self._quarantines.forget(key)
            await parts.networks.egress.detach(sandbox_id(key))
            found = await adoption.find(parts, key) if sandbox is None else None  # by label
            name = sandbox.info.id if sandbox is not None else parts.container_name(key)
            name = found.id if found is not None else name
            removed = await asyncio.to_thread(parts.containers.remove_own, name)
            await asyncio.to_thread(layout.unmount, paths)
            if delete_workspace:
                await asyncio.to_thread(parts.backend.remove_workspace, sandbox_id(key))
                if here:
                    await asyncio.to_thread(hostfs.remove_tree, paths.root)
            elif here:
                layout.stamp(paths.retired)
            return removed, delete_workspace

    async def _notice_deaths(self, sandboxes: tuple[Sandbox, ...]) -> None:
        """Mark sandboxes whose container stopped or vanished since their last call as
        lost, so that Get and List never report a dead container as RUNNING (the next call
        recreates it). One engine call; when the engine does not answer, what is known stays."""
        alive = [s for s in sandboxes if not s.lost]
        if not alive:
            return
        backend = self._parts.backend
        try:
            if len(alive) == 1:
                found = await asyncio.to_thread(backend.inspect, alive[0].info.id)
                infos = [found] if found is not None else []
            else:
                infos = await asyncio.to_thread(backend.list, self._parts.containers.labels())
        except EngineUnavailable:
            return
        running = {i.id for i in infos if i.running}
        for sandbox in alive:
            if sandbox.info.id not in running:
                sandbox.lost = True

    def no_container(self, key: str) -> SandboxNotFound:
        where = "has only a workspace" if self._parts.layout.of(key).root.is_dir() else "is unknown"
        return SandboxNotFound(f"sandbox {shown(key)!r} {where}; a tool call creates its container")

    def describe(self, sandbox: Sandbox) -> SandboxInfo:
        parts = self._parts
        workspace = self._workspace(sandbox.key)
        image = parts.profile_of(sandbox).image
        return self._quarantines.mark(
            describe(sandbox, parts.engine, image, workspace, parts.clinic.fields(sandbox))
        )

    def absent(self, key: str) -> SandboxInfo:
        parts = self._parts
        info = absent(key, parts.engine, parts.containers.image, self._workspace(key))
        return self._quarantines.mark(info)

    def _workspace(self, key: str) -> str:
        """The key's workspace as SandboxInfo names it: where the engine keeps it (a pod's
        claim), else its host folder."""
        parts = self._parts
        return parts.backend.workspace_of(sandbox_id(key)) or str(parts.layout.of(key).workspace)

    def settings_of(self, key: str) -> tuple[SandboxNetwork, SandboxProfile]:
        """The network and profile a new container of the key gets: its running sandbox's,
        else what its folder keeps, else the configured ones."""
        parts = self._parts
        held = parts.registry.get(key)
        if held is not None:
            return held.network, parts.profile_of(held)
        folder = parts.layout.of(key).root
        return parts.networks.kept(folder), parts.profiles.kept(folder)

    def copy_settings(self, source: str, key: str) -> None:
        """A fork's key keeps what its source keeps (its network and profile)."""
        of = self._parts.layout.of
        source_folder, folder = of(source).root, of(key).root
        for name in (KEPT_NETWORK, KEPT_PROFILE):
            with contextlib.suppress(FileNotFoundError):
                (folder / name).write_bytes((source_folder / name).read_bytes())
