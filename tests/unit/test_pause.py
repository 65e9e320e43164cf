"""Pausing and resuming sandboxes against an in-memory engine: the state machine, a call's
resume (or refusal), idle pausing by housekeeping, adoption of a paused container, and
health probes that never take a paused sandbox for a wedged one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from stockade.supervisor.config import Config, SandboxConfig, load_config
from stockade.supervisor.engines.backends._common import info_from_inspect, set_paused
from stockade.supervisor.engines.backends.base import ContainerInfo
from stockade.supervisor.errors import (
    CallTimedOut,
    ConfigError,
    EngineUnavailable,
    InvalidRequest,
    SandboxNotFound,
    SandboxPaused,
    SandboxStateConflict,
)
from stockade.supervisor.fronts.grpc.convert import sandbox_to_pb
from stockade.supervisor.fronts.grpc.status import status_for
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.v1 import sandbox_pb2
from tests.unit.fakes import FakeAgent, FakeBackend, fake_manager, invoke, quiet_housekeeping

Events = list[tuple[str, str, str]]


def manager(
    tmp_path: Path,
    backend: FakeBackend,
    events: Events | None = None,
    *,
    paused_call: str = "resume",
    **housekeeping: Any,
) -> SandboxManager:
    config = Config(
        state_dir=tmp_path,
        sandbox=SandboxConfig(user="1000:1000", paused_call=paused_call),  # type: ignore[arg-type]
        housekeeping=quiet_housekeeping(**housekeeping),
    )
    record = (lambda *event: events.append(event)) if events is not None else None
    return fake_manager(config, backend, record_event=record, silence_s=0.05)


async def test_pause_freezes_and_resume_thaws_the_same_container(
    tmp_path: Path, backend: FakeBackend
) -> None:
    events: Events = []
    mgr = manager(tmp_path, backend, events)
    sandbox = await mgr.ensure("k")
    info, changed = await mgr.pause("k", "asked")
    assert changed
    assert info.state.value == "PAUSED"
    assert info.paused_at is not None
    assert backend.containers[sandbox.info.id].paused
    assert mgr.state_counts()["PAUSED"] == 1
    assert (await mgr.get("k")).state.value == "PAUSED"
    info, changed = await mgr.resume("k", "asked again")
    assert changed
    assert (info.state.value, info.paused_at) == ("RUNNING", None)
    assert not backend.containers[sandbox.info.id].paused
    assert backend.runs == 1
    assert events == [("k", "pause", "asked"), ("k", "resume", "asked again")]


async def test_pausing_twice_and_resuming_a_running_sandbox_change_nothing(
    tmp_path: Path, backend: FakeBackend
) -> None:
    events: Events = []
    mgr = manager(tmp_path, backend, events)
    await mgr.ensure("k")
    first, _ = await mgr.pause("k", "one")
    again, changed = await mgr.pause("k", "two")
    assert not changed
    assert again.paused_at == first.paused_at
    await mgr.resume("k", "three")
    info, changed = await mgr.resume("k", "four")
    assert not changed
    assert info.state.value == "RUNNING"
    assert [e[1] for e in events] == ["pause", "resume"]
    assert [paused for _, paused in backend.pause_calls] == [True, False]


async def test_pausing_a_missing_key_or_a_bad_one_is_refused(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend)
    with pytest.raises(SandboxNotFound, match="is unknown"):
        await mgr.pause("nobody", "asked")
    with pytest.raises(SandboxNotFound, match="is unknown"):
        await mgr.resume("nobody", "asked")
    await mgr.ensure("k")
    await mgr.destroy("k", delete_workspace=False)
    with pytest.raises(SandboxNotFound, match="has only a workspace"):
        await mgr.pause("k", "asked")
    with pytest.raises(SandboxNotFound, match="is unknown"):
        await mgr.pause("../../etc", "asked")  # a key is any text: no path is made of it
    for bad in ("", "x" * 300, "lone \udc80 surrogate"):
        with pytest.raises(InvalidRequest):
            await mgr.pause(bad, "asked")
        with pytest.raises(InvalidRequest):
            await mgr.resume(bad, "asked")
    assert backend.runs == 1, "no call of these made a container"
    assert not backend.pause_calls


async def test_a_dead_or_broken_sandbox_cannot_be_paused(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend)
    sandbox = await mgr.ensure("k")
    backend.kill(sandbox.info.id)
    with pytest.raises(SandboxStateConflict, match="no longer runs"):
        await mgr.pause("k", "asked")
    assert (await mgr.get("k")).state.value == "EXITED"
    with pytest.raises(SandboxStateConflict, match="is EXITED"):
        await mgr.pause("k", "asked")
    assert status_for(SandboxStateConflict("x")) == grpc.StatusCode.FAILED_PRECONDITION


async def test_destroying_a_paused_sandbox_removes_it(tmp_path: Path, backend: FakeBackend) -> None:
    mgr = manager(tmp_path, backend)
    await mgr.ensure("k")
    await mgr.pause("k", "asked")
    assert await mgr.destroy("k", delete_workspace=True) == (True, True)
    assert not backend.containers
    with pytest.raises(SandboxNotFound):
        await mgr.get("k")


async def test_a_call_to_a_paused_sandbox_resumes_it_first(
    tmp_path: Path, backend: FakeBackend
) -> None:
    events: Events = []
    mgr = manager(tmp_path, backend, events)
    sandbox = await mgr.ensure("k")
    await mgr.pause("k", "asked")
    reply = await invoke(mgr, "k", "exec", {}, 5, "r1")
    assert reply.result is not None
    assert reply.result["exit_code"] == 0
    assert (await mgr.get("k")).state.value == "RUNNING"
    assert backend.runs == 1
    assert mgr.registry["k"] is sandbox
    assert events[-1] == ("k", "resume", "a call to the paused sandbox")
    assert mgr.heal_counts == dict.fromkeys(mgr.heal_counts, 0)


async def test_a_paused_sandbox_is_resumed_before_each_agent_call_of_a_held_lease(
    tmp_path: Path, backend: FakeBackend
) -> None:
    """An Interact session holds its lease while it lasts: input after a pause resumes."""
    mgr = manager(tmp_path, backend)
    async with mgr.lease("k") as lease:
        await lease.invoke("process", {}, 5, "r0")
        await mgr.pause("k", "asked")
        reply = await lease.invoke("process", {}, 5, "r1")
        assert reply.result is not None
        assert not lease.sandbox.paused
    assert backend.runs == 1


async def test_with_paused_call_refuse_a_call_is_refused_and_nothing_runs(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend, paused_call="refuse")
    sandbox = await mgr.ensure("k")
    await mgr.pause("k", "asked")
    agent = sandbox.agent
    assert isinstance(agent, FakeAgent)
    before = len(agent.calls)
    with pytest.raises(SandboxPaused, match="paused_call") as info:
        await invoke(mgr, "k", "exec", {}, 5, "r1")
    assert info.value.reason == "SANDBOX_PAUSED"
    assert status_for(info.value) == grpc.StatusCode.FAILED_PRECONDITION
    assert len(agent.calls) == before
    assert (await mgr.get("k")).state.value == "PAUSED"
    await mgr.resume("k", "asked")
    assert (await invoke(mgr, "k", "exec", {}, 5, "r2")).result is not None


async def test_a_call_that_a_pause_freezes_times_out_without_marking_the_sandbox(
    tmp_path: Path, backend: FakeBackend
) -> None:
    """exec's agent enforces its timeout: a deadline it lets pass marks the sandbox broken,
    unless the sandbox was paused meanwhile (frozen, not failed)."""
    mgr = manager(tmp_path, backend)
    await mgr.ensure("k")
    hold = asyncio.Event()
    call = asyncio.create_task(invoke(mgr, "k", "exec", {"hold": hold}, 0.1, "r1"))
    await asyncio.sleep(0.02)
    await mgr.pause("k", "asked")
    hold.set()
    with pytest.raises(CallTimedOut, match="paused during the call"):
        await call
    info = await mgr.get("k")
    assert (info.state.value, info.trouble) == ("PAUSED", "")
    await invoke(mgr, "k", "exec", {}, 5, "r2")
    assert backend.runs == 1


async def test_an_unpaused_agent_that_lets_its_deadline_pass_is_still_marked(
    tmp_path: Path, backend: FakeBackend
) -> None:
    """The check above can fail: without a pause the same call marks the sandbox."""
    mgr = manager(tmp_path, backend)
    await mgr.ensure("k")
    backend.agent_frozen = True
    with pytest.raises(Exception, match="did not end the command"):
        await invoke(mgr, "k", "exec", {}, 0.05, "r1")
    backend.agent_frozen = False
    assert (await mgr.get("k")).state.value == "BROKEN"


async def test_health_probes_never_mark_or_heal_a_paused_sandbox(
    tmp_path: Path, backend: FakeBackend
) -> None:
    events: Events = []
    mgr = manager(tmp_path, backend, events)
    sandbox = await mgr.ensure("k")
    await mgr.pause("k", "asked")
    for _ in range(3):
        await mgr.sweep()
        info = await mgr.get("k")
        assert (info.state.value, info.trouble) == ("PAUSED", "")
    assert not sandbox.broken
    assert mgr.registry["k"] is sandbox
    assert backend.runs == 1
    assert [e[1] for e in events] == ["pause"], "no heal, no removal"
    await invoke(mgr, "k", "exec", {}, 5, "r1")
    assert (await mgr.get("k")).heals == 0


async def test_a_silent_unpaused_agent_is_still_marked_by_the_sweep(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend)
    await mgr.ensure("k")
    backend.agent_frozen = True
    await mgr.sweep()
    backend.agent_frozen = False
    assert (await mgr.get("k")).state.value == "BROKEN"


async def test_housekeeping_pauses_an_idle_sandbox_then_removes_it(
    tmp_path: Path, backend: FakeBackend
) -> None:
    events: Events = []
    # margins wide enough for a loaded machine: the first sweep must come before idle_pause_s
    mgr = manager(
        tmp_path, backend, events, idle_action="pause", idle_pause_s=0.5, idle_timeout_s=1.2
    )
    await mgr.ensure("k")
    await mgr.ensure("busy")
    await mgr.sweep()
    assert (await mgr.get("k")).state.value == "RUNNING", "not idle long enough yet"
    await asyncio.sleep(0.6)
    async with mgr.lease("busy"):
        await mgr.sweep()
    assert (await mgr.get("k")).state.value == "PAUSED"
    assert (await mgr.get("busy")).state.value == "RUNNING", "a call in flight keeps it awake"
    assert events[0][:2] == ("k", "pause")
    assert "idle for" in events[0][2]
    assert "idle_pause_s" in events[0][2]
    await asyncio.sleep(0.7)
    await mgr.sweep()
    assert (await mgr.get("k")).state.value == "ABSENT", "idle_timeout_s removes it, paused"
    assert ("k", "remove container") in [e[:2] for e in events]


async def test_idle_action_destroy_never_pauses(tmp_path: Path, backend: FakeBackend) -> None:
    mgr = manager(tmp_path, backend, idle_pause_s=0.01, idle_timeout_s=60)
    await mgr.ensure("k")
    await asyncio.sleep(0.05)
    await mgr.sweep()
    assert (await mgr.get("k")).state.value == "RUNNING"
    assert not backend.pause_calls


async def test_a_resumed_sandbox_is_not_paused_again_at_once(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend, idle_action="pause", idle_pause_s=0.05, idle_timeout_s=60)
    await mgr.ensure("k")
    await asyncio.sleep(0.1)
    await mgr.sweep()
    await mgr.resume("k", "asked")
    await mgr.sweep()
    assert (await mgr.get("k")).state.value == "RUNNING"


async def test_a_restart_adopts_a_paused_sandbox_as_paused(
    tmp_path: Path, backend: FakeBackend
) -> None:
    first = manager(tmp_path, backend)
    created = await first.ensure("k")
    info, _ = await first.pause("k", "asked")
    await first.close()
    second = manager(tmp_path, backend)
    assert await second.start() == ["k"]
    adopted = await second.get("k")
    assert adopted.state.value == "PAUSED"
    assert adopted.container_id == created.info.id
    assert adopted.paused_at is not None
    assert info.paused_at is not None
    assert abs((adopted.paused_at - info.paused_at).total_seconds()) < 1
    await second.sweep()
    assert (await second.get("k")).state.value == "PAUSED"
    await invoke(second, "k", "exec", {}, 5, "r1")
    assert backend.runs == 1, "resumed, not re-created"
    assert (await second.get("k")).state.value == "RUNNING"


def test_config_of_pausing(tmp_path: Path) -> None:
    assert (Config().sandbox.paused_call, Config().housekeeping.idle_action) == (
        "resume",
        "destroy",
    )
    path = tmp_path / "c.toml"
    cases = {
        "[sandbox]\npaused_call = 'wait'": "sandbox.paused_call must be one of",
        "[housekeeping]\nidle_action = 'stop'": "housekeeping.idle_action must be one of",
        "[housekeeping]\nidle_action = 'pause'\nidle_pause_s = 0": "needs idle_pause_s above 0",
        "[housekeeping]\nidle_action = 'pause'\nidle_pause_s = 1800": "below idle_timeout_s",
        "[housekeeping]\nidle_pause_s = -1": "idle_pause_s must be between 0",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_config(path)
    path.write_text("[housekeeping]\nidle_action = 'pause'\nidle_pause_s = 60\nidle_timeout_s = 0")
    assert load_config(path).housekeeping.idle_pause_s == 60


def test_the_paused_state_on_the_wire(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from stockade.supervisor.models import SandboxInfo, SandboxState

    since = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    info = SandboxInfo("k", "c1", "n", "podman", "img", SandboxState.PAUSED, None, None, "/w")
    msg = sandbox_to_pb(info.__class__(**{**info.__dict__, "paused_at": since}))
    assert msg.state == sandbox_pb2.SANDBOX_STATE_PAUSED
    assert msg.paused_at.ToDatetime(tzinfo=UTC) == since


def test_both_engines_paused_containers_read_as_running_and_paused() -> None:
    podman = {"Id": "a", "State": {"Status": "paused", "Running": False, "Paused": True}}
    docker = {"Id": "b", "State": {"Status": "paused", "Running": True, "Paused": True}}
    exited = {"Id": "c", "State": {"Status": "exited", "Running": False, "Paused": False}}
    assert [(i.running, i.paused) for i in map(info_from_inspect, (podman, docker, exited))] == [
        (True, True),
        (True, True),
        (False, False),
    ]


def test_a_failed_engine_pause_is_judged_by_the_state_after() -> None:
    class Boom(Exception):
        pass

    states: dict[str, ContainerInfo | None] = {}

    def info(paused: bool, running: bool = True) -> ContainerInfo:
        return ContainerInfo("c", "n", running, "", {}, "img", paused=paused)

    def failing(after: ContainerInfo | None) -> Any:
        def act(_cid: str) -> None:
            states["c"] = after
            raise Boom("engine said no")

        return act

    def inspect(name: str) -> ContainerInfo | None:
        return states.get(name)

    states["c"] = info(False)
    assert set_paused(inspect, failing(info(True)), (Boom,), "c", True), "paused meanwhile"
    states["c"] = info(False)
    assert not set_paused(inspect, failing(None), (Boom,), "c", True), "removed meanwhile"
    states["c"] = info(False)
    with pytest.raises(EngineUnavailable, match="cannot pause container n: engine said no"):
        set_paused(inspect, failing(info(False)), (Boom,), "c", True)
    states["c"] = info(True)
    assert set_paused(inspect, failing(info(False)), (Boom,), "c", True), "already paused"
    states["c"] = info(False, running=False)
    assert not set_paused(inspect, failing(info(False)), (Boom,), "c", True), "exited"
    assert not set_paused(inspect, failing(None), (Boom,), "gone", False)


async def test_a_container_that_died_while_paused_is_remade_by_the_next_call(
    tmp_path: Path, backend: FakeBackend
) -> None:
    """Even where calls to paused sandboxes are refused: there is nothing left to resume."""
    mgr = manager(tmp_path, backend, paused_call="refuse")
    sandbox = await mgr.ensure("k")
    await mgr.pause("k", "asked")
    backend.kill(sandbox.info.id)
    info = await mgr.get("k")
    assert (info.state.value, info.paused_at) == ("EXITED", None)
    assert (await invoke(mgr, "k", "exec", {}, 5, "r1")).result is not None
    assert backend.runs == 2
    assert (await mgr.get("k")).state.value == "RUNNING"
