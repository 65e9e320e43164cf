"""Housekeeping on real engines through the real `stockade serve`, with short timeouts:
idle prune, maximum age, workspace retention, orphan reaping (never a live or a stopped
supervisor's containers), the warm pool, host pressure and the graceful drain on SIGTERM."""

from __future__ import annotations

import contextlib
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stockade.client import NotFound, ResourceExhausted, Stockade, ToolResult, Unavailable
from stockade.supervisor.cli import launcher
from stockade.supervisor.engines.backends.base import LABEL_INSTANCE, LABEL_POOL, ContainerInfo
from stockade.supervisor.sandboxes import hostfs, workspaces
from tests.integration.harness import (
    NO_RATE_LIMIT,
    Supervisor,
    backend,
    engine_url,
    instance_containers,
    running_supervisor,
)

pytestmark = pytest.mark.timeout(600)
WAIT_S = 180.0
"""Upper bound for things that happen on their own (a sweep every 0.2 s): a limit against
hanging, not a timing assertion."""
FAST = "[housekeeping]\nsweep_interval_s = 0.2\n"
IDLE = FAST + "idle_timeout_s = 2\nmax_age_s = 0\n"
AGE = FAST + "idle_timeout_s = 0\nmax_age_s = 3\nworkspace_retention_s = 2\n" + NO_RATE_LIMIT


def wait_for(condition: Callable[[], object], what: str, limit: float = WAIT_S) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {limit:.0f} s")
        time.sleep(0.1)


def engine_has(engine: str, container_id: str) -> bool:
    be = backend(engine)
    try:
        return be.inspect(container_id) is not None
    finally:
        be.close()


def containers_of(engine: str, instance: str) -> list[ContainerInfo]:
    be = backend(engine)
    try:
        return be.list({LABEL_INSTANCE: instance})
    finally:
        be.close()


def remove_all(engine: str, instance: str) -> None:
    be = backend(engine)
    try:
        for info in be.list({LABEL_INSTANCE: instance}):
            be.remove(info.id)
    finally:
        be.close()


def health(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        return int(reply.status)


@pytest.fixture(scope="module")
def idle_supervisor(engine: str) -> Iterator[Supervisor]:
    with running_supervisor(engine, IDLE) as sup:
        yield sup


def test_idle_sandbox_loses_its_container_and_keeps_its_workspace(
    idle_supervisor: Supervisor, key: str
) -> None:
    with idle_supervisor.client() as c:
        box = c.sandbox(key)
        box.write_file("keep.txt", "kept")
        old = box.info().container_id
        wait_for(lambda: c.get_sandbox(key).state == "ABSENT", "the idle prune")
        wait_for(lambda: not engine_has(idle_supervisor.engine, old), "the container's removal")
        assert (idle_supervisor.workspace(key) / "keep.txt").read_text() == "kept"
        assert box.read_file("keep.txt") == "kept"  # a new container on the same workspace
        assert box.info().container_id not in ("", old)
        steps = [r.policy_step for r in c.list_audit(sandbox_key=key, tool="housekeeping")]
        assert any(s.startswith("housekeeping: remove container: idle for") for s in steps)


def test_a_call_longer_than_the_idle_timeout_is_not_cut(
    idle_supervisor: Supervisor, key: str
) -> None:
    """The sandbox is idle past its timeout many sweeps over, but a call is in flight: a
    prune would end the call with SANDBOX_LOST."""
    with idle_supervisor.client() as c:
        box = c.sandbox(key)
        box.exec("true")
        result = box.exec("sleep 6; echo done", timeout=120)
        assert result.error_code == ""
        assert result.exit_code == 0
        assert result.stdout == "done\n"


def test_old_sandbox_is_replaced_between_calls_and_workspace_expires(engine: str) -> None:
    with running_supervisor(engine, AGE) as sup, sup.client() as c:
        box = c.sandbox("aging")
        first = box.ensure().container_id
        results: list[ToolResult] = []
        deadline = time.monotonic() + WAIT_S
        while box.info().container_id in ("", first):
            assert time.monotonic() < deadline, "the old sandbox was never replaced"
            results.append(box.exec("true"))
        assert results
        assert [r for r in results if r.error_code or r.exit_code != 0] == []
        assert not engine_has(engine, first)
        steps = [r.policy_step for r in c.list_audit(sandbox_key="aging", tool="housekeeping")]
        assert any("remove container" in s and "max_age_s 3" in s for s in steps)

        other = c.sandbox("expiring")
        other.write_file("f.txt", "soon gone")
        folder = sup.workspace("expiring").parent
        wait_for(lambda: not folder.exists(), "the workspace's expiry")
        with pytest.raises(NotFound):
            c.get_sandbox("expiring")
        steps = [r.policy_step for r in c.list_audit(sandbox_key="expiring")]
        assert any(s.startswith("housekeeping: delete workspace") for s in steps)


def test_orphans_of_a_dead_instance_are_reaped_never_a_live_or_stopped_ones(
    engine: str,
) -> None:
    dead = Supervisor(engine, Path(tempfile.mkdtemp(prefix="stk", dir="/tmp")))
    stopped = Supervisor(engine, Path(tempfile.mkdtemp(prefix="stk", dir="/tmp")))
    instances: list[str] = []
    try:
        for sup in (dead, stopped):
            sup.start()
            instances.append(sup.instance_id())
            with sup.client() as c:
                c.sandbox("x").exec("true")
                c.sandbox("y").exec("true")
        with running_supervisor(engine) as live:
            with live.client() as c:
                live_box = c.sandbox("live").ensure().container_id
            dead.stop(signal.SIGKILL)
            workspaces.unmount_all(dead.state_dir)
            hostfs.remove_tree(dead.state_dir)
            stopped.stop()  # cleanly, state kept: its next start adopts
            kept = {i.id for i in containers_of(engine, instances[1])}
            assert len(kept) == 2
            with running_supervisor(engine, FAST):
                wait_for(lambda: not containers_of(engine, instances[0]), "the reaping")
                # The sweep that reaped looked at every container; more sweeps get their
                # chance to do wrong (not a timing assertion: it only gives them time).
                time.sleep(2)
                assert {i.id for i in containers_of(engine, instances[1])} == kept
                with live.client() as c:
                    assert c.sandbox("live").exec("echo alive").stdout == "alive\n"
                    assert c.sandbox("live").info().container_id == live_box
                # Which live supervisor reaped is not fixed (every one with reap_orphans on
                # may, e.g. another test's): the audit record is checked in the unit tests.
            stopped.start()
            with stopped.client() as c:
                assert {s.container_id for s in c.list_sandboxes()} == kept
    finally:
        for sup in (dead, stopped):
            sup.stop()
        for instance in instances:
            remove_all(engine, instance)
        workspaces.unmount_all(stopped.state_dir)
        with contextlib.suppress(OSError):
            hostfs.remove_tree(stopped.state_dir)


def test_a_second_supervisor_on_the_same_state_dir_is_refused(engine: str) -> None:
    with running_supervisor(engine) as sup:
        log_path = sup.state_dir / "second.log"
        second = launcher.spawn(sup.config_file(), log_path)
        assert second.wait(120) == 1
        assert "another supervisor is running on the state directory" in log_path.read_text()
        with sup.client() as c:
            assert c.sandbox("still").exec("echo fine").stdout == "fine\n"


def test_warm_pool_serves_a_new_key_refills_and_is_adopted(engine: str) -> None:
    with running_supervisor(engine, FAST + "warm_pool = 1\n") as sup:
        url = engine_url(engine)

        def unassigned(taken: str = "") -> list[str]:
            found = instance_containers(engine, url, sup)
            return [i.id for i in found if LABEL_POOL in i.labels and i.id != taken and i.running]

        ready = re.compile(r"warm pool: container \S+ \(base\) ready")  # the profile it is for
        wait_for(lambda: ready.search(sup.log()), "the pool's first container")
        pooled = unassigned()[0]
        with sup.client() as c:
            box = c.sandbox("fresh")
            assert box.exec("echo hi > f; cat f").stdout == "hi\n"
            assert box.info().container_id == pooled
            assert (sup.workspace("fresh") / "f").read_text() == "hi\n"  # the key's folder
            # the pooled container has the same capped /tmp as any other (65536 inodes)
            inodes = box.exec("df -i /tmp | tail -1").stdout.split()[1]
            assert inodes == "64K" or int(inodes) <= 65536, inodes
            wait_for(lambda: unassigned(pooled), "the pool's refill")
        sup.stop()
        assert [i.id for i in instance_containers(engine, url, sup)] == [pooled]
        sup.start()
        with sup.client() as c:
            assert c.sandbox("fresh").info().container_id == pooled  # adopted
            assert c.sandbox("fresh").read_file("f") == "hi\n"
            assert c.destroy_sandbox("fresh")
        assert not engine_has(engine, pooled)


def test_host_pressure_refuses_new_sandboxes_not_running_ones(engine: str) -> None:
    with running_supervisor(engine) as sup:
        with sup.client() as c:
            c.sandbox("old").write_file("f", "x")
        sup.stop()
        sup.extra_config = "[housekeeping]\nmin_free_memory_mb = 1000000000\n"
        sup.start()
        with sup.client() as c:
            with pytest.raises(ResourceExhausted, match="min_free_memory_mb = 1000000000") as e:
                c.sandbox("new").exec("true")
            assert e.value.reason == "HOST_RESOURCES_EXHAUSTED"
            with pytest.raises(ResourceExhausted, match="memory available"):
                c.ensure_sandbox("new")
            assert c.sandbox("old").read_file("f") == "x"
            assert c.sandbox("old").exec("echo ok").stdout == "ok\n"
        sup.stop()
        sup.extra_config = "[housekeeping]\nmin_free_disk_mb = 1000000000000\n"
        sup.start()
        with sup.client() as c, pytest.raises(ResourceExhausted, match="MiB of disk free"):
            c.sandbox("new").exec("true")


BLOCKED = "while [ ! -e release ]; do sleep 0.05; done; echo finished"
"""Runs until the test creates `release` in the workspace: the call is in flight for as long
as the test needs, with no timing involved."""


def start_blocked_call(c: Stockade, key: str) -> tuple[threading.Thread, list[object]]:
    box = c.sandbox(key)
    outcome: list[object] = []

    def call() -> None:
        try:
            outcome.append(box.exec(BLOCKED, timeout=280))
        except Exception as exc:
            outcome.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    running = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"
    wait_for(lambda: "release" in box.exec(running).stdout, "the blocked call's start")
    return worker, outcome


def test_sigterm_drains_calls_in_flight_and_leaves_containers(engine: str) -> None:
    with running_supervisor(engine, "[housekeeping]\nshutdown_grace_s = 250\n") as sup:
        assert sup.process is not None
        with sup.client() as c:
            container = c.sandbox("drain").ensure().container_id
            worker, outcome = start_blocked_call(c, "drain")
            sup.process.send_signal(signal.SIGTERM)
            wait_for(
                lambda: health(sup.target) == health_pb2.HealthCheckResponse.NOT_SERVING,
                "NOT_SERVING",
            )
            with pytest.raises(Unavailable, match="shutting down") as refused:
                c.sandbox("drain").exec("true")
            assert refused.value.reason == "SHUTTING_DOWN"
            assert worker.is_alive()  # it cannot end before `release` exists
            assert sup.process.poll() is None
            (sup.workspace("drain") / "release").write_text("")
            worker.join(120)
        assert isinstance(outcome[0], ToolResult)
        assert outcome[0].exit_code == 0
        assert outcome[0].stdout == "finished\n"
        assert sup.process.wait(60) == 0
        sup.process = None
        assert engine_has(engine, container)
        sup.start()
        with sup.client() as c:
            assert c.sandbox("drain").info().container_id == container


def test_a_call_past_the_grace_is_ended_and_the_supervisor_stops(engine: str) -> None:
    with running_supervisor(engine, "[housekeeping]\nshutdown_grace_s = 1\n") as sup:
        assert sup.process is not None
        with sup.client() as c:
            worker, outcome = start_blocked_call(c, "late")
            sup.process.send_signal(signal.SIGTERM)
            assert sup.process.wait(120) == 0
            sup.process = None
            worker.join(120)
        assert not worker.is_alive()
        assert outcome
        assert not (isinstance(outcome[0], ToolResult) and outcome[0].exit_code == 0)
        assert "shutting down" in sup.log()
