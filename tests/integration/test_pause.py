"""Pause and resume for real, on both engines, through the real supervisor: a paused
sandbox uses no CPU (read from the host, in the container's cgroup), keeps its processes and
their memory, answers a call by resuming (or refuses it when so configured), survives a
supervisor restart paused, and is never taken for a wedged sandbox by health probes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stockade.client import AsyncStockade, FailedPrecondition, InvalidArgument, NotFound
from tests.integration.harness import (
    Supervisor,
    backend,
    engine_cli,
    inspected,
    process,
    running_supervisor,
)

pytestmark = pytest.mark.timeout(300)

FAST_SWEEP = "[housekeeping]\nsweep_interval_s = 0.25\n"
"""Health probes every quarter second: a paused sandbox meets many of them."""
BUSY = "while :; do :; done"
COUNTER = (
    "python3 -c '\n"
    "import http.server\n"
    "hits = [0]\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        hits[0] += 1\n"
    "        self.send_response(200); self.end_headers()\n"
    "        self.wfile.write(str(hits[0]).encode())\n"
    "    def log_message(self, *a): pass\n"
    'http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()\''
)
"""A server whose only state is in its memory: the count of requests it answered."""
FETCH = (
    "python3 -c 'import urllib.request; "
    'print(urllib.request.urlopen("http://127.0.0.1:8000/", timeout=5).read().decode())\''
)
CPU_EPSILON_NS = 5_000_000
"""CPU time a frozen cgroup may still show gained over a second (none is expected: the
freezer stops every task; a margin for accounting that lands after the freeze)."""


@pytest.fixture(scope="module")
def supervisor(engine: str) -> Iterator[Supervisor]:
    with running_supervisor(engine, FAST_SWEEP) as sup:
        yield sup


def wait_until(check: Callable[[], bool], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def cgroup_dir(pid: int, controller: str) -> Path:
    """The host's folder of `pid`'s cgroup for a cgroup v1 controller (this host's layout is
    hybrid: cpuacct may be mounted alone or as cpu,cpuacct), or the unified one ("")."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            for mount in (names, controller, "cpu,cpuacct", "cpuacct,cpu"):
                folder = Path("/sys/fs/cgroup", mount, path.lstrip("/"))
                if folder.is_dir():
                    return folder
        if not controller and names == "":
            unified = Path("/sys/fs/cgroup/unified", path.lstrip("/"))
            return unified if unified.is_dir() else Path("/sys/fs/cgroup", path.lstrip("/"))
    raise AssertionError(f"no {controller or 'unified'} cgroup for pid {pid}")


class Cgroup:
    """The sandbox container's cgroup, read from the host (not through the agent, which is
    frozen with everything else)."""

    def __init__(self, engine: str, container_id: str) -> None:
        info = inspected(engine, container_id)
        assert info.pid > 0
        self.pid = info.pid

    def cpu_ns(self) -> int:
        try:
            return int((cgroup_dir(self.pid, "cpuacct") / "cpuacct.usage").read_text())
        except AssertionError:  # a pure cgroup v2 host: usage_usec in cpu.stat
            stat = (cgroup_dir(self.pid, "") / "cpu.stat").read_text().split()
            return int(stat[stat.index("usage_usec") + 1]) * 1000

    def frozen(self) -> bool:
        try:
            return (cgroup_dir(self.pid, "freezer") / "freezer.state").read_text().strip() in (
                "FROZEN",
            )
        except AssertionError:
            return (cgroup_dir(self.pid, "") / "cgroup.freeze").read_text().strip() == "1"


def test_a_paused_sandbox_uses_no_cpu_and_runs_on_after_resume(
    supervisor: Supervisor, engine: str, key: str
) -> None:
    with supervisor.client() as c:
        box = c.sandbox(key)
        busy = process(box, "start", command=BUSY, name="busy")
        info = box.info()
        group = Cgroup(engine, info.container_id)
        start = group.cpu_ns()
        wait_until(lambda: group.cpu_ns() > start + 100_000_000)  # the loop spins
        assert box.pause() is True
        assert group.frozen()
        before = group.cpu_ns()
        time.sleep(1.0)
        after = group.cpu_ns()
        assert after - before <= CPU_EPSILON_NS, f"{after - before} ns of CPU while paused"
        paused = box.info()
        assert (paused.state, paused.container_id) == ("PAUSED", info.container_id)
        assert paused.paused_at is not None
        assert box.resume() is True
        assert not group.frozen()
        wait_until(lambda: group.cpu_ns() > after + 100_000_000)  # it spins again
        again = process(box, "poll", id="busy")
        assert (again["state"], again["pid"]) == ("running", busy["pid"])
        resumed = box.info()
        assert (resumed.state, resumed.paused_at, resumed.heals) == ("RUNNING", None, 0)
        process(box, "kill", id="busy", signal="KILL")


def test_a_background_server_answers_after_resume_with_its_memory_intact(
    supervisor: Supervisor, key: str
) -> None:
    with supervisor.client() as c:
        box = c.sandbox(key)
        process(box, "start", command=COUNTER, name="counter")
        wait_until(lambda: box.exec(FETCH, timeout=20).exit_code == 0)
        assert box.exec(FETCH, timeout=20).stdout == "2\n"
        assert box.pause() is True
        assert box.pause() is False, "pausing a paused sandbox changes nothing"
        time.sleep(2.0)  # health probes every 0.25 s meet the frozen agent meanwhile
        info = box.info()
        assert (info.state, info.trouble, info.heals) == ("PAUSED", "", 0)
        assert box.resume() is True
        assert box.resume() is False, "resuming a running sandbox changes nothing"
        assert box.exec(FETCH, timeout=20).stdout == "3\n"  # the count lived in its memory
        assert box.info().container_id == info.container_id


def test_an_interact_session_survives_a_pause(supervisor: Supervisor, key: str) -> None:
    with supervisor.client() as c, c.sandbox(key).interact("cat") as session:
        box = c.sandbox(key)
        session.send("one\n")
        assert session.read_until("one\n") == "one\n"
        assert box.pause() is True
        assert box.resume() is True
        session.send("two\n")
        assert session.read_until("two\n") == "two\n"
        assert box.pause() is True
        session.send("three\n")  # input to a paused sandbox resumes it
        assert session.read_until("three\n") == "three\n"
        assert box.info().state == "RUNNING"


def test_a_call_to_a_paused_sandbox_resumes_it_and_both_are_audited(
    supervisor: Supervisor, key: str
) -> None:
    with supervisor.client() as c:
        box = c.sandbox(key)
        box.write_file("note.txt", "kept")
        container = box.info().container_id
        assert box.pause() is True
        assert box.read_file("note.txt") == "kept"
        ran = box.exec("echo awake")
        assert (ran.exit_code, ran.stdout) == (0, "awake\n")
        info = box.info()
        assert (info.state, info.container_id, info.heals) == ("RUNNING", container, 0)
        (paused,) = c.list_audit(sandbox_key=key, tool="pause_sandbox")  # the caller's
        assert (paused.front, paused.is_error) == ("grpc", False)
        assert paused.caller.startswith(("ipv4:", "ipv6:", "unix:")), paused.caller  # the peer
        records = c.list_audit(sandbox_key=key, tool="housekeeping")  # the call's resume
        steps = [r.policy_step for r in reversed(records)]
        assert steps == ["housekeeping: resume: a call to the paused sandbox"], steps


def test_with_paused_call_refuse_a_call_is_refused_clearly(engine: str) -> None:
    refuse = '[sandbox]\npaused_call = "refuse"\n'
    with running_supervisor(engine, refuse) as sup, sup.client() as c:
        box = c.sandbox("frozen")
        box.write_file("a.txt", "before")
        assert box.pause() is True
        with pytest.raises(FailedPrecondition) as refused:
            box.exec("echo no")
        assert refused.value.reason == "SANDBOX_PAUSED"
        assert refused.value.code == "FAILED_PRECONDITION"
        assert "is paused" in str(refused.value)
        assert "stockade resume KEY" in str(refused.value)
        with pytest.raises(FailedPrecondition):
            box.write_file("a.txt", "after")
        assert box.info().state == "PAUSED"
        assert box.resume() is True
        assert box.read_file("a.txt") == "before", "the refused write never ran"


def test_unknown_and_hostile_keys_get_clear_errors(supervisor: Supervisor) -> None:
    with supervisor.client() as c:
        for verb in (c.pause_sandbox, c.resume_sandbox):
            with pytest.raises(NotFound, match="is unknown; a tool call creates its container"):
                verb("never-made")
            with pytest.raises(NotFound, match="is unknown"):
                verb("../../etc/passwd")  # any text is a key; no path is made of it
            with pytest.raises(InvalidArgument, match="sandbox key is empty"):
                verb("")
            with pytest.raises(InvalidArgument, match="the limit is 256"):
                verb("k" * 300)
        assert all(s.key != "never-made" for s in c.list_sandboxes())


def test_the_async_client_pauses_and_resumes(supervisor: Supervisor, key: str) -> None:
    async def main() -> list[object]:
        async with AsyncStockade(supervisor.target) as client:
            box = client.sandbox(key)
            await box.exec("true")
            seen: list[object] = [await box.pause(), await box.pause()]
            info = await box.info()
            seen += [info.state, info.paused_at is not None]
            seen += [await box.resume(), await box.resume(), (await box.info()).state]
            with pytest.raises(NotFound):
                await client.pause_sandbox("never-made")
            return seen

    assert asyncio.run(main()) == [True, False, "PAUSED", True, True, False, "RUNNING"]


def test_the_cli_pauses_and_resumes(supervisor: Supervisor, key: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "STOCKADE_ADDR": supervisor.target}
        cmd = [sys.executable, "-m", "stockade.supervisor.cli", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)

    with supervisor.client() as c:
        c.sandbox(key).exec("true")
    assert cli("pause", key).stdout == f"{key}: paused\n"
    assert cli("pause", key).stdout == f"{key}: already paused\n"
    listing = cli("ls").stdout
    assert f"{key}" in listing
    assert "PAUSED" in listing
    assert "paused since" in listing
    assert cli("resume", key).stdout == f"{key}: resumed\n"
    assert cli("resume", key).stdout == f"{key}: not paused\n"
    missing = cli("pause", "never-made")
    assert missing.returncode != 0
    assert "NOT_FOUND" in missing.stderr
    assert "is unknown" in missing.stderr


def test_a_restart_adopts_a_paused_sandbox_as_paused(
    own_supervisor: Supervisor, engine: str
) -> None:
    with own_supervisor.client() as c:
        box = c.sandbox("sleeper")
        started = process(box, "start", command="sleep 1000", name="nap")
        assert box.pause() is True
        before = box.info()
    own_supervisor.stop()
    own_supervisor.start()
    be = backend(engine)
    try:
        found = be.inspect(before.container_id)
    finally:
        be.close()
    assert found is not None
    assert found.paused, "the engine still holds it paused"
    with own_supervisor.client() as c:
        box = c.sandbox("sleeper")
        adopted = box.info()
        assert (adopted.state, adopted.container_id) == ("PAUSED", before.container_id)
        assert adopted.paused_at is not None
        assert before.paused_at is not None
        assert abs((adopted.paused_at - before.paused_at).total_seconds()) < 2
        nap = process(box, "poll", id="nap")  # a call: resumes it, on the same container
        assert (nap["state"], nap["pid"]) == ("running", started["pid"])
        assert box.info().state == "RUNNING"
        assert box.info().container_id == before.container_id
    inspected = engine_cli(engine, "inspect", "--format", "{{.State.Paused}}", before.container_id)
    assert inspected.stdout.strip() == "false"


def test_housekeeping_pauses_an_idle_sandbox_and_never_heals_it(engine: str) -> None:
    config = (
        '[housekeeping]\nidle_action = "pause"\nidle_pause_s = 1\nidle_timeout_s = 600\n'
        "sweep_interval_s = 0.25\n"
    )
    with running_supervisor(engine, config) as sup, sup.client() as c:
        box = c.sandbox("idle")
        box.write_file("x.txt", "x")
        container = box.info().container_id
        wait_until(lambda: box.info().state == "PAUSED")
        time.sleep(6.0)  # longer than an agent may stay silent before it counts as wedged
        info = box.info()
        assert (info.state, info.container_id, info.heals, info.trouble) == (
            "PAUSED",
            container,
            0,
            "",
        )
        assert box.read_file("x.txt") == "x"  # resumes it
        assert box.info().container_id == container
        records = c.list_audit(sandbox_key="idle", tool="housekeeping")
        assert any("pause: idle for" in r.policy_step for r in records)
        assert "healed sandbox" not in sup.log()
