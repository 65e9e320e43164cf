"""Interact: a caller's live session with a background process of the `process` tool.

    Interaction.run(request, inputs)
    ├── open     start the command through the whole pipeline (`process start`: policy,
    │            guard, approvals, rate limit, audit), or look the named process up through it
    │            (`process poll`); a refused or unknown process ends the call with that result
    ├── output   `process attach` relayed as streamed calls are (scrubbed across chunks)
    ├── input    the caller's messages as `process write` / `resize` / `kill` to the agent;
    │            stdin goes in WRITE_CHUNK pieces and waits while PENDING_HIGH bytes are unread
    └── finish   the exit state as the result, and one audit record for the session

The caller's input is not guarded: like `process write`, it is data for a program that passed
the guard when it started. A process this call started is killed when the call ends before it
exits, unless keep_running; one it attached to keeps running."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, Final

from stockade.supervisor.calls.outcome import CALL_FAULTS, failure, no_result, outcome_of, result_of
from stockade.supervisor.calls.pipeline import STREAM_QUEUE, ToolPipeline
from stockade.supervisor.calls.recorder import Trail
from stockade.supervisor.calls.streaming import relay
from stockade.supervisor.calls.tripwires import REFUSED
from stockade.supervisor.errors import InvalidRequest, QuotaExceeded
from stockade.supervisor.keys import validate_scoped as validate_key
from stockade.supervisor.models import (
    EofInput,
    ErrorCode,
    InteractInput,
    InteractRequest,
    ResizeInput,
    ResultEvent,
    SignalInput,
    StartedEvent,
    StdinInput,
    ToolCall,
    ToolEvent,
    ToolResult,
)
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.sandboxes.agent_link import AgentReply
from stockade.supervisor.sandboxes.lease import Lease
from stockade.supervisor.sandboxes.manager import SandboxManager

WRITE_CHUNK: Final = 64 * 1024
PENDING_HIGH: Final = 256 * 1024
"""Stdin bytes the process may leave unread before more input waits (the agent takes 1 MiB)."""
PENDING_POLL_S: Final = 0.02
SESSION_MAX_S: Final = 24 * 3600.0
CONTROL_TIMEOUT_S: Final = 30.0


class _InputRefused(Exception):
    """The agent refused an input (e.g. stdin already closed); ends the session."""


class _ProcessEnded(Exception):
    """The process exited: the rest of the input has no reader."""


@dataclass
class _Session:
    lease: Lease
    """The session's hold on its sandbox: one for all its agent calls."""
    process_id: str
    request_id: str
    input_bytes: int = 0


class Interaction:
    def __init__(
        self, pipeline: ToolPipeline, sandboxes: SandboxManager, scrubber: Scrubber | None
    ) -> None:
        self._pipeline = pipeline
        self._sandboxes = sandboxes
        self._scrubber = scrubber

    async def run(
        self, request: InteractRequest, inputs: AsyncIterator[InteractInput], caller: str = ""
    ) -> AsyncIterator[ToolEvent]:
        """Events of the session: approval pending and started, output, then the result.
        Raises InvalidRequest for a wrong request (also one found among the inputs)."""
        validate_key(request.sandbox_key)
        request = replace(request, request_id=request.request_id or uuid.uuid4().hex)
        opening = _opening_call(request)
        with contextlib.ExitStack() as held:  # one of the tenant's streams, for the session
            try:
                held.enter_context(self._pipeline.streams.hold(request.sandbox_key))
            except QuotaExceeded as exc:
                yield ResultEvent(self._pipeline.refuse_stream(opening, caller, exc))
                return
            session = self._session(request, opening, inputs, caller)
            async with contextlib.aclosing(session):  # closed as this one is: its process ends
                async for event in session:
                    yield event

    async def _session(
        self,
        request: InteractRequest,
        opening: ToolCall,
        inputs: AsyncIterator[InteractInput],
        caller: str,
    ) -> AsyncGenerator[ToolEvent, None]:
        opened: ToolResult | None = None
        async for event in self._pipeline.call_stream(opening, caller, counted=False):
            if isinstance(event, ResultEvent):
                opened = event.result
            else:
                yield event
        if opened is None or opened.is_error or not opened.data:
            yield ResultEvent(opened or failure(ErrorCode.EXECUTION_FAILED, "no process"))
            return
        if not isinstance(opened.data.get("id"), str):
            yield ResultEvent(failure(ErrorCode.EXECUTION_FAILED, "the sandbox named no process"))
            return
        async with self._sandboxes.lease(request.sandbox_key) as lease:
            session = _Session(lease, str(opened.data["id"]), request.request_id)
            yield StartedEvent(int(opened.data.get("pid") or 0), session.process_id)
            async for event in self._follow(request, session, inputs, opening, caller):
                yield event

    async def _follow(
        self,
        request: InteractRequest,
        session: _Session,
        inputs: AsyncIterator[InteractInput],
        opening: ToolCall,
        caller: str,
    ) -> AsyncIterator[ToolEvent]:
        started = time.monotonic()
        trail = Trail(tool="process", ran_as="process")
        events: asyncio.Queue[ToolEvent] = asyncio.Queue(maxsize=STREAM_QUEUE)
        output = asyncio.create_task(self._output(request, session, trail, events))
        feeder = asyncio.create_task(self._feed(session, inputs))
        result: ToolResult | None = None
        finished = False
        item: asyncio.Future[ToolEvent] | None = None
        try:
            while result is None:
                item = asyncio.ensure_future(events.get())
                waiting = {item, output} | ({feeder} if not feeder.done() else set())
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if item.done():
                    yield item.result()
                    continue
                item.cancel()
                if output.done():
                    while not events.empty():
                        yield events.get_nowait()
                    result, finished = output.result(), True
                else:
                    result = _input_outcome(feeder)
        finally:
            pending = [t for t in (item, feeder, output) if t is not None]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if not finished and _started_here(request):
                await self._stop(session)
            trail.arguments = {
                "action": "interact",
                "id": session.process_id,
                "input_bytes": session.input_bytes,
            }
            outcome = result or ToolResult("", "", data=_detached(session))
            outcome = self._pipeline.recorder.finish(opening, caller, trail, outcome, started)
        yield ResultEvent(outcome)

    async def _output(
        self,
        request: InteractRequest,
        session: _Session,
        trail: Trail,
        events: asyncio.Queue[ToolEvent],
    ) -> ToolResult:
        args = {"action": "attach", "id": session.process_id, "offset": request.offset}
        source = session.lease.stream("process", args, SESSION_MAX_S, session.request_id)
        honey, key = self._pipeline.honey, request.sandbox_key
        said = f"interact {request.command or request.process_id}"
        watch = honey.stream(key, "output", said) if honey is not None else None
        try:
            reply, trail.stream_redactions = await relay(source, self._scrubber, events, watch)
        except CALL_FAULTS as exc:
            return outcome_of(exc)
        result = no_result() if reply is None else _exit_result(result_of("process", reply))
        if honey is not None and watch is not None and not watch.hit:
            honey.output(key, "process", (result.data, result.error_message), said)
        return result

    async def _feed(self, session: _Session, inputs: AsyncIterator[InteractInput]) -> None:
        """Pass the caller's input on until it ends or the process does."""
        ident, honey = session.process_id, self._pipeline.honey
        said = f"interact input to process {ident}"
        watch = honey.stream(session.lease.key, "stdin", said) if honey is not None else None
        try:
            async for item in inputs:
                if isinstance(item, StdinInput):
                    if watch is not None and watch.feed(item.data) and watch.refuse:
                        raise _InputRefused(REFUSED)
                    for at in range(0, len(item.data), WRITE_CHUNK):
                        await self._write(session, item.data[at : at + WRITE_CHUNK])
                elif isinstance(item, EofInput):
                    await self._control(session, {"action": "write", "id": ident, "eof": True})
                elif isinstance(item, ResizeInput):
                    args = {"action": "resize", "id": ident, "cols": item.cols, "rows": item.rows}
                    await self._control(session, args)
                elif isinstance(item, SignalInput):
                    await self._control(
                        session, {"action": "kill", "id": ident, "signal": item.name}
                    )
        except _ProcessEnded:
            return

    async def _write(self, session: _Session, data: bytes) -> None:
        # bytes that are not UTF-8 travel as lone surrogates; the agent turns them back
        text = data.decode("utf-8", "surrogateescape")
        args = {"action": "write", "id": session.process_id, "data": text}
        state = await self._control(session, args)
        session.input_bytes += len(data)
        while int(state.get("pending_stdin", 0)) > PENDING_HIGH:
            await asyncio.sleep(PENDING_POLL_S)
            state = await self._control(session, {"action": "poll", "id": session.process_id})
            if state.get("state") == "exited":
                raise _ProcessEnded

    async def _control(self, session: _Session, args: dict[str, Any]) -> dict[str, Any]:
        reply = await self._process(session, args)
        if reply.error_code:
            poll = await self._process(session, {"action": "poll", "id": session.process_id})
            if poll.error_code or (poll.result or {}).get("state") == "exited":
                raise _ProcessEnded
            raise _InputRefused(reply.error_message)
        return reply.result or {}

    async def _stop(self, session: _Session) -> None:
        """Best effort: kill a process this call started and leaves before it exited."""
        args = {"action": "kill", "id": session.process_id, "signal": "KILL"}
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._process(session, args), CONTROL_TIMEOUT_S)

    async def _process(self, session: _Session, args: dict[str, Any]) -> AgentReply:
        """One `process` action straight to the agent (the session passed policy at its start)."""
        return await session.lease.invoke("process", args, CONTROL_TIMEOUT_S, session.request_id)


def _opening_call(request: InteractRequest) -> ToolCall:
    """`process start` for a command, `process poll` for a process to attach to."""
    if bool(request.command) == bool(request.process_id):
        raise InvalidRequest("give exactly one of process_id (to attach) and command (to start)")
    if request.command:
        if request.offset:
            raise InvalidRequest("offset is for attaching to a process (process_id)")
        args: dict[str, Any] = {"action": "start", "command": request.command}
        if request.workdir:
            args["workdir"] = request.workdir
        if request.env:
            args["env"] = dict(request.env)
        if request.name:
            args["name"] = request.name
        if request.pty:
            args["pty"] = True
            if request.cols or request.rows:
                args["cols"], args["rows"] = request.cols or 80, request.rows or 24
        elif request.cols or request.rows:
            raise InvalidRequest("a window size needs pty")
    else:
        given = [
            field
            for field in ("workdir", "env", "name", "pty", "cols", "rows", "keep_running")
            if getattr(request, field)
        ]
        if given:
            raise InvalidRequest(f"{', '.join(given)}: only for starting a command")
        args = {"action": "poll", "id": request.process_id}
    return ToolCall(
        sandbox_key=request.sandbox_key,
        tool="process",
        arguments_json=json.dumps(args),
        context=request.context,
        request_id=request.request_id,
    )


def _started_here(request: InteractRequest) -> bool:
    return bool(request.command) and not request.keep_running


def _input_outcome(feeder: asyncio.Task[None]) -> ToolResult | None:
    """The session's result when its input side stops: None (go on) unless it failed."""
    exc = feeder.exception()
    if exc is None:
        return None
    if isinstance(exc, _InputRefused):
        return failure(ErrorCode.INVALID_ARGS, f"input refused: {exc}")
    if isinstance(exc, CALL_FAULTS):
        return outcome_of(exc)
    raise exc  # a wrong request among the inputs (InvalidRequest), or a bug


def _exit_result(result: ToolResult) -> ToolResult:
    """A process that exited non-zero (or by a signal) makes the result an error, as exec."""
    data = result.data or {}
    code = data.get("exit_code")
    if result.is_error or data.get("state") != "exited" or code == 0:
        return result
    by = f" ({data['signal']})" if data.get("signal") else ""
    message = f"process exited with code {code}{by}"
    return replace(
        result, is_error=True, error_code=ErrorCode.EXECUTION_FAILED, error_message=message
    )


def _detached(session: _Session) -> dict[str, Any]:
    return {"id": session.process_id, "detached": True, "input_bytes": session.input_bytes}
