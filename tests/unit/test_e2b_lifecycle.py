"""The E2B front's sandbox lifecycle on a fake engine: a paused sandbox answers envd with 502
(E2B's edge) unless it was created with auto_resume, which resumes it (one record);
lifecycle.on_timeout "pause" pauses at the end instead of removing; the create options'
checks. Served for real, with the real SDK, in tests/integration/test_e2b_lifecycle.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor.calls.lifecycle import PAUSE, RESUME
from stockade.supervisor.config import Config
from stockade.supervisor.fronts.e2b.connect import ConnectError
from stockade.supervisor.fronts.e2b.control import Control, lifecycle_of
from stockade.supervisor.fronts.e2b.envd_process import until_gone
from stockade.supervisor.fronts.e2b.records import PAUSED, RUNNING, Records
from stockade.supervisor.fronts.e2b.server import Dispatch
from stockade.supervisor.fronts.e2b.wire import ApiError
from stockade.supervisor.observe.audit import AuditRecord
from tests.unit.fakes import e2b_context
from tests.unit.test_e2b_front import Recorder, call, sandbox


@pytest.mark.parametrize(
    ("body", "wanted"),
    [
        ({}, (False, False)),
        ({"autoPause": False}, (False, False)),
        ({"autoPause": True}, (True, False)),
        ({"autoPause": True, "autoPauseMemory": False}, (True, False)),
        ({"autoPause": True, "autoResume": {"enabled": True}}, (True, True)),
        ({"autoPause": True, "autoResume": {"enabled": False}}, (True, False)),
    ],
)
def test_lifecycle_options(body: dict[str, Any], wanted: tuple[bool, bool]) -> None:
    assert lifecycle_of(body) == wanted


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"autoPause": "yes"}, "autoPause must be a boolean"),
        ({"autoPause": True, "autoPauseMemory": 1}, "autoPauseMemory must be a boolean"),
        ({"autoPause": True, "autoResume": True}, "autoResume must be an object"),
        ({"autoPause": True, "autoResume": {"enabled": "1"}}, "enabled must be a boolean"),
        ({"autoResume": {"enabled": True}}, "needs lifecycle.on_timeout 'pause'"),
        (
            {"autoPause": True, "autoPauseMemory": False, "autoResume": {"enabled": True}},
            "filesystem-only pause cannot be auto-resumed",
        ),
    ],
)
def test_forged_lifecycle_options_are_refused(body: dict[str, Any], says: str) -> None:
    with pytest.raises(ApiError) as refused:
        lifecycle_of(body)
    assert refused.value.status == 400
    assert says in refused.value.message


class Kept:
    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def record(self, record: AuditRecord) -> None:
        self.records.append(record)


def _control(tmp_path: Path) -> tuple[Control, Records, Kept]:
    records = Records(None)
    ctx = e2b_context(Config(state_dir=tmp_path), records)
    kept = Kept()
    ctx.policy = replace(ctx.policy, audit=kept)
    return Control(ctx), records, kept


async def test_a_paused_sandbox_answers_502_until_resumed(tmp_path: Path) -> None:
    control, records, kept = _control(tmp_path)
    paused = sandbox(started=time.time(), state=PAUSED)
    await records.add(paused)
    envd = Recorder()
    app = Dispatch(control.ctx, Recorder(), envd, control)
    headers = {"E2b-Sandbox-Id": paused.sandbox_id, "X-Access-Token": paused.access_token}
    for path in ("/health", "/process.Process/List", "/files"):
        status, body = await call(app, headers, path=path)
        assert status == 502
        assert body is not None
        assert "was not found: it is paused" in body["message"]
    assert envd.scopes == []  # nothing reached envd, nothing resumed it
    assert paused.state == PAUSED
    assert kept.records == []


async def test_auto_resume_resumes_on_the_first_envd_request(tmp_path: Path) -> None:
    control, records, kept = _control(tmp_path)
    woken = sandbox(started=time.time(), auto_pause=True, auto_resume=True)
    await records.add(woken)
    manager = control.ctx.manager
    await manager.ensure(woken.key)
    await manager.pause(woken.key, "test", recorded=False)
    woken.state = PAUSED
    envd = Recorder()
    app = Dispatch(control.ctx, Recorder(), envd, control)
    headers = {"E2b-Sandbox-Id": woken.sandbox_id, "X-Access-Token": woken.access_token}
    status, _ = await call(app, headers)
    assert status == 204
    assert len(envd.scopes) == 1
    assert woken.state == RUNNING
    assert not manager.registry[woken.key].paused
    (resumed,) = kept.records
    assert (resumed.tool, resumed.front) == (RESUME, "e2b")
    assert json.loads(resumed.arguments_json)["as"] == "auto_resume"
    status, _ = await call(app, headers)  # running now: no second record
    assert status == 204
    assert len(kept.records) == 1


async def test_on_timeout_pause_pauses_at_the_end_then_removes(tmp_path: Path) -> None:
    control, records, kept = _control(tmp_path)
    now = time.time()
    kept_one = sandbox(started=now, end_at=now - 1, auto_pause=True)
    killed = sandbox(started=now, end_at=now - 1)
    for one in (kept_one, killed):
        await records.add(one)
        await control.ctx.manager.ensure(one.key)
    assert not kept_one.ended(time.time())  # reachable until the sweep has paused it
    assert await control.expire() == 1  # the one without on_timeout pause
    assert records.by_id(killed.sandbox_id) is None
    assert records.by_id(kept_one.sandbox_id) is kept_one
    assert kept_one.state == PAUSED
    assert control.ctx.manager.registry[kept_one.key].paused
    assert kept_one.end_at >= now + control.max_timeout - 5
    paused = [r for r in kept.records if r.tool == PAUSE]
    assert len(paused) == 1
    assert paused[0].caller == "supervisor"
    assert json.loads(paused[0].arguments_json)["as"] == "timeout"
    assert await control.expire() == 0  # paused, within its keeping: left alone
    kept_one.end_at = time.time() - 1
    assert kept_one.ended(time.time())
    assert await control.expire() == 1  # paused and past its keeping: removed
    assert records.by_id(kept_one.sandbox_id) is None


async def test_on_timeout_pause_survives_a_restart(tmp_path: Path) -> None:
    records = Records(tmp_path)
    one = sandbox(auto_pause=True, auto_resume=True)
    await records.add(one)
    again = Records(tmp_path).by_id(one.sandbox_id)
    assert again is not None
    assert (again.auto_pause, again.auto_resume) == (True, True)


async def test_a_kill_ends_the_open_streams_as_e2bs_edge_does() -> None:
    """A stream of a sandbox that is killed mid-command ends at once with an `unavailable`
    that names no cause (the SDK probes /health, finds 502 "was not found" and reports the
    sandbox killed), not with whatever the pipeline would say later."""
    gone = asyncio.Event()
    blocked = asyncio.Event()

    async def events() -> AsyncIterator[int]:
        yield 1
        yield 2
        await blocked.wait()  # a `sleep 60` that never ends on its own
        yield 3

    got: list[int] = []
    stream = until_gone(events(), gone, "sbx0")
    got.append(await anext(stream))
    got.append(await anext(stream))
    later = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    gone.set()
    with pytest.raises(ConnectError) as dropped:
        await later
    assert got == [1, 2]
    assert dropped.value.code == "unavailable"
    assert "ended before the stream completed" in dropped.value.message
    assert "was not found" not in dropped.value.message  # else the SDK would skip its probe


async def test_a_stream_that_ends_first_ends_cleanly() -> None:
    async def events() -> AsyncIterator[int]:
        yield 1

    assert [e async for e in until_gone(events(), asyncio.Event(), "sbx0")] == [1]


async def test_a_pause_at_the_timeout_ends_the_open_streams(tmp_path: Path) -> None:
    """The front's pause tells envd (Processes.drop, tested with the real SDK in
    tests/integration/test_e2b_lifecycle.py): the sandbox's open streams end."""
    control, records, _kept = _control(tmp_path)
    one = sandbox(started=time.time())
    await records.add(one)
    dropped: list[str] = []
    control.ctx.pausers.append(dropped.append)
    await control.ctx.manager.ensure(one.key)
    await control.pause_at_timeout(one)
    assert dropped == [one.sandbox_id]


async def test_paused_on_record_before_the_freeze(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An envd call that comes while the container is being frozen is answered 502 (paused),
    not let through to a container that the call would then resume: get_info (the
    container's state) said paused while /health still answered 204 (seen under load)."""
    control, records, _kept = _control(tmp_path)
    now = time.time()
    one = sandbox(started=now, end_at=now - 1, auto_pause=True)  # the sweep's case
    await records.add(one)
    manager = control.ctx.manager
    await manager.ensure(one.key)
    app = Dispatch(control.ctx, Recorder(), Recorder(), control)
    headers = {"E2b-Sandbox-Id": one.sandbox_id, "X-Access-Token": one.access_token}
    during: list[int] = []
    ended: list[bool] = []
    freeze = manager.pause

    async def pause_watched(*args: Any, **kwargs: Any) -> Any:
        during.append((await call(app, headers, path="/health"))[0])
        ended.append(one.ended(time.time()))  # get_info then: 404 if it were
        return await freeze(*args, **kwargs)

    monkeypatch.setattr(manager, "pause", pause_watched)
    await control.pause_at_timeout(one)
    assert during == [502]
    assert ended == [False]  # paused on record, with its new end: still found
    assert one.state == PAUSED
    assert manager.registry[one.key].paused


async def test_a_failed_freeze_leaves_the_record_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control, records, _kept = _control(tmp_path)
    now = time.time()
    one = sandbox(started=now, end_at=now - 1, auto_pause=True)
    await records.add(one)
    manager = control.ctx.manager
    await manager.ensure(one.key)

    async def pause_fails(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the engine said no")

    monkeypatch.setattr(manager, "pause", pause_fails)
    with pytest.raises(RuntimeError):
        await control.pause_at_timeout(one)
    assert (one.state, one.end_at) == (RUNNING, now - 1)  # tried again at the next sweep
