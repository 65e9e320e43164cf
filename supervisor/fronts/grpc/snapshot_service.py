"""SandboxService's snapshot calls: take, list, delete, restore and fork, within the caller's
tenant (sandboxes/snapshots/operations.py does the work; policy and audit are there too)."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from stockade.supervisor.fronts.grpc.convert import sandbox_to_pb, scoped
from stockade.supervisor.fronts.grpc.interceptor import current_tenant
from stockade.supervisor.fronts.grpc.status import Context, mapped
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.supervisor.sandboxes.snapshots.checkpoints import Undo
from stockade.supervisor.sandboxes.snapshots.operations import Taken
from stockade.supervisor.sandboxes.snapshots.repository import Snapshot
from stockade.supervisor.text import wire_text
from stockade.v1 import sandbox_pb2


class SnapshotCalls:
    """The snapshot handlers of SandboxServicer."""

    _sandboxes: SandboxManager
    scrubber: Scrubber | None

    @mapped
    async def SnapshotSandbox(
        self, request: sandbox_pb2.SnapshotSandboxRequest, context: Context
    ) -> sandbox_pb2.SnapshotInfo:
        taken = await self._sandboxes.snapshots.snapshot(
            scoped(request.key), request.name,
            include_tmp=request.include_tmp, include_memory=request.include_memory,
            reason=f"SnapshotSandbox from {context.peer()}",
        )  # fmt: skip
        return snapshot_to_pb(taken.snapshot, taken)

    @mapped
    async def ListSnapshots(
        self, request: sandbox_pb2.ListSnapshotsRequest, context: Context
    ) -> sandbox_pb2.ListSnapshotsResponse:
        tenant = current_tenant()
        snapshots = self._sandboxes.snapshots
        found = await snapshots.listed(tenant, request.source_key)
        count, size, max_count, max_bytes = await snapshots.usage(tenant)
        return sandbox_pb2.ListSnapshotsResponse(
            snapshots=[snapshot_to_pb(s) for s in found],
            count=count, bytes=size, max_count=max_count, max_bytes=max_bytes,
        )  # fmt: skip

    @mapped
    async def DeleteSnapshot(
        self, request: sandbox_pb2.DeleteSnapshotRequest, context: Context
    ) -> sandbox_pb2.DeleteSnapshotResponse:
        freed = await self._sandboxes.snapshots.delete(
            current_tenant(), request.name, f"DeleteSnapshot from {context.peer()}"
        )
        return sandbox_pb2.DeleteSnapshotResponse(freed_bytes=freed)

    @mapped
    async def RestoreSandbox(
        self, request: sandbox_pb2.RestoreSandboxRequest, context: Context
    ) -> sandbox_pb2.RestoreSandboxResponse:
        info, snap, replaced = await self._sandboxes.snapshots.restore(
            scoped(request.key), request.snapshot, f"RestoreSandbox from {context.peer()}"
        )
        return sandbox_pb2.RestoreSandboxResponse(
            sandbox=sandbox_to_pb(info), snapshot=snapshot_to_pb(snap), replaced=replaced
        )

    @mapped
    async def RollbackSandbox(
        self, request: sandbox_pb2.RollbackSandboxRequest, context: Context
    ) -> sandbox_pb2.RollbackSandboxResponse:
        undo = await self._sandboxes.checkpoints.undo(
            scoped(request.key), request.to_call_id, apply=request.apply,
            reason=f"RollbackSandbox from {context.peer()}",
        )  # fmt: skip
        return undo_to_pb(undo, self.scrubber)

    @mapped
    async def ForkSandbox(
        self, request: sandbox_pb2.ForkSandboxRequest, context: Context
    ) -> sandbox_pb2.ForkSandboxResponse:
        infos, taken = await self._sandboxes.snapshots.fork(
            scoped(request.source_key), [scoped(k) for k in request.new_keys],
            include_tmp=request.include_tmp, include_memory=request.include_memory,
            reason=f"ForkSandbox from {context.peer()}",
        )  # fmt: skip
        return sandbox_pb2.ForkSandboxResponse(
            sandboxes=[sandbox_to_pb(i) for i in infos],
            capture=snapshot_to_pb(taken.snapshot, taken),
        )


def snapshot_to_pb(snap: Snapshot, taken: Taken | None = None) -> sandbox_pb2.SnapshotInfo:
    created = Timestamp()
    created.FromDatetime(datetime.fromtimestamp(snap.created, UTC))
    out = sandbox_pb2.SnapshotInfo(
        name="" if snap.transient else snap.name,
        source_key=snap.source,
        created_at=created,
        files=snap.files,
        entries=snap.entries,
        bytes=snap.bytes,
        includes_tmp="tmp" in snap.parts,
        includes_memory=False,
        skipped=list(snap.skipped),
    )
    if taken is not None:
        out.frozen_seconds = taken.frozen_s
        out.files_read_frozen = taken.stats.files_read
    return out


def undo_to_pb(undo: Undo, scrubber: Scrubber | None) -> sandbox_pb2.RollbackSandboxResponse:
    point, diff = undo.checkpoint, undo.diff
    when = Timestamp()
    when.FromDatetime(datetime.fromtimestamp(point.created, UTC))
    text = diff.text if scrubber is None else scrubber.scrub(diff.text)[0]
    added, removed, changed = diff.counts
    return sandbox_pb2.RollbackSandboxResponse(
        call_id=point.call_id, tool=point.tool, checkpoint_time=when,
        added=[wire_text(p) for p in diff.added],
        removed=[wire_text(p) for p in diff.removed],
        changed=[wire_text(p) for p in diff.changed],
        added_count=added, removed_count=removed, changed_count=changed,
        diff=wire_text(text), applied=undo.applied,
    )  # fmt: skip
