"""The exec tool: run a shell command in its own process group, with a timeout.

Life of one command:
1. the shell (shells.py: `/bin/bash -c COMMAND` unless the call asks for sh, or a session's
   preamble and trailer around it) starts in a new session (so its process group is its
   own), stdin from /dev/null, its OOM score raised so an OOM kills it first;
2. stdout and stderr are read as they come; each keeps at most
   `max_output_bytes`, the rest is counted and dropped;
3. when the shell exits, the pipes get at most EOF_GRACE more to reach EOF
   (a background child may hold them open);
4. then, and always on timeout, the whole group gets SIGKILL until none of it
   is alive, the shell is reaped and the pipes are closed;
5. oom_killed tells whether the container's OOM killer struck meanwhile.
A timeout is a result (timed_out=true, partial output), not an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from . import kernfiles, paths, shells, spawn, strays
from .argcheck import Args, encoded, expect_only, opt_number, opt_str, opt_str_map, req_str
from .errors import ToolError

_T = TypeVar("_T")
DEFAULT_TIMEOUT: Final = 30.0
MAX_TIMEOUT: Final = 300.0
EOF_GRACE: Final = 0.2
REAP_TIMEOUT: Final = 5.0
_KILL_PAUSE: Final = 0.01


class StreamSink:
    """Hands the command's pid and output chunks to a consumer as they come; when the
    consumer lags `high` chunks behind, reading from the pipes pauses (so memory stays
    bounded and the command blocks on its own writes)."""

    def __init__(self, high: int = 64) -> None:
        self.queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self._high = high
        self._pipes: list[spawn.PipeReader] = []
        self._paused = False
        self._early: list[tuple[int, bytes]] | None = []
        """Output read before attach(): the pipes can deliver data before the process's
        transport is handed back, and the pid must come first."""

    def attach(self, child: spawn.Child) -> None:
        self._pipes = child.pipes
        self.queue.put_nowait((0, str(child.pid).encode()))
        early, self._early = self._early or [], None
        for fd, data in early:
            self.put(fd, data)

    def put(self, fd: int, data: bytes) -> None:
        if self._early is not None:
            self._early.append((fd, data))
            return
        self.queue.put_nowait((fd, data))
        if self.queue.qsize() >= self._high and not self._paused:
            self._set_paused(True)

    async def get(self) -> tuple[int, bytes]:
        """(0, pid) once, then (fd, chunk) for fd 1 and 2."""
        item = await self.queue.get()
        if self._paused and self.queue.qsize() < self._high // 2:
            self._set_paused(False)
        return item

    def _set_paused(self, paused: bool) -> None:
        self._paused = paused
        for pipe in self._pipes:
            with contextlib.suppress(RuntimeError, AttributeError):
                pipe.pause_reading() if paused else pipe.resume_reading()


async def exec_command(
    root: Path,
    args: dict[str, Any],
    *,
    max_output_bytes: int = 10 * 1024 * 1024,
    sink: StreamSink | None = None,
    sessions: shells.Sessions | None = None,
) -> dict[str, Any]:
    """Run `command` with the call's shell (bash by default) in `workdir` (default: the
    workspace root, or a session's folder); with a sink, stream the output to it as well."""
    expect_only(args, ("command", "timeout", "workdir", "env", "stdin", *_SHELL_ARGS))
    command, timeout, env = _command(args), _timeout(args), _env(args)
    stdin, shell = _stdin(args), shells.shell_of(args)
    name = opt_str(args, "session", None)
    cwd = await resolve_workdir(root, opt_str(args, "workdir", "."))
    if name is None:
        run = _Run(shell.argv(command), cwd, {**os.environ, **env}, stdin, timeout)
        return await run.go(max_output_bytes, sink)
    table = shells.SESSIONS if sessions is None else sessions
    session = table.open(name, shell)
    async with table.hold(session):
        given = cwd if "workdir" in args else None
        launch = table.launch(session, shell, command, env, given, keep=True)
        try:
            result = await _Run(launch.argv, launch.cwd or cwd, launch.env, stdin, timeout).go(
                max_output_bytes, sink
            )
        except BaseException:
            table.finish(session, launch, ended=False)
            raise
        result["session"] = table.finish(session, launch, ended=not result["timed_out"])
    return result


_SHELL_ARGS: Final = ("shell", "login", "session")


@dataclass
class _Run:
    """One command's start, wait, kill and result."""

    argv: list[str]
    cwd: Path
    env: dict[str, str]
    stdin: bytes | None
    timeout: float

    async def go(self, max_output_bytes: int, sink: StreamSink | None) -> dict[str, Any]:
        started, oom_before = time.monotonic(), _oom_kills()
        output = _Output(max_output_bytes, sink)
        child = await _spawn(self.argv, self.cwd, self.env, output, self.stdin)
        strays.LIVE.add(child.pid)
        try:
            timed_out = not await _within(output.exited, self.timeout)
            if not timed_out:
                await _within(output.eof, EOF_GRACE)
        finally:
            await _kill_group(child.pid)
            await _within(output.exited, REAP_TIMEOUT)
            child.close()
            strays.LIVE.discard(child.pid)
            crowded = await strays.sweep_if_crowded()
        result = output.result(child.returncode, timed_out, time.monotonic() - started)
        result["oom_killed"] = oom_before is not None and (_oom_kills() or 0) > oom_before
        if crowded:
            result["pids_crowded"] = True
        return result


@dataclass
class _Capture:
    """The first `limit` bytes of a stream, and how many bytes it carried."""

    limit: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


class _Output:
    """Collects both pipes and signals exit and end-of-output."""

    def __init__(self, limit: int, sink: StreamSink | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.sink = sink
        self.streams = {1: _Capture(limit), 2: _Capture(limit)}
        self.exited: asyncio.Future[None] = loop.create_future()
        self.eof: asyncio.Future[None] = loop.create_future()
        self._open = {1, 2}

    def data(self, fd: int, chunk: bytes) -> None:
        self.streams[fd].add(chunk)
        if self.sink is not None:
            self.sink.put(fd, chunk)

    def closed(self, fd: int) -> None:
        self._open.discard(fd)
        if not self._open and not self.eof.done():
            self.eof.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def result(self, returncode: int | None, timed_out: bool, seconds: float) -> dict[str, Any]:
        if returncode is None:
            raise ToolError("EXECUTION_FAILED", "the command did not exit after SIGKILL")
        out, err = self.streams[1], self.streams[2]
        return {
            "exit_code": 128 - returncode if returncode < 0 else returncode,
            "stdout": out.text(),
            "stderr": err.text(),
            "duration_ms": round(seconds * 1000),
            "timed_out": timed_out,
            "stdout_bytes": out.total,
            "stderr_bytes": err.total,
            "stdout_truncated": out.total > out.limit,
            "stderr_truncated": err.total > err.limit,
            "signal": _signal_name(-returncode) if returncode < 0 else None,
        }


def _command(args: Args) -> str:
    command = req_str(args, "command")
    if not command.strip():
        raise ToolError("INVALID_ARGS", "argument 'command' must not be empty")
    if "\0" in command:
        raise ToolError("INVALID_ARGS", "argument 'command' contains a NUL byte")
    encoded(command, "command")
    return command


def _timeout(args: Args) -> float:
    """Seconds, > 0; values above MAX_TIMEOUT are clamped to it."""
    timeout = opt_number(args, "timeout", DEFAULT_TIMEOUT)
    if timeout <= 0:
        raise ToolError("INVALID_ARGS", f"argument 'timeout' must be above 0, got {timeout}")
    return min(float(timeout), MAX_TIMEOUT)


MAX_STDIN: Final = 16 * 1024 * 1024


def _stdin(args: Args) -> bytes | None:
    text = opt_str(args, "stdin", None)
    if text is None:
        return None
    data = encoded(text, "stdin")
    if len(data) > MAX_STDIN:
        raise ToolError("INVALID_ARGS", f"argument 'stdin' is over {MAX_STDIN} bytes")
    return data


def _env(args: Args) -> dict[str, str]:
    env = opt_str_map(args, "env")
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            raise ToolError("INVALID_ARGS", f"argument 'env': invalid variable name {name!r}")
        if "\0" in value:
            raise ToolError("INVALID_ARGS", f"argument 'env': the value of {name} contains NUL")
        encoded(name, "env")
        encoded(value, f"env.{name}")
    return env


async def _spawn(
    shell_argv: list[str], cwd: Path, env: dict[str, str], output: _Output, stdin: bytes | None
) -> spawn.Child:
    argv = spawn.command_argv(shell_argv, cwd)

    async def start() -> spawn.Child:
        return spawn.spawn(
            argv, env, on_data=output.data, on_eof=output.closed, on_exit=output.process_exited,
            stdin=stdin,
        )  # fmt: skip

    child = await start_or_sweep(start)
    _raise_oom_score(child.pid)
    if output.sink is not None:
        output.sink.attach(child)
    return child


async def start_or_sweep(start: Callable[[], Awaitable[_T]]) -> _T:
    """start(), after a sweep when the pids limit is crowded; when it fails (EAGAIN when pids
    run out, no thread left) and processes that nobody owns could be swept, start() once more;
    a ToolError when it still fails."""
    await strays.sweep_if_crowded()  # strays that grew back since the last command ended
    for attempt in (1, 2):
        try:
            return await start()
        except (OSError, RuntimeError) as exc:
            if attempt == 2 or not await asyncio.to_thread(_sweep_for_start):
                raise ToolError(
                    "EXECUTION_FAILED", f"could not start the command: {_reason(exc)}"
                ) from None
    raise AssertionError("unreachable")


def _sweep_for_start() -> int:
    """strays.sweep(); 0 when it fails itself (no descriptor left to read /proc with): the
    start's own error is what the caller hears."""
    try:
        return strays.sweep()
    except OSError:
        return 0


def _reason(exc: Exception) -> str:
    if not isinstance(exc, OSError) or not exc.strerror:
        return str(exc)
    return f"{exc.strerror}: '{exc.filename}'" if exc.filename else exc.strerror


def _raise_oom_score(pid: int) -> None:
    """Best effort: make the command, not the agent, the OOM killer's choice."""
    with contextlib.suppress(OSError):
        kernfiles.write(f"/proc/{pid}/oom_score_adj", "1000")


async def resolve_workdir(root: Path, workdir: str) -> Path:
    """paths.resolve of a command's working folder. The default, the workspace root, takes
    a few stat calls and is resolved here; any other path may have thousands of components
    and is resolved in a thread, off the event loop."""
    resolve = functools.partial(paths.resolve, root, workdir, kind="dir", arg="workdir")
    return resolve() if workdir == "." else await asyncio.to_thread(resolve)


async def _within(future: asyncio.Future[None], seconds: float) -> bool:
    """Wait for `future` at most `seconds` without cancelling it; whether it is done."""
    if future.done():  # most often after a command: no round trips through the loop
        return True
    done, _ = await asyncio.wait({future}, timeout=seconds)
    return bool(done)


async def _kill_group(pgid: int) -> None:
    """SIGKILL the group until none of it is alive.

    Repeated because a forking member may add processes while the signal is
    delivered; bounded by REAP_TIMEOUT. Zombies count as dead: whether they
    get reaped is up to their parent or init.
    """
    deadline = time.monotonic() + REAP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        if not await asyncio.to_thread(_group_alive, pgid):
            return
        await asyncio.sleep(_KILL_PAUSE)


def _group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` is alive (not a zombie), from /proc."""
    with os.scandir("/proc") as entries:
        return any(entry.name.isdigit() and _pgrp_if_alive(entry.name) == pgid for entry in entries)


def _pgrp_if_alive(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return None
    # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
    fields = stat[stat.rfind(b")") + 1 :].split()
    if len(fields) < 3 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[2])


_OOM_COUNTERS: Final = (
    kernfiles.Kept("/sys/fs/cgroup/memory.events"),
    kernfiles.Kept("/sys/fs/cgroup/memory/memory.oom_control"),
)


def _oom_kills() -> int | None:
    """How many processes the memory cgroup's OOM killer has killed (v2 or v1), if known."""
    for counter in _OOM_COUNTERS:
        try:
            lines = counter.read().splitlines()
        except OSError:
            continue
        for line in lines:
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def with_file_size_errors(*argv: str) -> tuple[str, ...]:
    """`argv` as a sandbox command (spawn.command_argv), with SIGXFSZ ignored when the
    container caps file sizes (RLIMIT_FSIZE): for what starts through subprocess (background
    processes, transfers; exec uses spawn.py).

    A write past the cap sends SIGXFSZ, whose default action kills the writer; the agent
    ignores it (Python does), but subprocess gives children the default back. Ignored, the
    write fails with EFBIG ("File too large"), which the program reports like a full disk.
    env(1) or stockade-drop sets the disposition and execs: the same pid, and no Python
    between fork and exec."""
    return tuple(spawn.command_argv(argv, ignore_xfsz=spawn.file_sizes_capped()))


def unignore_signals() -> None:
    """Give back the default action to signals this process ignores (e.g. SIGHUP under nohup).

    An ignored signal stays ignored across exec, and a shell cannot un-ignore what it was
    started with: every command and background process would inherit it, and `kill HUP`
    would not stop them. Only from the main thread (the only one allowed to change them)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for number in spawn.INHERITABLE_SIGNALS:
        if signal.getsignal(number) == signal.SIG_IGN:
            signal.signal(number, signal.SIG_DFL)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"
