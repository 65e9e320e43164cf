"""Snapshots of sandboxes' files, restores and forks: the manager's side of the store
(snapshots/repository.py keeps the files; snapshots/staging.py switches a workspace). Takes
the manager's parts (sandboxes/parts.py), never the manager.

A capture runs in two passes under the key's lock: the first copies the workspace while the
sandbox runs on (calls keep being served), the second reads again, with every process of the
sandbox frozen (the engine's pause), only the files changed since (their ctime moved) and
records the tree. The freeze lasts that second pass alone. A sandbox that is paused stays
paused; one with only a workspace is read as it is.

/tmp (include_tmp) is read through the container's init (/proc/PID/root/tmp, the pid checked
again after the folder is opened, so a reused pid cannot hand over another process's tree),
or from the tmpfs the supervisor mounts for it. It is written back the same way into the new
container of a restore or fork before any call can reach it.

Snapshots belong to the tenant (the store's owner is a digest of the tenant's name); a
snapshot of any of its sandboxes may be restored into any of them, or into a new key. A fork
is a transient capture (never listed, deleted at once) restored into each new key, whose
containers start in parallel. Every operation is an audit record; [snapshots] operations
(per tenant: snapshot_operations) says who may take, restore, fork and delete.

Process memory is not captured: CRIU does not work on the hosts this was built on
(include_memory is Unsupported), and the API keeps the flag so that a host where it works
can offer it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psutil

from stockade.supervisor.errors import (
    AlreadyExists,
    HostExhausted,
    InvalidRequest,
    PolicyDenied,
    QuotaExceeded,
    SandboxLost,
    SandboxNotFound,
    SandboxStateConflict,
    Unsupported,
)
from stockade.supervisor.keys import shown, split
from stockade.supervisor.keys import validate_scoped as validate_key
from stockade.supervisor.models import SandboxInfo
from stockade.supervisor.sandboxes import layout, workspaces
from stockade.supervisor.sandboxes.inventory import Inventory
from stockade.supervisor.sandboxes.parts import Parts
from stockade.supervisor.sandboxes.profiles import SandboxProfile
from stockade.supervisor.sandboxes.quarantine import Quarantines
from stockade.supervisor.sandboxes.sandbox import Sandbox, SandboxNetwork
from stockade.supervisor.sandboxes.snapshots import staging
from stockade.supervisor.sandboxes.snapshots.capture import DIR_FLAGS, Cache, Known
from stockade.supervisor.sandboxes.snapshots.held import Held, opened, whole
from stockade.supervisor.sandboxes.snapshots.repository import (
    FORK_PREFIX,
    MAIN,
    CaptureSession,
    CaptureStats,
    Opener,
    Snapshot,
    SnapshotExists,
    SnapshotStore,
    check_name,
    keys_of,
)
from stockade.supervisor.sandboxes.snapshots.restore import Reuse

log = logging.getLogger("stockade.snapshots")
TMP = "tmp"
MAX_FORKS = 64
MiB = 1 << 20


@dataclass(frozen=True)
class Taken:
    """A capture and how it went: `frozen_s` the sandbox was frozen for (0 when it was not
    running), `stats` of the frozen pass."""

    snapshot: Snapshot
    stats: CaptureStats
    frozen_s: float
    keys: Cache = field(default_factory=dict)
    """With want_keys: the workspace's file keys and digests, the next capture's cache."""
    known: Known = field(default_factory=dict)
    """With want_keys: the walk's records and entries (capture.Known), the next walk's."""
    added: frozenset[str] = frozenset()
    """The content the capture added to the store (recorded at once: not a deferred one)."""


Plant = Callable[[Sandbox], Awaitable[None]]
"""A new container's decoys planted (decoys.py Planter.plant; never raises)."""


async def _no_plant(_sandbox: Sandbox) -> None:
    pass


class Snapshots:
    def __init__(
        self,
        parts: Parts,
        quarantines: Quarantines,
        inventory: Inventory,
        plant: Plant = _no_plant,
    ) -> None:
        """`plant`: the decoys of a container a restore or a fork makes, planted before any
        call reaches it (its own, derived from its key; a file /tmp's restore wrote is kept)."""
        self._parts = parts
        self._quarantines, self._inventory = quarantines, inventory
        self._plant = plant
        config = parts.config
        root = (
            Path(config.snapshots.dir) if config.snapshots.dir else config.state_dir / "snapshots"
        )
        self.store = SnapshotStore(root)
        self.held = Held()
        """Every call that takes an owner's store lock waits for it here first (held.py)."""

    # --- the operations ------------------------------------------------------------------

    async def snapshot(
        self, key: str, name: str, *, include_tmp: bool, include_memory: bool, reason: str
    ) -> Taken:
        validate_key(key)
        tenant = split(key)[0]
        _, max_count, max_bytes = self._allowed(tenant, "snapshot")
        _no_memory(include_memory)
        if name:
            check_name(name)
        taken = await self._capture(key, name, include_tmp, max_bytes, max_count)
        snap = taken.snapshot
        self._parts.record(
            key, "snapshot",
            f"{snap.name}: {reason}; {snap.files} files, {snap.bytes} bytes, frozen "
            f"{taken.frozen_s:.3f} s",
        )  # fmt: skip
        return taken

    async def listed(self, tenant: str, source: str = "") -> list[Snapshot]:
        found = await asyncio.to_thread(self.store.list, owner_of(tenant))
        return [s for s in found if not source or s.source == source]

    async def usage(self, tenant: str) -> tuple[int, int, int, int]:
        """(count, bytes, max_count, max_bytes) of the tenant's store."""
        _, max_count, max_bytes = self._parts.config.snapshot_rules(tenant)
        used = await asyncio.to_thread(self.store.usage, owner_of(tenant))
        return used.count, used.bytes, max_count, max_bytes

    async def delete(self, tenant: str, name: str, reason: str) -> int:
        self._allowed(tenant, "delete")
        check_name(name)
        owner = owner_of(tenant)
        freed = await self.held.run(owner, self.store.delete, owner, name)
        self._parts.record(_tenant_key(tenant), "snapshot-delete", f"{name}: {reason}")
        return freed

    async def restore(self, key: str, name: str, reason: str) -> tuple[SandboxInfo, Snapshot, bool]:
        """The key's files become the snapshot's, its container re-created (or made: a new
        key). (the sandbox, the snapshot, whether a sandbox was replaced)"""
        validate_key(key)
        tenant = split(key)[0]
        self._allowed(tenant, "restore")
        check_name(name)
        owner = owner_of(tenant)
        snap = await asyncio.to_thread(self.store.get, owner, name)
        parts = self._parts
        async with parts.lock(key):
            self._quarantines.refuse(key)  # its files are the evidence
            old = parts.registry.get(key)
            replaced = old is not None or parts.layout.of(key).root.is_dir()
            network, profile = self._inventory.settings_of(key)
            reuse = await self._into(key, owner, name, snap, old, network, profile)
        info = await self._inventory.get(key)
        how = f"; {reuse.linked} files linked, {reuse.copied} copied" if reuse else ""
        self._parts.record(key, "restore", f"{name}: {reason}{how}")
        return info, snap, replaced

    async def fork(
        self,
        source: str,
        new_keys: list[str],
        *,
        include_tmp: bool,
        include_memory: bool,
        reason: str,
    ) -> tuple[list[SandboxInfo], Taken]:
        """New sandboxes with the source's files of now; all or nothing."""
        validate_key(source)
        tenant = split(source)[0]
        self._allowed(tenant, "fork")
        _no_memory(include_memory)
        self._quarantines.refuse(source)  # a snapshot keeps its files; a fork would run them
        self._check_new(source, new_keys)
        parts = self._parts
        owner = owner_of(tenant)
        made: list[str] = []
        try:
            for key in new_keys:  # each counts against the tenant's sandboxes from now on
                parts.quotas.admit(key)
                parts.starting.add(key)
            async with self.held_capture(source, owner, FORK_PREFIX, include_tmp) as taken:
                network, profile = self._inventory.settings_of(source)
                done = await asyncio.gather(
                    *(
                        self._fork_one(k, source, owner, taken.snapshot, made, network, profile)
                        for k in new_keys
                    ),
                    return_exceptions=True,
                )
            failed = [e for e in done if isinstance(e, BaseException)]
            if failed:
                raise failed[0]
        except BaseException:
            for key in made:
                with contextlib.suppress(Exception):
                    await self._inventory.destroy(key, delete_workspace=True)
            raise
        finally:
            parts.starting.difference_update(new_keys)
        for key in new_keys:
            parts.record(key, "fork", f"from {shown(source)!r}: {reason}")
        return [await self._inventory.get(k) for k in new_keys], taken

    async def _fork_one(
        self,
        key: str,
        source: str,
        owner: str,
        snap: Snapshot,
        made: list[str],
        network: SandboxNetwork,
        profile: SandboxProfile,
    ) -> None:
        async with self._parts.lock(key):
            if key in self._parts.registry or self._parts.layout.of(key).root.is_dir():
                raise AlreadyExists(f"sandbox {shown(key)!r} appeared while it was being forked")
            made.append(key)
            await self._into(
                key, owner, snap.name, snap, None, network, profile, settings_from=source
            )

    # --- capture -------------------------------------------------------------------------

    @asynccontextmanager
    async def held_capture(
        self,
        key: str,
        owner: str,
        prefix: str,
        include_tmp: bool = False,
        *,
        precopy: bool = True,
        freeze: bool = True,
    ) -> AsyncIterator[Taken]:
        """A transient capture of `key` (named `prefix`: a fork's, an undo diff's) for the
        block's length: held meanwhile (SnapshotStore.hold_transient: the store removes it
        if this process dies before its delete), then deleted by what it added (only that
        can have been left unused)."""
        name = f"{prefix}{secrets.token_hex(8)}"
        with await self.held.run(owner, self.store.hold_transient, owner, name):
            taken = await self._capture(key, name, include_tmp, 0, precopy=precopy, freeze=freeze)
            try:
                yield taken
            finally:
                drop = functools.partial(self.store.delete, added=taken.added)
                await self.held.run(owner, drop, owner, name)

    async def _capture(
        self,
        key: str,
        name: str,
        include_tmp: bool,
        max_bytes: int,
        max_count: int = 0,
        *,
        precopy: bool = True,
        freeze: bool = True,
        cache: tuple[str, Cache, Known] | None = None,
        want_keys: bool = False,
        compresslevel: int = 6,
        later: set[asyncio.Task[None]] | None = None,
        gate: asyncio.Event | None = None,
    ) -> Taken:
        """precopy=False: one pass only (a checkpoint's: few files changed since the last);
        freeze=False: not frozen for it either; `cache`: a capture's name, file keys and walk's
        records (capture.Known), kept by the caller, used instead of reading the lineage's
        newest manifest while that capture is still in the store (checked under the store's
        lock: its content cannot go);
        `later`: the manifest is written after this returns, by a task put in `later` (the
        files' content is in the store already; the store stays held until it is written),
        once `gate` is set (the caller's own quick writes first: they share the interpreter)."""
        parts = self._parts
        paths = parts.layout.of(key)
        tenant, plain = split(key)
        async with parts.lock(key):
            sandbox = parts.registry.get(key)
            if sandbox is None and not paths.root.is_dir():
                raise SandboxNotFound(f"no sandbox for key {shown(key)!r}")
            trees: dict[str, Opener] = {MAIN: _folder(paths.workspace)}
            if include_tmp:
                trees[TMP] = self._tmp(sandbox, paths.tmp)
            lineage = paths.root.name
            async with self._mounted(paths, sandbox):
                held_by = self.held.lock(owner_of(tenant))  # released once the session ends
                await held_by.acquire()
                try:
                    session = await opened(functools.partial(self.store.begin, owner_of(tenant)))
                except BaseException:
                    held_by.release()
                    raise
                session.defer = later is not None  # new content written beside the call
                handed = False
                try:
                    if max_count and session.count() >= max_count:  # under the store's lock
                        raise QuotaExceeded(
                            f"the tenant may keep at most {max_count} snapshot(s) ([snapshots] "
                            "max_count); delete one first"
                        )
                    session.budget = await whole(self._budget, tenant, max_bytes)
                    known: Known | None = None
                    if precopy:
                        cached, known = await whole(session.precopy, trees, lineage)
                    elif cache is not None and session.holds(cache[0]):
                        cached, known = cache[1], cache[2]
                    else:
                        cached = await whole(session.cache, lineage)
                    chosen = name or _fresh_name(session)
                    session.check_free(chosen)
                    held = sandbox if freeze else None
                    async with self._parts.pausing.frozen(held) as clock:  # the walk alone
                        got, stats = await whole(session.walk, trees, cached, known)
                    keys = keys_of(got[MAIN].entries) if want_keys else {}
                    known = got[MAIN].known if want_keys else {}
                    record = functools.partial(
                        session.record, chosen, got, lineage, source=plain,
                        max_bytes=max_bytes, compresslevel=compresslevel,
                    )  # fmt: skip
                    if later is not None:
                        task = asyncio.create_task(
                            _record_later(record, session, key, held_by, gate)
                        )
                        handed = True
                        later.add(task)
                        task.add_done_callback(later.discard)
                        snap = session.describe(chosen, got, lineage, plain)
                    else:
                        snap = await whole(record)
                    added = frozenset(session.added if later is None else ())
                    return Taken(snap, stats, clock[0], keys, known, added)
                finally:
                    if not handed:
                        try:
                            await asyncio.to_thread(session.end)
                        finally:
                            held_by.release()

    def _budget(self, tenant: str, max_bytes: int) -> tuple[int, str] | None:
        """How much new content a capture may add: the tenant's quota left, and the disk
        above housekeeping.min_free_disk_mb (HostExhausted when there is none left)."""
        budgets = []
        if max_bytes:
            used = self.store.usage(owner_of(tenant)).bytes
            why = (
                f"the snapshot would take the tenant's snapshots past {max_bytes // MiB} MiB "
                "after deduplication ([snapshots] max_mb); it was not kept"
            )
            budgets.append((max_bytes - used, why))
        min_free = self._parts.config.housekeeping.min_free_disk_mb * MiB
        if min_free:
            free = psutil.disk_usage(str(self.store.root)).free
            why = (
                f"no snapshot: {self.store.root} would have less than "
                f"housekeeping.min_free_disk_mb = {min_free // MiB} MiB free; it was not kept"
            )
            if free <= min_free:
                raise HostExhausted(why.replace(" would have", " has"))
            budgets.append((free - min_free, why))
        return min(budgets) if budgets else None

    @asynccontextmanager
    async def _mounted(self, paths: layout.Paths, sandbox: Sandbox | None) -> AsyncIterator[None]:
        """A capped or layered workspace whose container is gone may be unmounted: its
        files are in the image or the layers. Mount it for the capture, and unmount it
        after."""
        mounted = sandbox is None and await asyncio.to_thread(
            self._parts.layout.mount_existing, paths
        )
        try:
            yield
        finally:
            if mounted:
                await asyncio.to_thread(workspaces.unmount, paths.workspace)

    def _tmp(self, sandbox: Sandbox | None, host_tmp: Path) -> Opener:
        """An opener of the sandbox's /tmp (see the module's doc)."""
        if sandbox is None or sandbox.lost:
            raise SandboxStateConflict(
                "include_tmp: the sandbox has no running container, and /tmp lives and dies "
                "with its container"
            )
        if self._parts.layout.host_tmp:
            return _folder(host_tmp)
        return self._container_tmp(sandbox)

    def _container_tmp(self, sandbox: Sandbox) -> Opener:
        if self._parts.containers.runtime.gvisor:
            raise Unsupported("/tmp of a gVisor sandbox lives in gVisor's own kernel: not read")
        pid, cid, backend = sandbox.info.pid, sandbox.info.id, self._parts.backend
        if not pid or not os.path.isdir(f"/proc/{pid}"):
            raise Unsupported(
                "/tmp: this supervisor cannot see the container's processes (does it run in a "
                "container of its own?)"
            )

        def open_tmp() -> int:
            fd = os.open(f"/proc/{pid}/root/tmp", DIR_FLAGS)
            info = backend.inspect(cid)
            if info is None or info.pid != pid:
                os.close(fd)
                raise SandboxLost("the container ended while its /tmp was being read")
            return fd

        return open_tmp

    # --- restore -------------------------------------------------------------------------

    async def _into(
        self,
        key: str,
        owner: str,
        name: str,
        snap: Snapshot,
        old: Sandbox | None,
        network: SandboxNetwork,
        profile: SandboxProfile,
        settings_from: str = "",
    ) -> Reuse | None:
        """Under the key's lock: stage the snapshot's workspace, stop the old container,
        switch, start the new container (on `network`, with `profile`; a fork's key keeps
        what `settings_from`, its source, keeps), write /tmp back. What was linked rather
        than copied, when the snapshot is of this sandbox and the workspace uncapped."""
        parts = self._parts
        parts.quotas.admit(key, profile.memory_mb)
        await parts.quotas.admit_shared(key, profile.memory_mb)
        paths = await asyncio.to_thread(parts.layout.prepare, key)
        if settings_from:
            await asyncio.to_thread(self._inventory.copy_settings, settings_from, key)
        ids = parts.layout.workspace_ids(paths)
        cap = staging.cap_of(paths, parts.config.sandbox.workspace_size_mb)
        link = not settings_from and snap.lineage == paths.root.name  # never a fork's
        layered = parts.layout.layered and not cap and (not link or paths.layers.is_dir())
        if layered:  # the store held for the links alone: a fork's keys make the rest at once
            planned = await self.held.run(owner, staging.stage_data, self.store, owner, name, paths)
            staged = await whole(staging.stage_meta, planned, ids)
        else:
            staged = await self.held.run(
                owner,
                functools.partial(
                    staging.stage, self.store, owner, name, paths, ids, cap, link=link
                ),
            )
        try:
            if old is not None:
                parts.registry.pop(key, None)
                await parts.containers.stop(old.container)
            else:
                await asyncio.to_thread(layout.unmount, paths)
            await self.held.run(owner, functools.partial(staged.switch, remove=False))
        except BaseException:
            await asyncio.to_thread(staged.discard)
            raise
        # The old files go while the new container starts (their own folder; what a failure
        # leaves there, the next restore's stage removes); done before this returns.
        removing = asyncio.ensure_future(asyncio.to_thread(staged.remove_old))
        if staged.reuse is not None:
            log.info(
                "%s restored from %s: %d files linked, %d copied", shown(key), name,
                staged.reuse.linked, staged.reuse.copied,
            )  # fmt: skip
        counted = key in parts.starting  # a fork's keys are the fork's to discard
        parts.starting.add(key)
        try:
            sandbox = await parts.create(key, network, profile)
            if TMP in snap.parts:  # before any call can reach the new container
                await self._restore_tmp(sandbox, owner, name, paths.tmp, ids)
            await self._plant(sandbox)
        finally:
            if not counted:
                parts.starting.discard(key)
            for failed in await asyncio.gather(removing, return_exceptions=True):
                if isinstance(failed, BaseException):
                    log.warning("the old workspace of %s was not removed: %s", shown(key), failed)
        parts.registry[key] = sandbox
        return staged.reuse

    async def _restore_tmp(
        self, sandbox: Sandbox, owner: str, name: str, host_tmp: Path, ids: tuple[int, int]
    ) -> None:
        target = _folder(host_tmp) if self._parts.layout.host_tmp else self._container_tmp(sandbox)
        try:
            await self.held.run(owner, self.store.restore, owner, name, target, ids, TMP)
        except OSError as exc:
            await self._parts.containers.stop(sandbox.container, keep_workspace_mounted=True)
            if exc.errno == errno.ENOSPC:
                raise staging.SnapshotTooBig(
                    f"snapshot {name!r}: its /tmp does not fit in the sandbox's /tmp "
                    "(sandbox.tmp_size_mb, tmp_inodes); the workspace was restored"
                ) from None
            raise

    # --- checks --------------------------------------------------------------------------

    def _allowed(self, tenant: str, operation: str) -> tuple[tuple[str, ...], int, int]:
        if not self._parts.host.snapshots and operation != "delete":
            raise Unsupported(
                "snapshots read and write workspaces on the supervisor's host; a pod's "
                "workspace is a volume in the cluster (engine.kind kubernetes): not supported"
            )
        rules = self._parts.config.snapshot_rules(tenant)
        if operation not in rules[0]:
            raise PolicyDenied(
                f"this supervisor does not let {'you' if not tenant else repr(tenant)} "
                f"{operation} snapshots ([snapshots] operations)"
            )
        return rules

    def _check_new(self, source: str, new_keys: list[str]) -> None:
        if not 1 <= len(new_keys) <= MAX_FORKS:
            raise InvalidRequest(
                f"a fork makes 1 to {MAX_FORKS} new sandboxes, not {len(new_keys)}"
            )
        if len(set(new_keys)) != len(new_keys):
            raise InvalidRequest("the new keys of a fork must all be different")
        for key in new_keys:
            validate_key(key)
            if key == source:
                raise AlreadyExists(f"the new key {shown(key)!r} is the source's")
            if key in self._parts.registry or self._parts.layout.of(key).root.is_dir():
                raise AlreadyExists(
                    f"sandbox {shown(key)!r} exists (a container or a workspace): a fork makes "
                    "new sandboxes only (destroy it with its workspace first)"
                )


async def _record_later(
    record: Callable[[], Snapshot],
    session: CaptureSession,
    key: str,
    held_by: asyncio.Lock,
    gate: asyncio.Event | None = None,
) -> None:
    """Write a capture's manifest, once `gate` is set, and give the store back (a
    checkpoint's, after its call began)."""
    try:
        if gate is not None:
            await gate.wait()
        await whole(record)
    except Exception:
        log.exception("the capture of %s was not recorded", shown(key))
    finally:
        try:
            await asyncio.to_thread(session.end)
        finally:
            held_by.release()


def owner_of(tenant: str) -> str:
    """The store's owner for a tenant: a digest, so that any tenant name makes a plain
    folder name and no two tenants share one."""
    return "t-" + hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _tenant_key(tenant: str) -> str:
    """The audit record's key for a tenant-wide operation (a delete names no sandbox)."""
    return f"{tenant}/" if tenant else ""


def _fresh_name(session: CaptureSession) -> str:
    """snap- and the time; with a suffix in the rare case that name is taken."""
    now = datetime.now(UTC)
    name = f"snap-{now.strftime('%Y%m%dT%H%M%S')}.{now.microsecond // 1000:03d}Z"
    for n in range(2, 100):
        try:
            session.check_free(name)
        except SnapshotExists:
            name = f"{name.split('Z')[0]}Z-{n}"
            continue
        break
    return name


def _folder(path: Path) -> Opener:
    return lambda: os.open(path, DIR_FLAGS)


class MemoryCheckpointUnavailable(Unsupported):
    reason = "MEMORY_CHECKPOINT_UNAVAILABLE"


def _no_memory(include_memory: bool) -> None:
    if include_memory:
        raise MemoryCheckpointUnavailable(
            "include_memory: process memory checkpoints need CRIU, which does not work on this "
            "host (CRIU 3.17 fails on its kernel); snapshots carry files only"
        )
