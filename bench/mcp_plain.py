"""An MCP client without the SDK: JSON-RPC over one kept-alive HTTP connection (httpx2), for
the share of an MCP call that is the server's and the wire's, not the mcp SDK client's."""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any

import httpx2
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

PROTOCOL = max(HANDSHAKE_PROTOCOL_VERSIONS)
"""The newest protocol version with sessions (they are dates)."""


class PlainMcp:
    """One MCP session: `initialize` and `notifications/initialized`, then tool calls, each a
    POST read to its end; `DELETE` at the end."""

    protocol_version = PROTOCOL

    def __init__(self, url: str) -> None:
        self._url = url
        self._http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120))
        self._headers = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
        }
        self._last_id = 0

    async def __aenter__(self) -> PlainMcp:
        opened = await self._http.post(
            self._url,
            headers=self._headers,
            content=json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": PROTOCOL,
                        "capabilities": {},
                        "clientInfo": {"name": "stockade-bench", "version": "0"},
                    },
                }
            ),
        )
        message(opened, 0)
        self._headers["mcp-session-id"] = opened.headers["mcp-session-id"]
        self._headers["mcp-protocol-version"] = PROTOCOL
        done = await self._http.post(
            self._url,
            headers=self._headers,
            content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        )
        if done.status_code != 202:
            raise RuntimeError(f"notifications/initialized: HTTP {done.status_code}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if "mcp-session-id" in self._headers:
                await self._http.delete(self._url, headers=self._headers)
        finally:
            await self._http.aclose()

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The call's result object (a JSON-RPC error raises)."""
        self._last_id += 1
        request = {
            "jsonrpc": "2.0",
            "id": self._last_id,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        }
        answer = await self._http.post(
            self._url, headers=self._headers, content=json.dumps(request)
        )
        return message(answer, self._last_id)


def message(answer: httpx2.Response, request_id: int) -> dict[str, Any]:
    """The result of the response to `request_id` in an answer: a JSON body, or an SSE
    stream's event that holds it."""
    if answer.status_code != 200:
        raise RuntimeError(f"HTTP {answer.status_code}: {answer.text[:200]}")
    if answer.headers.get("content-type", "").startswith("application/json"):
        found: Any = answer.json()
    else:
        found = None
        for line in answer.text.splitlines():
            if line.startswith("data:"):
                candidate = json.loads(line[5:])
                if isinstance(candidate, dict) and candidate.get("id") == request_id:
                    found = candidate
                    break
    if not isinstance(found, dict) or found.get("id") != request_id or "result" not in found:
        raise RuntimeError(f"no result for request {request_id}: {answer.text[:200]}")
    result: dict[str, Any] = found["result"]
    return result
