"""Resource abuse, each attempt a tool call inside a sandbox with small quotas: it must be
contained (a clear result, the limit holds), the supervisor must stay responsive, the same key
must work afterwards, and another sandbox's calls must keep working while the abuse runs
(proved here by calling it all along; how much slower it gets is measured in bench/)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from stockade.client import Sandbox, Stockade, ToolResult
from stockade.supervisor.engines.backends.base import LABEL_KEY
from tests.integration.harness import Supervisor, backend, process, running_supervisor

pytestmark = pytest.mark.timeout(300)
MiB = 1024 * 1024
PACE_S = 0.05
"""Pause between the neighbour's calls (under the rate limit, and leaving CPU to the abuse)."""
QUOTAS = """
[sandbox]
workspace_size_mb = 64
tmp_size_mb = 16
tmp_inodes = 4096
max_file_size_mb = 8
"""


@pytest.fixture(scope="module")
def supervisor(engine: str) -> Iterator[Supervisor]:
    """Overrides the shared one: these sandboxes have small disk quotas."""
    with running_supervisor(engine, extra_config=QUOTAS) as sup:
        yield sup


@dataclass
class Neighbour:
    """Another sandbox, called in a loop on a thread of its own while an abuse runs."""

    supervisor: Supervisor
    key: str
    calls: list[tuple[float, float]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _warm: threading.Event = field(default_factory=threading.Event)

    def _loop(self) -> None:
        with self.supervisor.client() as c:
            box = c.sandbox(self.key)
            n = 0
            while not self._stop.is_set():
                n += 1
                began = time.monotonic()
                try:
                    result = box.exec(f"echo {n} > n.txt && cat n.txt", timeout=60)
                    said = f"{result.exit_code} {result.stdout!r} {result.for_llm[:200]}"
                    good = result.exit_code == 0 and result.stdout == f"{n}\n"
                except Exception as exc:
                    said, good = repr(exc), False
                if not good:
                    self.failures.append(said)
                self.calls.append((began, time.monotonic()))
                self._warm.set()
                self._stop.wait(PACE_S)


@pytest.fixture
def neighbour(supervisor: Supervisor, key: str) -> Iterator[Neighbour]:
    """Started and warm before the test's abuse; checked when the test ends: every call
    worked, and calls were in flight during the whole test."""
    other = Neighbour(supervisor, key + "-neighbour")
    worker = threading.Thread(target=other._loop, daemon=True)
    worker.start()
    assert other._warm.wait(120), "the neighbour's first call did not return"
    began = time.monotonic()
    yield other
    ended = time.monotonic()
    count = len(other.calls)
    while len(other.calls) == count and worker.is_alive():  # one more, after the abuse
        time.sleep(0.05)
    other._stop.set()
    worker.join(120)
    assert other.failures == [], "the neighbour's calls failed during the abuse"
    assert any(start < ended and end > began for start, end in other.calls)


def run(box: Sandbox, command: str, timeout: float = 120) -> ToolResult:
    result = box.exec(command, timeout=timeout)
    assert result.exit_code is not None, f"{command!r}: {result.error_code} {result.for_llm}"
    return result


def assert_next_call_works(client: Stockade, key: str) -> None:
    """The same key works and nothing of the abuse is left running in it."""
    result = client.sandbox(key).exec("echo alive; ps -e --no-headers | wc -l")
    assert result.exit_code == 0, result.for_llm
    alive, count = result.stdout.split()
    assert alive == "alive"
    assert int(count) < 10, "processes of the previous call are left behind"


def wait_armed(box: Sandbox, ident: str) -> None:
    deadline = time.monotonic() + 60
    while "armed" not in process(box, "log", id=ident).get("data", ""):
        assert time.monotonic() < deadline, "the process never set its trap"
        time.sleep(0.05)


def wait_exited(box: Sandbox, ident: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while (polled := process(box, "poll", id=ident))["state"] == "running":
        assert time.monotonic() < deadline, "the background process did not end"
        time.sleep(0.1)
    return polled


# disk


def test_workspace_fill_stops_at_its_quota(
    supervisor: Supervisor, client: Stockade, key: str, neighbour: Neighbour
) -> None:
    box = client.sandbox(key)
    size = int(run(box, "df -k --output=size /workspace | tail -1").stdout)
    assert 48 * 1024 < size <= 64 * 1024, "the workspace is a file system of its own"
    fill = run(box, "i=0; while head -c 4M /dev/zero > fill$i; do i=$((i+1)); done; echo $i")
    assert "No space left on device" in fill.stderr
    assert int(fill.stdout) < 16
    image = supervisor.workspace(key).parent / "workspace.img"
    assert os.stat(image).st_blocks * 512 <= 64 * MiB, "the host's disk holds no more"
    refused = box.call("write_file", {"path": "more.txt", "content": "x" * 100_000})
    assert refused.is_error
    assert "No space left on device" in refused.error_message
    run(box, "rm -f fill*")
    box.write_file("more.txt", "room again")
    assert box.read_file("more.txt") == "room again"
    assert_next_call_works(client, key)


def test_tmp_fill_stops_at_its_quota(client: Stockade, key: str, neighbour: Neighbour) -> None:
    box = client.sandbox(key)
    assert int(run(box, "df -k --output=size /tmp | tail -1").stdout) == 16 * 1024
    fill = run(box, "i=0; while head -c 1M /dev/zero > /tmp/fill$i; do i=$((i+1)); done; echo $i")
    assert "No space left on device" in fill.stderr
    assert int(fill.stdout) <= 16, "16 MiB in files of 1 MiB"
    run(box, "rm -f /tmp/fill*")
    assert run(box, "echo room > /tmp/x && cat /tmp/x").stdout == "room\n"
    assert_next_call_works(client, key)


def test_a_million_files_in_tmp_stop_at_its_inode_cap(
    supervisor: Supervisor, client: Stockade, key: str, neighbour: Neighbour
) -> None:
    """Empty files cost no blocks, so only an inode cap stops them before they eat the
    memory limit (tmpfs inodes are kernel memory charged to the sandbox)."""
    box = client.sandbox(key)
    container = box.ensure().container_id
    assert run(box, "df --output=itotal /tmp | tail -1").stdout.strip() == "4096"
    run(box, "echo kept > /tmp/marker")
    box.write_file(
        "many.py",
        "import os\nos.mkdir('/tmp/m')\nn = 0\ntry:\n"
        "    for n in range(1_000_000):\n        open(f'/tmp/m/{n}', 'w').close()\n"
        "except OSError as exc:\n    print(n, exc.strerror)\n",
    )
    result = run(box, "python3 many.py")
    assert result.data["oom_killed"] is not True
    made, reason = result.stdout.split(" ", 1)
    assert int(made) < 4096
    assert reason.strip() == "No space left on device"
    assert run(box, "cat /tmp/marker").stdout == "kept\n", "the same container, not a new one"
    assert box.ensure().container_id == container
    run(box, "python3 -c 'import shutil; shutil.rmtree(\"/tmp/m\")'")
    assert run(box, "touch /tmp/again && echo room").stdout == "room\n"
    assert_next_call_works(client, key)


def test_tmp_is_fresh_per_container_and_unmounted_on_destroy(
    supervisor: Supervisor, client: Stockade, key: str
) -> None:
    """Podman's /tmp is a tmpfs the supervisor mounts: a new container gets a new one, and
    destroying the sandbox leaves no mount behind (Docker's is the engine's own)."""
    box = client.sandbox(key)
    run(box, "echo old > /tmp/left")
    host_tmp = supervisor.workspace(key).parent / "tmp"
    assert host_tmp.is_mount() is (supervisor.engine == "podman")
    client.destroy_sandbox(key)
    assert not host_tmp.is_mount()
    assert run(box, "ls -A /tmp").stdout == "", "a new container's /tmp is empty"
    assert run(box, "df --output=itotal /tmp | tail -1").stdout.strip() == "4096"
    client.destroy_sandbox(key, delete_workspace=True)
    assert not host_tmp.exists()


def test_a_file_past_the_size_cap_is_an_error_not_a_kill(
    client: Stockade, key: str, neighbour: Neighbour
) -> None:
    box = client.sandbox(key)
    for path in ("big", "/tmp/big"):
        result = run(box, f"head -c 20M /dev/zero > {path}; echo status $?; stat -c %s {path}")
        assert result.data["signal"] is None
        assert result.stdout.split() == ["status", "1", str(8 * MiB)]
        assert "File too large" in result.stderr
    refused = box.call("write_file", {"path": "huge.txt", "content": "x" * (9 * MiB)})
    assert refused.is_error
    assert "File too large" in refused.error_message
    started = process(box, "start", command="head -c 20M /dev/zero > bg; echo status $?")
    assert wait_exited(box, started["id"])["exit_code"] == 0
    log = process(box, "log", id=started["id"])["data"]
    assert "File too large" in log
    assert "status 1" in log
    assert_next_call_works(client, key)


def test_a_million_files_stop_at_the_inode_cap(
    client: Stockade, key: str, neighbour: Neighbour
) -> None:
    box = client.sandbox(key)
    inodes = int(run(box, "df --output=itotal /workspace | tail -1").stdout)
    assert inodes < 100_000
    box.write_file(
        "many.py",
        "import os\nos.mkdir('m')\nn = 0\ntry:\n"
        "    for n in range(1_000_000):\n        open(f'm/{n}', 'w').close()\n"
        "except OSError as exc:\n    print(n, exc.strerror)\n",
    )
    made, reason = run(box, "python3 many.py").stdout.split(" ", 1)
    assert int(made) < inodes
    assert reason.strip() == "No space left on device"
    cleared = run(box, "python3 -c 'import shutil; shutil.rmtree(\"m\")' && echo cleared")
    assert cleared.stdout == "cleared\n"
    assert_next_call_works(client, key)


# output


def test_output_flood_is_capped(
    supervisor: Supervisor, client: Stockade, key: str, neighbour: Neighbour
) -> None:
    result = client.sandbox(key).exec("yes | head -c 200M", timeout=120)
    assert result.exit_code == 0, result.for_llm
    assert result.data["stdout_truncated"] is True
    assert result.data["stdout_bytes"] == 200 * MiB
    assert len(result.stdout) == 10 * MiB
    assert result.truncated
    assert len(result.for_llm.encode()) <= 64 * 1024
    assert supervisor.rss_bytes() < 600 * MiB
    assert_next_call_works(client, key)


# memory and processes


def test_memory_bomb_is_killed_not_the_agent(
    client: Stockade, key: str, neighbour: Neighbour
) -> None:
    bomb = "python3 -c \"a = [b'x' * (50 << 20) for _ in range(100)]\""
    result = client.sandbox(key).exec(bomb, timeout=60)
    assert result.is_error
    assert result.error_code == "EXECUTION_FAILED"
    assert result.exit_code == 137
    assert result.data["oom_killed"] is True
    assert "out of memory" in result.error_message
    assert "out of memory" in result.for_llm
    assert_next_call_works(client, key)


def test_fork_bomb_is_contained(client: Stockade, key: str, neighbour: Neighbour) -> None:
    box = client.sandbox(key)
    assert box.exec(":(){ :|:& };:").error_code == "PERMISSION_DENIED", "the guard stops it"
    # The guard is friction; the container is the boundary. A script gets past the guard:
    box.write_file("bomb.sh", ":(){ :|:& };:\n")
    result = box.exec("sh bomb.sh", timeout=5)
    assert result.error_code in ("TIMEOUT", "EXECUTION_FAILED", ""), result.for_llm
    assert_next_call_works(client, key)


PIDS = "cat /sys/fs/cgroup/pids/pids.{0} 2>/dev/null || cat /sys/fs/cgroup/pids.{0}"


OWN_GROUP = "perl -e 'setpgrp(0, 0) or die; exec qw(sleep 300)' &"
"""A process group of its own in the agent's session (what job control makes)."""
STARTS = {
    "plain": "sleep 300 &",
    "setsid": "setsid sleep 300 &",
    "own-group": OWN_GROUP,
}


@pytest.mark.parametrize("start", STARTS.values(), ids=STARTS.keys())
def test_a_thousand_background_processes_meet_the_pids_limit(
    client: Stockade, key: str, neighbour: Neighbour, start: str
) -> None:
    """Plain ones die with their call's process group; ones that left it (setsid, a group of
    their own) are swept because they crowd the pids limit: either way the
    sandbox can fork again. Run from a script: the guard need not see them. (dash exits at
    the first fork that fails: the script may end there.)"""
    box = client.sandbox(key)
    limit = int(run(box, PIDS.format("max")).stdout)
    box.write_file("flood.sh", f"for i in $(seq 1000); do {start} done 2>/dev/null\n")
    flood = run(box, f"sh flood.sh; {PIDS.format('current')}")
    assert flood.exit_code != 0 or int(flood.stdout) <= limit, "cannot fork past the limit"
    assert int(run(box, PIDS.format("current")).stdout) < limit // 2
    assert run(box, "sh -c 'sh -c \"echo forked\"' | cat").stdout == "forked\n"
    assert_next_call_works(client, key)


CROWD = """\
i=0; while [ $i -lt {count} ]; do {start} i=$((i+1)); done
sleep 1
total=0
for f in /proc/[0-9]*/stat; do
  read -r line < $f || continue
  set -- $line
  [ "$2" = "(sleep)" ] && total=$((total+1))
done 2>/dev/null
echo $total
"""


@pytest.mark.parametrize("start", STARTS.values(), ids=STARTS.keys())
def test_strays_that_crowd_the_pids_limit_are_swept_after_the_call(
    client: Stockade, key: str, start: str
) -> None:
    """Three quarters of the pids limit in sleepers, each started as `start`, all running when
    the call ends (counted from /proc): after the call none is left, killed with the call's
    group or swept as strays."""
    box = client.sandbox(key)
    limit = int(run(box, PIDS.format("max")).stdout)
    count = limit * 3 // 4
    box.write_file("crowd.sh", CROWD.format(count=count, start=start))
    total = int(run(box, "sh crowd.sh").stdout)
    assert total == count, "every sleeper ran as the call ended"
    assert int(run(box, PIDS.format("current")).stdout) < limit // 4
    assert_next_call_works(client, key)


def test_a_process_ignoring_sigterm_is_still_killed(
    supervisor: Supervisor, client: Stockade, key: str, neighbour: Neighbour
) -> None:
    box = client.sandbox(key)
    stubborn = "trap '' TERM; echo armed; while :; do sleep 1; done"
    timed_out = box.exec(stubborn, timeout=2)
    assert timed_out.error_code == "TIMEOUT"
    assert timed_out.stdout == "armed\n"
    assert_next_call_works(client, key)
    started = process(box, "start", command=stubborn)
    wait_armed(box, started["id"])  # the trap is set: TERM sent before it would just kill
    process(box, "kill", id=started["id"], signal="TERM")
    assert process(box, "poll", id=started["id"])["state"] == "running", "TERM is ignored"
    process(box, "kill", id=started["id"], signal="KILL")
    assert wait_exited(box, started["id"])["state"] != "running"
    assert_next_call_works(client, key)
    # DestroySandbox removes the container with a stubborn process in it, and keeps the data
    process(box, "start", command=stubborn)
    box.write_file("kept.txt", "kept")
    assert client.destroy_sandbox(key) is True
    engine = backend(supervisor.engine)
    try:
        assert engine.list({LABEL_KEY: key}) == [], "the container is gone"
    finally:
        engine.close()
    assert not supervisor.workspace(key).is_mount(), "destroy unmounts the workspace"
    assert box.read_file("kept.txt") == "kept"
    assert_next_call_works(client, key)


def test_sleep_past_timeout_is_killed_with_its_group(
    client: Stockade, key: str, neighbour: Neighbour
) -> None:
    result = client.sandbox(key).exec("echo started; sleep 100 & sleep 100", timeout=1)
    assert result.is_error
    assert result.error_code == "TIMEOUT"
    assert result.data["timed_out"] is True
    assert result.stdout == "started\n"
    assert "timed out" in result.for_llm
    assert_next_call_works(client, key)
