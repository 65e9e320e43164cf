"""Start a command with posix_spawn: its output read straight from the pipes, its exit seen
through a pidfd.

This is the exec tool's path, the one every warm call takes. asyncio's subprocess machinery
costs more than the command `true` itself here: Popen's Python code and its error pipe, three
pipe transports each connected through its own round of the event loop, and, for a sandbox
with a file size cap, an extra exec of env(1) only to leave SIGXFSZ ignored (subprocess gives
every child the default action back). posix_spawn takes the signals to reset as an argument,
so SIGXFSZ stays ignored while SIGPIPE and the rest get their default; the pipes are read with
plain add_reader callbacks.

posix_spawn has no working-folder argument (Python 3.11 does not expose glibc's addchdir), and
the agent must never chdir while other tasks and threads run: a command that runs in the
agent's own folder (the workspace root, the default) starts directly, any other through
`env --chdir=FOLDER`, which changes folder and execs in the same process.

In a sandbox the agent runs as a user of its own with the sandbox user's effective ids
(identity.py): every command, whatever starts it, then goes through stockade-drop, which
sets all of the sandbox user's ids (and the folder, and SIGXFSZ when asked) and execs in
the same process. `command_argv` is the one place that decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

ENV: Final = "/usr/bin/env"
DROP: Final = "/usr/local/libexec/stockade-drop"
READ_BYTES: Final = 256 * 1024
"""The most one read takes from a pipe (asyncio's pipe transports read as much)."""

INHERITABLE_SIGNALS: Final = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
"""Signals an ignoring parent would pass on ignored (under nohup, say): commands get them at
their default action (execute.unignore_signals gives the agent's own back too)."""
_RESET: Final = frozenset({signal.SIGPIPE, *INHERITABLE_SIGNALS})
"""Signals a command starts with at their default action whatever the agent does with them
(Python ignores SIGPIPE and SIGXFSZ; a handler is reset by exec anyway)."""


def file_sizes_capped() -> bool:
    """Whether the sandbox caps file sizes (RLIMIT_FSIZE): then a command must start with
    SIGXFSZ ignored, so a write past the cap fails with EFBIG ("File too large") instead of
    killing the writer."""
    return resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY


def reset_signals() -> frozenset[int]:
    """_RESET, and SIGXFSZ unless file sizes are capped."""
    return _RESET if file_sizes_capped() else _RESET | {signal.SIGXFSZ}


_sandbox_ids: tuple[int, int] | None = None


def start_as(uid: int, gid: int) -> None:
    """From now on every command starts as uid:gid through stockade-drop (identity.take)."""
    global _sandbox_ids
    _sandbox_ids = (uid, gid)


def command_argv(
    argv: Sequence[str], cwd: Path | None = None, ignore_xfsz: bool = False
) -> list[str]:
    """How to start `argv` as a sandbox command: as the sandbox user (through stockade-drop
    when the agent is not that user), in `cwd` when given and not the agent's own folder,
    with SIGXFSZ ignored when `ignore_xfsz` (else as the caller leaves it)."""
    folder = None if cwd is None or str(cwd) == os.getcwd() else str(cwd)
    if _sandbox_ids is not None:
        uid, gid = _sandbox_ids
        flags = "x" if ignore_xfsz else "-"
        program = argv[0] if "/" in argv[0] else shutil.which(argv[0]) or argv[0]
        return [DROP, str(uid), str(gid), folder or "-", flags, program, *argv[1:]]
    prefix = [ENV] if folder or ignore_xfsz else []
    prefix += [f"--chdir={folder}"] if folder else []
    prefix += ["--ignore-signal=XFSZ"] if ignore_xfsz else []
    return [*prefix, *argv]


def shell_argv(command: str, cwd: Path) -> list[str]:
    """`sh -c command` in `cwd`, as command_argv starts it."""
    return command_argv(["/bin/sh", "-c", command], cwd)


class PipeReader:
    """Reads one pipe on the event loop and hands each chunk to `on_data(fd, chunk)` (fd 1 or
    2: which of the command's streams), then `on_eof(fd)` once."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        pipe: int,
        fd: int,
        on_data: Callable[[int, bytes], None],
        on_eof: Callable[[int], None],
    ) -> None:
        self._loop, self._pipe, self._fd = loop, pipe, fd
        self._on_data, self._on_eof = on_data, on_eof
        self._paused = False
        self._closed = False
        os.set_blocking(pipe, False)
        loop.add_reader(pipe, self._ready)

    def _ready(self) -> None:
        try:
            data = os.read(self._pipe, READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self._on_data(self._fd, data)
            return
        self.close()
        self._on_eof(self._fd)

    def pause_reading(self) -> None:
        if not self._closed and not self._paused:
            self._paused = True
            self._loop.remove_reader(self._pipe)

    def resume_reading(self) -> None:
        if not self._closed and self._paused:
            self._paused = False
            self._loop.add_reader(self._pipe, self._ready)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._paused:
            self._loop.remove_reader(self._pipe)
        os.close(self._pipe)


class PipeWriter:
    """Writes `data` to the command's stdin on the event loop, then closes it (one-shot input);
    a command that exits without reading it all (EPIPE) ends it early, as no error."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pipe: int, data: bytes) -> None:
        self._loop, self._pipe, self._data = loop, pipe, memoryview(data)
        self._closed = False
        os.set_blocking(pipe, False)
        loop.add_writer(pipe, self._ready)

    def _ready(self) -> None:
        try:
            written = os.write(self._pipe, self._data[:READ_BYTES])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            written = len(self._data)
        self._data = self._data[written:]
        if not self._data:
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_writer(self._pipe)
            os.close(self._pipe)


class Child:
    """A command started by spawn(): its pid, its pipes, and its exit status once reaped."""

    def __init__(self, pid: int, on_exit: Callable[[], None]) -> None:
        self.pid = pid
        self.returncode: int | None = None
        """As subprocess has it: the exit status, or minus the signal that ended it."""
        self.pipes: list[PipeReader] = []
        self.stdin: PipeWriter | None = None
        self._on_exit = on_exit

    def reaped(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)
        self._on_exit()

    def close(self) -> None:
        """Close the pipes (the process itself is reaped whenever it exits)."""
        for pipe in self.pipes:
            pipe.close()
        if self.stdin is not None:
            self.stdin.close()


def spawn(
    argv: Sequence[str],
    env: dict[str, str],
    *,
    on_data: Callable[[int, bytes], None],
    on_eof: Callable[[int], None],
    on_exit: Callable[[], None],
    stdin: bytes | None = None,
) -> Child:
    """Start `argv` as the leader of a new session, stdin from /dev/null (or the pipe `stdin`
    is written to, then closed), stdout and stderr on pipes. OSError when it cannot start
    (EAGAIN when the pids limit is reached, EMFILE, ENOENT). Nothing here waits: a caller
    cancelled right after gets the Child (and must end it), never a command left untracked."""
    loop = asyncio.get_running_loop()
    opened: list[int] = []
    try:
        out_r, out_w = _pipe(opened)
        err_r, err_w = _pipe(opened)
        child_ends = [out_w, err_w]
        actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [
            (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, err_w, 2),
        ]
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in inheritable_fds()]
        if stdin is None:
            actions.append((os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0))
        else:
            in_r, in_w = _pipe(opened)
            child_ends.append(in_r)
            actions.append((os.POSIX_SPAWN_DUP2, in_r, 0))
        pid = os.posix_spawn(
            argv[0], list(argv), env,
            file_actions=actions, setsid=True, setsigdef=reset_signals(),
        )  # fmt: skip
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    for fd in child_ends:
        os.close(fd)
    child = Child(pid, on_exit)
    child.pipes = [PipeReader(loop, out_r, 1, on_data, on_eof)]
    child.pipes.append(PipeReader(loop, err_r, 2, on_data, on_eof))
    _watch(loop, child)
    if stdin is not None:
        child.stdin = PipeWriter(loop, in_w, stdin)
    return child


def inheritable_fds() -> list[int]:
    """Descriptors above 2 without close-on-exec: what the agent itself was started with
    (whatever its parent left open). Everything the agent opens is close-on-exec (Python's
    and gRPC's own rule); these are closed in the child, as subprocess's close_fds does."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            if int(name) > 2 and os.get_inheritable(int(name)):
                found.append(int(name))
    return found


def _pipe(opened: list[int]) -> tuple[int, int]:
    read_end, write_end = os.pipe()  # both close-on-exec: only the dup2 copies reach the child
    opened += (read_end, write_end)
    return read_end, write_end


def _watch(loop: asyncio.AbstractEventLoop, child: Child) -> None:
    """Reap `child` when it exits: through a pidfd on the event loop, or where the kernel has
    none (gVisor of 2022), in a thread of its own that waits for it."""
    try:
        pidfd = os.pidfd_open(child.pid)
    except OSError:
        _wait_in_thread(loop, child)
        return

    def exited() -> None:
        try:
            pid, status = os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by somebody else: status unknown, as asyncio says
            pid, status = child.pid, 255 << 8
        if pid == 0:
            return
        loop.remove_reader(pidfd)
        os.close(pidfd)
        child.reaped(status)

    loop.add_reader(pidfd, exited)


def _wait_in_thread(loop: asyncio.AbstractEventLoop, child: Child) -> None:
    def wait() -> None:
        try:
            _, status = os.waitpid(child.pid, 0)
        except ChildProcessError:
            status = 255 << 8
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(child.reaped, status)

    threading.Thread(target=wait, name=f"waitpid-{child.pid}", daemon=True).start()
