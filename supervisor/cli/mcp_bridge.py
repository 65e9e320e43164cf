"""`stockade mcp`: an MCP server on stdin and stdout that forwards to a supervisor over its
gRPC API (the Python client, with the other client commands' --server, --token and TLS flags).
For MCP clients that start their servers as commands. Every call is an ordinary gRPC call on
the supervisor (its audit record names the front "grpc"); the tools and their annotations
are those of the supervisor's own MCP endpoint (fronts/mcp/convert.py)."""

from __future__ import annotations

import json
import secrets
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from stockade.client import AsyncStockade, CallContext, StockadeError
from stockade.client import ToolResult as ClientResult
from stockade.supervisor.fronts.mcp.convert import hints, result_to_mcp
from stockade.supervisor.models import ErrorCode, ToolResult

SESSION_KEY_PREFIX = "mcp-"


def bridge_key(key: str | None) -> str:
    """The sandbox this bridge uses: `key`, else one of its own (like an MCP session's)."""
    return key or SESSION_KEY_PREFIX + secrets.token_hex(16)


def _result(result: ClientResult) -> types.CallToolResult:
    code = ErrorCode(result.error_code) if result.error_code else ErrorCode.NONE
    return result_to_mcp(
        ToolResult(
            for_llm=result.for_llm,
            for_user=result.for_user,
            is_error=result.is_error,
            error_code=code,
            error_message=result.error_message,
            data=result.data or None,
        )
    )


def _refusal(exc: StockadeError) -> types.CallToolResult:
    text = f"Error ({exc.reason or exc.code or 'CLIENT'}): {exc}"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class Bridge:
    def __init__(self, client: AsyncStockade, key: str, context: CallContext) -> None:
        self._client = client
        self.key = key
        self._context = context

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
    ) -> types.CallToolResult:
        try:
            arguments = json.dumps(params.arguments or {}, allow_nan=False)
        except (ValueError, TypeError, RecursionError) as exc:
            text = f"Error (INVALID_ARGS): the arguments are not a JSON object: {exc}"
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=text)], is_error=True
            )
        try:
            result = await self._client.call(
                self.key, params.name, arguments, context=self._context
            )
        except StockadeError as exc:
            return _refusal(exc)
        return _result(result)


async def serve_stdio(client: AsyncStockade, key: str, context: CallContext) -> None:
    """Serve MCP on stdin/stdout until the client closes stdin."""
    bridge = Bridge(client, key, context)
    server: Server[Any] = Server(
        "stockade", on_list_tools=bridge.list_tools, on_call_tool=bridge.call_tool
    )
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
