"""What a call reports: the agent's reply as a ToolResult, and the one mapping of the domain
errors a call reports as its result (rather than as a gRPC status). Every caller uses it:
unary and streamed calls, Interact, and any front to come."""

from __future__ import annotations

from typing import Any

from stockade.supervisor.errors import AgentMisbehaved, CallTimedOut, SandboxLost
from stockade.supervisor.models import ErrorCode, ToolResult
from stockade.supervisor.sandboxes.agent_link import AgentReply

CALL_FAULTS = (SandboxLost, AgentMisbehaved, CallTimedOut)
"""The errors of a call's sandbox that are the call's result: `except CALL_FAULTS as exc:
return outcome_of(exc)`. Every other error is no result (a wrong request, a quota, the
engine down, a sandbox that cannot start): the front reports it its own way."""


def outcome_of(exc: Exception) -> ToolResult:
    """The result of a call that ended with `exc` (one of CALL_FAULTS; anything else is
    raised again)."""
    if isinstance(exc, (SandboxLost, AgentMisbehaved)):
        return failure(ErrorCode.SANDBOX_LOST, str(exc))
    if isinstance(exc, CallTimedOut):
        return failure(ErrorCode.TIMEOUT, str(exc))
    raise exc


def no_result() -> ToolResult:
    """The agent's stream ended before its result (the call was cut short)."""
    return failure(ErrorCode.EXECUTION_FAILED, "the sandbox ended the call without a result")


def failure(code: ErrorCode, message: str) -> ToolResult:
    text = f"Error ({code.value}): {message}"
    return ToolResult(
        for_llm=text, for_user=text, is_error=True, error_code=code, error_message=message
    )


def result_of(tool: str, reply: AgentReply) -> ToolResult:
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
        truncated=any(data.get(k) for k in ("stdout_truncated", "stderr_truncated", "truncated")),
    )


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
