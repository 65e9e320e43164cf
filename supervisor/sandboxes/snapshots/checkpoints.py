"""Checkpoints: a capture of a sandbox's workspace before a risky call ([checkpoints], chosen
by the pipeline), and `undo`: the workspace put back as it was before a call, the change it
takes back shown first (docs/undo.md).

A checkpoint is a snapshot the supervisor names itself (`~ckpt-<hex>`: never listed nor
counted against [snapshots] max_count, though its content counts in the tenant's bytes) in
the same store, incremental against the key's newest capture: one pass (no pre-copy) that
reads only the files whose (inode, ctime, size, mtime) moved since, the sandbox frozen for
that pass alone ([checkpoints] freeze). Each sandbox's checkpoints are kept in a ledger
(`snapshots/<owner>/checkpoints/<sandbox id>.json`: name, call, tool, time, the bytes its
pass read; and the names dropped but not yet deleted) and bounded: at most `keep`, and at most
`max_mb` of content read by them, the oldest dropped first. The ledger is written before the
call runs; deleting what it dropped from the store (its content collected when no other
capture uses it) runs after, off the call's path, and is retried by the next one when a
crash cut it short.

An undo restores the checkpoint as RestoreSandbox does (a workspace staged beside the old one
and switched in, the container re-created): files, modes, links and empty folders come back
exactly; processes do not (the container starts anew). The checkpoint undone and every newer
one leave the ledger, so a second undo goes one further step back. Each undo is one audit
record ("undo").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Final

from stockade.supervisor.errors import NotFound, SandboxNotFound
from stockade.supervisor.keys import sandbox_id, shown, split
from stockade.supervisor.keys import validate_scoped as validate_key
from stockade.supervisor.sandboxes.parts import Parts
from stockade.supervisor.sandboxes.snapshots.capture import Cache, Known
from stockade.supervisor.sandboxes.snapshots.diffs import TreeDiff, diff_trees
from stockade.supervisor.sandboxes.snapshots.held import acquired
from stockade.supervisor.sandboxes.snapshots.operations import Snapshots, owner_of
from stockade.supervisor.sandboxes.snapshots.repository import NOW_PREFIX, SnapshotStore

log = logging.getLogger("stockade.checkpoints")
MiB: Final = 1 << 20
MAX_LEDGER: Final = 1000
"""Entries a ledger holds at most whatever the config says ([checkpoints] keep's bound)."""


MAX_CACHED: Final = 64
"""Sandboxes whose last checkpoint's file keys and walk's records are kept in memory (about
300 bytes a file, half of it the records: 3 MiB for 10,000 files); others read their newest
manifest instead (and their next walk looks at each entry in Python)."""


class CheckpointNotFound(NotFound):
    pass


@dataclass(frozen=True)
class Checkpoint:
    name: str
    call_id: str
    tool: str
    created: float
    read_bytes: int
    """What its pass read into the store: the content it may have added."""


@dataclass(frozen=True)
class Undo:
    """An undo, shown or done: the checkpoint it goes back to and what it takes back."""

    checkpoint: Checkpoint
    diff: TreeDiff
    applied: bool


class Ledger:
    """A sandbox's checkpoints, oldest first, and the names of those dropped but not yet
    deleted from the store, in one JSON file (blocking: through a thread)."""

    def __init__(self, store: SnapshotStore, owner: str, lineage: str) -> None:
        self.path = store.root / owner / "checkpoints" / f"{lineage}.json"

    def read(self) -> tuple[list[Checkpoint], list[str]]:
        try:
            raw = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return [], []
        points = [Checkpoint(**one) for one in raw["points"][-MAX_LEDGER:]]
        return points, [str(n) for n in raw["dropped"][:MAX_LEDGER]]

    def load(self) -> list[Checkpoint]:
        return self.read()[0]

    def save(self, points: list[Checkpoint], dropped: list[str] | None = None) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        body = {"points": [asdict(p) for p in points], "dropped": dropped or []}
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.path)


def bound(
    points: list[Checkpoint], keep: int, max_bytes: int
) -> tuple[list[Checkpoint], list[Checkpoint]]:
    """(kept, dropped): the oldest dropped while there are more than `keep`, or while their
    read bytes pass `max_bytes` (0: no such bound); the newest is always kept."""
    kept = list(points)
    dropped: list[Checkpoint] = []
    total = sum(p.read_bytes for p in kept)
    while len(kept) > 1 and (len(kept) > keep or (max_bytes and total > max_bytes)):
        gone = kept.pop(0)
        total -= gone.read_bytes
        dropped.append(gone)
    return kept, dropped


def add(
    store: SnapshotStore, owner: str, lineage: str, point: Checkpoint, keep: int, max_bytes: int
) -> list[str]:
    """Put `point` in the sandbox's ledger and drop what the bounds say (quick: the call
    waits for it); the names to delete from the store (collect)."""
    ledger = Ledger(store, owner, lineage)
    points, pending = ledger.read()
    kept, dropped = bound([*points, point], keep, max_bytes)
    pending = [*pending, *(g.name for g in dropped)]
    ledger.save(kept, pending)
    return pending


def collect(store: SnapshotStore, owner: str, lineage: str) -> list[str]:
    """Delete from the store the checkpoints the ledger dropped (content no other capture
    uses goes with them); what a crash left undeleted is deleted by the next one."""
    ledger = Ledger(store, owner, lineage)
    _, pending = ledger.read()
    for name in pending:
        with contextlib.suppress(NotFound):
            store.delete(owner, name)
    points, _ = ledger.read()
    ledger.save(points, [])
    return pending


class Checkpoints:
    def __init__(self, parts: Parts, snapshots: Snapshots) -> None:
        self._parts = parts
        self._snapshots = snapshots
        self._pruning: set[asyncio.Task[None]] = set()
        self._ledgers: dict[str, asyncio.Lock] = {}
        self._caches: dict[str, tuple[str, Cache, Known]] = {}
        """Per key: its newest checkpoint's name, file keys and walk's records, so that the
        next one reads no manifest (used only while that checkpoint is still in the store)."""

    @property
    def store(self) -> SnapshotStore:
        return self._snapshots.store

    def wanted(self, tenant: str) -> bool:
        return self._parts.host.snapshots and self._parts.config.checkpoints_on(tenant)

    async def before_call(self, key: str, call_id: str, tool: str) -> str:
        """Take a checkpoint of the key's workspace before its call; its name, or "" when the
        key has no workspace yet (nothing to take back) or checkpoints are off for it."""
        tenant = split(key)[0]
        if not self.wanted(tenant):
            return ""
        config = self._parts.config.checkpoints
        name = f"~ckpt-{secrets.token_hex(8)}"
        owner, lineage = owner_of(tenant), sandbox_id(key)
        cache = self._caches.get(key)
        ledger_written = asyncio.Event()  # the manifest is written after the ledger
        try:
            try:
                taken = await self._snapshots._capture(
                    key, name, False, 0, precopy=False, freeze=config.freeze, cache=cache,
                    want_keys=True, compresslevel=1, later=self._pruning, gate=ledger_written,
                )  # fmt: skip
            except SandboxNotFound:
                return ""
            self._caches.pop(key, None)
            self._caches[key] = (name, taken.keys, taken.known)
            while len(self._caches) > MAX_CACHED:  # the least recently checkpointed go
                del self._caches[next(iter(self._caches))]
            point = Checkpoint(name, call_id, tool, time.time(), taken.stats.bytes_read)
            # The ledger's holder (an undo, a collect) may wait for the store, which this
            # capture's manifest holds until the gate opens: opened when the ledger is not
            # free at once, so that nothing waits in a circle.
            async with acquired(self._ledger(key), ledger_written.set):
                pending = await asyncio.to_thread(
                    add, self.store, owner, lineage, point, config.keep, config.max_mb * MiB
                )
        finally:
            ledger_written.set()
        if pending:  # dropped ones leave the store off the call's path
            task = asyncio.create_task(self._collect(key, owner, lineage))
            self._pruning.add(task)
            task.add_done_callback(self._pruning.discard)
        return name

    async def settled(self) -> None:
        """Every manifest and deletion begun has ended (before an undo; tests)."""
        while self._pruning:
            await asyncio.gather(*list(self._pruning), return_exceptions=True)

    async def _collect(self, key: str, owner: str, lineage: str) -> None:
        async with self._ledger(key):
            try:
                await self._snapshots.held.run(owner, collect, self.store, owner, lineage)
            except Exception:  # left in the ledger's dropped list: the next collect retries
                log.exception("dropping old checkpoints of %s", shown(key))

    def _ledger(self, key: str) -> asyncio.Lock:
        return self._ledgers.setdefault(key, asyncio.Lock())

    async def undo(self, key: str, to_call: str, *, apply: bool, reason: str = "") -> Undo:
        """Show (apply=False) or do the undo of the key's files to the checkpoint before the
        call `to_call` ("": the newest checkpoint)."""
        validate_key(key)
        tenant = split(key)[0]
        self._snapshots._allowed(tenant, "restore")
        owner = owner_of(tenant)
        await self.settled()
        async with self._ledger(key):
            ledger = Ledger(self.store, owner, sandbox_id(key))
            points, pending = await asyncio.to_thread(ledger.read)
            index = _find(points, to_call, key)
            point = points[index]
            diff = await self._diff(key, owner, point)
            if not apply:
                return Undo(point, diff, False)
            self._caches.pop(key, None)
            await self._restore(key, owner, point)
            gone = [*pending, *(p.name for p in points[index:])]
            await asyncio.to_thread(ledger.save, points[:index], gone)
            await self._snapshots.held.run(owner, collect, self.store, owner, sandbox_id(key))
        added, removed, changed = diff.counts
        self._parts.record(
            key, "undo",
            f"to before call {point.call_id} ({point.tool}): {added} added, {removed} removed, "
            f"{changed} changed taken back; {reason}".rstrip("; "),
        )  # fmt: skip
        return Undo(point, diff, True)

    async def _diff(self, key: str, owner: str, point: Checkpoint) -> TreeDiff:
        """What changed since the checkpoint: a transient capture of now, compared."""
        freeze = self._parts.config.checkpoints.freeze
        snaps = self._snapshots
        async with snaps.held_capture(key, owner, NOW_PREFIX, precopy=False, freeze=freeze) as now:
            before = await asyncio.to_thread(self.store.tree, owner, point.name)
            after = await asyncio.to_thread(self.store.tree, owner, now.snapshot.name)
            return await asyncio.to_thread(
                diff_trees, before, after, lambda d, n: self.store.content(owner, d, n)
            )

    async def _restore(self, key: str, owner: str, point: Checkpoint) -> None:
        snaps, parts = self._snapshots, self._parts
        snap = await asyncio.to_thread(self.store.get, owner, point.name)
        async with parts.lock(key):
            snaps._quarantines.refuse(key)
            old = parts.registry.get(key)
            network, profile = snaps._inventory.settings_of(key)
            await snaps._into(key, owner, point.name, snap, old, network, profile)


def _find(points: list[Checkpoint], to_call: str, key: str) -> int:
    if not points:
        raise CheckpointNotFound(f"sandbox {shown(key)!r} has no checkpoint to go back to")
    if not to_call:
        return len(points) - 1
    for index in range(len(points) - 1, -1, -1):
        if points[index].call_id == to_call:
            return index
    raise CheckpointNotFound(
        f"no checkpoint before call {to_call!r} in sandbox {shown(key)!r} (it took none, or it "
        "was dropped: [checkpoints] keep, max_mb)"
    )
