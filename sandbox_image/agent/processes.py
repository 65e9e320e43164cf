"""The process tool: background processes that outlive the call that started them.

    ProcessTable    one per agent: `handle(args)` is the tool, `follow` streams a log
    ├── _Process    one started command: its transport, its state, its output log
    └── _Ring       the last `log_bytes` of that output, addressed by absolute offset

Life of one process:
1. `start` runs `SHELL -c COMMAND` (shells.py: bash unless the call asks for sh) in a new
   session (its process group is its own, so no exec call's group kill reaches it), stdin
   a pipe kept open (or /dev/null with `stdin: false`), stdout and stderr into one pipe and
   one log (or two pipes into the one log, each byte's stream remembered, with
   `separate_stderr`: `follow` tells them apart), its OOM score raised as for exec; a
   streamed `start` with `follow` goes on as `attach`;
2. `write` feeds stdin through the transport's buffer, never blocking the agent; at most
   MAX_PENDING_STDIN bytes may wait unread; `kill` signals the whole group;
3. when the shell exits, the pipe gets EOF_GRACE to drain, then what is left of its group
   is SIGKILLed and the shell reaped: an exited process has nothing left running;
4. the entry and its log stay until `remove`; past `max_exited` exited entries the
   oldest go. Processes end with the agent (`close`) or the container, never with a call.

With `pty`, the command gets a pseudo-terminal instead (stdin, stdout and stderr all on its
slave side, which is its controlling terminal): the log is what the terminal shows, input
is typed into it (eof types the EOF character, ^D), and `resize` changes its window size
(the kernel sends SIGWINCH to its foreground group).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import signal
import struct
import termios
import time
from asyncio.subprocess import DEVNULL, PIPE, STDOUT
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, cast

from . import shells, strays
from .argcheck import Args, encoded, expect_only, opt_bool, opt_int, opt_str, req_int, req_str
from .errors import ToolError
from .execute import (
    EOF_GRACE,
    REAP_TIMEOUT,
    _command,
    _env,
    _kill_group,
    _raise_oom_score,
    _signal_name,
    _within,
    resolve_workdir,
    start_or_sweep,
    unignore_signals,
    with_file_size_errors,
)

MAX_EXITED: Final = 50
DEFAULT_LOG_LIMIT: Final = 64 * 1024
MAX_LOG_LIMIT: Final = 1 << 20
MAX_PENDING_STDIN: Final = 1 << 20
MAX_NAME: Final = 64
MAX_WINDOW: Final = 1000
"""Columns and rows of a PTY window: 1 to this."""
DEFAULT_WINDOW: Final = (80, 24)
PTY_TERM: Final = "xterm-256color"
SETSID: Final = "/usr/bin/setsid"
SESSION_WAIT: Final = 2.0
KILL_WAIT: Final = 1.0
"""How long `kill` waits for the process to exit before it answers."""
FOLLOW_CHUNK: Final = 64 * 1024
SIGNALS: Final = {
    name: signal.Signals[f"SIG{name}"]
    for name in ("TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2")
}
_ID: Final = re.compile(r"p[0-9]+")
_ACTION_ARGS: Final[dict[str, tuple[str, ...]]] = {
    "start": (
        "command",
        "workdir",
        "env",
        "name",
        "pty",
        "cols",
        "rows",
        "stdin",
        "separate_stderr",
        "follow",
        "shell",
        "login",
        "session",
    ),
    "list": (),
    "poll": ("id",),
    "log": ("id", "offset", "limit"),
    "write": ("id", "data", "eof"),
    "kill": ("id", "signal"),
    "remove": ("id",),
    "attach": ("id", "offset"),
    "resize": ("id", "cols", "rows"),
}


class _Ring:
    """The last `size` bytes of a stream; offsets count every byte since the start. Each
    byte's file descriptor (1 stdout, 2 stderr) is kept as runs: (first offset, fd)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.start = 0
        """Offset of the oldest byte kept."""
        self._data = bytearray()
        self._runs: list[tuple[int, int]] = [(0, 1)]

    @property
    def end(self) -> int:
        return self.start + len(self._data)

    def add(self, chunk: bytes, fd: int = 1) -> None:
        if chunk and fd != self._runs[-1][1]:
            self._runs.append((self.end, fd))
        self._data += chunk
        excess = len(self._data) - self.size
        if excess > 0:
            del self._data[:excess]
            self.start += excess
            while len(self._runs) > 1 and self._runs[1][0] <= self.start:
                self._runs.pop(0)

    def read_run(self, offset: int, limit: int) -> tuple[int, int, bytes]:
        """read(), stopped where the bytes' fd changes: (begin, fd, data)."""
        begin, data = self.read(offset, limit)
        fd, stop = 1, None
        for first, run_fd in self._runs:
            if first <= begin:
                fd = run_fd
            else:
                stop = first
                break
        if stop is not None:
            data = data[: stop - begin]
        return begin, fd, data

    def read(self, offset: int, limit: int) -> tuple[int, bytes]:
        """At most `limit` bytes from `offset`, or from the oldest byte kept if that is later."""
        begin = max(offset, self.start)
        at = begin - self.start
        return begin, bytes(self._data[at : at + limit])


class _Process(asyncio.SubprocessProtocol):
    """One started command, as the protocol of its subprocess transport."""

    def __init__(
        self, ident: str, name: str | None, command: str, log_bytes: int, outputs: int = 1
    ) -> None:
        loop = asyncio.get_running_loop()
        self.id, self.name, self.command = ident, name, command
        self.log = _Ring(log_bytes)
        self.started_at = _now()
        self.ended_at: str | None = None
        self.transport: asyncio.SubprocessTransport | None = None
        self.exited: asyncio.Future[None] = loop.create_future()
        self.eof: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        """Exited, drained, group killed, transport closed: nothing more will come."""
        self.removed = False
        self.wake = asyncio.Event()
        """Set (and replaced) whenever output arrives or the state changes."""
        self.pty: _Pty | None = None
        self.open_pipes = {1, 2} if outputs == 2 else {1}
        """The output pipes not yet at EOF (2 too with separate_stderr)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.SubprocessTransport, transport)

    def pipe_data_received(self, fd: int, data: bytes | bytearray) -> None:
        self.log.add(bytes(data), fd)
        self.changed()

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.open_pipes.discard(fd)
        if not self.open_pipes and not self.eof.done():
            self.eof.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)
        self.changed()

    def changed(self) -> None:
        self.wake.set()
        self.wake = asyncio.Event()

    @property
    def pid(self) -> int:
        return self.transport.get_pid() if self.transport else 0

    @property
    def returncode(self) -> int | None:
        return self.transport.get_returncode() if self.transport else None

    @property
    def running(self) -> bool:
        """Until the shell has exited and its output is all in the log."""
        return not self.finished.done()

    def status(self) -> dict[str, Any]:
        code = self.returncode
        if self.running or code is None:
            return {"state": "running", "exit_code": None, "signal": None}
        if code < 0:  # killed by a signal: the shell's convention, 128 + its number
            return {"state": "exited", "exit_code": 128 - code, "signal": _signal_name(-code)}
        return {"state": "exited", "exit_code": code, "signal": None}

    def stdin(self) -> asyncio.WriteTransport | None:
        if self.pty is not None:
            return self.pty.writer
        pipe = self.transport.get_pipe_transport(0) if self.transport else None
        return pipe if isinstance(pipe, asyncio.WriteTransport) else None

    def pending_stdin(self) -> int:
        pipe = self.stdin()
        return pipe.get_write_buffer_size() if pipe is not None and not pipe.is_closing() else 0

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if self.pty is not None:
            self.pty.close()


class _PtyOutput(asyncio.Protocol):
    """Reads the PTY's master side into the process's log; EOF (EIO) once the terminal is
    closed by everything that held it."""

    def __init__(self, proc: _Process) -> None:
        self._proc = proc

    def data_received(self, data: bytes) -> None:
        self._proc.pipe_data_received(1, data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._proc.pipe_connection_lost(1, exc)


class _Pty:
    """A process's terminal: its master side read and written by the agent, its slave side
    the process's stdin, stdout and stderr (closed in the agent once the process has it)."""

    def __init__(self, master: int, slave: int) -> None:
        self.master, self.slave = master, slave
        self.reader: asyncio.ReadTransport | None = None
        self.writer: asyncio.WriteTransport | None = None

    @classmethod
    def open(cls, cols: int, rows: int) -> _Pty:
        pty = cls(*os.openpty())
        pty.resize(cols, rows)
        return pty

    async def connect(self, proc: _Process) -> None:
        """Close the agent's copy of the slave side; read and write the master side."""
        os.close(self.slave)
        self.slave = -1
        loop = asyncio.get_running_loop()
        reader = os.fdopen(os.dup(self.master), "rb", buffering=0)
        self.reader, _ = await loop.connect_read_pipe(lambda: _PtyOutput(proc), reader)
        writer = os.fdopen(os.dup(self.master), "wb", buffering=0)
        self.writer, _ = await loop.connect_write_pipe(asyncio.Protocol, writer)

    def resize(self, cols: int, rows: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def close(self) -> None:
        for transport in (self.reader, self.writer):
            if transport is not None:
                transport.close()
        for fd in (self.master, self.slave):
            if fd >= 0:
                os.close(fd)
        self.master = self.slave = -1


class ProcessTable:
    """The background processes of one agent, reachable by id (p1, p2, ...) or name."""

    def __init__(
        self,
        root: Path,
        *,
        max_running: int = 5,
        log_bytes: int = 1 << 20,
        max_exited: int = MAX_EXITED,
        sessions: shells.Sessions | None = None,
    ) -> None:
        unignore_signals()
        self._root = root
        self._sessions = shells.SESSIONS if sessions is None else sessions
        self._max_running = max_running
        self._log_bytes = log_bytes
        self._max_exited = max_exited
        self._entries: dict[str, _Process] = {}
        self._started = 0
        self._ended: list[_Process] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._start_lock = asyncio.Lock()
        self._closed = False
        self._actions: dict[str, Callable[[Args], Awaitable[dict[str, Any]]]] = {
            "start": self._start,
            "list": self._list,
            "poll": self._poll,
            "log": self._log,
            "write": self._write,
            "kill": self._kill,
            "remove": self._remove,
            "attach": self._attach_unary,
            "resize": self._resize,
        }

    async def handle(self, args: dict[str, Any]) -> dict[str, Any]:
        """The tool: dispatch on args["action"]; ToolError for anything wrong."""
        action = req_str(args, "action")
        if action not in _ACTION_ARGS:
            raise ToolError(
                "INVALID_ARGS", f"unknown action '{action}'; one of: {', '.join(_ACTION_ARGS)}"
            )
        expect_only(args, ("action", *_ACTION_ARGS[action]))
        return await self._actions[action](args)

    async def follow(self, proc_id: str, offset: int = 0) -> AsyncIterator[tuple[int, int, bytes]]:
        """(offset, fd, chunk) of the process's output from `offset` as it is produced, until
        the process has exited and everything is delivered (used for streaming 'attach'; fd
        is 2 only for stderr of a process started with separate_stderr).

        An offset older than the log keeps starts at the oldest byte kept: the first
        offset yielded shows the gap. One past the end waits for the output to get there.
        Ends early if the process is removed."""
        proc = self._find(proc_id)
        if offset < 0:
            raise ToolError("INVALID_ARGS", f"offset must be at least 0, got {offset}")
        while True:
            wake = proc.wake
            begin, fd, chunk = proc.log.read_run(offset, FOLLOW_CHUNK)
            if chunk:
                yield begin, fd, chunk
                offset = begin + len(chunk)
            elif proc.finished.done() or proc.removed:
                return
            else:
                await wake.wait()

    async def attach(self, args: dict[str, Any]) -> AsyncIterator[tuple[int, int, bytes]]:
        """`attach` {id, offset?} through a streamed call: follow() with checked arguments."""
        expect_only(args, ("action", *_ACTION_ARGS["attach"]))
        offset = opt_int(args, "offset", 0)
        async for item in self.follow(req_str(args, "id"), offset):
            yield item

    async def start_following(self, args: dict[str, Any]) -> dict[str, Any]:
        """`start` with `follow` through a streamed call: the start (its result); the caller
        then follows the new process as attach does."""
        return await self.handle({k: v for k, v in args.items() if k != "follow"})

    async def _attach_unary(self, args: Mapping[str, Any]) -> dict[str, Any]:
        raise ToolError(
            "INVALID_ARGS",
            "attach follows a process's output live: call it through CallToolStream "
            "(or use action 'log' for what was printed so far)",
        )

    async def close(self) -> None:
        """Kill every process group, reap every shell, close every transport."""
        self._closed = True
        procs = list(self._entries.values())
        await asyncio.gather(*(_kill_group(p.pid) for p in procs if p.running))
        await asyncio.gather(*(_within(p.finished, REAP_TIMEOUT) for p in procs))
        for task in list(self._tasks):
            task.cancel()
        for proc in procs:
            proc.close()

    # actions

    async def _start(self, args: Args) -> dict[str, Any]:
        command, env = _command(args), _env(args)
        workdir = opt_str(args, "workdir", ".")
        window = _window(args) if opt_bool(args, "pty", False) else None
        if window is None and ("cols" in args or "rows" in args):
            raise ToolError("INVALID_ARGS", "'cols' and 'rows' need 'pty': true")
        stdin, apart = opt_bool(args, "stdin", True), opt_bool(args, "separate_stderr", False)
        if window is not None and (not stdin or apart):
            raise ToolError(
                "INVALID_ARGS", "a terminal is stdin, stdout and stderr at once: 'stdin' and "
                "'separate_stderr' are for processes without 'pty'"
            )  # fmt: skip
        if opt_bool(args, "follow", False):
            raise ToolError(
                "INVALID_ARGS", "'follow' streams the output: start it through CallToolStream"
            )
        cwd = await resolve_workdir(self._root, workdir)
        shell_argv, cwd = self._shell_argv(args, command, env, cwd, "workdir" in args)
        async with self._start_lock:
            name = self._new_name(args)
            self._check_room()
            ident = f"p{self._started + 1}"
            proc = await self._spawn(
                ident, name, command, cwd, env, window, (stdin, apart), shell_argv
            )
            self._started += 1
            self._entries[proc.id] = proc
            task = asyncio.create_task(self._reap(proc))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return {
            "id": proc.id,
            "name": proc.name,
            "pid": proc.pid,
            "command": command,
            "started_at": proc.started_at,
            "pty": proc.pty is not None,
        }

    async def _list(self, args: Args) -> dict[str, Any]:
        return {"processes": [_entry(p) for p in self._entries.values()]}

    async def _poll(self, args: Args) -> dict[str, Any]:
        proc = self._get(args)
        return {
            "id": proc.id,
            "pid": proc.pid,
            **proc.status(),
            "output_bytes": proc.log.end,
            "pending_stdin": proc.pending_stdin(),
        }

    async def _log(self, args: Args) -> dict[str, Any]:
        proc = self._get(args)
        offset = opt_int(args, "offset", 0)
        limit = opt_int(args, "limit", DEFAULT_LOG_LIMIT)
        if limit < 1:
            raise ToolError("INVALID_ARGS", f"argument 'limit' must be at least 1, got {limit}")
        _check_offset(proc, offset)
        begin, data = proc.log.read(offset, min(limit, MAX_LOG_LIMIT))
        at_end = begin + len(data) == proc.log.end
        data = _whole_chars(data, at_end=at_end, final=not proc.running)
        return {
            "id": proc.id,
            "offset": begin,
            "next_offset": begin + len(data),
            "data": data.decode("utf-8", errors="replace"),
            "dropped": begin - offset,
            **proc.status(),
            "output_bytes": proc.log.end,
        }

    async def _write(self, args: Args) -> dict[str, Any]:
        proc = self._get(args)
        text, eof = opt_str(args, "data", ""), opt_bool(args, "eof", False)
        if not text and not eof:
            raise ToolError(
                "INVALID_ARGS", "give 'data' to write, 'eof': true to close stdin, or both"
            )
        data = encoded(text, "data")
        pipe = proc.stdin()
        if not proc.running:
            raise ToolError("INVALID_ARGS", f"process '{proc.id}' has exited; it reads no input")
        if pipe is None or pipe.is_closing():
            raise ToolError("INVALID_ARGS", f"the stdin of process '{proc.id}' is closed")
        pending = pipe.get_write_buffer_size()
        if pending + len(data) > MAX_PENDING_STDIN:
            raise ToolError(
                "EXECUTION_FAILED",
                f"process '{proc.id}' is not reading its input fast enough: {pending} bytes "
                f"wait unread, and {len(data)} more would pass the limit of "
                f"{MAX_PENDING_STDIN} bytes; nothing was written",
            )
        if data:
            pipe.write(data)
        if eof and proc.pty is not None:
            pipe.write(b"\x04")  # a terminal has no EOF to send: type ^D (ends a line read)
        elif eof:
            pipe.write_eof()
        return {
            "id": proc.id,
            "written": len(data),
            "eof": eof,
            "pending_stdin": proc.pending_stdin(),
        }

    async def _kill(self, args: Args) -> dict[str, Any]:
        proc = self._get(args)
        name, number = _signal(args)
        if not proc.running:
            status = proc.status()
            raise ToolError(
                "INVALID_ARGS",
                f"process '{proc.id}' has exited already (exit code {status['exit_code']})",
            )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, number)
        await _within(proc.finished, KILL_WAIT)
        status = proc.status()
        return {
            "id": proc.id,
            "signal": name,
            "state": status["state"],
            "exit_code": status["exit_code"],
        }

    async def _resize(self, args: Args) -> dict[str, Any]:
        proc = self._get(args)
        cols, rows = req_int(args, "cols"), req_int(args, "rows")
        _check_window(cols, rows)
        if proc.pty is None:
            raise ToolError(
                "INVALID_ARGS", f"process '{proc.id}' has no terminal (start it with 'pty': true)"
            )
        if not proc.running:
            raise ToolError("INVALID_ARGS", f"process '{proc.id}' has exited")
        proc.pty.resize(cols, rows)
        return {"id": proc.id, "cols": cols, "rows": rows}

    async def _remove(self, args: Args) -> dict[str, Any]:
        proc = self._get(args)
        if proc.running:
            raise ToolError("INVALID_ARGS", f"process '{proc.id}' is running; kill it first")
        self._forget(proc)
        return {"id": proc.id, "removed": True}

    # helpers

    def _get(self, args: Args) -> _Process:
        return self._find(req_str(args, "id"))

    def _find(self, ident: str) -> _Process:
        proc = self._entries.get(ident)
        if proc is None:
            proc = next((p for p in self._entries.values() if p.name == ident), None)
        if proc is None:
            raise ToolError("INVALID_ARGS", f"no process '{ident}' (process list shows them)")
        return proc

    def _new_name(self, args: Args) -> str | None:
        name = opt_str(args, "name", None)
        if name is None:
            return None
        if not name.strip() or len(name) > MAX_NAME or not name.isprintable():
            raise ToolError(
                "INVALID_ARGS", f"argument 'name' must be 1 to {MAX_NAME} printable characters"
            )
        if _ID.fullmatch(name):
            raise ToolError("INVALID_ARGS", "argument 'name' must not look like an id (p1, p2...)")
        taken = next((p for p in self._entries.values() if p.name == name), None)
        if taken is not None:
            raise ToolError(
                "INVALID_ARGS",
                f"a process named '{name}' exists already ({taken.id}); pick another name, "
                "or remove that one",
            )
        return name

    def _shell_argv(
        self, args: Args, command: str, env: dict[str, str], cwd: Path, given: bool
    ) -> tuple[tuple[list[str], dict[str, str] | None], Path]:
        """The shell's argv and, in a session (shells.py), its whole environment, and the
        folder to start in: the session's folder, environment, options, functions and
        aliases, not updated by the process."""
        shell = shells.shell_of(args)
        name = opt_str(args, "session", None)
        if name is None:
            return (shell.argv(command), None), cwd
        session = self._sessions.open(name, shell)
        launch = self._sessions.launch(
            session, shell, command, env, cwd if given else None, keep=False
        )
        return (launch.argv, launch.env), launch.cwd or cwd

    def _check_room(self) -> None:
        if self._closed:
            raise ToolError("EXECUTION_FAILED", "the agent is shutting down")
        running = sum(p.running for p in self._entries.values())
        if running >= self._max_running:
            raise ToolError(
                "EXECUTION_FAILED",
                f"{running} processes are running, the limit; kill or wait for one (process list)",
            )

    async def _spawn(
        self,
        ident: str,
        name: str | None,
        command: str,
        cwd: Path,
        env: dict[str, str],
        window: tuple[int, int] | None,
        pipes: tuple[bool, bool] = (True, False),
        shell_argv: tuple[list[str], dict[str, str] | None] | None = None,
    ) -> _Process:
        """Start `sh -c command` in a session of its own: on pipes, or with `window` on a new
        terminal. For a terminal, setsid(1) makes the child a session leader with the terminal
        as its controlling one and then execs the shell: the same pid, and no Python between
        fork and exec (a preexec_fn crashes now and then in a child of the gRPC threads).
        `pipes`: (stdin a pipe, else /dev/null; stderr a pipe of its own, else into stdout).
        `shell_argv`: the shell's argv and, for a session, the whole environment."""
        loop = asyncio.get_running_loop()
        shell, whole = shell_argv or (["/bin/sh", "-c", command], None)
        pty = None if window is None else _Pty.open(*window)
        try:
            if pty is None:
                argv: tuple[str, ...] = with_file_size_errors(*shell)
                stdin, apart = pipes
                stdio: dict[str, Any] = {
                    "stdin": PIPE if stdin else DEVNULL,
                    "stdout": PIPE,
                    "stderr": PIPE if apart else STDOUT,
                }
                env = whole or {**os.environ, **env}
            else:
                argv = with_file_size_errors(SETSID, "--ctty", *shell)
                stdio = dict.fromkeys(("stdin", "stdout", "stderr"), pty.slave)
                env = {**(whole or os.environ), "TERM": PTY_TERM, **env}
            _, proc = await start_or_sweep(
                lambda: loop.subprocess_exec(
                    lambda: _Process(ident, name, command, self._log_bytes, 1 + pipes[1]),
                    *argv,
                    cwd=cwd,
                    env=env,
                    start_new_session=pty is None,
                    **stdio,
                )
            )
        except ToolError:
            if pty is not None:
                pty.close()
            raise
        strays.LIVE.add(proc.pid)
        if pty is not None:
            proc.pty = pty
            await pty.connect(proc)
            await _own_session(proc.pid)
        _raise_oom_score(proc.pid)
        return proc

    async def _reap(self, proc: _Process) -> None:
        """After the shell exits: drain, kill what is left of its group, close, prune."""
        try:
            await proc.exited
            proc.ended_at = _now()
            await _within(proc.eof, EOF_GRACE)
            await _kill_group(proc.pid)
        finally:
            strays.LIVE.discard(proc.pid)
            proc.close()
            if not proc.finished.done():
                proc.finished.set_result(None)
            proc.changed()
        self._ended.append(proc)
        self._prune()
        await strays.sweep_if_crowded()

    def _prune(self) -> None:
        """Forget the oldest exited entries beyond `max_exited`."""
        self._ended = [p for p in self._ended if not p.removed]
        while len(self._ended) > self._max_exited:
            self._forget(self._ended.pop(0))

    def _forget(self, proc: _Process) -> None:
        proc.removed = True
        self._entries.pop(proc.id, None)
        proc.changed()


def _entry(proc: _Process) -> dict[str, Any]:
    return {
        "id": proc.id,
        "name": proc.name,
        "pid": proc.pid,
        "command": proc.command,
        **proc.status(),
        "started_at": proc.started_at,
        "ended_at": None if proc.running else proc.ended_at,
        "output_bytes": proc.log.end,
        "pty": proc.pty is not None,
    }


def _check_offset(proc: _Process, offset: int) -> None:
    if offset < 0:
        raise ToolError("INVALID_ARGS", f"argument 'offset' must be at least 0, got {offset}")
    if offset > proc.log.end:
        raise ToolError(
            "INVALID_ARGS",
            f"offset {offset} is past the end of the output of '{proc.id}' "
            f"({proc.log.end} bytes so far)",
        )


def _whole_chars(data: bytes, *, at_end: bool, final: bool) -> bytes:
    """`data` without a UTF-8 sequence cut at its end, so that the next read starts on a
    character. Kept when nothing more will complete it (`final`, at the end of the output),
    or when it is all there is to return (a limit under 4 bytes)."""
    tail = _partial_tail(data)
    if not tail or (at_end and final) or (not at_end and tail == len(data)):
        return data
    return data[:-tail]


def _partial_tail(data: bytes) -> int:
    """How many bytes at the end of `data` begin a UTF-8 sequence without finishing it."""
    for back in range(1, min(3, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: the sequence starts here
            need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return back if 0xC0 <= byte <= 0xF7 and back < need else 0
    return 0


async def _own_session(pid: int) -> None:
    """Wait (briefly) until setsid(1) has made `pid` a group leader: until then a signal for
    its group would reach nothing."""
    deadline = time.monotonic() + SESSION_WAIT
    while time.monotonic() < deadline:
        try:
            if os.getpgid(pid) == pid:
                return
        except ProcessLookupError:
            return
        await asyncio.sleep(0.002)


def _window(args: Args) -> tuple[int, int]:
    cols = opt_int(args, "cols", DEFAULT_WINDOW[0])
    rows = opt_int(args, "rows", DEFAULT_WINDOW[1])
    _check_window(cols, rows)
    return cols, rows


def _check_window(cols: int, rows: int) -> None:
    for name, value in (("cols", cols), ("rows", rows)):
        if not 1 <= value <= MAX_WINDOW:
            raise ToolError(
                "INVALID_ARGS", f"argument '{name}' must be 1 to {MAX_WINDOW}, got {value}"
            )


def _signal(args: Args) -> tuple[str, signal.Signals]:
    given = opt_str(args, "signal", "TERM")
    name = given.strip().upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise ToolError("INVALID_ARGS", f"unknown signal '{given}'; one of: {', '.join(SIGNALS)}")
    return f"SIG{name}", SIGNALS[name]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
