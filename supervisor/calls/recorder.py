"""The last steps of every call, whatever its front: scrub, render and cap the result, stamp
its duration and request id, write its audit record, and tell the observers (metrics, traces,
logs). The pipeline, Interact and any front to come record through one CallRecorder."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from stockade.supervisor.calls.outcome import failure
from stockade.supervisor.config import Config
from stockade.supervisor.models import CallContext, ErrorCode, ToolCall, ToolResult
from stockade.supervisor.observe import telemetry
from stockade.supervisor.observe.audit import AuditLog, AuditRecord
from stockade.supervisor.observe.telemetry import Observer, Stages
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.text import wire_json
from stockade.supervisor.tools.catalog import Catalog
from stockade.supervisor.tools.render import cap_text, render

CANCELLED = "CANCELLED"
"""The audit's error code of a call whose caller went away before it ended."""


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
    guarded: bool = False
    """The call runs a command (it went through the guard's and approvals' step)."""
    risk: str = ""
    """What the guard found risky in the command: "destructive" (it asked), "unparsed"."""
    checkpoint_rule: str = ""
    """A guard rule with checkpoint = true that matched the command."""
    checkpoint: str = ""
    """The checkpoint taken before the call (sandboxes/snapshots/checkpoints.py), or ""."""
    stages: Stages = field(default_factory=Stages)
    start_ns: int = field(default_factory=time.time_ns)
    """Wall clock when the call arrived, for its span (the stages' times are wall clock)."""


class CallRecorder:
    def __init__(
        self,
        config: Config,
        catalog: Catalog,
        scrubber: Scrubber | None,
        audit: AuditLog | None,
        observers: tuple[Observer, ...] = (),
    ) -> None:
        self._config = config
        self._catalog = catalog
        self._scrubber = scrubber
        self._audit_log = audit
        self._observers = observers

    def finish(
        self, call: ToolCall, caller: str, trail: Trail, result: ToolResult, started: float
    ) -> ToolResult:
        """Scrub, render and cap the result, stamp its duration (since `started`, a
        time.monotonic()) and request id, audit it and tell the observers."""
        with trail.stages.timed("finish"):
            result = self._scrubbed(result, trail.ran_as, trail.stream_redactions)
        elapsed = time.monotonic() - started
        result = replace(result, duration_ms=int(elapsed * 1000), request_id=call.request_id)
        self.audit(call, caller, trail, result)
        if self._observers:
            telemetry.notify(self._observers, self._observation(call, trail, result))
        return result

    def cancelled(self, call: ToolCall, caller: str, trail: Trail, started: float) -> None:
        """The caller went away before the call ended: it is audited all the same."""
        elapsed = int((time.monotonic() - started) * 1000)
        gone = failure(ErrorCode.NONE, "cancelled")
        self.audit(call, caller, trail, replace(gone, duration_ms=elapsed), error_code=CANCELLED)

    def audit(
        self, call: ToolCall, caller: str, trail: Trail, result: ToolResult, error_code: str = ""
    ) -> None:
        if self._audit_log is None:
            return
        data = result.data or {}
        exit_code = data.get("exit_code")
        self._audit_log.record(
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
                front=call.front,
                context_json=self._scrubbed_text(context_json(call.context)),
                checkpoint=trail.checkpoint,
            )
        )

    def _observation(
        self, call: ToolCall, trail: Trail, result: ToolResult
    ) -> telemetry.CallObservation:
        known = trail.tool if trail.tool in self._catalog.tools else ""
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

    def _scrubbed(self, result: ToolResult, ran_as: str, streamed: int = 0) -> ToolResult:
        """Scrub every field that leaves the host, then render and cap the text. `streamed`:
        redactions already made in streamed chunks of the same output (counted once)."""
        scrubber, count = self._scrubber, 0
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

    def _scrubbed_text(self, text: str) -> str:
        if self._scrubber is None or not text:
            return text
        return self._scrubber.scrub(text)[0]

    def _audit_arguments(self, args: dict[str, Any] | None, raw: str) -> str:
        limit = self._config.audit.max_arguments_bytes
        # scrubbed whole, then cut: a credential cut first would leave a piece no rule knows,
        # and the redactions before it could pull that piece under the limit
        text = wire_json(args) if args is not None else raw
        if self._scrubber is not None:
            text, _ = self._scrubber.scrub(text)
        return cap_text(text, limit)[0]


def context_json(context: CallContext) -> str:
    """What policy reads of a caller's context besides agent_id and provider (tool policy's
    group and subagent scopes), as its audit record keeps it for replay: the fields that are
    set, "" when none is. Cut like any caller's text, as the audit writer cuts a field."""
    kept = {
        name: value
        for name in ("channel", "chat_id", "peer_kind", "subagent_depth")
        if (value := getattr(context, name))
    }
    return (
        wire_json({k: v[:256] if isinstance(v, str) else v for k, v in kept.items()})
        if kept
        else ""
    )


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
