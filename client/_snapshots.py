"""Snapshots of sandboxes' files (SandboxService's SnapshotSandbox, ListSnapshots,
DeleteSnapshot, RestoreSandbox and ForkSandbox): the result types, their conversion from
protobuf and the requests, shared by the sync and the asyncio client. Kept apart from _core
so that module does not grow further."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from stockade.client._core import InvalidArgument, SandboxInfo, sandbox_from_pb
from stockade.v1 import sandbox_pb2


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot of a sandbox's files (its workspace, and its /tmp when includes_tmp)."""

    name: str
    source_key: str
    """The key the snapshot was taken of."""
    created_at: datetime
    files: int
    """Regular files captured."""
    entries: int
    """All entries captured: files, folders and symbolic links."""
    bytes: int
    """The files' total size, before deduplication (what a restore writes)."""
    includes_tmp: bool
    includes_memory: bool
    skipped: tuple[str, ...]
    """Entries not captured (fifos, sockets, devices), as paths below the workspace."""
    frozen_seconds: float
    """Only in the reply of a snapshot or a fork (0 in a listing): how long the sandbox was
    frozen for the capture's final pass."""
    files_read_frozen: int
    """Likewise: files read while frozen (those changed since the first pass or an earlier
    snapshot)."""


@dataclass(frozen=True)
class SnapshotList:
    """The tenant's snapshots, oldest first, and what they take of its quota."""

    snapshots: list[SnapshotInfo]
    count: int
    bytes: int
    """Bytes on disk for all of them, after deduplication."""
    max_count: int
    """The tenant's limits; 0: none."""
    max_bytes: int


@dataclass(frozen=True)
class Restored:
    """A restore: the sandbox as it is now, the snapshot its files came from, and whether it
    replaced an existing sandbox (False: the key was created from the snapshot)."""

    sandbox: SandboxInfo
    snapshot: SnapshotInfo
    replaced: bool


@dataclass(frozen=True)
class Rollback:
    """An undo (RollbackSandbox), shown or done: the call whose checkpoint it goes back to,
    and what changed since, which it takes back."""

    call_id: str
    tool: str
    checkpoint_time: datetime | None
    added: list[str]
    removed: list[str]
    changed: list[str]
    counts: tuple[int, int, int]
    """(added, removed, changed): exact, the lists may be cut."""
    diff: str
    """A unified diff from the checkpoint (a/) to now (b/)."""
    applied: bool


@dataclass(frozen=True)
class Forked:
    """A fork: the new sandboxes in the order their keys were given, and the one capture of
    the source they were all made from (not kept: it is not listed)."""

    sandboxes: list[SandboxInfo]
    capture: SnapshotInfo


def snapshot_from_pb(msg: Any) -> SnapshotInfo:
    return SnapshotInfo(
        name=msg.name,
        source_key=msg.source_key,
        created_at=msg.created_at.ToDatetime(tzinfo=UTC),
        files=msg.files,
        entries=msg.entries,
        bytes=msg.bytes,
        includes_tmp=msg.includes_tmp,
        includes_memory=msg.includes_memory,
        skipped=tuple(msg.skipped),
        frozen_seconds=msg.frozen_seconds,
        files_read_frozen=msg.files_read_frozen,
    )


def snapshot_list_from_pb(msg: Any) -> SnapshotList:
    return SnapshotList(
        snapshots=[snapshot_from_pb(s) for s in msg.snapshots],
        count=msg.count,
        bytes=msg.bytes,
        max_count=msg.max_count,
        max_bytes=msg.max_bytes,
    )


def restored_from_pb(msg: Any) -> Restored:
    return Restored(
        sandbox=sandbox_from_pb(msg.sandbox),
        snapshot=snapshot_from_pb(msg.snapshot),
        replaced=msg.replaced,
    )


def rollback_from_pb(msg: Any) -> Rollback:
    when = msg.checkpoint_time.ToDatetime(tzinfo=UTC) if msg.HasField("checkpoint_time") else None
    return Rollback(
        call_id=msg.call_id, tool=msg.tool, checkpoint_time=when,
        added=list(msg.added), removed=list(msg.removed), changed=list(msg.changed),
        counts=(msg.added_count, msg.removed_count, msg.changed_count),
        diff=msg.diff, applied=msg.applied,
    )  # fmt: skip


def rollback_request(key: str, to_call_id: str, apply: bool) -> Any:
    return sandbox_pb2.RollbackSandboxRequest(key=key, to_call_id=to_call_id, apply=apply)


def forked_from_pb(msg: Any) -> Forked:
    return Forked(
        sandboxes=[sandbox_from_pb(s) for s in msg.sandboxes],
        capture=snapshot_from_pb(msg.capture),
    )


def snapshot_request(key: str, name: str, include_tmp: bool, include_memory: bool) -> Any:
    return sandbox_pb2.SnapshotSandboxRequest(
        key=key, name=name, include_tmp=include_tmp, include_memory=include_memory
    )


def list_request(source_key: str) -> Any:
    return sandbox_pb2.ListSnapshotsRequest(source_key=source_key)


def delete_request(name: str) -> Any:
    return sandbox_pb2.DeleteSnapshotRequest(name=name)


def restore_request(key: str, snapshot: str) -> Any:
    return sandbox_pb2.RestoreSandboxRequest(key=key, snapshot=snapshot)


def fork_request(
    source_key: str, new_keys: Sequence[str], include_tmp: bool, include_memory: bool
) -> Any:
    """A lone string is refused rather than forked into one sandbox per character."""
    if isinstance(new_keys, str | bytes):
        raise InvalidArgument(
            "new_keys must be a sequence of keys, not one string: write [key]", code="CLIENT"
        )
    return sandbox_pb2.ForkSandboxRequest(
        source_key=source_key,
        new_keys=list(new_keys),
        include_tmp=include_tmp,
        include_memory=include_memory,
    )
