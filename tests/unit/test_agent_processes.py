"""The process tool's table, run for real with /bin/sh on a temporary workspace."""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stockade.agent import execute, processes, tools
from stockade.agent.errors import ToolError
from stockade.agent.processes import ProcessTable
from tests.unit.fakes import make_folder
from tests.unit.test_agent_exec import alive, gone, group_members, zombie_children

MiB = 1024 * 1024

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "ws", dirs=("sub",))


@pytest.fixture
async def table(ws: Path) -> AsyncIterator[ProcessTable]:
    table = ProcessTable(ws, max_running=3, log_bytes=4096)
    yield table
    await table.close()


async def call(table: ProcessTable, action: str, **args: Any) -> dict[str, Any]:
    return await table.handle({"action": action, **args})


async def fails(table: ProcessTable, code: str, action: str, **args: Any) -> str:
    with pytest.raises(ToolError) as info:
        await call(table, action, **args)
    assert info.value.code == code, info.value.message
    return info.value.message


async def start(table: ProcessTable, command: str, **args: Any) -> str:
    return str((await call(table, "start", command=command, **args))["id"])


async def exited(table: ProcessTable, ident: str, within: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while (poll := await call(table, "poll", id=ident))["state"] == "running":
        assert time.monotonic() < deadline, f"{ident} still runs"
        await asyncio.sleep(0.02)
    return poll


async def output(table: ProcessTable, ident: str, *, until: str, within: float = 5.0) -> str:
    """The whole log, once it holds `until`."""
    deadline = time.monotonic() + within
    while until not in (text := (await call(table, "log", id=ident))["data"]):
        assert time.monotonic() < deadline, f"{until!r} not in {text!r}"
        await asyncio.sleep(0.02)
    return str(text)


# start, list, poll, log


async def test_start_list_poll_log(table: ProcessTable, ws: Path) -> None:
    started = await call(table, "start", command="echo out; echo err >&2", name="greeter")
    assert set(started) == {"id", "name", "pid", "command", "started_at", "pty"}
    assert started["pty"] is False
    assert (started["id"], started["name"]) == ("p1", "greeter")
    assert started["started_at"].endswith("Z")
    poll = await exited(table, "p1")
    assert poll == {
        "id": "p1",
        "pid": started["pid"],
        "state": "exited",
        "exit_code": 0,
        "signal": None,
        "output_bytes": 8,
        "pending_stdin": 0,
    }
    log = await call(table, "log", id="greeter")
    assert log == {
        "id": "p1",
        "offset": 0,
        "next_offset": 8,
        "data": "out\nerr\n",
        "dropped": 0,
        "state": "exited",
        "exit_code": 0,
        "signal": None,
        "output_bytes": 8,
    }
    (entry,) = (await call(table, "list"))["processes"]
    assert entry["command"] == "echo out; echo err >&2"
    assert (entry["pid"], entry["state"], entry["output_bytes"]) == (started["pid"], "exited", 8)
    assert entry["ended_at"] >= entry["started_at"]


async def test_ids_are_short_and_never_reused(table: ProcessTable) -> None:
    assert [await start(table, "true") for _ in range(3)] == ["p1", "p2", "p3"]
    await exited(table, "p3")
    await call(table, "remove", id="p3")
    assert await start(table, "true") == "p4"


async def test_log_follows_a_process_by_offsets(table: ProcessTable) -> None:
    ident = await start(table, "for i in 1 2 3 4 5 6; do echo line$i; sleep 0.1; done")
    seen, offset, reads = "", 0, 0
    while True:
        log = await call(table, "log", id=ident, offset=offset)
        assert (log["offset"], log["dropped"]) == (offset, 0)
        seen, offset, reads = seen + log["data"], log["next_offset"], reads + 1
        if log["state"] == "exited" and offset == log["output_bytes"]:
            break
        await asyncio.sleep(0.05)
    assert seen == "".join(f"line{i}\n" for i in range(1, 7))
    assert reads > 3


async def test_log_limit(table: ProcessTable) -> None:
    ident = await start(table, "printf 0123456789")
    await exited(table, ident)
    log = await call(table, "log", id=ident, offset=2, limit=3)
    assert (log["data"], log["offset"], log["next_offset"]) == ("234", 2, 5)
    end = await call(table, "log", id=ident, offset=10)
    assert (end["data"], end["next_offset"]) == ("", 10)


async def test_ring_buffer_wrap_reports_dropped(ws: Path) -> None:
    table = ProcessTable(ws, log_bytes=100)
    try:
        ident = await start(table, "for i in $(seq 100 129); do echo $i; done")  # 120 bytes
        await exited(table, ident)
        log = await call(table, "log", id=ident, offset=4)
        assert (log["offset"], log["dropped"], log["next_offset"]) == (20, 16, 120)
        assert log["data"] == "".join(f"{i}\n" for i in range(105, 130))
        kept = await call(table, "log", id=ident, offset=60)
        assert (kept["offset"], kept["dropped"]) == (60, 0)
    finally:
        await table.close()


async def test_log_never_splits_a_character(table: ProcessTable) -> None:
    ident = await start(table, "printf '\\342\\202\\254\\342\\202\\254'")  # two euro signs
    await exited(table, ident)
    log = await call(table, "log", id=ident, limit=4)
    assert (log["data"], log["next_offset"]) == ("€", 3)
    rest = await call(table, "log", id=ident, offset=3, limit=4)
    assert (rest["data"], rest["next_offset"]) == ("€", 6)
    tiny = await call(table, "log", id=ident, limit=2)  # smaller than a character: no stall
    assert tiny["next_offset"] == 2


async def test_log_holds_back_a_character_still_being_written(table: ProcessTable) -> None:
    ident = await start(table, "printf 'a\\342\\202'; sleep 0.5; printf '\\254b'")
    await output(table, ident, until="a")
    first = await call(table, "log", id=ident)
    assert (first["data"], first["next_offset"]) == ("a", 1)
    await exited(table, ident)
    rest = await call(table, "log", id=ident, offset=1)
    assert rest["data"] == "€b"


async def test_cut_character_at_the_end_of_a_finished_log_is_replaced(table: ProcessTable) -> None:
    ident = await start(table, "printf 'a\\342\\202'")
    await exited(table, ident)
    log = await call(table, "log", id=ident)
    assert (log["data"], log["next_offset"]) == ("a\ufffd", 3)


# stdin


async def test_write_and_eof(table: ProcessTable) -> None:
    command = "python3 -c 'import sys; print(sys.stdin.readline().upper())'"
    ident = await start(table, command)
    assert await call(table, "write", id=ident, data="hello ") == {
        "id": ident,
        "written": 6,
        "eof": False,
        "pending_stdin": 0,
    }
    await call(table, "write", id=ident, data="wörld\n", eof=True)
    assert (await exited(table, ident))["exit_code"] == 0
    assert await output(table, ident, until="\n\n") == "HELLO WÖRLD\n\n"


async def test_eof_alone_ends_cat(table: ProcessTable) -> None:
    ident = await start(table, "cat; echo done")
    await call(table, "write", id=ident, data="x")
    assert (await call(table, "write", id=ident, eof=True))["written"] == 0
    await exited(table, ident)
    assert await output(table, ident, until="done") == "xdone\n"


async def test_write_after_eof_or_exit_is_refused(table: ProcessTable) -> None:
    ident = await start(table, "sleep 100")
    await call(table, "write", id=ident, eof=True)
    assert await fails(table, "INVALID_ARGS", "write", id=ident, data="x") == (
        f"the stdin of process '{ident}' is closed"
    )
    done = await start(table, "true")
    await exited(table, done)
    message = await fails(table, "INVALID_ARGS", "write", id=done, data="x")
    assert message == f"process '{done}' has exited; it reads no input"
    assert "give 'data'" in await fails(table, "INVALID_ARGS", "write", id=ident)


async def test_huge_writes_do_not_block_and_are_capped(table: ProcessTable) -> None:
    ident = await start(table, "sleep 100")  # never reads
    started = time.monotonic()
    assert (await call(table, "write", id=ident, data="x" * (900 * 1024)))["written"] == 900 * 1024
    message = await fails(table, "EXECUTION_FAILED", "write", id=ident, data="y" * (300 * 1024))
    assert "is not reading its input fast enough" in message
    assert "nothing was written" in message
    too_big = await fails(table, "EXECUTION_FAILED", "write", id=ident, data="z" * (2 * MiB))
    assert "limit of 1048576 bytes" in too_big
    assert time.monotonic() - started < 2
    assert (await call(table, "poll", id=ident))["state"] == "running"


async def test_a_process_closing_stdin_closes_it_for_writers(table: ProcessTable) -> None:
    ident = await start(table, "exec 0<&-; echo closed; sleep 100")
    await output(table, ident, until="closed")
    deadline = time.monotonic() + 2
    while not (stdin := await write_refused(table, ident)) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert stdin == f"the stdin of process '{ident}' is closed"


async def write_refused(table: ProcessTable, ident: str) -> str:
    try:
        await call(table, "write", id=ident, data="x")
    except ToolError as exc:
        return exc.message
    return ""


# kill, remove, limits


async def test_kill_by_signal_name(table: ProcessTable) -> None:
    ident = await start(table, "trap '' TERM; echo ready; while :; do sleep 0.1; done")
    await output(table, ident, until="ready")
    term = await call(table, "kill", id=ident)
    assert term == {"id": ident, "signal": "SIGTERM", "state": "running", "exit_code": None}
    killed = await call(table, "kill", id=ident, signal="kill")
    assert killed == {"id": ident, "signal": "SIGKILL", "state": "exited", "exit_code": 137}
    poll = await call(table, "poll", id=ident)
    assert (poll["exit_code"], poll["signal"]) == (137, "SIGKILL")


@pytest.mark.parametrize(
    ("given", "sent", "exit_code"),
    [("INT", "SIGINT", 130), ("SIGHUP", "SIGHUP", 129), ("TERM", "SIGTERM", 143)],
)
async def test_signal_spellings(table: ProcessTable, given: str, sent: str, exit_code: int) -> None:
    ident = await start(table, "echo ready; sleep 100")
    await output(table, ident, until="ready")  # a signal between fork and exec may be lost
    result = await call(table, "kill", id=ident, signal=given)
    assert result["signal"] == sent
    await exited(table, ident)  # kill waits at most 1 s; a loaded machine may need longer
    poll = await call(table, "poll", id=ident)
    assert (poll["exit_code"], poll["signal"]) == (exit_code, sent)


async def test_kill_reaches_the_whole_group(table: ProcessTable) -> None:
    ident = await start(table, "sleep 100 & echo $!; wait")
    child = int((await output(table, ident, until="\n")).strip())
    pid = (await call(table, "list"))["processes"][0]["pid"]
    assert alive(child)
    await call(table, "kill", id=ident)
    assert await gone(child)
    assert group_members(pid) == []


async def test_leftovers_of_an_exited_shell_are_killed(table: ProcessTable) -> None:
    ident = await start(table, "sleep 100 & echo $!")
    child = int((await output(table, ident, until="\n")).strip())
    await exited(table, ident)
    assert await gone(child)


async def test_cap_on_running_processes(table: ProcessTable) -> None:
    ids = [await start(table, "sleep 100") for _ in range(3)]
    message = await fails(table, "EXECUTION_FAILED", "start", command="true")
    assert message == "3 processes are running, the limit; kill or wait for one (process list)"
    await call(table, "kill", id=ids[0])
    assert await start(table, "true") == "p4"


async def test_concurrent_starts_respect_the_cap(table: ProcessTable) -> None:
    results = await asyncio.gather(
        *(call(table, "start", command="sleep 100") for _ in range(6)), return_exceptions=True
    )
    assert sum(isinstance(r, dict) for r in results) == 3
    assert all(isinstance(r, ToolError) for r in results if not isinstance(r, dict))


async def test_remove(table: ProcessTable) -> None:
    ident = await start(table, "sleep 100", name="web")
    assert await fails(table, "INVALID_ARGS", "remove", id="web") == (
        f"process '{ident}' is running; kill it first"
    )
    await call(table, "kill", id="web")
    assert await call(table, "remove", id="web") == {"id": ident, "removed": True}
    assert (await call(table, "list"))["processes"] == []
    assert "no process" in await fails(table, "INVALID_ARGS", "poll", id=ident)
    assert await start(table, "true", name="web") == "p2"  # the name is free again


async def test_oldest_exited_entries_are_dropped(ws: Path) -> None:
    table = ProcessTable(ws, max_exited=2)
    try:
        for _ in range(4):
            await exited(table, await start(table, "true"))
        await asyncio.sleep(0.3)  # reaped
        running = await start(table, "sleep 100")
        listed = [p["id"] for p in (await call(table, "list"))["processes"]]
        assert listed == ["p3", "p4", running]
    finally:
        await table.close()


# names, ids, arguments


async def test_names(table: ProcessTable) -> None:
    await start(table, "sleep 100", name="web")
    assert await fails(table, "INVALID_ARGS", "start", command="true", name="web") == (
        "a process named 'web' exists already (p1); pick another name, or remove that one"
    )
    assert "look like an id" in await fails(table, "INVALID_ARGS", "start", command="x", name="p2")
    too_long = await fails(table, "INVALID_ARGS", "start", command="x", name="n" * 65)
    assert too_long == "argument 'name' must be 1 to 64 printable characters"
    assert (await call(table, "poll", id="web"))["id"] == "p1"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            {"action": "poll", "id": "p9"},
            "INVALID_ARGS",
            "no process 'p9' (process list shows them)",
        ),
        (
            {"action": "launch"},
            "INVALID_ARGS",
            "unknown action 'launch'; one of: start, list, poll, log, write, kill, remove, "
            "attach, resize",
        ),
        ({}, "INVALID_ARGS", "argument 'action' is required"),
        ({"action": 1}, "INVALID_ARGS", "argument 'action' must be a string, got integer"),
        (
            {"action": "list", "id": "p1"},
            "INVALID_ARGS",
            "unknown argument 'id'; allowed: action",
        ),
        (
            {"action": "start", "command": "true", "timeout": 5},
            "INVALID_ARGS",
            "unknown argument 'timeout'; allowed: action, cols, command, env, follow, login, name, "
            "pty, rows, separate_stderr, session, shell, stdin, workdir",
        ),
        ({"action": "start"}, "INVALID_ARGS", "argument 'command' is required"),
        (
            {"action": "start", "command": " "},
            "INVALID_ARGS",
            "argument 'command' must not be empty",
        ),
        (
            {"action": "start", "command": "true", "env": {"A": 1}},
            "INVALID_ARGS",
            "argument 'env' must map names to strings; 'A' is integer",
        ),
        (
            {"action": "start", "command": "true", "workdir": ".."},
            "INVALID_PATH",
            "workdir '..' leaves the workspace",
        ),
        ({"action": "kill"}, "INVALID_ARGS", "argument 'id' is required"),
    ],
)
async def test_bad_arguments(
    table: ProcessTable, args: dict[str, Any], code: str, message: str
) -> None:
    with pytest.raises(ToolError) as info:
        await table.handle(args)
    assert (info.value.code, info.value.message) == (code, message)


async def test_bad_arguments_on_a_process(table: ProcessTable) -> None:
    ident = await start(table, "sleep 100")
    assert await fails(table, "INVALID_ARGS", "kill", id=ident, signal="STOPIT") == (
        "unknown signal 'STOPIT'; one of: TERM, KILL, INT, HUP, QUIT, USR1, USR2"
    )
    assert "must be a string" in await fails(table, "INVALID_ARGS", "kill", id=ident, signal=9)
    assert "at least 0" in await fails(table, "INVALID_ARGS", "log", id=ident, offset=-1)
    assert "at least 1" in await fails(table, "INVALID_ARGS", "log", id=ident, limit=0)
    assert "must be an integer" in await fails(table, "INVALID_ARGS", "log", id=ident, offset=1.5)
    assert await fails(table, "INVALID_ARGS", "log", id=ident, offset=10) == (
        f"offset 10 is past the end of the output of '{ident}' (0 bytes so far)"
    )
    assert "a boolean" in await fails(table, "INVALID_ARGS", "write", id=ident, eof="yes")
    await call(table, "kill", id=ident, signal="KILL")
    assert "has exited already" in await fails(table, "INVALID_ARGS", "kill", id=ident)


async def test_workdir_env_session_and_oom_score(table: ProcessTable, ws: Path) -> None:
    command = (
        'pwd; echo "$FOO"; cut -d" " -f5,6 /proc/$$/stat; echo $$; '
        "sleep 0.2; cat /proc/$$/oom_score_adj"
    )
    ident = await start(table, command, workdir="sub", env={"FOO": "bar"})
    await exited(table, ident)
    cwd, foo, ids, pid, oom = (await call(table, "log", id=ident))["data"].splitlines()
    assert (cwd, foo, oom) == (os.path.realpath(ws / "sub"), "bar", "1000")
    assert ids.split() == [pid, pid]


async def test_spawn_failure_is_execution_failed(table: ProcessTable) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), hard))
    try:
        message = await fails(table, "EXECUTION_FAILED", "start", command="true")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert message == "could not start the command: Too many open files"
    assert (await call(table, "list"))["processes"] == []


# follow, close, isolation


async def test_follow_yields_everything_and_ends_after_exit(table: ProcessTable) -> None:
    ident = await start(table, "echo early; sleep 0.3; echo late; sleep 0.2; echo last")
    chunks = [(offset, chunk) async for offset, fd, chunk in table.follow(ident) if fd == 1]
    assert b"".join(chunk for _, chunk in chunks) == b"early\nlate\nlast\n"
    assert chunks[0][0] == 0
    assert len(chunks) >= 3  # delivered as produced, not at the end
    assert (await call(table, "poll", id=ident))["state"] == "exited"


async def test_follow_from_an_offset_and_from_a_wrapped_log(ws: Path) -> None:
    table = ProcessTable(ws, log_bytes=10)
    try:
        ident = await start(table, "printf 0123456789abcdef")
        chunks = [item async for item in table.follow(ident, 3)]
        # the first read may come before the wrap: then it starts at 3, else at 6
        data = b"".join(chunk for _, _, chunk in chunks)
        assert b"0123456789abcdef".endswith(data)
        assert chunks[0][0] in (3, 6)
        with pytest.raises(ToolError, match="no process 'p7'"):
            [item async for item in table.follow("p7")]
    finally:
        await table.close()


async def test_follow_of_a_silent_finished_process_ends(table: ProcessTable) -> None:
    ident = await start(table, "true")
    await exited(table, ident)
    await asyncio.sleep(0.3)
    assert [chunk async for _, chunk in table.follow(ident)] == []


async def test_close_kills_all_and_leaves_no_zombies(ws: Path) -> None:
    table = ProcessTable(ws, max_running=5)
    pids = []
    for command in ("sleep 100", "trap '' TERM; sleep 100", "sleep 100 & wait", "true"):
        pids.append((await call(table, "start", command=command))["pid"])
    started = time.monotonic()
    await table.close()
    assert time.monotonic() - started < 5
    assert not any(alive(pid) for pid in pids)
    assert all(group_members(pid) == [] for pid in pids)
    assert zombie_children() == []
    assert "shutting down" in await fails(table, "EXECUTION_FAILED", "start", command="true")


async def test_exec_group_kill_never_reaches_a_process(table: ProcessTable, ws: Path) -> None:
    ident = await start(table, "sleep 100")
    pid = (await call(table, "list"))["processes"][0]["pid"]
    result = await execute.exec_command(ws, {"command": "sleep 30", "timeout": 0.2})
    assert result["timed_out"] is True
    own_group = await execute.exec_command(ws, {"command": "kill 0"})
    assert own_group["signal"] == "SIGTERM"
    assert alive(pid)
    assert (await call(table, "poll", id=ident))["state"] == "running"


async def test_no_zombies_after_exits_and_kills(table: ProcessTable) -> None:
    done = [await start(table, c) for c in ("true", "exit 3", "sleep 100")]
    await call(table, "kill", id=done[2], signal="KILL")
    for ident in done:
        await exited(table, ident)
    await asyncio.sleep(0.3)
    assert zombie_children() == []


# pty


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_pty_is_the_controlling_terminal_of_the_foreground_group(table: ProcessTable) -> None:
    program = (
        "import os, sys; "
        "print(os.isatty(0), os.isatty(1), os.isatty(2), os.tcgetpgrp(0) == os.getpgrp()); "
        "print(os.ttyname(0).startswith('/dev/pts/'), os.environ['TERM'])"
    )
    started = await call(table, "start", command=f'python3 -c "{program}"', pty=True)
    assert started["pty"] is True
    text = await output(table, started["id"], until="xterm")
    # a terminal turns \n into \r\n
    assert text == "True True True True\r\nTrue xterm-256color\r\n"
    assert (await call(table, "list"))["processes"][0]["pty"] is True


async def test_pty_input_is_echoed_and_read_by_input(table: ProcessTable) -> None:
    ident = await start(table, "python3 -c \"print('got', input('name? '))\"", pty=True)
    await output(table, ident, until="name? ")
    await call(table, "write", id=ident, data="bob\n")
    assert (await exited(table, ident))["exit_code"] == 0
    assert await output(table, ident, until="got bob") == "name? bob\r\ngot bob\r\n"


async def test_pty_window_size_and_resize_signal_the_program(table: ProcessTable) -> None:
    ident = await start(table, "stty size", pty=True, cols=120, rows=40)
    assert await output(table, ident, until="\n") == "40 120\r\n"
    default = await start(table, "stty size", pty=True)
    assert await output(table, default, until="\n") == "24 80\r\n"
    program = (
        "import os, signal, time\n"
        'signal.signal(signal.SIGWINCH, lambda *_: print("size", *os.get_terminal_size()))\n'
        'print("ready")\n'
        "time.sleep(30)\n"
    )
    watcher = await start(table, f"python3 -c '{program}'", pty=True)
    await output(table, watcher, until="ready")
    assert await call(table, "resize", id=watcher, cols=100, rows=30) == {
        "id": watcher,
        "cols": 100,
        "rows": 30,
    }
    await output(table, watcher, until="size 100 30")


async def test_pty_eof_and_ctrl_c(table: ProcessTable) -> None:
    cat = await start(table, "cat", pty=True)
    await call(table, "write", id=cat, data="abc\n", eof=True)
    assert (await exited(table, cat))["exit_code"] == 0
    assert await output(table, cat, until="abc\r\nabc") == "abc\r\nabc\r\n"
    sleeper = await start(table, "sleep 100", pty=True)
    await asyncio.sleep(0.2)
    await call(table, "write", id=sleeper, data="\x03")  # ^C: SIGINT to the foreground group
    assert (await exited(table, sleeper))["signal"] == "SIGINT"


async def test_pty_bad_arguments(table: ProcessTable) -> None:
    assert await fails(table, "INVALID_ARGS", "start", command="true", cols=100) == (
        "'cols' and 'rows' need 'pty': true"
    )
    for args in ({"cols": 0}, {"rows": 1001}, {"cols": -5}):
        message = await fails(table, "INVALID_ARGS", "start", command="true", pty=True, **args)
        assert "must be 1 to 1000" in message
    assert "an integer" in await fails(
        table, "INVALID_ARGS", "start", command="true", pty=True, cols="80"
    )
    plain = await start(table, "sleep 100")
    assert "has no terminal" in await fails(
        table, "INVALID_ARGS", "resize", id=plain, cols=80, rows=24
    )
    tty = await start(table, "true", pty=True)
    await exited(table, tty)
    assert "has exited" in await fails(table, "INVALID_ARGS", "resize", id=tty, cols=80, rows=24)
    assert "'rows' is required" in await fails(table, "INVALID_ARGS", "resize", id=tty, cols=80)


async def test_pty_processes_leave_no_descriptor_open(table: ProcessTable) -> None:
    before = open_fds()
    for _ in range(5):
        ident = await start(table, "echo hi", pty=True)
        await exited(table, ident)
        killed = await start(table, "sleep 100", pty=True)
        await call(table, "kill", id=killed, signal="KILL")
        await exited(table, killed)
    await asyncio.sleep(0.1)
    assert open_fds() == before
    assert zombie_children() == []


# wiring


async def test_tools_run_dispatches_to_the_table(table: ProcessTable, ws: Path) -> None:
    args = {"action": "start", "command": "true"}
    result = await tools.run("process", args, root=ws, max_output_bytes=1, processes=table)
    assert result["id"] == "p1"
    with pytest.raises(ToolError, match="keeps no process table"):
        await tools.run("process", {"action": "list"}, root=ws, max_output_bytes=1)


def test_partial_tail() -> None:
    euro = "€".encode()
    cases = [(b"", 0), (b"a", 0), (euro, 0), (euro[:1], 1), (euro[:2], 2), (b"a\xff", 0)]
    cases += [("😀".encode()[:3], 3), (b"\x80\x80\x80", 0)]
    for data, tail in cases:
        assert processes._partial_tail(data) == tail, data


async def test_agent_flags_and_shutdown_reach_the_table(ws: Path) -> None:
    """The real agent, through the supervisor's link: --max-processes caps, SIGTERM kills
    its processes."""
    from stockade.supervisor.sandboxes.agent_link import AgentConnection

    run_dir = Path(tempfile.mkdtemp(dir="/tmp"))  # a unix socket path must stay short
    socket = run_dir / "agent.sock"
    flags = ["--socket", str(socket), "--workspace", str(ws)]
    flags += ["--max-processes", "1", "--process-log-bytes", "10"]
    agent = subprocess.Popen([sys.executable, "-P", "-m", "stockade.agent", *flags])
    link = AgentConnection(socket)
    try:
        await link.wait_ready(20)

        async def invoke(**args: Any) -> Any:
            return await link.invoke("process", args, 20, "r")

        first = (await invoke(action="start", command="seq 100; sleep 100")).result
        second = await invoke(action="start", command="true")
        assert "1 processes are running, the limit" in second.error_message
        deadline = time.monotonic() + 5
        while (await invoke(action="poll", id="p1")).result["output_bytes"] < 292:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        log = (await invoke(action="log", id="p1")).result
        assert (log["data"], log["dropped"]) == ("98\n99\n100\n", 282)
        await link.close()
        agent.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(agent.wait, 20) == 0
        assert not alive(first["pid"])
    finally:
        await link.close()
        agent.kill()
        agent.wait()
        shutil.rmtree(run_dir, ignore_errors=True)


async def test_the_supervisor_renders_every_action(table: ProcessTable) -> None:
    """The renderer tells the actions apart by their fields: feed it the table's own results."""
    from stockade.supervisor.tools.render import render

    assert render("process", await call(table, "list")) == "[no processes]"
    started = await call(table, "start", command="cat", name="echoer")
    assert render("process", started) == f"Started process p1 'echoer' (pid {started['pid']}): cat"
    assert render("process", await call(table, "write", id="p1", data="hi")) == (
        "Wrote 2 bytes to the stdin of p1"
    )
    await output(table, "p1", until="hi")
    assert render("process", await call(table, "poll", id="p1")) == (
        "Process p1: running, 2 bytes output"
    )
    assert render("process", await call(table, "log", id="p1", offset=1)) == "i\n[next offset 2]"
    assert render("process", await call(table, "kill", id="p1")) == (
        "Sent SIGTERM to process p1: now exited by SIGTERM, exit code 143"
    )
    pid = started["pid"]
    assert render("process", await call(table, "list")) == (
        f"p1  echoer  pid {pid}  exited by SIGTERM, exit code 143  2 bytes output  $ cat"
    )
    assert render("process", await call(table, "remove", id="p1")) == "Removed process p1"
    tty = await call(table, "start", command="sleep 100", pty=True)
    assert render("process", tty) == (
        f"Started process p2 (pid {tty['pid']}) on a terminal: sleep 100"
    )
    assert render("process", await call(table, "resize", id="p2", cols=90, rows=20)) == (
        "Resized the terminal of p2 to 90x20"
    )
    wrapped = {
        "id": "p2",
        "offset": 9,
        "next_offset": 10,
        "data": "x",
        "dropped": 9,
        "state": "exited",
        "exit_code": 0,
    }
    assert render("process", wrapped) == (
        "x\n[9 bytes dropped: the log keeps only the latest output]\n"
        "[process exited, exit code 0]\n[next offset 10]"
    )


async def test_signals_ignored_by_the_agent_are_not_passed_on(tmp_path: Path) -> None:
    """Under nohup SIGHUP is ignored, and ignored signals survive exec: the table gives them
    back their default action, so `kill HUP` still stops a background process."""
    saved = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        table = ProcessTable(tmp_path)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
        ident = await start(table, "echo ready; sleep 100")
        await output(table, ident, until="ready")
        await call(table, "kill", id=ident, signal="HUP")
        poll = await exited(table, ident)
        assert (poll["exit_code"], poll["signal"]) == (129, "SIGHUP")
        await table.close()
    finally:
        signal.signal(signal.SIGHUP, saved)


# stdin: false, separate_stderr, follow (the E2B front's processes)


async def test_separate_stderr_keeps_each_bytes_stream(table: ProcessTable) -> None:
    script = "echo out1; echo err1 >&2; sleep 0.1; echo out2; echo err2 >&2; printf tail"
    ident = await start(table, script, separate_stderr=True)
    chunks = [(fd, chunk) async for _, fd, chunk in table.follow(ident)]
    by_fd = {fd: b"".join(c for f, c in chunks if f == fd) for fd in (1, 2)}
    assert by_fd == {1: b"out1\nout2\ntail", 2: b"err1\nerr2\n"}
    # the log keeps both, in the order they came; a second follow sees the same runs
    log = (await call(table, "log", id=ident))["data"]
    pieces = ("out1\n", "err1\n", "out2\n", "err2\n", "tail")  # each one write: whole
    assert all(piece in log for piece in pieces)
    assert len(log) == sum(map(len, pieces))
    again = [(fd, chunk) async for _, fd, chunk in table.follow(ident)]
    assert again == _merged(chunks)
    assert (await exited(table, ident))["exit_code"] == 0


def _merged(chunks: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """Adjacent chunks of one fd as one (a later follow reads whole runs)."""
    out: list[tuple[int, bytes]] = []
    for fd, chunk in chunks:
        if out and out[-1][0] == fd:
            out[-1] = (fd, out[-1][1] + chunk)
        else:
            out.append((fd, chunk))
    return out


async def test_runs_survive_the_ring_wrapping(ws: Path) -> None:
    table = ProcessTable(ws, log_bytes=8)
    try:
        ident = await start(
            table, "printf aaaa; sleep 0.05; printf bbbb >&2; sleep 0.05; printf cccc",
            separate_stderr=True,
        )  # fmt: skip
        await exited(table, ident)
        chunks = [(offset, fd, chunk) async for offset, fd, chunk in table.follow(ident)]
        assert chunks == [(4, 2, b"bbbb"), (8, 1, b"cccc")]
    finally:
        await table.close()


async def test_without_stdin_a_reader_gets_eof_and_writes_are_refused(
    table: ProcessTable,
) -> None:
    ident = await start(table, "cat; echo done", stdin=False)
    assert (await exited(table, ident))["exit_code"] == 0
    assert "done" in (await call(table, "log", id=ident))["data"]
    other = await start(table, "sleep 5", stdin=False)
    message = await fails(table, "INVALID_ARGS", "write", id=other, data="x")
    assert "stdin" in message


async def test_follow_is_for_streamed_starts_and_pty_takes_no_stdin_options(
    table: ProcessTable,
) -> None:
    assert "CallToolStream" in await fails(
        table, "INVALID_ARGS", "start", command="true", follow=True
    )
    for option in ({"stdin": False}, {"separate_stderr": True}):
        message = await fails(table, "INVALID_ARGS", "start", command="true", pty=True, **option)
        assert "without 'pty'" in message
    assert (await call(table, "list"))["processes"] == []


async def test_a_streamed_start_follows_its_process(table: ProcessTable) -> None:
    started = await table.start_following(
        {"action": "start", "command": "echo hi; echo oops >&2; exit 3", "follow": True,
         "separate_stderr": True, "stdin": False}
    )  # fmt: skip
    chunks = [(fd, chunk) async for _, fd, chunk in table.follow(started["id"])]
    assert b"".join(c for fd, c in chunks if fd == 1) == b"hi\n"
    assert b"".join(c for fd, c in chunks if fd == 2) == b"oops\n"
    assert (await exited(table, started["id"]))["exit_code"] == 3
