"""A stand-in SandboxService for the snapshot calls, served on loopback: it answers from
the requests' fields, keeps every request, and refuses some names with the server's status
codes and reasons (tests of the clients and of the snapshot commands)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc

from stockade.v1 import sandbox_pb2, sandbox_pb2_grpc

CREATED = datetime(2026, 11, 25, 20, 1, 2, 123000, tzinfo=UTC)
REFUSALS = {
    "taken": (grpc.StatusCode.ALREADY_EXISTS, "ALREADY_EXISTS"),
    "forbidden": (grpc.StatusCode.PERMISSION_DENIED, "POLICY_DENIED"),
    "missing": (grpc.StatusCode.NOT_FOUND, "SNAPSHOT_NOT_FOUND"),
}
"""Names (or keys) the stand-in refuses, with the status and reason it refuses them with."""


def snapshot_pb(name: str, source_key: str = "src", **extra: Any) -> Any:
    fields: dict[str, Any] = {
        "files": 3, "entries": 5, "bytes": 4096, "includes_tmp": True,
        "skipped": ["run/app.sock", "fifo"], "frozen_seconds": 0.0125, "files_read_frozen": 2,
    }  # fmt: skip
    msg = sandbox_pb2.SnapshotInfo(name=name, source_key=source_key, **(fields | extra))
    msg.created_at.FromDatetime(CREATED)
    return msg


def sandbox_pb(key: str) -> Any:
    return sandbox_pb2.SandboxInfo(
        key=key, container_id=f"c-{key}", engine="podman", state=sandbox_pb2.SANDBOX_STATE_RUNNING
    )


@dataclass
class FakeSandboxService(sandbox_pb2_grpc.SandboxServiceServicer):
    """Answers the snapshot calls from the requests' fields; keeps every request."""

    requests: list[Any] = field(default_factory=list)

    def _refuse(self, context: Any, *names: str) -> None:
        for name in names:
            if name in REFUSALS:
                code, reason = REFUSALS[name]
                context.set_trailing_metadata((("stockade-error-reason", reason),))
                context.abort(code, f"refused {name!r}")

    def SnapshotSandbox(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        self._refuse(context, request.name, request.key)
        if request.include_memory:
            context.set_trailing_metadata(
                (("stockade-error-reason", "MEMORY_CHECKPOINT_UNAVAILABLE"),)
            )
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "no CRIU on this host")
        if request.name == "sockets":
            return snapshot_pb("sockets", request.key, skipped=[f"s{i}.sock" for i in range(12)])
        return snapshot_pb(request.name or "snap-20261125T200102.123Z", request.key)

    def ListSnapshots(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        snapshots = [snapshot_pb("one", "a"), snapshot_pb("two", "b", includes_memory=True)]
        return sandbox_pb2.ListSnapshotsResponse(
            snapshots=[s for s in snapshots if request.source_key in ("", s.source_key)],
            count=2, bytes=6000, max_count=100, max_bytes=10 << 30,
        )  # fmt: skip

    def DeleteSnapshot(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        self._refuse(context, request.name)
        return sandbox_pb2.DeleteSnapshotResponse(freed_bytes=1234)

    def RestoreSandbox(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        self._refuse(context, request.snapshot)
        return sandbox_pb2.RestoreSandboxResponse(
            sandbox=sandbox_pb(request.key),
            snapshot=snapshot_pb(request.snapshot),
            replaced=request.key != "fresh",
        )

    def ForkSandbox(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        self._refuse(context, *request.new_keys)
        return sandbox_pb2.ForkSandboxResponse(
            sandboxes=[sandbox_pb(k) for k in request.new_keys],
            capture=snapshot_pb("fork-capture", request.source_key),
        )


@contextmanager
def serving() -> Iterator[tuple[FakeSandboxService, str]]:
    """The stand-in and its address."""
    fake = FakeSandboxService()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield fake, f"127.0.0.1:{port}"
    server.stop(None)
