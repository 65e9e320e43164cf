"""The snapshot calls of `Stockade` and `AsyncStockade`, as mixins (the two clients' modules
stay under 500 lines): each expects the class to have `_rpc` and `_sandboxes`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stockade.client import _snapshots
from stockade.client._snapshots import Forked, Restored, Rollback, SnapshotInfo, SnapshotList


class SnapshotCalls:
    """Snapshot calls of the blocking client."""

    _sandboxes: Any
    _rpc: Callable[..., Any]

    def snapshot_sandbox(
        self, key: str, name: str = "", *, include_tmp: bool = False, include_memory: bool = False
    ) -> SnapshotInfo:
        """Capture the sandbox's files (its workspace; its /tmp too with include_tmp, which
        needs a running or paused container) as a snapshot of the caller's tenant.

        The sandbox is frozen only for the capture's final pass: a first pass copies while it
        runs, the frozen one reads only what changed since (see frozen_seconds and
        files_read_frozen). A sandbox with only a workspace (no container) is captured as
        it is. `name`: 1 to 128 of A-Z a-z 0-9 . _ @ + -, starting with a letter or digit;
        empty: one made from the time ("snap-20261125T200102.123Z").

        AlreadyExists when the tenant has a snapshot of that name; ResourceExhausted past the
        tenant's snapshot count or bytes (nothing is kept); PermissionDenied when the tenant
        may not snapshot; Unimplemented (reason MEMORY_CHECKPOINT_UNAVAILABLE) for
        include_memory on a host without a working CRIU."""
        request = _snapshots.snapshot_request(key, name, include_tmp, include_memory)
        return _snapshots.snapshot_from_pb(self._rpc(self._sandboxes.SnapshotSandbox, request))

    def list_snapshots(self, source_key: str = "") -> SnapshotList:
        """The tenant's snapshots, oldest first (only those taken of `source_key` when
        given), and what they take of its quota."""
        request = _snapshots.list_request(source_key)
        return _snapshots.snapshot_list_from_pb(self._rpc(self._sandboxes.ListSnapshots, request))

    def delete_snapshot(self, name: str) -> int:
        """Delete a snapshot and the stored content no other snapshot of the tenant uses;
        returns the bytes the store gave back. NotFound when there is no such snapshot."""
        request = _snapshots.delete_request(name)
        return int(self._rpc(self._sandboxes.DeleteSnapshot, request).freed_bytes)

    def restore_sandbox(self, key: str, snapshot: str) -> Restored:
        """Make the key's files the snapshot's: its workspace is replaced (and /tmp, when
        the snapshot holds it) and its container re-created, so the old container's
        processes end. A key with no sandbox yet is created from the snapshot (replaced is
        then False). The snapshot may come from any sandbox of the tenant. A failure before
        the switch leaves the sandbox as it was."""
        request = _snapshots.restore_request(key, snapshot)
        return _snapshots.restored_from_pb(self._rpc(self._sandboxes.RestoreSandbox, request))

    def rollback_sandbox(self, key: str, to_call_id: str = "", *, apply: bool) -> Rollback:
        """Undo: with apply=False, what going back to the checkpoint before `to_call_id`
        (empty: the newest checkpoint) would take back; with apply=True, do it (the container
        is re-created: processes are not rolled back). NotFound when there is no checkpoint."""
        request = _snapshots.rollback_request(key, to_call_id, apply)
        return _snapshots.rollback_from_pb(self._rpc(self._sandboxes.RollbackSandbox, request))

    def fork_sandbox(
        self,
        source_key: str,
        new_keys: Sequence[str],
        *,
        include_tmp: bool = False,
        include_memory: bool = False,
    ) -> Forked:
        """New sandboxes, one per key of `new_keys` (1 to 64, all different), whose
        files are the source's at this moment: one frozen capture for all, the source
        running on. Each new key must be new (no container, no workspace): AlreadyExists
        otherwise, checked before anything is done. All or nothing: when one new sandbox
        cannot be made, those made are removed with their workspaces."""
        request = _snapshots.fork_request(source_key, new_keys, include_tmp, include_memory)
        return _snapshots.forked_from_pb(self._rpc(self._sandboxes.ForkSandbox, request))


class AsyncSnapshotCalls:
    """Snapshot calls of the asyncio client."""

    _sandboxes: Any
    _rpc: Callable[..., Any]

    async def snapshot_sandbox(
        self, key: str, name: str = "", *, include_tmp: bool = False, include_memory: bool = False
    ) -> SnapshotInfo:
        """The same as Stockade.snapshot_sandbox."""
        request = _snapshots.snapshot_request(key, name, include_tmp, include_memory)
        reply = await self._rpc(self._sandboxes.SnapshotSandbox, request)
        return _snapshots.snapshot_from_pb(reply)

    async def list_snapshots(self, source_key: str = "") -> SnapshotList:
        """The same as Stockade.list_snapshots."""
        request = _snapshots.list_request(source_key)
        reply = await self._rpc(self._sandboxes.ListSnapshots, request)
        return _snapshots.snapshot_list_from_pb(reply)

    async def delete_snapshot(self, name: str) -> int:
        """The same as Stockade.delete_snapshot."""
        request = _snapshots.delete_request(name)
        return int((await self._rpc(self._sandboxes.DeleteSnapshot, request)).freed_bytes)

    async def rollback_sandbox(self, key: str, to_call_id: str = "", *, apply: bool) -> Rollback:
        """The same as Stockade.rollback_sandbox."""
        request = _snapshots.rollback_request(key, to_call_id, apply)
        reply = await self._rpc(self._sandboxes.RollbackSandbox, request)
        return _snapshots.rollback_from_pb(reply)

    async def restore_sandbox(self, key: str, snapshot: str) -> Restored:
        """The same as Stockade.restore_sandbox."""
        request = _snapshots.restore_request(key, snapshot)
        reply = await self._rpc(self._sandboxes.RestoreSandbox, request)
        return _snapshots.restored_from_pb(reply)

    async def fork_sandbox(
        self,
        source_key: str,
        new_keys: Sequence[str],
        *,
        include_tmp: bool = False,
        include_memory: bool = False,
    ) -> Forked:
        """The same as Stockade.fork_sandbox."""
        request = _snapshots.fork_request(source_key, new_keys, include_tmp, include_memory)
        reply = await self._rpc(self._sandboxes.ForkSandbox, request)
        return _snapshots.forked_from_pb(reply)
