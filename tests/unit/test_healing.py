"""Healing: the facts that make a sandbox wedged, and the manager re-creating it (against the
in-memory engine and agent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.supervisor.config import Config
from stockade.supervisor.errors import AgentMisbehaved, EngineUnavailable
from stockade.supervisor.sandboxes import healing
from stockade.supervisor.sandboxes.manager import SandboxManager
from tests.unit.fakes import FakeAgent, FakeBackend, fake_manager, invoke

EXPECTED = healing.Expected(nofile=1024, nproc=16384, fsize=None)
LIMITS = (
    b"Limit                     Soft Limit           Hard Limit           Units     \n"
    b"Max cpu time              unlimited            unlimited            seconds   \n"
    b"Max file size             unlimited            unlimited            bytes     \n"
    b"Max data size             unlimited            unlimited            bytes     \n"
    b"Max processes             16384                16384                processes \n"
    b"Max open files            1024                 1024                 files     \n"
    b"Max address space         unlimited            unlimited            bytes     \n"
)
HEALTHY: dict[str, bytes | str] = {
    healing.INIT_STAT: b"1 (tini) S 0 1 1 0 -1 4194560 1 0",
    healing.AGENT_LIMITS: LIMITS,
    "/sys/fs/cgroup/pids.current": b"120\n",
    "/sys/fs/cgroup/pids.max": b"128\n",
}


def facts(**changes: bytes | str) -> dict[str, bytes | str]:
    named = {"init": healing.INIT_STAT, "limits": healing.AGENT_LIMITS}
    return {**HEALTHY, **{named[k]: v for k, v in changes.items()}}


def kind(found: healing.Trouble | None) -> str:
    return found.kind if found else ""


@pytest.mark.parametrize(
    ("given", "spawn_failure", "wanted"),
    [
        (HEALTHY, False, ""),
        (facts(init=b"1 (tini) T 0 1 1"), False, healing.INIT_STOPPED),
        (facts(init=b"1 (tini) t 0 1 1"), False, healing.INIT_STOPPED),
        (facts(init=b"1 (a) T (b) R 0 1"), False, ""),  # the state follows the last ')'
        (facts(init=b"1 (a) b) Z 0 1"), False, healing.INIT_STOPPED),
        (facts(init="EACCES"), False, ""),  # unreadable: no proof
        (facts(init=b"garbage"), False, ""),
        (facts(limits=LIMITS.replace(b"1024                 1024", b"4  4")), False,
         healing.AGENT_LIMITED),
        (facts(limits=LIMITS.replace(b"16384                16384", b"1  1")), False,
         healing.AGENT_LIMITED),
        (facts(limits=LIMITS.replace(b"Max address space         unlimited",
                                     b"Max address space         50000000")), False,
         healing.AGENT_LIMITED),
        (facts(limits=LIMITS.replace(b"1024                 1024", b"4096  4096")), False, ""),
        (facts(limits="EMFILE", init="EMFILE"), False, healing.AGENT_LIMITED),
        (HEALTHY, True, healing.PIDS_EXHAUSTED),  # 120 of 128 after a failed start
        ({**HEALTHY, "/sys/fs/cgroup/pids.current": b"60\n"}, True, ""),
    ],
)  # fmt: skip
def test_diagnose(given: dict[str, bytes | str], spawn_failure: bool, wanted: str) -> None:
    assert kind(healing.diagnose(given, EXPECTED, after_sweep=spawn_failure)) == wanted


def test_a_capped_file_size_is_no_lowering_at_its_cap() -> None:
    capped = LIMITS.replace(b"Max file size             unlimited", b"Max file size    8388608")
    expected = healing.Expected(1024, 16384, 8 * 1024 * 1024)
    assert healing.diagnose(facts(limits=capped), expected, after_sweep=False) is None
    lower = healing.Expected(1024, 16384, 16 * 1024 * 1024)
    assert kind(healing.diagnose(facts(limits=capped), lower, after_sweep=False))


def test_only_a_command_that_never_started_is_a_spawn_failure() -> None:
    assert healing.spawn_failed("EXECUTION_FAILED", "could not start the command: EAGAIN")
    assert not healing.spawn_failed("EXECUTION_FAILED", "agent error in exec: MemoryError")
    assert not healing.spawn_failed("INVALID_ARGS", "could not start the command: x")


# The manager


Events = list[tuple[str, str, str]]


def manager(tmp_path: Path, backend: FakeBackend, events: Events) -> SandboxManager:
    sandbox = Config().sandbox.__class__(user="1000:1000")
    return fake_manager(
        Config(state_dir=tmp_path, sandbox=sandbox),
        backend,
        record_event=lambda *event: events.append(event),
        silence_s=0.05,
    )


async def test_a_command_that_cannot_start_in_a_wedged_sandbox_runs_on_a_new_one(
    tmp_path: Path, backend: FakeBackend
) -> None:
    events: Events = []
    mgr = manager(tmp_path, backend, events)
    await invoke(mgr, "k", "exec", {}, 5, "r0")
    backend.agent_facts = facts(init=b"1 (tini) T 0 1 1")
    reply = await invoke(mgr, "k", "exec", {"no_start": True}, 5, "r1")
    assert reply.error_code == "EXECUTION_FAILED", "the new agent has the same (fake) facts"
    assert backend.runs == 2, "one re-creation, one retry: never a loop"
    info = await mgr.get("k")
    assert info.heals == 1
    assert info.last_heal_reason.startswith("init_stopped: the container's init")
    assert mgr.heal_counts[healing.INIT_STOPPED] == 1
    assert events[-1][:2] == ("k", "heal")
    backend.agent_facts = {}
    assert (await invoke(mgr, "k", "exec", {"no_start": True}, 5, "r2")).result is not None


async def test_a_failure_the_facts_do_not_explain_changes_nothing(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend, [])
    backend.agent_facts = HEALTHY  # 120 of 128 pids used, init sleeping: a busy workload
    reply = await invoke(mgr, "k", "exec", {}, 5, "r0")
    assert reply.result is not None
    assert (await mgr.get("k")).state.value == "RUNNING"
    assert backend.runs == 1


async def test_pids_crowded_after_a_command_by_what_the_agent_cannot_end_mark_the_sandbox(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend, [])
    backend.agent_facts = HEALTHY  # 120 of 128 pids
    reply = await invoke(mgr, "k", "exec", {"crowded": True}, 5, "r0")
    assert reply.result is not None
    assert "pids_crowded" not in reply.result, "the flag is the supervisor's, not the caller's"
    assert reply.result["exit_code"] == 0, "a command that ran is never run again"
    assert backend.runs == 1
    assert (await mgr.get("k")).trouble.startswith("pids_exhausted:")


async def test_get_probes_and_reports_a_stopped_init(tmp_path: Path, backend: FakeBackend) -> None:
    mgr = manager(tmp_path, backend, [])
    await invoke(mgr, "k", "exec", {}, 5, "r0")
    backend.agent_facts = facts(init=b"1 (tini) T 0 1 1")
    info = await mgr.get("k")
    assert info.state.value == "BROKEN"
    assert info.trouble.startswith("init_stopped:")
    backend.agent_facts = {}
    await invoke(mgr, "k", "exec", {}, 5, "r1")
    assert backend.runs == 2
    assert (await mgr.get("k")).heals == 1


async def test_a_silent_agent_is_marked_by_the_sweep_and_healed(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend, [])
    await invoke(mgr, "k", "exec", {}, 5, "r0")
    backend.agent_frozen = True
    await mgr.sweep()
    backend.agent_frozen = False
    assert (await mgr.get("k")).trouble.startswith("agent_unresponsive:")
    await invoke(mgr, "k", "exec", {}, 5, "r1")
    assert mgr.heal_counts[healing.AGENT_UNRESPONSIVE] == 1


async def test_a_call_past_its_deadline_on_a_silent_agent_marks_the_sandbox(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend, [])
    await invoke(mgr, "k", "read_file", {}, 5, "r0")
    backend.agent_frozen = True
    with pytest.raises(AgentMisbehaved, match="did not answer"):
        await invoke(mgr, "k", "read_file", {}, 0.05, "r1")
    backend.agent_frozen = False
    assert (await invoke(mgr, "k", "read_file", {}, 5, "r2")).result is not None
    assert (await mgr.get("k")).last_heal_reason.startswith("agent_unresponsive:")


async def test_a_running_sandbox_whose_link_has_no_connection_is_asked_not_the_engine(
    tmp_path: Path, backend: FakeBackend
) -> None:
    """A link with no open connection (its calls' connections all closed) is not a dead
    agent: the agent is asked first, so a call is served while the engine is down (the
    engine restart test on Podman found it after every call went framed)."""
    mgr = manager(tmp_path, backend, [])
    await invoke(mgr, "k", "exec", {}, 5, "r0")
    (sandbox,) = mgr.registry.values()
    assert isinstance(sandbox.agent, FakeAgent)
    sandbox.agent.ready = False
    backend.engine_down = True
    assert (await invoke(mgr, "k", "exec", {}, 5, "r1")).result is not None
    assert backend.runs == 1
    for cid in list(backend.containers):
        backend.kill(cid)
    with pytest.raises(EngineUnavailable):  # a dead one still needs the engine
        await invoke(mgr, "k", "exec", {}, 5, "r2")


async def test_a_dead_container_recreated_counts_as_a_heal(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend, [])
    await invoke(mgr, "k", "exec", {}, 5, "r0")
    for cid in list(backend.containers):
        backend.kill(cid)
    await invoke(mgr, "k", "exec", {}, 5, "r1")
    assert (await mgr.get("k")).last_heal_reason.startswith("container_exited:")


async def test_a_destroyed_sandbox_made_again_is_no_heal(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend, [])
    await invoke(mgr, "k", "exec", {}, 5, "r0")
    await mgr.destroy("k", delete_workspace=False)
    await invoke(mgr, "k", "exec", {}, 5, "r1")
    assert (await mgr.get("k")).heals == 0


async def test_a_closed_agent_connection_does_not_answer(tmp_path: Path) -> None:
    """GetSandbox's probe may meet a connection that housekeeping closed meanwhile (the
    sandbox retired): it answers False, never grpc's 'Channel is closed' error."""
    from stockade.supervisor.sandboxes.agent_link import AgentConnection

    agent = AgentConnection(tmp_path / "agent.sock")
    stub = agent._stub
    await agent.close()
    assert await agent.answers(0.1) is False
    agent._closed = False  # as if close() ran between the check and the call
    agent._grpc_stub = stub
    assert await agent.answers(0.1) is False
