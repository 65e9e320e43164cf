"""The path of one call: resolve the tool, tool policy, validate the arguments, guard the
command, approval, rate limit, take the sandbox's lease (once) and run the call through it,
then scrub, render, cap and record (calls/recorder.py). See docs/architecture.md.

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
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from stockade.supervisor import errors
from stockade.supervisor.calls import previews
from stockade.supervisor.calls.outcome import CALL_FAULTS, failure, no_result, outcome_of, result_of
from stockade.supervisor.calls.recorder import CallRecorder, Trail
from stockade.supervisor.calls.sessions import SessionBook, SessionEnded
from stockade.supervisor.calls.streaming import AgentEvent, relay
from stockade.supervisor.calls.tripwires import REFUSED, CallTripwire
from stockade.supervisor.config import Config
from stockade.supervisor.keys import split
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
from stockade.supervisor.observe.alarms import MAX_EVIDENCE, Alarm, AlarmSink
from stockade.supervisor.observe.audit import AuditLog
from stockade.supervisor.observe.refusals import Refusals
from stockade.supervisor.observe.telemetry import Observer
from stockade.supervisor.policy.approvals import ApprovalManager, Ask, Pending, Preview
from stockade.supervisor.policy.guard import Guard
from stockade.supervisor.policy.limits import FairShare, KeyLimiter, LimitExceeded, TenantSlots
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.policy.tool_policy import PolicyEngine
from stockade.supervisor.sandboxes.agent_link import AgentReply
from stockade.supervisor.sandboxes.lease import Deadline
from stockade.supervisor.sandboxes.profiles import SandboxShell, shell_of
from stockade.supervisor.tools.catalog import Catalog, ToolSpec, render_command
from stockade.supervisor.tools.schemas import ArgumentError, json_type_phrase, validate_arguments

DEFAULT_CALL_TIMEOUT_S = 60.0
_SESSION_LIST_S = 10.0
SESSION_START = "/workspace"
"""Where a new session's first call starts (the workspace root, as the guard knows it)."""
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
    honey: CallTripwire | None = None
    """The honeytoken checks (calls/tripwires.py); None: honeytokens off."""
    streams: TenantSlots = field(default_factory=lambda: TenantSlots(0, "streams", ""))
    """Streamed calls open per tenant, every front together (limits.max_streams_per_tenant)."""
    watches: TenantSlots = field(default_factory=lambda: TenantSlots(0, "watches", ""))
    """File watches open per tenant, every front together (limits.max_watches_per_tenant)."""
    refusals: Refusals | None = None
    """Where every front tells of a refused authentication (observe/refusals.py)."""
    share: FairShare = field(default_factory=lambda: FairShare(0))
    """Transfers paced while other tenants call (limits.shared_transfer_mb_per_s)."""


class CallLease(Protocol):
    """What the pipeline calls on a sandbox's lease, its arguments given by position
    (sandboxes/lease.py Lease is the real one; tests put fakes in its place)."""

    @property
    def generation(self) -> str:
        """Which container serves the key now (a shell session lives in one)."""
        ...

    async def invoke(
        self,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        request_id: str,
        /,
        *,
        deadline: Deadline = "caller",
    ) -> AgentReply: ...

    def stream(
        self,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        request_id: str,
        /,
        *,
        deadline: Deadline = "caller",
    ) -> AsyncIterator[AgentEvent]: ...


Checkpointer = Callable[[str, str, str], Awaitable[str]]
"""Takes a checkpoint of a key's workspace before a call (key, call id, tool): its name, or ""
when there was nothing to take (sandboxes/snapshots/checkpoints.py Checkpoints.before_call)."""
OVERWRITES = frozenset({"write_file", "edit_file"})


class Sandboxes(Protocol):
    """What the pipeline calls on the sandboxes (sandboxes/manager.py SandboxManager is the
    real one): a call's lease on its key's sandbox."""

    def lease(self, key: str, /) -> AbstractAsyncContextManager[CallLease]: ...


class _Stop(Exception):
    """A step refused the call; carries the result to return."""

    def __init__(self, result: ToolResult) -> None:
        self.result = result


class ToolPipeline:
    def __init__(
        self,
        config: Config,
        sandboxes: Sandboxes,
        policy: HostPolicy,
        observers: tuple[Observer, ...] = (),
        alarm: AlarmSink | None = None,
        shells: Callable[[str], SandboxShell] | None = None,
        checkpoint: Checkpointer | None = None,
    ) -> None:
        """alarm: where signs of an attack are told (observe/alarms.py AlarmHub.sound);
        shells: the shell of a key's commands (SandboxManager.shell_of; default: its
        tenant's or [sandbox]'s); checkpoint: what takes a checkpoint before a risky call
        ([checkpoints])."""
        self._config = config
        self._shells = shells or (lambda key: shell_of(config, "", split(key)[0]))
        self.sessions = SessionBook()
        """The shell sessions' containers and folders (calls/sessions.py)."""
        self._checkpoint = checkpoint
        self._sandboxes = sandboxes
        self._policy = policy
        self._alarm = alarm
        self._quarantine_rules = frozenset(
            r.name for r in config.guard.rules if r.action == "quarantine"
        )
        self.recorder = CallRecorder(
            config, policy.catalog, policy.scrubber, policy.audit, observers
        )
        """The last steps of every call (scrub, render, cap, audit, observers): Interact and
        other fronts record through it too."""

    @property
    def honey(self) -> CallTripwire | None:
        """The honeytoken checks, for the fronts that pass input on themselves (Interact)."""
        return self._policy.honey

    @property
    def streams(self) -> TenantSlots:
        """The streams each tenant has open (Interact holds one for a session's life)."""
        return self._policy.streams

    def refuse_stream(self, call: ToolCall, caller: str, exc: errors.QuotaExceeded) -> ToolResult:
        """The result and audit record of a streamed call refused at its tenant's stream cap
        by a front that holds the stream itself (Interact)."""
        trail = Trail(tool=call.tool)
        result = self._too_many_streams(trail, exc)
        return self.recorder.finish(call, caller, trail, result, time.monotonic())

    @staticmethod
    def _too_many_streams(trail: Trail, exc: errors.QuotaExceeded) -> ToolResult:
        trail.policy_step = "limits.max_streams_per_tenant"
        return failure(ErrorCode.RATE_LIMITED, str(exc))

    async def call(self, call: ToolCall, caller: str = "", ask: Ask | None = None) -> ToolResult:
        """Run one tool call. Raises only for a wrong request or a broken supervisor.
        `ask`: a front that can ask its caller about an approval (MCP elicitation) gives
        it; the approvers are asked all the same (policy/approvals.py)."""
        return await self._execute(call, caller, None, ask)

    async def call_stream(
        self, call: ToolCall, caller: str = "", ask: Ask | None = None, *, counted: bool = True
    ) -> AsyncIterator[ToolEvent]:
        """The same call, streamed: started, output and approval-pending events, then the
        result. Closing the iterator cancels the call (its process group is killed). The call
        holds one of its tenant's streams (limits.max_streams_per_tenant) while it runs; past
        the cap its result is RATE_LIMITED at once. `counted=False`: the caller holds one for
        it already (an Interact session, for its whole life)."""
        validate_key(call.sandbox_key)
        events: asyncio.Queue[ToolEvent] = asyncio.Queue(maxsize=STREAM_QUEUE)
        task = asyncio.create_task(self._execute(call, caller, events, ask, counted=counted))
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
        self,
        call: ToolCall,
        caller: str,
        events: asyncio.Queue[ToolEvent] | None,
        ask: Ask | None = None,
        *,
        counted: bool = False,
    ) -> ToolResult:
        started = time.monotonic()
        validate_key(call.sandbox_key)
        self._policy.share.busy(call.sandbox_key)
        call = replace(call, request_id=call.request_id or uuid.uuid4().hex)
        telemetry.request_id.set(call.request_id)  # this task's: a copy of the context
        trail = Trail(tool=call.tool)
        try:
            with contextlib.ExitStack() as stream:
                if counted:
                    try:
                        stream.enter_context(self.streams.hold(call.sandbox_key))
                    except errors.QuotaExceeded as exc:
                        raise _Stop(self._too_many_streams(trail, exc)) from None
                result = await self._run(call, trail, events, ask)
        except _Stop as stop:
            result = stop.result
        except asyncio.CancelledError:  # the caller went away: the call is audited all the same
            self.recorder.cancelled(call, caller, trail, started)
            raise
        return self.recorder.finish(call, caller, trail, result, started)

    async def _run(
        self,
        call: ToolCall,
        trail: Trail,
        events: asyncio.Queue[ToolEvent] | None,
        ask: Ask | None = None,
    ) -> ToolResult:
        with trail.stages.timed("policy"):
            spec = self._resolve(call, trail)
            try:
                args = self._arguments(spec, call.arguments_json, trail)
            except _Stop:  # wrong arguments may still carry a decoy
                self._decoys(call, spec, trail.arguments, None, trail)
                raise
        command = command_of(spec, args)
        self._decoys(call, spec, args, command, trail)
        shell = self._shells(call.sandbox_key) if command is not None else SandboxShell()
        if command is not None:
            where = await self._where(call, spec, args)
            await self._check_command(call, spec, command, trail, events, where, shell, ask)
        elif spec.custom is None and self._policy.approvals.asks_files(spec.name):
            await self._check_change(call, spec, args, trail, events, ask)
        limiter = self._policy.limiter
        async with contextlib.AsyncExitStack() as hold:
            try:
                with trail.stages.timed("queue"):
                    limiter.take(call.sandbox_key)
                    await hold.enter_async_context(limiter.slot(call.sandbox_key))
            except LimitExceeded as exc:
                return failure(ErrorCode.RATE_LIMITED, str(exc))
            with trail.stages.timed("sandbox"):
                if self._checkpoint is not None and (why := self._risk(call, spec, trail)):
                    try:
                        trail.checkpoint = await self._checkpoint(
                            call.sandbox_key, call.request_id, spec.name
                        )
                    except errors.StockadeError as exc:
                        return failure(
                            ErrorCode.EXECUTION_FAILED,
                            f"no checkpoint could be taken before this call ({why}), so it "
                            f"did not run: {exc}",
                        )
                lease = await hold.enter_async_context(self._sandboxes.lease(call.sandbox_key))
            streamed = command is not None or _is_attach(spec, args)
            with trail.stages.timed("agent"):
                return await self._invoke(
                    lease, call, spec, args, command, trail, events if streamed else None, shell
                )

    def _risk(self, call: ToolCall, spec: ToolSpec, trail: Trail) -> str:
        """Why the call gets a checkpoint first ([checkpoints] before), or "" (asked only
        when a checkpointer is given)."""
        if not self._config.checkpoints_on(split(call.sandbox_key)[0]):
            return ""
        points = self._config.checkpoints
        if spec.name == "apply_patch":
            found = "apply_patch"
        elif spec.name in OVERWRITES:
            found = "overwrite"
        elif trail.checkpoint_rule:  # the rule asks for one, whatever `before` says
            return f"guard rule {trail.checkpoint_rule}"
        elif trail.risk:
            found = trail.risk if trail.risk in points.before else "commands"
        else:
            found = "commands" if trail.guarded else ""
        return found if found in points.before else ""

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

    def _decoys(
        self,
        call: ToolCall,
        spec: ToolSpec,
        args: dict[str, Any] | None,
        command: str | None,
        trail: Trail,
    ) -> None:
        """The honeytoken search of the call (calls/tripwires.py); refused when it uses one
        and on_use says quarantine."""
        honey, key = self._policy.honey, call.sandbox_key
        if honey is not None and honey.before(key, spec.name, call.arguments_json, args, command):
            trail.policy_step = "honeytoken"
            raise _Stop(failure(ErrorCode.PERMISSION_DENIED, REFUSED))

    async def _check_command(
        self,
        call: ToolCall,
        spec: ToolSpec,
        command: str,
        trail: Trail,
        events: asyncio.Queue[ToolEvent] | None,
        where: dict[str, Any],
        shell: SandboxShell,
        ask: Ask | None = None,
    ) -> None:
        must_ask = None
        trail.guarded = True
        guard = self._policy.guard
        if guard is not None:
            with trail.stages.timed("guard"):
                check = functools.partial(guard.check, command, shell=shell.name, **where)
                # a hostile 256 KiB command takes ~0.4 s to parse: keep it off the event loop
                long = len(command) > GUARD_INLINE_CHARS
                verdict = await asyncio.to_thread(check) if long else check()
            trail.guard_rule = verdict.rule or ""
            trail.risk = (
                "unparsed" if verdict.unparsed else "destructive" * (verdict.action == "ask")
            )
            trail.checkpoint_rule = verdict.checkpoint
            if verdict.action == "deny":
                if verdict.rule in self._quarantine_rules:
                    self._guard_alarm(call.sandbox_key, verdict.rule or "", command)
                message = f"command blocked by the guard: {verdict.reason}"
                raise _Stop(failure(ErrorCode.PERMISSION_DENIED, message))
            if verdict.action == "ask":
                must_ask = f"the guard asks: {verdict.reason}"
        await self._approval(call, spec, command, trail, events, ask, must_ask)

    async def _check_change(
        self,
        call: ToolCall,
        spec: ToolSpec,
        args: dict[str, Any],
        trail: Trail,
        events: asyncio.Queue[ToolEvent] | None,
        ask: Ask | None = None,
    ) -> None:
        """A file change approvals.files names is asked about, with the diff it will make
        (calls/previews.py) made only once an approver is sure to be asked."""
        approvals, key = self._policy.approvals, call.sandbox_key
        change = previews.change_of(spec.name, args)
        reason = approvals.reason_to_ask_file(spec.name, change, split(key)[0])
        if reason is None:
            return
        preview = functools.partial(
            previews.preview, self._sandboxes.lease, key, call.request_id, spec.name, args,
            self._policy.scrubber,
        )  # fmt: skip
        await self._approval(call, spec, change, trail, events, ask, reason, preview)

    async def _approval(
        self,
        call: ToolCall,
        spec: ToolSpec,
        command: str,
        trail: Trail,
        events: asyncio.Queue[ToolEvent] | None,
        ask: Ask | None,
        must_ask: str | None,
        preview: Preview | None = None,
    ) -> None:
        """The approval step of a command or a file change (`command`: what is asked about,
        and what allow-always keeps); the call stopped when it is not allowed."""
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
                ask=ask,
                preview=preview,
            )
        trail.approval, trail.approver = outcome.how, outcome.approver
        if not outcome.allowed:
            why = {"timeout": "no decision in time", "no-approver": "no approver is connected"}
            reason = why.get(outcome.how, f"denied by {outcome.approver or 'an approver'}")
            what = "file change" if preview is not None else "command"
            raise _Stop(failure(ErrorCode.APPROVAL_DENIED, f"{what} not approved: {reason}"))

    def _guard_alarm(self, key: str, rule: str, command: str) -> None:
        """A guard rule marked quarantine matched: the alarm (and, as configured, the
        quarantine) with the command, scrubbed and cut, as its evidence."""
        if self._alarm is None:
            return
        scrubber = self._policy.scrubber
        shown = command if scrubber is None else scrubber.scrub(command)[0]
        detail = f"guard rule {rule!r} (action quarantine) matched a command"
        self._alarm(Alarm(key, "guard", "guard", detail, shown[:MAX_EVIDENCE]))

    async def _where(self, call: ToolCall, spec: ToolSpec, args: dict[str, Any]) -> dict[str, Any]:
        """The working directory and added environment the guard judges a command in: a
        session's folder when the call names none."""
        where = where_of(spec, args)
        session = _session_of(spec, args)
        if session is not None and "workdir" not in args:
            where["workdir"] = await self._session_folder(call, session)
        return where

    async def _session_folder(self, call: ToolCall, name: str) -> str | None:
        """The folder a session's next call starts in: the book's, else (a session this
        supervisor has not seen: new, or from before a restart) its agent's, once; None when
        that cannot be told (the guard then judges relative paths as unknown)."""
        key, book = call.sandbox_key, self.sessions
        if book.known(key, name):
            return book.folder(key, name)
        try:
            async with self._sandboxes.lease(key) as lease:
                reply = await lease.invoke(
                    "session", {"action": "list"}, _SESSION_LIST_S, call.request_id
                )
                generation = lease.generation
        except CALL_FAULTS:
            return None
        listed = (reply.result or {}).get("sessions") if not reply.error_code else None
        if not isinstance(listed, list):
            return None
        folders = {s.get("name"): s.get("cwd") for s in listed if isinstance(s, dict)}
        book.left(key, name, generation, {"cwd": folders.get(name) or SESSION_START})
        return book.folder(key, name)

    def _agent_call(
        self,
        call: ToolCall,
        spec: ToolSpec,
        args: dict[str, Any],
        command: str | None,
        trail: Trail,
        shell: SandboxShell,
    ) -> tuple[str, dict[str, Any], float]:
        """The agent tool, its arguments and the RPC deadline (custom tools run as exec);
        a command gets the sandbox's shell."""
        tool = trail.ran_as = "exec" if spec.custom else spec.name
        if spec.custom:
            args = self._custom_exec_args(spec, command)
        if command is not None:
            args = {**args, **shell.arguments()}
        args, timeout = self._deadline(tool, args, call.timeout_ms)
        return tool, args, timeout

    async def _invoke(
        self,
        lease: CallLease,
        call: ToolCall,
        spec: ToolSpec,
        args: dict[str, Any],
        command: str | None,
        trail: Trail,
        events: asyncio.Queue[ToolEvent] | None,
        shell: SandboxShell,
    ) -> ToolResult:
        """Run the call in the sandbox; with `events`, relay its output as it comes. exec
        ends a command at its own timeout: a deadline it lets pass is the agent's fault. A
        call in a session whose container was re-created is refused (calls/sessions.py)."""
        tool, args, timeout = self._agent_call(call, spec, args, command, trail, shell)
        request_id, honey, key = call.request_id, self._policy.honey, call.sandbox_key
        session = _session_of(spec, args)
        if session is not None:
            try:
                self.sessions.enter(key, session, lease.generation)
            except SessionEnded as exc:
                return failure(ErrorCode.SANDBOX_LOST, str(exc))
        deadline: Deadline = "agent" if tool == "exec" else "caller"
        said = f"{spec.name} {call.arguments_json}"
        watch = honey.stream(key, "output", said) if honey and events is not None else None
        try:
            if events is None:
                reply: AgentReply | None = await lease.invoke(
                    tool, args, timeout, request_id, deadline=deadline
                )
            else:
                source = lease.stream(tool, args, timeout, request_id, deadline=deadline)
                scrubber = self._policy.scrubber
                reply, trail.stream_redactions = await relay(source, scrubber, events, watch)
        except CALL_FAULTS as exc:
            return outcome_of(exc)
        result = no_result() if reply is None else result_of(tool, reply)
        if session is not None and tool == "exec" and result.data is not None:
            self.sessions.left(key, session, lease.generation, result.data.get("session"))
        if honey is not None and not (watch is not None and watch.hit):
            honey.output(key, spec.name, (result.data, result.error_message), said)
        return result

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


def _announce(events: asyncio.Queue[ToolEvent] | None) -> Callable[[Pending], None] | None:
    """For streamed calls: tell the caller that a human is being asked."""
    if events is None:
        return None
    return lambda p: events.put_nowait(ApprovalPendingEvent(p.id, p.reason))


def _is_attach(spec: ToolSpec, args: dict[str, Any]) -> bool:
    """`process attach`, or `process start` with `follow`: output streamed as it comes."""
    if spec.name != "process":
        return False
    action = args.get("action")
    return action == "attach" or (action == "start" and bool(args.get("follow")))


def command_of(spec: ToolSpec, args: dict[str, Any]) -> str | None:
    """The shell command a call would run, for the guard and approvals."""
    if spec.custom is not None:
        return render_command(spec.custom.command, args)
    if spec.name == "exec":
        return str(args["command"])
    if spec.name == "process" and args.get("action") == "start":
        return str(args.get("command", ""))
    return None


def _session_of(spec: ToolSpec, args: dict[str, Any]) -> str | None:
    """The shell session an exec or process start names."""
    if spec.custom is not None or spec.name not in ("exec", "process"):
        return None
    if spec.name == "process" and args.get("action") != "start":
        return None
    session = args.get("session")
    return session if isinstance(session, str) else None


def where_of(spec: ToolSpec, args: dict[str, Any]) -> dict[str, Any]:
    """The working directory and added environment the guard judges a command in."""
    if spec.custom is not None:
        return {"workdir": spec.custom.workdir, "env": dict(spec.custom.env)}
    workdir, env = args.get("workdir") or ".", args.get("env")
    return {
        "workdir": workdir if isinstance(workdir, str) else None,
        "env": env if isinstance(env, dict) else {},
    }


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
