"""`stockade mcp`: an MCP server on stdin and stdout that forwards to a supervisor over its
gRPC API (the Python client, with the other client commands' --server, --token and TLS flags).
For MCP clients that start their servers as commands. Every call is an ordinary gRPC call on
the supervisor, named front "mcp-stdio" in its audit record; the tools, their annotations,
results and progress notifications are those of the supervisor's own MCP endpoint
(fronts/mcp/convert.py, handlers.py), and so are approvals asked by elicitation
(fronts/mcp/elicit.py), answered here through the ApprovalService."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from stockade.client import ApprovalPending as ClientPending
from stockade.client import ApprovalRequest, AsyncStockade, CallContext, StockadeError
from stockade.client import Output as ClientOutput
from stockade.client import ToolResult as ClientResult
from stockade.supervisor import errors
from stockade.supervisor.config.policy import ApprovalsConfig, ToolsConfig
from stockade.supervisor.fronts.mcp.convert import hints, refusal_to_mcp, result_to_mcp
from stockade.supervisor.fronts.mcp.handlers import (
    ROUNDS_GRACE_S,
    Asking,
    Gathered,
    follow,
    wants_progress,
)
from stockade.supervisor.fronts.mcp.rounds import Progress, Rounds
from stockade.supervisor.models import (
    ApprovalPendingEvent,
    ErrorCode,
    OutputEvent,
    ResultEvent,
    ToolEvent,
    ToolResult,
)
from stockade.supervisor.policy.approvals import Ask, Pending

log = logging.getLogger("stockade.mcp")
SESSION_KEY_PREFIX = "mcp-"
FRONT = "mcp-stdio"
"""What the audit log names as the front of a call forwarded by this bridge."""
APPROVER = "mcp elicitation (stdio bridge)"
"""The approver the audit log names when this bridge's client answered an elicitation."""
ATTACH_MAX_BYTES = ToolsConfig().llm_max_bytes
"""How much of the output `process` attach followed goes into its result's text (head and
tail): the supervisor's default `tools.llm_max_bytes`, as the bridge cannot read its
configuration."""


def bridge_key(key: str | None) -> str:
    """The sandbox this bridge uses: `key`, else one of its own (like an MCP session's)."""
    return key or SESSION_KEY_PREFIX + secrets.token_hex(16)


def _domain(result: ClientResult) -> ToolResult:
    code = ErrorCode(result.error_code) if result.error_code else ErrorCode.NONE
    return ToolResult(
        for_llm=result.for_llm,
        for_user=result.for_user,
        is_error=result.is_error,
        error_code=code,
        error_message=result.error_message,
        data=result.data or None,
    )


def _refusal(exc: StockadeError) -> types.CallToolResult:
    text = f"Error ({exc.reason or exc.code or 'CLIENT'}): {exc}"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _is_attach(name: str, arguments: dict[str, Any] | None) -> bool:
    """`process` attach, which only a streamed call can run."""
    return name == "process" and (arguments or {}).get("action") == "attach"


class Bridge:
    def __init__(self, client: AsyncStockade, key: str, context: CallContext) -> None:
        self._client = client
        self.key = key
        self._context = context
        rounds = Rounds(ApprovalsConfig().timeout_s + ROUNDS_GRACE_S, None)
        self._asking = Asking(rounds, "", APPROVER, None)
        """Asks the client as the endpoint does; the commands come scrubbed already."""

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = await self._client.list_tools("json", self._context)
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=t.name,
                    description=t.description,
                    input_schema=t.parameters,
                    annotations=hints(t.name, custom=t.group == "custom"),
                )
                for t in tools
            ]
        )

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        """A gRPC CallTool; CallToolStream when the client sent a progress token (output as
        progress notifications), for `process` attach, and when the client can be asked
        about an approval (the stream names it), as the endpoint asks (handlers.Asking)."""
        try:
            arguments = json.dumps(params.arguments or {}, allow_nan=False)
        except (ValueError, TypeError, RecursionError) as exc:
            text = f"Error (INVALID_ARGS): the arguments are not a JSON object: {exc}"
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=text)], is_error=True
            )
        attach = _is_attach(params.name, params.arguments)
        stream = wants_progress(ctx) or attach

        async def run(ask: Ask | None, progress: Progress) -> ToolResult:
            if not (stream or ask):
                reply = await self._client.call(
                    self.key, params.name, arguments, context=self._context, front=FRONT
                )
                return _domain(reply)
            output = Gathered(ATTACH_MAX_BYTES if attach else 0)
            events = self._stream(params.name, arguments, ask)
            async with contextlib.aclosing(events):
                return await follow(events, progress, output)

        try:
            result = await self._asking.answer(ctx, params, run)
        except StockadeError as exc:
            return _refusal(exc)
        except errors.StockadeError as exc:  # a sessionless answer naming no waiting call
            return refusal_to_mcp(exc)
        if isinstance(result, types.InputRequiredResult):
            return result
        return result_to_mcp(result)

    async def _stream(
        self, tool: str, arguments: str, ask: Ask | None
    ) -> AsyncGenerator[ToolEvent]:
        """The gRPC stream's events as the pipeline's; with `ask`, each approval the call
        waits for is asked of the client too, until the call goes on (whoever decided)."""
        asking: asyncio.Task[None] | None = None
        stream = self._client.call_stream(
            self.key,
            tool,
            arguments,
            context=self._context,
            front=FRONT,
            caller_approves=ask is not None,
        )
        try:
            async for event in stream:
                if asking is not None:  # decided (here or by an approver): withdraw the question
                    await _withdraw(asking)
                    asking = None
                if isinstance(event, ClientPending):
                    if ask is not None:
                        asking = asyncio.create_task(self._ask(ask, event.approval_id))
                    yield ApprovalPendingEvent(event.approval_id, event.reason)
                elif isinstance(event, ClientOutput):
                    yield OutputEvent(event.stream, event.text)
                elif isinstance(event, ClientResult):
                    yield ResultEvent(_domain(event))
        finally:
            if asking is not None:
                await _withdraw(asking)
            close = getattr(stream, "aclose", None)  # ends the gRPC stream now
            if close is not None:
                await close()

    async def _ask(self, ask: Ask, approval_id: str) -> None:
        """Ask the client about the approval, as the approvers see it (the command
        scrubbed), and resolve it with the answer; a failure leaves it to the approvers."""
        try:
            listed = await self._client.list_approvals()
            request = next((p for p in listed.pending if p.id == approval_id), None)
            if request is None:  # decided already
                return
            answer = await ask(_pending(request))
            if answer is not None:
                decision, approver = answer
                await self._client.resolve_approval(approval_id, decision, approver)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # decided meanwhile, or the client could not answer
            log.warning("approval %s: asking the client failed: %r", approval_id, exc)


def _pending(request: ApprovalRequest) -> Pending:
    """The approval as the ApprovalService shows it (the command scrubbed, the key as the
    bridge wrote it), as the question (elicit.message_of) takes it."""
    now = datetime.now(UTC)
    shown = dataclasses.asdict(request)
    times = {"created_at": request.created_at or now, "expires_at": request.expires_at or now}
    return Pending(**shown | times)


async def _withdraw(asking: asyncio.Task[None]) -> None:
    asking.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asking


async def serve_stdio(client: AsyncStockade, key: str, context: CallContext) -> None:
    """Serve MCP on stdin/stdout until the client closes stdin."""
    bridge = Bridge(client, key, context)
    server: Server[Any] = Server(
        "stockade", on_list_tools=bridge.list_tools, on_call_tool=bridge.call_tool
    )
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
