"""The path of one call (DESIGN.md): resolve the tool, policy, validate the arguments, guard
the command, approval, rate limit, run it in the sandbox, scrub, cap, audit.

Every decision is recorded in a Trail that ends up in the audit log. Nothing here sees
protobuf or a container SDK."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from stockade.supervisor.calls.catalog import Catalog, ToolSpec, render_command
from stockade.supervisor.calls.render import cap_text, render, wire_json
from stockade.supervisor.calls.schemas import ArgumentError, json_type_phrase, validate_arguments
from stockade.supervisor.calls.streaming import relay
from stockade.supervisor.config import Config
from stockade.supervisor.errors import AgentMisbehaved, SandboxLost
from stockade.supervisor.keys import validate_scoped as validate_key
from stockade.supervisor.models import (
    ApprovalPendingEvent,
    ErrorCode,
    ResultEvent,
    ToolCall,
    ToolEvent,
    ToolResult,
)
from stockade.supervisor.observe import telemetry
from stockade.supervisor.observe.audit import AuditLog, AuditRecord
from stockade.supervisor.observe.telemetry import Observer, Stages
from stockade.supervisor.policy.approvals import ApprovalManager, Pending
from stockade.supervisor.policy.guard import Guard
from stockade.supervisor.policy.limits import KeyLimiter, LimitExceeded
from stockade.supervisor.policy.scrub import Scrubber
from stockade.supervisor.policy.tools import PolicyEngine
from stockade.supervisor.sandboxes.agent_link import AgentCallFailed, AgentReply
from stockade.supervisor.sandboxes.manager import SandboxManager

DEFAULT_CALL_TIMEOUT_S = 60.0
CANCELLED = "CANCELLED"
"""The audit's error code of a call whose caller went away before it ended."""
STREAM_QUEUE = 64
GUARD_INLINE_CHARS = 2048
_GRACE_S = 10.0


@dataclass(frozen=True)
class HostPolicy:
    """The host-side parts of the pipeline, built once from the config."""

    catalog: Catalog
    tools: PolicyEngine
    guard: Guard | None
    approvals: ApprovalManager
    limiter: KeyLimiter
    scrubber: Scrubber | None
    audit: AuditLog | None


@dataclass
class Trail:
    """What each step decided, for the audit record."""

    tool: str = ""
    arguments: dict[str, Any] | None = None
    policy_step: str = ""
    guard_rule: str = ""
    approval: str = ""
    approver: str = ""
    ran_as: str = ""
    """The agent tool that produced the data (custom tools run as exec); picks the renderer."""
    stream_redactions: int = 0
    stages: Stages = field(default_factory=Stages)
    start_ns: int = field(default_factory=time.time_ns)
    """Wall clock when the call arrived, for its span (the stages' times are wall clock)."""


class _Stop(Exception):
    """A step refused the call; carries the result to return."""

    def __init__(self, result: ToolResult) -> None:
        self.result = result


class ToolPipeline:
    def __init__(
        self,
        config: Config,
        sandboxes: SandboxManager,
        policy: HostPolicy,
        observers: tuple[Observer, ...] = (),
    ) -> None:
        self._config = config
        self._sandboxes = sandboxes
        self._policy = policy
        self._observers = observers

    async def call(self, call: ToolCall, caller: str = "") -> ToolResult:
        """Run one tool call. Raises only for a wrong request or a broken supervisor."""
        return await self._execute(call, caller, None)

    async def call_stream(self, call: ToolCall, caller: str = "") -> AsyncIterator[ToolEvent]:
        """The same call, streamed: started, output and approval-pending events, then the
        result. Closing the iterator cancels the call (its process group is killed)."""
        validate_key(call.sandbox_key)
        events: asyncio.Queue[ToolEvent] = asyncio.Queue(maxsize=STREAM_QUEUE)
        task = asyncio.create_task(self._execute(call, caller, events))
        try:
            while True:
                item = asyncio.ensure_future(events.get())
                await asyncio.wait({item, task}, return_when=asyncio.FIRST_COMPLETED)
                if not item.done():
                    item.cancel()
                    break
                yield item.result()
            while not events.empty():
                yield events.get_nowait()
            yield ResultEvent(task.result())
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _execute(
        self, call: ToolCall, caller: str, events: asyncio.Queue[ToolEvent] | None
    ) -> ToolResult:
        started = time.monotonic()
        validate_key(call.sandbox_key)
        call = replace(call, request_id=call.request_id or uuid.uuid4().hex)
        telemetry.request_id.set(call.request_id)  # this task's: a copy of the context
        trail = Trail(tool=call.tool)
        try:
            result = await self._run(call, trail, events)
        except _Stop as stop:
            result = stop.result
        except asyncio.CancelledError:  # the caller went away: the call is audited all the same
            elapsed = int((time.monotonic() - started) * 1000)
            gone = replace(failure(ErrorCode.NONE, "cancelled"), duration_ms=elapsed)
            self._audit(call, caller, trail, gone, error_code=CANCELLED)
            raise
        return self.finish(call, caller, trail, result, started)

    def finish(
        self, call: ToolCall, caller: str, trail: Trail, result: ToolResult, started: float
    ) -> ToolResult:
        """The last steps of every call: scrub, render and cap the result, stamp its duration
        (since `started`, a time.monotonic()) and request id, and audit it."""
        with trail.stages.timed("finish"):
            result = self._scrubbed(result, trail.ran_as, trail.stream_redactions)
        elapsed = time.monotonic() - started
        result = replace(result, duration_ms=int(elapsed * 1000), request_id=call.request_id)
        self._audit(call, caller, trail, result)
        if self._observers:
            telemetry.notify(self._observers, self._observation(call, trail, result))
        return result

    def _observation(
        self, call: ToolCall, trail: Trail, result: ToolResult
    ) -> telemetry.CallObservation:
        known = trail.tool if trail.tool in self._policy.catalog.tools else ""
        return telemetry.CallObservation(
            request_id=call.request_id,
            sandbox_key=call.sandbox_key,
            tool=known,
            result=result.error_code.name if result.is_error else "ok",
            start_ns=trail.start_ns,
            end_ns=time.time_ns(),
            stages=tuple(trail.stages.done),
            redactions=result.redactions,
            agent_id=call.context.agent_id,
            traceparent=call.traceparent,
        )

    async def _run(
        self, call: ToolCall, trail: Trail, events: asyncio.Queue[ToolEvent] | None
    ) -> ToolResult:
        with trail.stages.timed("policy"):
            spec = self._resolve(call, trail)
            args = self._arguments(spec, call.arguments_json, trail)
        command = _command_of(spec, args)
        if command is not None:
            await self._check_command(call, spec, command, trail, events, args)
        limiter = self._policy.limiter
        async with contextlib.AsyncExitStack() as hold:
            try:
                with trail.stages.timed("queue"):
                    limiter.take(call.sandbox_key)
                    await hold.enter_async_context(limiter.slot(call.sandbox_key))
            except LimitExceeded as exc:
                return failure(ErrorCode.RATE_LIMITED, str(exc))
            with trail.stages.timed("sandbox"):
                await self._sandboxes.ensure(call.sandbox_key)
            streamed = command is not None or _is_attach(spec, args)
            with trail.stages.timed("agent"):
                return await self._invoke(
                    call, spec, args, command, trail, events if streamed else None
                )

    def _resolve(self, call: ToolCall, trail: Trail) -> ToolSpec:
        spec = self._policy.catalog.resolve(call.tool)
        if spec is None:
            allowed = self._policy.tools.allowed_tools(call.context)  # as ListTools gives them
            known = ", ".join(sorted(t.name for t in allowed)) or "none"
            name = call.tool[:64] + ("..." if len(call.tool) > 64 else "")
            raise _Stop(failure(ErrorCode.NOT_FOUND, f"unknown tool {name!r}; tools: {known}"))
        trail.tool = spec.name
        decision = self._policy.tools.decide(spec.name, call.context)
        trail.policy_step = decision.step
        if not decision.allowed:
            message = f"tool {spec.name!r} is not allowed here: {decision.reason}"
            raise _Stop(failure(ErrorCode.PERMISSION_DENIED, message))
        return spec

    def _arguments(self, spec: ToolSpec, raw: str, trail: Trail) -> dict[str, Any]:
        try:
            args = parse_arguments(raw)
            trail.arguments = args
            validate_arguments(spec.parameters, args)
        except (ValueError, ArgumentError) as exc:
            raise _Stop(failure(ErrorCode.INVALID_ARGS, str(exc))) from exc
        return args

    async def _check_command(
        self,
        call: ToolCall,
        spec: ToolSpec,
        command: str,
        trail: Trail,
        events: asyncio.Queue[ToolEvent] | None = None,
        args: dict[str, Any] | None = None,
    ) -> None:
        must_ask = None
        guard = self._policy.guard
        if guard is not None:
            with trail.stages.timed("guard"):
                check = functools.partial(guard.check, command, **_where_of(spec, args or {}))
                # a hostile 256 KiB command takes ~0.4 s to parse: keep it off the event loop
                long = len(command) > GUARD_INLINE_CHARS
                verdict = await asyncio.to_thread(check) if long else check()
            trail.guard_rule = verdict.rule or ""
            if verdict.action == "deny":
                message = f"command blocked by the guard: {verdict.reason}"
                raise _Stop(failure(ErrorCode.PERMISSION_DENIED, message))
            if verdict.action == "ask":
                must_ask = f"the guard asks: {verdict.reason}"
        trail.approval = "withdrawn"  # unless the check below returns
        with trail.stages.timed("approval"):
            outcome = await self._policy.approvals.check(
                sandbox_key=call.sandbox_key,
                agent_id=call.context.agent_id,
                tool=spec.name,
                command=command,
                request_id=call.request_id,
                must_ask=must_ask,
                on_pending=_announce(events),
            )
        trail.approval, trail.approver = outcome.how, outcome.approver
        if not outcome.allowed:
            why = {"timeout": "no decision in time", "no-approver": "no approver is connected"}
            reason = why.get(outcome.how, f"denied by {outcome.approver or 'an approver'}")
            raise _Stop(failure(ErrorCode.APPROVAL_DENIED, f"command not approved: {reason}"))

    def _agent_call(
        self,
        call: ToolCall,
        spec: ToolSpec,
        args: dict[str, Any],
        command: str | None,
        trail: Trail,
    ) -> tuple[str, dict[str, Any], float]:
        """The agent tool, its arguments and the RPC deadline (custom tools run as exec)."""
        tool = trail.ran_as = "exec" if spec.custom else spec.name
        if spec.custom:
            args = self._custom_exec_args(spec, command)
        args, timeout = self._deadline(tool, args, call.timeout_ms)
        return tool, args, timeout

    async def _invoke(
        self,
        call: ToolCall,
        spec: ToolSpec,
        args: dict[str, Any],
        command: str | None,
        trail: Trail,
        events: asyncio.Queue[ToolEvent] | None,
    ) -> ToolResult:
        """Run the call in the sandbox; with `events`, relay its output as it comes."""
        tool, args, timeout = self._agent_call(call, spec, args, command, trail)
        key, request_id = call.sandbox_key, call.request_id
        try:
            if events is None:
                reply: AgentReply | None = await self._sandboxes.invoke(
                    key, tool, args, timeout, request_id
                )
            else:
                source = self._sandboxes.invoke_stream(key, tool, args, timeout, request_id)
                reply, trail.stream_redactions = await relay(source, self._policy.scrubber, events)
        except (SandboxLost, AgentMisbehaved) as exc:
            return failure(ErrorCode.SANDBOX_LOST, str(exc))
        except AgentCallFailed:
            return failure(ErrorCode.TIMEOUT, f"{spec.name} did not finish within {timeout:g} s")
        if reply is None:
            return failure(
                ErrorCode.EXECUTION_FAILED, "the sandbox ended the call without a result"
            )
        return self.result_of(tool, reply)

    def _custom_exec_args(self, spec: ToolSpec, command: str | None) -> dict[str, Any]:
        custom = spec.custom
        if custom is None or command is None:
            raise TypeError("not a custom tool")
        args: dict[str, Any] = {"command": command, "timeout": custom.timeout_s}
        if custom.workdir != ".":
            args["workdir"] = custom.workdir
        if custom.env:
            args["env"] = dict(custom.env)
        return args

    def _deadline(
        self, tool: str, args: dict[str, Any], timeout_ms: int
    ) -> tuple[dict[str, Any], float]:
        """The agent RPC's deadline; for exec also the command's own timeout, so that a
        timed-out command still returns its partial output."""
        limit = timeout_ms / 1000 if timeout_ms else None
        if tool != "exec":
            return args, limit or DEFAULT_CALL_TIMEOUT_S
        tools = self._config.tools
        wanted = args.get("timeout", tools.exec_default_timeout_s)
        if isinstance(wanted, (int, float)) and not isinstance(wanted, bool) and wanted > 0:
            wanted = min(wanted, tools.exec_max_timeout_s, limit or wanted)
            return {**args, "timeout": wanted}, (limit or wanted) + _GRACE_S
        return args, (limit or tools.exec_max_timeout_s) + _GRACE_S

    def result_of(self, tool: str, reply: AgentReply) -> ToolResult:
        """The agent's reply for `tool` as a result (exec: a failed command is an error)."""
        data = reply.result
        if reply.error_code and data is None:
            return failure(ErrorCode(reply.error_code), reply.error_message)
        data = data or {}
        code, message = _exec_outcome(data) if tool == "exec" else (ErrorCode.NONE, "")
        return ToolResult(
            for_llm="",
            for_user="",
            is_error=code is not ErrorCode.NONE,
            error_code=code,
            error_message=message,
            data=data,
            truncated=any(
                data.get(k) for k in ("stdout_truncated", "stderr_truncated", "truncated")
            ),
        )

    def _scrubbed(self, result: ToolResult, ran_as: str, streamed: int = 0) -> ToolResult:
        """Scrub every field that leaves the host, then render and cap the text. `streamed`:
        redactions already made in streamed chunks of the same output (counted once)."""
        scrubber, count = self._policy.scrubber, 0
        data, message = result.data, result.error_message
        if scrubber is not None:
            if data is not None:
                cleaned, n = scrubber.scrub_value(data)
                data, count = cleaned, count + n  # type: ignore[assignment]
                data, n = _cut_ends_scrubbed(scrubber, data)
                count += n
            message, n = scrubber.scrub(message)
            count += n
        text = result.for_llm
        if data is not None:
            text = render(ran_as, data)
        elif scrubber is not None:
            text, n = scrubber.scrub(text)
            count += n
        tools = self._config.tools
        for_llm, cut_llm = cap_text(text, tools.llm_max_bytes)
        for_user, cut_user = cap_text(text, tools.user_max_bytes)
        return replace(
            result,
            for_llm=for_llm,
            for_user=for_user,
            error_message=message,
            data=data,
            truncated=result.truncated or cut_llm or cut_user,
            redactions=max(count, streamed),
        )

    def _audit(
        self, call: ToolCall, caller: str, trail: Trail, result: ToolResult, error_code: str = ""
    ) -> None:
        audit = self._policy.audit
        if audit is None:
            return
        data = result.data or {}
        exit_code = data.get("exit_code")
        audit.record(
            AuditRecord(
                time=time.time(),
                request_id=call.request_id,
                caller=caller,
                sandbox_key=call.sandbox_key,
                agent_id=call.context.agent_id,
                provider=call.context.provider,
                tool=trail.tool,
                arguments_json=self._audit_arguments(trail.arguments, call.arguments_json),
                policy_step=trail.policy_step,
                guard_rule=trail.guard_rule,
                approval=trail.approval,
                approver=trail.approver,
                duration_ms=result.duration_ms,
                exit_code=exit_code if isinstance(exit_code, int) else -1,
                output_bytes=len(result.for_user.encode("utf-8", "replace")),
                redactions=result.redactions,
                error_code=error_code
                or ("" if result.error_code is ErrorCode.NONE else result.error_code.value),
                is_error=result.is_error,
            )
        )

    def _audit_arguments(self, args: dict[str, Any] | None, raw: str) -> str:
        limit = self._config.audit.max_arguments_bytes
        # scrubbed whole, then cut: a credential cut first would leave a piece no rule knows,
        # and the redactions before it could pull that piece under the limit
        text = wire_json(args) if args is not None else raw
        if self._policy.scrubber is not None:
            text, _ = self._policy.scrubber.scrub(text)
        return cap_text(text, limit)[0]


def _cut_ends_scrubbed(scrubber: Scrubber, data: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """An output the sandbox cut at its limit (`stdout_truncated`) may end in a piece of a
    configured secret: Scrubber.scrub_cut hides it."""
    count = 0
    for name in ("stdout", "stderr"):
        text = data.get(name)
        if data.get(f"{name}_truncated") and isinstance(text, str):
            cleaned, n = scrubber.scrub_cut(text)
            if n:
                data, count = {**data, name: cleaned}, count + n
    return data, count


def _announce(events: asyncio.Queue[ToolEvent] | None) -> Callable[[Pending], None] | None:
    """For streamed calls: tell the caller that a human is being asked."""
    if events is None:
        return None
    return lambda p: events.put_nowait(ApprovalPendingEvent(p.id, p.reason))


def _is_attach(spec: ToolSpec, args: dict[str, Any]) -> bool:
    return spec.name == "process" and args.get("action") == "attach"


def _command_of(spec: ToolSpec, args: dict[str, Any]) -> str | None:
    """The shell command a call would run, for the guard and approvals."""
    if spec.custom is not None:
        return render_command(spec.custom.command, args)
    if spec.name == "exec":
        return str(args["command"])
    if spec.name == "process" and args.get("action") == "start":
        return str(args.get("command", ""))
    return None


def _where_of(spec: ToolSpec, args: dict[str, Any]) -> dict[str, Any]:
    """The working directory and added environment the guard judges a command in."""
    if spec.custom is not None:
        return {"workdir": spec.custom.workdir, "env": dict(spec.custom.env)}
    workdir, env = args.get("workdir") or ".", args.get("env")
    return {
        "workdir": workdir if isinstance(workdir, str) else None,
        "env": env if isinstance(env, dict) else {},
    }


def _exec_outcome(data: dict[str, Any]) -> tuple[ErrorCode, str]:
    if data.get("timed_out"):
        return ErrorCode.TIMEOUT, f"command timed out after {data.get('duration_ms', 0)} ms"
    code = data.get("exit_code")
    if data.get("oom_killed"):
        return ErrorCode.EXECUTION_FAILED, f"command killed: out of memory (exit code {code})"
    if not isinstance(code, int):
        return ErrorCode.EXECUTION_FAILED, "the agent reported no exit code"
    if code != 0:
        signal = f" ({data['signal']})" if data.get("signal") else ""
        return ErrorCode.EXECUTION_FAILED, f"command exited with code {code}{signal}"
    return ErrorCode.NONE, ""


MAX_ARGUMENT_DEPTH = 64
"""Nesting of arguments_json: deeper JSON made json.loads (and later json.dumps) raise
RecursionError, an internal error instead of INVALID_ARGS."""
MAX_ARGUMENT_VALUES = 10_000
"""Objects, arrays, members and items in arguments_json, all told. No tool takes more; a
request of a million members held the event loop (so every other call and the health check)
for seconds in validation, rendering and the audit."""


def parse_arguments(arguments_json: str) -> dict[str, Any]:
    """The arguments as a dict; ValueError saying what is wrong otherwise."""
    if not arguments_json.strip():
        return {}
    too_deep = f"arguments_json nests deeper than {MAX_ARGUMENT_DEPTH} levels"
    try:
        args = json.loads(arguments_json)
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments_json is not valid JSON: {exc}") from exc
    except ValueError:  # int() refuses more digits than sys.get_int_max_str_digits()
        limit = sys.get_int_max_str_digits()
        raise ValueError(f"arguments_json holds an integer of more than {limit} digits") from None
    except RecursionError:
        raise ValueError(too_deep) from None
    if not isinstance(args, dict):
        raise ValueError(f"arguments_json must be a JSON object, got {json_type_phrase(args)}")
    _check_shape(args)
    return args


def _check_shape(value: object) -> None:
    """ValueError when `value` nests deeper than MAX_ARGUMENT_DEPTH or holds more than
    MAX_ARGUMENT_VALUES values; walked without recursion, stopping at the first excess."""
    stack, seen = [(value, 1)], 1
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            if level > MAX_ARGUMENT_DEPTH:
                raise ValueError(f"arguments_json nests deeper than {MAX_ARGUMENT_DEPTH} levels")
            seen += len(item)
            if seen > MAX_ARGUMENT_VALUES:
                raise ValueError(f"arguments_json holds more than {MAX_ARGUMENT_VALUES} values")
            stack.extend((child, level + 1) for child in item)


def failure(code: ErrorCode, message: str) -> ToolResult:
    text = f"Error ({code.value}): {message}"
    return ToolResult(
        for_llm=text, for_user=text, is_error=True, error_code=code, error_message=message
    )
