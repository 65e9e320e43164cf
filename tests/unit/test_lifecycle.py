"""The one lifecycle path (calls/lifecycle.py): every change a front asks for is exactly one
audit record naming the front and the caller, done or refused; housekeeping's own changes
stay housekeeping's. And refused authentication (observe/refusals.py): one record per front
and address per window with a count, bounded however many refusals and addresses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stockade.supervisor.calls.lifecycle import (
    DESTROY,
    ENSURE,
    PAUSE,
    QUARANTINE,
    RELEASE,
    RESUME,
    Actor,
    Lifecycle,
)
from stockade.supervisor.config import Config
from stockade.supervisor.errors import InvalidRequest, SandboxNotFound
from stockade.supervisor.keys import scope
from stockade.supervisor.observe.alarms import Alarm
from stockade.supervisor.observe.audit import AuditRecord
from stockade.supervisor.observe.refusals import MAX_ADDRESSES, OTHERS, TOOL, Refusals
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.supervisor.sandboxes.quarantine import MAX_REASON
from tests.unit.fakes import Audited, FakeBackend, fake_manager, quiet_housekeeping

WHO = Actor("grpc", "ipv4:127.0.0.1:5000")
KEY = scope("acme", "k")


class Setup:
    """A manager on a fake engine (its housekeeping events kept) and a Lifecycle over it."""

    def __init__(self, tmp_path: Path) -> None:
        self.housekeeping: list[tuple[str, ...]] = []
        config = Config(
            state_dir=tmp_path,
            sandbox=Config().sandbox.__class__(user="1000:1000"),
            housekeeping=quiet_housekeeping(),
        )
        self.manager: SandboxManager = fake_manager(
            config, FakeBackend(), record_event=lambda *event: self.housekeeping.append(event)
        )
        self.audit = Audited()
        self.sounded: list[Alarm] = []
        self.lifecycle = Lifecycle(self.manager, self.audit, self.sounded.append)

    def seen(self) -> list[tuple[str, str, str, bool]]:
        return [(r.tool, r.front, r.caller, r.is_error) for r in self.audit.records]


async def test_each_change_is_one_record_naming_front_and_caller(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    life = s.lifecycle
    assert await life.ensure(WHO, KEY) is True  # made
    assert await life.ensure(WHO, KEY) is False  # running already: recorded, nothing made
    assert (await life.pause(WHO, KEY))[1] is True
    assert (await life.resume(WHO, KEY))[1] is True
    await life.quarantine(WHO, KEY, "odd traffic")
    await life.release(WHO, KEY)
    assert await life.destroy(WHO, KEY, delete_workspace=True) == (True, True)
    tools = [ENSURE, ENSURE, PAUSE, RESUME, QUARANTINE, RELEASE, DESTROY]
    assert s.seen() == [(t, "grpc", WHO.caller, False) for t in tools]
    assert s.housekeeping == []  # no second record of any of them
    assert {r.sandbox_key for r in s.audit.records} == {KEY}  # the tenant's, split on write
    made = json.loads(s.audit.records[0].arguments_json)
    assert made == {"key": "k"}
    assert [a.where for a in s.sounded] == ["operator"]  # a quarantine by hand's alarm
    assert "odd traffic" in s.sounded[0].detail
    assert WHO.caller in s.sounded[0].detail


async def test_a_refused_change_is_one_record_with_its_code(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    with pytest.raises(SandboxNotFound):
        await s.lifecycle.pause(WHO, KEY)
    with pytest.raises(SandboxNotFound):
        await s.lifecycle.destroy(WHO, KEY, delete_workspace=False)
    await s.lifecycle.ensure(WHO, KEY)
    with pytest.raises(InvalidRequest):
        await s.lifecycle.quarantine(WHO, KEY, "x" * (MAX_REASON + 1))
    assert s.seen() == [
        (PAUSE, "grpc", WHO.caller, True),
        (DESTROY, "grpc", WHO.caller, True),
        (ENSURE, "grpc", WHO.caller, False),
        (QUARANTINE, "grpc", WHO.caller, True),
    ]
    codes = [r.error_code for r in s.audit.records]
    assert codes == ["SANDBOX_NOT_FOUND", "SANDBOX_NOT_FOUND", "", "INVALID_REQUEST"]
    assert len(s.audit.records[-1].arguments_json) < MAX_REASON + 100  # the reason is cut
    assert not s.manager.quarantines.held
    assert s.sounded == []


async def test_missing_ok_destroy_and_a_quiet_retry(tmp_path: Path) -> None:
    """E2B's kill of a sandbox whose container is gone is no error (recorded); a retry of
    a failure already audited is not audited again."""
    s = Setup(tmp_path)
    assert await s.lifecycle.destroy(WHO, KEY, delete_workspace=True, missing_ok=True) == (
        False,
        False,
    )
    with pytest.raises(SandboxNotFound):
        await s.lifecycle.destroy(WHO, KEY, delete_workspace=True, audit_failure=False)
    assert s.seen() == [(DESTROY, "grpc", WHO.caller, False)]


async def test_housekeeping_changes_stay_housekeeping(tmp_path: Path) -> None:
    """A pause through the manager itself (housekeeping's idle pause, a call's resume) is
    still the manager's record, and never the lifecycle's."""
    s = Setup(tmp_path)
    await s.manager.ensure(KEY)
    await s.manager.pause(KEY, "idle for 1 s")
    await s.manager.ensure(KEY)  # a call resumes it
    assert [e[1] for e in s.housekeeping] == ["pause", "resume"]
    assert s.audit.records == []


def test_a_flood_of_refusals_is_one_record_per_window_with_its_count() -> None:
    audit, now = Audited(), [0.0]
    refusals = Refusals(audit, window_s=60, clock=lambda: now[0])
    for _ in range(1000):
        refusals.refused("console", "10.0.0.1", "wrong token")
    assert len(audit.records) == 1  # the first, at once
    now[0] = 59.0
    refusals.flush()
    assert len(audit.records) == 1  # its window has not ended
    now[0] = 60.0
    refusals.flush()
    first, rest = audit.records
    assert json.loads(first.arguments_json)["count"] == 1
    assert json.loads(rest.arguments_json)["count"] == 999
    for rec in audit.records:
        assert (rec.tool, rec.front, rec.caller) == (TOOL, "console", "10.0.0.1")
        assert (rec.error_code, rec.is_error) == ("UNAUTHENTICATED", True)
        assert rec.policy_step == "console: authentication refused: wrong token"
    refusals.refused("console", "10.0.0.1", "wrong token")  # a new window
    assert len(audit.records) == 3
    refusals.refused("grpc", "10.0.0.1", "invalid bearer token")  # each front its own
    assert len(audit.records) == 4


def test_many_addresses_are_bounded_and_closing_loses_no_count() -> None:
    audit = Audited()
    refusals = Refusals(audit, clock=lambda: 0.0)
    for n in range(MAX_ADDRESSES + 500):
        for _ in range(3):
            refusals.refused("mcp", f"10.{n >> 16}.{(n >> 8) & 255}.{n & 255}", "missing")
    # each counted address's first, then one for all the others together
    assert len(audit.records) == MAX_ADDRESSES + 1
    assert audit.records[-1].caller == OTHERS
    refusals.close()
    counts = [json.loads(r.arguments_json)["count"] for r in audit.records]
    assert sum(counts) == 3 * (MAX_ADDRESSES + 500)
    assert len(audit.records) <= 2 * (MAX_ADDRESSES + 1)


def test_a_refusal_never_fails_and_never_holds_the_token() -> None:
    class Broken:
        def record(self, rec: AuditRecord) -> None:
            raise OSError("disk full")

    Refusals(Broken()).refused("grpc", "::1", "invalid bearer token")  # logged, answered
    Refusals(None).refused("grpc", "::1", "invalid bearer token")  # audit off
    audit = Audited()
    Refusals(audit).refused("e2b", "", "x" * 10_000)
    (rec,) = audit.records
    assert rec.caller == "?"
    assert len(rec.policy_step) < 300
