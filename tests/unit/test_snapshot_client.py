"""The clients' snapshot calls against a stand-in SandboxService on loopback: what each
method sends, what it makes of the reply (every field of SnapshotInfo, the list's quota,
a restore's and a fork's sandboxes), sandbox handles, and the new status codes' errors."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from stockade.client import (
    AlreadyExists,
    AsyncStockade,
    Forked,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Restored,
    SandboxInfo,
    SnapshotInfo,
    SnapshotList,
    Stockade,
    Unimplemented,
)
from stockade.client._snapshots import snapshot_from_pb
from stockade.v1 import sandbox_pb2
from tests.unit.fake_snapshots import CREATED, FakeSandboxService, serving, snapshot_pb


@pytest.fixture
def service() -> Iterator[tuple[FakeSandboxService, str]]:
    with serving() as served:
        yield served


def expected_info(name: str, source_key: str = "src") -> SnapshotInfo:
    return SnapshotInfo(
        name=name, source_key=source_key, created_at=CREATED, files=3, entries=5, bytes=4096,
        includes_tmp=True, includes_memory=False, skipped=("run/app.sock", "fifo"),
        frozen_seconds=0.0125, files_read_frozen=2,
    )  # fmt: skip


def test_every_field_of_a_snapshot_is_converted() -> None:
    info = snapshot_from_pb(snapshot_pb("before", "demo"))
    assert info == expected_info("before", "demo")
    assert info.created_at.tzinfo is UTC
    unset = snapshot_from_pb(sandbox_pb2.SnapshotInfo(name="x"))
    assert (unset.created_at, unset.skipped, unset.frozen_seconds) == (
        datetime(1970, 1, 1, tzinfo=UTC), (), 0.0,
    )  # fmt: skip


def test_the_sync_client_sends_and_converts_each_call(
    service: tuple[FakeSandboxService, str],
) -> None:
    fake, target = service
    with Stockade(target) as client:
        taken = client.snapshot_sandbox("demo", "before", include_tmp=True)
        named = client.snapshot_sandbox("demo")
        listing = client.list_snapshots()
        only_b = client.list_snapshots("b")
        freed = client.delete_snapshot("before")
        restored = client.restore_sandbox("demo", "before")
        created = client.restore_sandbox("fresh", "before")
        forked = client.fork_sandbox("demo", ["f1", "f2"], include_tmp=True)
    assert taken == expected_info("before", "demo")
    assert named.name == "snap-20261125T200102.123Z"
    assert isinstance(listing, SnapshotList)
    assert [s.name for s in listing.snapshots] == ["one", "two"]
    assert listing.snapshots[1].includes_memory is True
    assert (listing.count, listing.bytes, listing.max_count, listing.max_bytes) == (
        2, 6000, 100, 10 << 30,
    )  # fmt: skip
    assert [s.name for s in only_b.snapshots] == ["two"]
    assert freed == 1234
    assert isinstance(restored, Restored)
    assert (restored.sandbox.key, restored.sandbox.state, restored.replaced) == (
        "demo", "RUNNING", True,
    )  # fmt: skip
    assert restored.snapshot == expected_info("before")
    assert created.replaced is False
    assert isinstance(forked, Forked)
    assert [(s.key, s.container_id) for s in forked.sandboxes] == [("f1", "c-f1"), ("f2", "c-f2")]
    assert all(isinstance(s, SandboxInfo) for s in forked.sandboxes)
    assert forked.capture.name == "fork-capture"
    sent = [(type(r).__name__, str(r).replace("\n", " ").strip()) for r in fake.requests]
    assert sent == [
        ("SnapshotSandboxRequest", 'key: "demo" name: "before" include_tmp: true'),
        ("SnapshotSandboxRequest", 'key: "demo"'),
        ("ListSnapshotsRequest", ""),
        ("ListSnapshotsRequest", 'source_key: "b"'),
        ("DeleteSnapshotRequest", 'name: "before"'),
        ("RestoreSandboxRequest", 'key: "demo" snapshot: "before"'),
        ("RestoreSandboxRequest", 'key: "fresh" snapshot: "before"'),
        ("ForkSandboxRequest",
         'source_key: "demo" new_keys: "f1" new_keys: "f2" include_tmp: true'),
    ]  # fmt: skip


async def test_the_asyncio_client_does_the_same(service: tuple[FakeSandboxService, str]) -> None:
    fake, target = service
    async with AsyncStockade(target) as client:
        taken = await client.snapshot_sandbox("demo", "before", include_tmp=True)
        listing = await client.list_snapshots("a")
        freed = await client.delete_snapshot("before")
        restored = await client.restore_sandbox("fresh", "before")
        forked = await client.fork_sandbox("demo", ("f1",))
        with pytest.raises(AlreadyExists):
            await client.fork_sandbox("demo", ["f1", "taken"])
    assert taken == expected_info("before", "demo")
    assert [s.name for s in listing.snapshots] == ["one"]
    assert freed == 1234
    assert (restored.sandbox.key, restored.replaced) == ("fresh", False)
    assert [s.key for s in forked.sandboxes] == ["f1"]
    assert len(fake.requests) == 6


def test_sandbox_handles_snapshot_restore_and_fork(
    service: tuple[FakeSandboxService, str],
) -> None:
    fake, target = service
    with Stockade(target) as client:
        box = client.sandbox("demo")
        assert box.snapshot("before", include_tmp=True) == expected_info("before", "demo")
        assert box.restore("before").sandbox.key == "demo"
        forks = box.fork("f1", "f2")
        assert [(f.key, f.client) for f in forks] == [("f1", client), ("f2", client)]
        assert box.fork("f3", include_tmp=True)[0].key == "f3"
    assert fake.requests[-1].include_tmp is True
    assert list(fake.requests[2].new_keys) == ["f1", "f2"]


async def test_async_sandbox_handles(service: tuple[FakeSandboxService, str]) -> None:
    _, target = service
    async with AsyncStockade(target) as client:
        box = client.sandbox("demo")
        assert (await box.snapshot()).source_key == "demo"
        assert (await box.restore("before")).replaced is True
        forks = await box.fork("f1", "f2")
        assert [(f.key, f.client) for f in forks] == [("f1", client), ("f2", client)]


@pytest.mark.parametrize(
    ("call", "cls", "code", "reason"),
    [
        (lambda c: c.snapshot_sandbox("demo", "taken"), AlreadyExists, "ALREADY_EXISTS",
         "ALREADY_EXISTS"),
        (lambda c: c.snapshot_sandbox("demo", include_memory=True), Unimplemented,
         "UNIMPLEMENTED", "MEMORY_CHECKPOINT_UNAVAILABLE"),
        (lambda c: c.snapshot_sandbox("forbidden"), PermissionDenied, "PERMISSION_DENIED",
         "POLICY_DENIED"),
        (lambda c: c.restore_sandbox("demo", "missing"), NotFound, "NOT_FOUND",
         "SNAPSHOT_NOT_FOUND"),
        (lambda c: c.delete_snapshot("missing"), NotFound, "NOT_FOUND", "SNAPSHOT_NOT_FOUND"),
        (lambda c: c.fork_sandbox("demo", ["ok", "taken"]), AlreadyExists, "ALREADY_EXISTS",
         "ALREADY_EXISTS"),
    ],
)  # fmt: skip
def test_refusals_are_the_specific_client_errors(
    service: tuple[FakeSandboxService, str], call: Any, cls: type, code: str, reason: str
) -> None:
    _, target = service
    with Stockade(target) as client, pytest.raises(cls) as caught:
        call(client)
    assert (type(caught.value), caught.value.code, caught.value.reason) == (cls, code, reason)
    assert str(caught.value).startswith(f"{code}: ")


def test_a_lone_string_of_new_keys_is_refused_before_sending(
    service: tuple[FakeSandboxService, str],
) -> None:
    fake, target = service
    with Stockade(target) as client, pytest.raises(InvalidArgument, match="not one string"):
        client.fork_sandbox("demo", "abc")
    assert fake.requests == []
