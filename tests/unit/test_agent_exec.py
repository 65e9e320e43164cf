"""The exec tool, run for real with /bin/sh on a temporary workspace."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stockade.agent import execute, spawn, tools
from stockade.agent.errors import ToolError
from tests.unit.fakes import make_folder

MiB = 1024 * 1024

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "ws", {"a.txt": "a"}, dirs=("sub",))


async def run(ws: Path, **args: Any) -> dict[str, Any]:
    return await execute.exec_command(ws, args)


async def fails(code: str, ws: Path, **args: Any) -> str:
    with pytest.raises(ToolError) as info:
        await run(ws, **args)
    assert info.value.code == code, info.value.message
    return info.value.message


def alive(pid: int) -> bool:
    """Whether `pid` runs. A zombie counts as gone: on a host whose PID 1 does not
    reap, killed orphans stay zombies, and os.kill(pid, 0) still succeeds on them."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat", "rb") as file:
            state = file.read().rsplit(b")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state not in (b"Z", b"X")


async def gone(pid: int, within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return not alive(pid)


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid`."""
    members = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in (b"Z", b"X") and int(fields[2]) == pgid:
            members.append(int(name))
    return members


def zombie_children() -> list[int]:
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == b"Z" and int(fields[1]) == os.getpid():
            found.append(int(name))
    return found


# results


async def test_echo_result(ws: Path) -> None:
    result = await run(ws, command="echo out; echo err >&2")
    duration = result.pop("duration_ms")
    assert result == {
        "exit_code": 0,
        "stdout": "out\n",
        "stderr": "err\n",
        "timed_out": False,
        "stdout_bytes": 4,
        "stderr_bytes": 4,
        "stdout_truncated": False,
        "stderr_truncated": False,
        "signal": None,
        "oom_killed": False,
    }
    assert isinstance(duration, int)
    assert 0 <= duration < 5000


@pytest.mark.parametrize(
    ("command", "exit_code", "signal_name"),
    [
        ("exit 3", 3, None),
        ("false", 1, None),
        ("kill -TERM $$", 143, "SIGTERM"),
        ("kill -KILL $$", 137, "SIGKILL"),
        ("kill -SEGV $$", 139, "SIGSEGV"),
        ("exit 255", 255, None),
    ],
)
async def test_exit_codes_and_signals(
    ws: Path, command: str, exit_code: int, signal_name: str | None
) -> None:
    result = await run(ws, command=command)
    assert (result["exit_code"], result["signal"]) == (exit_code, signal_name)


async def test_undecodable_output_is_replaced(ws: Path) -> None:
    assert (await run(ws, command="printf 'a\\377b'"))["stdout"] == "a\ufffdb"


async def test_stdin_is_dev_null(ws: Path) -> None:
    result = await run(ws, command="cat; echo done", timeout=10)
    assert (result["stdout"], result["timed_out"]) == ("done\n", False)
    assert result["duration_ms"] < 2000


async def test_runs_in_own_process_group_and_session(ws: Path) -> None:
    result = await run(ws, command="echo $$; cut -d' ' -f5,6 /proc/$$/stat")
    pid, ids = result["stdout"].splitlines()
    assert ids.split() == [pid, pid]


async def test_oom_score_is_raised(ws: Path) -> None:
    result = await run(ws, command="sleep 0.2; cat /proc/$$/oom_score_adj")
    assert result["stdout"] == "1000\n"


# output caps


async def test_stdout_cap_counts_the_rest(ws: Path) -> None:
    result = await execute.exec_command(
        ws, {"command": "yes | head -c 50M"}, max_output_bytes=1 * MiB
    )
    assert result["exit_code"] == 0
    assert result["stdout_bytes"] == 50 * MiB
    assert len(result["stdout"]) == 1 * MiB
    assert result["stdout"].startswith("y\ny\n")
    assert (result["stdout_truncated"], result["stderr_truncated"]) == (True, False)


async def test_stderr_cap(ws: Path) -> None:
    command = "head -c 3000 /dev/zero | tr '\\0' e >&2"
    result = await execute.exec_command(ws, {"command": command}, max_output_bytes=1000)
    assert (result["stderr"], result["stderr_bytes"]) == ("e" * 1000, 3000)
    assert result["stderr_truncated"] is True


async def test_run_passes_max_output_bytes(ws: Path) -> None:
    result = await tools.run("exec", {"command": "echo 12345"}, root=ws, max_output_bytes=3)
    assert (result["stdout"], result["stdout_bytes"]) == ("123", 6)


# timeouts and cleanup


async def test_timeout_kills_background_children(ws: Path) -> None:
    started = time.monotonic()
    result = await run(ws, command="echo start; sleep 100 & echo $!; sleep 100", timeout=0.5)
    assert time.monotonic() - started < 5
    first, child = result["stdout"].splitlines()
    assert first == "start"
    assert (result["timed_out"], result["exit_code"], result["signal"]) == (True, 137, "SIGKILL")
    assert await gone(int(child))


async def test_background_child_holding_pipes_does_not_delay_result(ws: Path) -> None:
    started = time.monotonic()
    result = await run(ws, command="sleep 100 & echo $!", timeout=30)
    assert time.monotonic() - started < 3
    assert (result["timed_out"], result["exit_code"]) == (False, 0)
    assert await gone(int(result["stdout"]))


async def test_detached_background_child_is_killed_with_the_group(ws: Path) -> None:
    result = await run(ws, command="sleep 100 >/dev/null 2>&1 & echo $!")
    assert await gone(int(result["stdout"]))


async def test_escaped_session_cannot_hold_the_call(ws: Path) -> None:
    started = time.monotonic()
    result = await run(ws, command="setsid sleep 30 & echo $!", timeout=30)
    escaped = int(result["stdout"])
    try:
        assert time.monotonic() - started < 3
        assert result["timed_out"] is False
    finally:
        os.kill(escaped, signal.SIGKILL)


async def test_forking_loop_is_killed_entirely(ws: Path) -> None:
    command = "echo $$; while :; do sleep 100 & done"
    result = await run(ws, command=command, timeout=1)
    assert result["timed_out"] is True
    assert group_members(int(result["stdout"].splitlines()[0])) == []


async def test_no_zombies_or_fd_leaks(ws: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for command, timeout in [("echo x", 5), ("sleep 100 & sleep 100", 0.2), ("exit 1", 5)]:
        await run(ws, command=command, timeout=timeout)
    assert len(os.listdir("/proc/self/fd")) == before
    assert zombie_children() == []


async def test_commands_run_concurrently(ws: Path) -> None:
    started = time.monotonic()
    results = await asyncio.gather(*(run(ws, command="sleep 0.5") for _ in range(3)))
    assert [r["exit_code"] for r in results] == [0, 0, 0]
    assert time.monotonic() - started < 1.4


# arguments


async def test_workdir(ws: Path) -> None:
    default = await run(ws, command="pwd")
    sub = await run(ws, command="pwd", workdir="sub")
    assert default["stdout"] == f"{os.path.realpath(ws)}\n"
    assert sub["stdout"] == f"{os.path.realpath(ws / 'sub')}\n"


@pytest.mark.parametrize(
    ("workdir", "code", "message"),
    [
        ("..", "INVALID_PATH", "workdir '..' leaves the workspace"),
        ("/tmp", "INVALID_PATH", "workdir '/tmp' leaves the workspace"),
        ("a.txt", "INVALID_PATH", "workdir 'a.txt' is a file, not a directory"),
        ("missing", "FILE_NOT_FOUND", "workdir 'missing' does not exist"),
        ("", "INVALID_ARGS", "argument 'workdir' must not be empty"),
        (3, "INVALID_ARGS", "argument 'workdir' must be a string, got integer"),
    ],
)
async def test_bad_workdir(ws: Path, workdir: Any, code: str, message: str) -> None:
    assert await fails(code, ws, command="true", workdir=workdir) == message


async def test_workdir_symlink_leaving_root(ws: Path, tmp_path: Path) -> None:
    (ws / "out").symlink_to(tmp_path)
    assert "leaves the workspace" in await fails("INVALID_PATH", ws, command="pwd", workdir="out")


async def test_env_is_added_to_the_agents(ws: Path) -> None:
    result = await run(ws, command='echo "$FOO|$PATH"', env={"FOO": "bar baz"})
    assert result["stdout"] == f"bar baz|{os.environ['PATH']}\n"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"A=B": "x"}, "argument 'env': invalid variable name 'A=B'"),
        ({"": "x"}, "argument 'env': invalid variable name ''"),
        ({"A\0": "x"}, "argument 'env': invalid variable name 'A\\x00'"),
        ({"A": "x\0y"}, "argument 'env': the value of A contains NUL"),
        ({"A": 1}, "argument 'env' must map names to strings; 'A' is integer"),
        (["A"], "argument 'env' must be an object, got array"),
    ],
)
async def test_bad_env(ws: Path, env: Any, message: str) -> None:
    assert await fails("INVALID_ARGS", ws, command="true", env=env) == message


@pytest.mark.parametrize(
    ("timeout", "message"),
    [
        (0, "argument 'timeout' must be above 0, got 0"),
        (-1.5, "argument 'timeout' must be above 0, got -1.5"),
        ("5", "argument 'timeout' must be a finite number, got string"),
        (True, "argument 'timeout' must be a finite number, got boolean"),
        (float("nan"), "argument 'timeout' must be a finite number, got number"),
        (float("inf"), "argument 'timeout' must be a finite number, got number"),
    ],
)
async def test_bad_timeout(ws: Path, timeout: Any, message: str) -> None:
    assert await fails("INVALID_ARGS", ws, command="true", timeout=timeout) == message


def test_timeout_is_clamped() -> None:
    assert execute._timeout({"timeout": 1000}) == execute.MAX_TIMEOUT
    assert execute._timeout({"timeout": 2}) == 2.0
    assert execute._timeout({}) == execute.DEFAULT_TIMEOUT


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "argument 'command' is required"),
        ({"command": ""}, "argument 'command' must not be empty"),
        ({"command": "  \n"}, "argument 'command' must not be empty"),
        ({"command": ["ls"]}, "argument 'command' must be a string, got array"),
        ({"command": "echo\0"}, "argument 'command' contains a NUL byte"),
        (
            {"command": "ls", "cwd": "."},
            "unknown argument 'cwd'; allowed: command, env, login, session, shell, stdin, "
            "timeout, workdir",
        ),
    ],
)
async def test_bad_command(ws: Path, args: dict[str, Any], message: str) -> None:
    assert await fails("INVALID_ARGS", ws, **args) == message


async def test_spawn_failure_is_execution_failed(ws: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), hard))
    try:
        message = await fails("EXECUTION_FAILED", ws, command="true")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert message == "could not start the command: Too many open files"


@pytest.fixture
def file_size_cap() -> Iterator[int]:
    """RLIMIT_FSIZE of 100 KB for this process and what it starts, as a sandbox's fsize."""
    cap = 100_000
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (cap, limits[1]))
    try:
        yield cap
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)


async def test_write_past_the_file_size_cap_is_an_error_not_a_signal(
    ws: Path, file_size_cap: int
) -> None:
    result = await run(ws, command="head -c 200000 /dev/zero > big; echo status $?")
    assert result["signal"] is None
    assert result["exit_code"] == 0
    assert result["stdout"] == "status 1\n"
    assert "File too large" in result["stderr"]
    assert (ws / "big").stat().st_size == file_size_cap


async def test_without_a_file_size_cap_commands_run_directly(ws: Path) -> None:
    assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == resource.RLIM_INFINITY
    assert execute.with_file_size_errors("/bin/sh", "-c", "x") == ("/bin/sh", "-c", "x")


async def test_stream_sink_hands_the_pid_before_output_read_early() -> None:
    """Pipes can deliver output before the process's transport is handed back to attach();
    the pid still comes first, then the early chunks in order."""
    sink = execute.StreamSink()
    sink.put(1, b"early out")
    sink.put(2, b"early err")
    sink.attach(spawn.Child(4242, on_exit=lambda: None))
    sink.put(1, b"late")
    got = [await sink.get() for _ in range(4)]
    assert got == [(0, b"4242"), (1, b"early out"), (2, b"early err"), (1, b"late")]


async def test_streamed_exec_always_starts_with_the_pid(ws: Path) -> None:
    for _ in range(20):
        sink = execute.StreamSink()
        task = asyncio.ensure_future(execute.exec_command(ws, {"command": "echo a"}, sink=sink))
        first = await sink.get()
        await task
        assert first[0] == 0, first
        assert int(first[1]) > 0, first


# Both ways a command starts (spawn.shell_argv): directly when it runs in the agent's own
# folder (the workspace root in a sandbox), through `env --chdir` elsewhere.
@pytest.fixture(params=["direct", "env-chdir"])
def start_route(request: pytest.FixtureRequest, ws: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(ws if request.param == "direct" else ws / "sub")
    assert (spawn.shell_argv("x", ws)[0] == "/bin/sh") == (request.param == "direct")
    return str(request.param)


async def test_each_route_runs_in_the_workdir_asked_for(ws: Path, start_route: str) -> None:
    assert (await run(ws, command="pwd"))["stdout"] == f"{ws}\n"
    assert (await run(ws, command="pwd", workdir="sub"))["stdout"] == f"{ws / 'sub'}\n"


async def test_each_route_gives_the_command_only_stdin_stdout_and_stderr(
    ws: Path, start_route: str
) -> None:
    """No descriptor of the agent's reaches a command, not even one its own parent left
    without close-on-exec (planted here): /proc/self/fd of `ls` holds 0, 1, 2 and the folder
    ls itself reads."""
    planted = os.open(ws / "a.txt", os.O_RDONLY)
    os.set_inheritable(planted, True)
    try:
        result = await run(ws, command="ls /proc/self/fd")
    finally:
        os.close(planted)
    assert result["stdout"].split() == ["0", "1", "2", "3"]


async def test_each_route_gives_sigpipe_its_default_action(ws: Path, start_route: str) -> None:
    """The agent (Python) ignores SIGPIPE; a command must not: `yes | head` ends quietly."""
    result = await run(ws, command="yes | head -c 3; grep SigIgn /proc/self/status")
    assert result["stdout"].startswith("y\ny")
    assert result["stderr"] == ""
    ignored = int(result["stdout"].split()[-1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    assert not ignored & (1 << (signal.SIGXFSZ - 1))


async def test_each_route_keeps_sigxfsz_ignored_under_a_file_size_cap(
    ws: Path, start_route: str, file_size_cap: int
) -> None:
    result = await run(ws, command="head -c 200000 /dev/zero > big; echo status $?")
    assert (result["signal"], result["stdout"]) == (None, "status 1\n")
    assert "File too large" in result["stderr"]


async def test_each_route_feeds_stdin_and_reports_a_signal(ws: Path, start_route: str) -> None:
    assert (await run(ws, command="cat", stdin="in\n"))["stdout"] == "in\n"
    killed = await run(ws, command="kill -TERM $$")
    assert (killed["signal"], killed["exit_code"]) == ("SIGTERM", 128 + 15)


async def test_a_command_that_cannot_start_is_execution_failed(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spawn, "ENV", "/nonexistent/env")
    message = await fails("EXECUTION_FAILED", ws, command="true", workdir="sub")
    assert message == "could not start the command: No such file or directory: '/nonexistent/env'"


async def test_stdin_larger_than_a_pipe_is_delivered_whole(ws: Path) -> None:
    data = "".join(f"line {i}\n" for i in range(400_000))  # ~5 MB, far past a pipe's 64 KiB
    result = await run(ws, command="wc -c; cat >/dev/null", stdin=data)
    assert result["stdout"] == f"{len(data)}\n"


async def test_a_command_that_reads_no_stdin_ends_normally(ws: Path) -> None:
    """The writer meets EPIPE when the command exits unread: no error, no stuck call."""
    result = await run(ws, command="head -c 3", stdin="x" * (4 * MiB))
    assert (result["exit_code"], result["stdout"], result["timed_out"]) == (0, "xxx", False)
    result = await run(ws, command="exit 7", stdin="x" * (4 * MiB))
    assert result["exit_code"] == 7


async def test_cancelling_a_call_kills_its_command(ws: Path) -> None:
    task = asyncio.ensure_future(run(ws, command="echo $$ > pid; exec sleep 30", stdin="x"))
    while not (ws / "pid").exists() or not (ws / "pid").read_text().strip():
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await gone(int((ws / "pid").read_text()))
