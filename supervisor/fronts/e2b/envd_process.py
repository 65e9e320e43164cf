"""envd's process.Process service for the E2B front (`sandbox.commands`, `sandbox.pty`).

Every RPC is a call of the `process` tool through Stockade's one pipeline, on the sandbox's
scoped key with the front named "e2b": policy, the guard (on the command line as given:
`/bin/bash -l -c '...'`), approvals (a start waiting for one simply waits, within the call's
deadline), rate limits, scrubbing of every output chunk and an audit record each.

    Start       `process start` with `follow` (streamed): the start event, stdout and stderr
                apart (or the terminal's output for a PTY), keepalives in silence, the end
    Connect     `process attach` from the first byte kept (streamed), the same events
    List        `process list`: the running ones
    SendInput, StreamInput, CloseStdin, SendSignal, Update
                `process write` / `write eof` / `kill` / `resize` on the process named by pid

A process outlives its stream (the SDK's background commands and disconnect): only its
deadline (Connect-Timeout-Ms on Start, as envd: none when 0 or absent) or a signal ends it.
Each process gets a name of our own at its start; pids map to names here, or, after a
supervisor restart, through `process list`."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import secrets
import shlex
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from starlette.requests import Request

from stockade.supervisor.calls.interact import SESSION_MAX_S
from stockade.supervisor.calls.streaming import close_source
from stockade.supervisor.fronts.e2b.connect import (
    ConnectError,
    Json,
    Last,
    keepalive_interval,
    timeout_of,
    with_keepalive,
)
from stockade.supervisor.fronts.e2b.context import FRONT, E2bContext
from stockade.supervisor.fronts.e2b.envd_files import (
    HOME,
    caller_of,
    e2b_path,
    error_of,
    sandbox_of,
    workspace_path,
)
from stockade.supervisor.models import (
    OutputEvent,
    ResultEvent,
    StartedEvent,
    ToolCall,
    ToolResult,
)

T = TypeVar("T")
FOLLOW_MAX_S: Final = SESSION_MAX_S
"""The pipeline deadline of a stream without Connect-Timeout-Ms (envd: no limit): as long as
an Interact session's."""
CONTROL_TIMEOUT_MS: Final = 30_000
SIGNALS: Final = {"SIGNAL_SIGKILL": "KILL", "SIGNAL_SIGTERM": "TERM", 9: "KILL", 15: "TERM"}
DEFAULT_USERS: Final = ("", "user")
NAME_PREFIX: Final = "e2b-"
"""The process tool's names of the processes this front starts."""
MAX_KNOWN: Final = 1000
"""Processes of one sandbox this front keeps by pid."""
PTY_ENV: Final = {"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


@dataclass
class _Proc:
    name: str
    """The `process` tool's name for it (unique in its sandbox)."""
    config: Json
    pty: bool
    tag: str | None = None
    deadline: asyncio.TimerHandle | None = None


@dataclass
class _Sandbox:
    by_pid: dict[int, _Proc] = field(default_factory=dict)
    """The processes started or found here, until they are seen to exit (at most
    MAX_KNOWN: the oldest go; `process list` finds a running one again)."""
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the sandbox is killed, ends or is paused: its open streams end at once."""

    def remember(self, pid: int, proc: _Proc) -> None:
        self.by_pid.pop(pid, None)
        self.by_pid[pid] = proc
        while len(self.by_pid) > MAX_KNOWN:
            oldest = next(iter(self.by_pid))
            gone = self.by_pid.pop(oldest)
            if gone.deadline is not None:
                gone.deadline.cancel()


def _user_of(request: Request) -> str:
    """The user an envd request names (Authorization: Basic base64("user:")), "" for none."""
    header = request.headers.get("authorization", "")
    if not header.lower().startswith("basic "):
        return ""
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise ConnectError("unauthenticated", "a malformed Authorization header") from None
    return decoded.split(":", 1)[0]


def check_user(request: Request) -> None:
    """Stockade runs every command as the sandbox's one unprivileged user: E2B's default
    user ("user") is that user; any other (root) is refused rather than silently ignored."""
    user = _user_of(request)
    if user not in DEFAULT_USERS:
        raise ConnectError(
            "permission_denied",
            f"user {user!r} is not available: Stockade runs every command as the sandbox's "
            "one unprivileged user (E2B's default user 'user'); leave `user` unset",
        )


def _b64(data: object, what: str) -> bytes:
    if not isinstance(data, str):
        raise ConnectError("invalid_argument", f"{what} must be base64 bytes")
    padded = data.replace("-", "+").replace("_", "/") + "=" * (-len(data) % 4)
    try:
        return base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        raise ConnectError("invalid_argument", f"{what} is not base64") from None


def _strings(value: object, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConnectError("invalid_argument", f"{what} must map strings to strings")
    return dict(value)


def _pid_of(msg: Json) -> int | str:
    """The selector's pid, or its tag (a str)."""
    selector = msg.get("process")
    if not isinstance(selector, dict):
        raise ConnectError("invalid_argument", "a process selector {pid} or {tag} is needed")
    pid, tag = selector.get("pid"), selector.get("tag")
    if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 1 << 32:
        return pid
    if isinstance(pid, str) and pid.isdigit() and len(pid) < 11:
        return int(pid)
    if isinstance(tag, str) and tag:
        return tag
    raise ConnectError("invalid_argument", "the process selector needs a pid or a tag")


def _window(pty: object) -> tuple[int, int] | None:
    if pty is None:
        return None
    size = pty.get("size") if isinstance(pty, dict) else None
    size = size if isinstance(size, dict) else {}
    cols, rows = size.get("cols", 80), size.get("rows", 24)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (cols, rows)):
        raise ConnectError("invalid_argument", "pty.size.cols and rows must be numbers")
    return cols, rows


def command_line(config: Json) -> str:
    """The shell command line for a ProcessConfig: cmd and args, each quoted."""
    cmd, args = config.get("cmd"), config.get("args") or []
    if not isinstance(cmd, str) or not cmd.strip():
        raise ConnectError("invalid_argument", "process.cmd must be a command")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConnectError("invalid_argument", "process.args must be a list of strings")
    return shlex.join([cmd, *args])


def placed(command: str, cwd: object) -> tuple[str, str, str]:
    """(command, workdir, PWD) for a process to run in `cwd`: a folder of the home (the
    workspace) is the process tool's workdir; any other absolute folder (/tmp, /) is a `cd`
    before the command, which the guard follows like any cd. PWD is what the shell's pwd
    shows: /home/user/..., not /workspace/..."""
    if not isinstance(cwd, str) or not cwd:
        return command, ".", HOME
    home = cwd in (HOME, "/workspace") or cwd.startswith((HOME + "/", "/workspace/"))
    if cwd.startswith("/") and not home:
        if "\0" in cwd:
            raise ConnectError("invalid_argument", "cwd contains a NUL byte")
        return f"cd -- {shlex.quote(cwd)} && exec {command}", ".", cwd
    workdir = workspace_path(cwd)
    return command, workdir, e2b_path(workdir)


def end_event(data: dict[str, Any]) -> Json:
    """envd's end event for the process tool's exit state: a signal is exitCode -1, not
    exited, status "signal: killed"; an exit, its code and "exit status N"."""
    signal = data.get("signal")
    if isinstance(signal, str) and signal:
        word = {"SIGKILL": "killed", "SIGTERM": "terminated", "SIGINT": "interrupt"}.get(
            signal, signal.lower()
        )
        status = f"signal: {word}"
        return {"end": {"exitCode": -1, "exited": False, "status": status, "error": status}}
    code = data.get("exit_code")
    code = code if isinstance(code, int) else -1
    end: Json = {"exitCode": code, "exited": True, "status": f"exit status {code}"}
    if code != 0:
        end["error"] = f"exit status {code}"
    return {"end": end}


class Processes:
    def __init__(self, ctx: E2bContext) -> None:
        self._ctx = ctx
        self._sandboxes: dict[str, _Sandbox] = {}
        self._kills: set[asyncio.Task[ToolResult]] = set()

    def _of(self, request: Request) -> _Sandbox:
        return self._sandboxes.setdefault(sandbox_of(request).sandbox_id, _Sandbox())

    def forget(self, sandbox_id: str) -> None:
        """The sandbox is gone: its processes' deadlines with it."""
        box = self._sandboxes.pop(sandbox_id, None)
        if box is not None:
            box.gone.set()
        for proc in box.by_pid.values() if box else ():
            if proc.deadline is not None:
                proc.deadline.cancel()

    def drop(self, sandbox_id: str) -> None:
        """The sandbox is paused: its open streams end as E2B's do when it pauses (its
        processes live on, frozen; after a resume `commands.connect(pid)` follows one again)."""
        box = self._sandboxes.get(sandbox_id)
        if box is not None:
            box.gone.set()
            box.gone = asyncio.Event()  # the streams opened after the resume

    async def close(self) -> None:
        for sandbox_id in list(self._sandboxes):
            self.forget(sandbox_id)
        for task in list(self._kills):
            task.cancel()
        await asyncio.gather(*self._kills, return_exceptions=True)

    def _call(self, request: Request, args: Json, timeout_ms: int = CONTROL_TIMEOUT_MS) -> ToolCall:
        return ToolCall(
            sandbox_key=sandbox_of(request).key,
            tool="process",
            arguments_json=json.dumps(args),
            timeout_ms=timeout_ms,
            front=FRONT,
        )

    async def _action(self, request: Request, args: Json) -> dict[str, Any]:
        result = await self._ctx.pipeline.call(self._call(request, args), caller_of(request))
        if result.is_error:
            raise error_of(result)
        return dict(result.data or {})

    # Start and Connect

    async def start(self, request: Request, msg: Json) -> AsyncIterator[Json]:
        check_user(request)
        config = msg.get("process")
        if not isinstance(config, dict):
            raise ConnectError("invalid_argument", "process (a ProcessConfig) is needed")
        window = _window(msg.get("pty"))
        record = sandbox_of(request)
        envs = _strings(config.get("envs"), "process.envs")
        env = {"HOME": HOME, "USER": "user", "LOGNAME": "user", **record.env_vars}
        env.update({**PTY_ENV, **envs} if window else envs)
        cwd = config.get("cwd")
        command, workdir, env["PWD"] = placed(command_line(config), cwd)
        name = f"{NAME_PREFIX}{secrets.token_hex(6)}"
        args: Json = {
            "action": "start",
            "command": command,
            "name": name,
            "env": env,
            "workdir": workdir,
            "follow": True,
        }
        if window is not None:
            args.update(pty=True, cols=window[0], rows=window[1])
        else:
            args.update(separate_stderr=True, stdin=msg.get("stdin", True) is not False)
        deadline = timeout_of(request)
        limit = FOLLOW_MAX_S if deadline is None else deadline + 5.0
        call = self._call(request, args, int(limit * 1000))
        tag = msg.get("tag") if isinstance(msg.get("tag"), str) else None
        proc = _Proc(name, _shown_config(config, cwd), window is not None, tag)
        box = self._of(request)
        started = False
        try:
            async for event in self._events(request, call, box, proc, deadline):
                started = True
                yield event
        except ConnectError as exc:
            if started or exc.code != "not_found" or "workdir" not in exc.message:
                raise
            where = cwd if isinstance(cwd, str) and cwd else HOME
            raise ConnectError("invalid_argument", f"cwd '{where}' does not exist") from None

    async def _events(
        self,
        request: Request,
        call: ToolCall,
        box: _Sandbox,
        proc: _Proc,
        deadline: float | None,
        pid: int = 0,
    ) -> AsyncIterator[Json]:
        """envd's events for a streamed `process` call: start, data, keepalive, end (`pid`:
        the process's, when the call is an attach, which says no start of its own)."""
        stream = self._ctx.pipeline.call_stream(call, caller_of(request))
        sandbox_id, every_s = sandbox_of(request).sandbox_id, keepalive_interval(request)
        events = until_gone(stream, box.gone, sandbox_id, every_s)
        try:  # a client gone: the call detaches at once (the stream is closed)
            async for event in events:
                if event is None:
                    if pid:
                        yield {"event": {"keepalive": {}}}
                elif isinstance(event, StartedEvent):
                    pid = event.pid or pid
                    box.remember(pid, proc)  # a pid the kernel reused names the new process
                    if deadline is not None:
                        proc.deadline = self._kill_at(request, proc, deadline)
                    yield {"event": {"start": {"pid": pid}}}
                elif isinstance(event, OutputEvent):
                    text = event.text.encode("utf-8", "surrogateescape")
                    kind = "pty" if proc.pty else event.stream
                    yield {"event": {"data": {kind: base64.b64encode(text).decode()}}}
                elif isinstance(event, ResultEvent):
                    result = event.result
                    if proc.deadline is not None:
                        proc.deadline.cancel()
                    if "exit_code" in (result.data or {}) and box.by_pid.get(pid) is proc:
                        del box.by_pid[pid]  # exited: its pid is free for the kernel to reuse
                    if result.is_error and (not pid or "exit_code" not in (result.data or {})):
                        raise error_of(result)
                    yield Last(event=end_event(dict(result.data or {})))
        finally:
            await close_source(events)
            await close_source(stream)

    def _kill_at(self, request: Request, proc: _Proc, after_s: float) -> asyncio.TimerHandle:
        """envd ends a process at its Start's deadline, stream or no stream."""
        call = self._call(request, {"action": "kill", "id": proc.name, "signal": "KILL"})
        caller = caller_of(request)

        def fire() -> None:
            task = asyncio.ensure_future(self._ctx.pipeline.call(call, caller))
            self._kills.add(task)
            task.add_done_callback(self._kills.discard)

        return asyncio.get_running_loop().call_later(after_s, fire)

    async def connect(self, request: Request, msg: Json) -> AsyncIterator[Json]:
        check_user(request)
        box = self._of(request)
        proc, pid = await self._find(request, _pid_of(msg))
        args = {"action": "attach", "id": proc.name}
        call = self._call(request, args, int(FOLLOW_MAX_S * 1000))
        yield {"event": {"start": {"pid": pid}}}
        async for event in self._events(request, call, box, proc, None, pid):
            yield event

    # unary calls on a process named by pid

    async def _find(self, request: Request, selector: int | str) -> tuple[_Proc, int]:
        box = self._of(request)
        for pid, proc in box.by_pid.items():
            if selector in (pid, proc.tag):
                return proc, pid
        for entry in (await self._action(request, {"action": "list"})).get("processes", []):
            if selector == entry.get("pid") and entry.get("state") == "running":
                name = str(entry.get("name") or entry["id"])
                found = _Proc(name, _config_of(entry), bool(entry.get("pty")))
                box.remember(int(entry["pid"]), found)
                return found, int(entry["pid"])
        raise ConnectError("not_found", f"process with {_selector_text(selector)} not found")

    async def list(self, request: Request, msg: Json) -> Json:
        check_user(request)
        box = self._of(request)
        out = []
        for entry in (await self._action(request, {"action": "list"})).get("processes", []):
            if entry.get("state") != "running":
                continue
            pid = int(entry.get("pid") or 0)
            known = box.by_pid.get(pid)
            info: Json = {"pid": pid, "config": known.config if known else _config_of(entry)}
            if known is not None and known.tag:
                info["tag"] = known.tag
            out.append(info)
        return {"processes": out}

    async def send_input(self, request: Request, msg: Json) -> Json:
        check_user(request)
        proc, _ = await self._find(request, _pid_of(msg))
        await self._write(request, proc, msg.get("input"))
        return {}

    async def _write(self, request: Request, proc: _Proc, given: object) -> None:
        if not isinstance(given, dict):
            raise ConnectError("invalid_argument", "input {stdin} or {pty} is needed")
        raw = given.get("pty") if proc.pty else given.get("stdin")
        if raw is None:
            raw = given.get("stdin", given.get("pty"))
        data = _b64(raw, "input")
        if not data:
            return
        # bytes that are not UTF-8 travel as lone surrogates; the agent turns them back
        text = data.decode("utf-8", "surrogateescape")
        await self._action(request, {"action": "write", "id": proc.name, "data": text})

    async def stream_input(self, request: Request, messages: AsyncIterator[Json]) -> Json:
        check_user(request)
        proc: _Proc | None = None
        async for msg in messages:
            if "start" in msg:
                start = msg["start"] if isinstance(msg["start"], dict) else {}
                proc, _ = await self._find(request, _pid_of(start))
            elif "data" in msg:
                if proc is None:
                    raise ConnectError("invalid_argument", "StreamInput starts with {start}")
                data = msg["data"] if isinstance(msg["data"], dict) else {}
                await self._write(request, proc, data.get("input"))
        return {}

    async def close_stdin(self, request: Request, msg: Json) -> Json:
        check_user(request)
        proc, _ = await self._find(request, _pid_of(msg))
        await self._action(request, {"action": "write", "id": proc.name, "eof": True})
        return {}

    async def send_signal(self, request: Request, msg: Json) -> Json:
        check_user(request)
        signal = SIGNALS.get(msg.get("signal", "SIGNAL_SIGKILL"))
        if signal is None:
            raise ConnectError("invalid_argument", f"unknown signal {msg.get('signal')!r}")
        proc, _ = await self._find(request, _pid_of(msg))
        try:
            await self._action(request, {"action": "kill", "id": proc.name, "signal": signal})
        except ConnectError as exc:
            if "exited already" in exc.message:
                raise ConnectError("not_found", exc.message) from None
            raise
        return {}

    async def update(self, request: Request, msg: Json) -> Json:
        check_user(request)
        window = _window(msg.get("pty"))
        proc, _ = await self._find(request, _pid_of(msg))
        if window is not None:
            args = {"action": "resize", "id": proc.name, "cols": window[0], "rows": window[1]}
            await self._action(request, args)
        return {}


def until_gone(
    events: AsyncIterator[T], gone: asyncio.Event, sandbox_id: str, every_s: float | None = None
) -> AsyncGenerator[T | None, None]:
    """The events until the sandbox is killed (or ends): then the stream ends as E2B's does
    when a sandbox goes mid-command, an `unavailable` that names no cause (the SDKs then
    probe /health, find the sandbox gone and report it killed or at its end of life), not
    the pipeline's later error. With `every_s`, None whenever that passes without an event
    (envd's keepalives), in the same wait (one task an event). The source is not closed
    here: its owner does that."""
    error = ConnectError(
        "unavailable",
        f"the connection to sandbox {sandbox_id} ended before the stream completed",
    )
    return with_keepalive(events, every_s, gone, error)


def _selector_text(selector: int | str) -> str:
    return f"pid {selector}" if isinstance(selector, int) else f"tag {selector!r}"


def _shown_config(config: Json, cwd: object) -> Json:
    shown: Json = {"cmd": config.get("cmd", ""), "args": list(config.get("args") or [])}
    shown["envs"] = _strings(config.get("envs"), "process.envs")
    if isinstance(cwd, str) and cwd:
        shown["cwd"] = cwd
    return shown


def _config_of(entry: dict[str, Any]) -> Json:
    """A ProcessConfig for a process this front does not know: one it started before a
    restart (named e2b-...) from its command line, any other as its shell and command."""
    command = str(entry.get("command", ""))
    if str(entry.get("name") or "").startswith(NAME_PREFIX):
        with contextlib.suppress(ValueError):
            argv = shlex.split(command)
            if argv:
                return {"cmd": argv[0], "args": argv[1:], "envs": {}}
    return {"cmd": "/bin/sh", "args": ["-c", command], "envs": {}}
