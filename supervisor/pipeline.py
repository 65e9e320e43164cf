"""The path of one call: resolve the tool, check the arguments, run it in the sandbox,
render and cap the result. Host-side policy (issue: policy) plugs in before and after."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from typing import Any

from stockade.supervisor.agent_client import AgentCallFailed, AgentReply
from stockade.supervisor.catalog import TOOLS, ToolSpec, get_tool
from stockade.supervisor.config import Config
from stockade.supervisor.errors import SandboxLost
from stockade.supervisor.keys import validate_key
from stockade.supervisor.models import ErrorCode, ToolCall, ToolResult
from stockade.supervisor.render import cap_text, render
from stockade.supervisor.sandboxes import SandboxManager

DEFAULT_CALL_TIMEOUT_S = 60.0
_GRACE_S = 10.0


class ToolPipeline:
    def __init__(self, config: Config, sandboxes: SandboxManager) -> None:
        self._config = config
        self._sandboxes = sandboxes

    async def call(self, call: ToolCall) -> ToolResult:
        """Run one tool call. Raises only for a wrong request or a broken supervisor."""
        started = time.monotonic()
        validate_key(call.sandbox_key)
        call = replace(call, request_id=call.request_id or uuid.uuid4().hex)
        result = await self._run(call)
        elapsed = int((time.monotonic() - started) * 1000)
        return replace(result, duration_ms=elapsed, request_id=call.request_id)

    async def _run(self, call: ToolCall) -> ToolResult:
        spec = get_tool(call.tool)
        if spec is None:
            known = ", ".join(sorted(TOOLS))
            return failure(ErrorCode.NOT_FOUND, f"unknown tool {call.tool!r}; tools: {known}")
        try:
            args = parse_arguments(call.arguments_json)
        except ValueError as exc:
            return failure(ErrorCode.INVALID_ARGS, str(exc))
        args, timeout = self._deadline(spec, args, call.timeout_ms)
        try:
            reply = await self._sandboxes.invoke(
                call.sandbox_key, spec.name, args, timeout, call.request_id
            )
        except SandboxLost as exc:
            return failure(ErrorCode.SANDBOX_LOST, str(exc))
        except AgentCallFailed:
            return failure(ErrorCode.TIMEOUT, f"{spec.name} did not finish within {timeout:.0f} s")
        return self._result(spec, reply)

    def _deadline(
        self, spec: ToolSpec, args: dict[str, Any], timeout_ms: int
    ) -> tuple[dict[str, Any], float]:
        """The agent RPC's deadline; for exec also the command's own timeout, so that a
        timed-out command still returns its partial output."""
        limit = timeout_ms / 1000 if timeout_ms else None
        if spec.name != "exec":
            return args, limit or DEFAULT_CALL_TIMEOUT_S
        tools = self._config.tools
        wanted = args.get("timeout", tools.exec_default_timeout_s)
        if isinstance(wanted, (int, float)) and not isinstance(wanted, bool) and wanted > 0:
            wanted = min(wanted, tools.exec_max_timeout_s, limit or wanted)
            return {**args, "timeout": wanted}, (limit or wanted) + _GRACE_S
        return args, (limit or tools.exec_max_timeout_s) + _GRACE_S

    def _result(self, spec: ToolSpec, reply: AgentReply) -> ToolResult:
        data = reply.result
        if reply.error_code and data is None:
            return failure(ErrorCode(reply.error_code), reply.error_message)
        data = data or {}
        text = render(spec.name, data)
        code, message = _exec_outcome(data) if spec.name == "exec" else (ErrorCode.NONE, "")
        tools = self._config.tools
        for_llm, cut_llm = cap_text(text, tools.llm_max_bytes)
        for_user, cut_user = cap_text(text, tools.user_max_bytes)
        truncated = cut_llm or cut_user or bool(data.get("stdout_truncated"))
        return ToolResult(
            for_llm=for_llm,
            for_user=for_user,
            is_error=code is not ErrorCode.NONE,
            error_code=code,
            error_message=message,
            data=data,
            truncated=truncated or bool(data.get("stderr_truncated") or data.get("truncated")),
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


def parse_arguments(arguments_json: str) -> dict[str, Any]:
    """The arguments as a dict; ValueError saying what is wrong otherwise."""
    if not arguments_json.strip():
        return {}
    try:
        args = json.loads(arguments_json)
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments_json is not valid JSON: {exc}") from exc
    if not isinstance(args, dict):
        raise ValueError(f"arguments_json must be a JSON object, got {type(args).__name__}")
    return args


def failure(code: ErrorCode, message: str) -> ToolResult:
    text = f"Error ({code.value}): {message}"
    return ToolResult(
        for_llm=text, for_user=text, is_error=True, error_code=code, error_message=message
    )
