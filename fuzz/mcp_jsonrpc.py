"""The MCP front's request parsing (fronts/mcp/): a POST body as the front reads it ahead
(`json_answers.plain_kind`) and as the `mcp` SDK then parses it (the JSON-RPC message model,
a request's params by its method, its `_meta`), a `tools/call` on to the domain call
(`convert.sandbox_of`, `convert.call_from_mcp`); and the same bytes as the SSE answer the
front reads its first event from (`first_event`, `response_data`).

Clean refusals: ValueError (pydantic's ValidationError is one: the SDK answers it 400) and
the front's InvalidRequest (answered as a tool error)."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pydantic_core

from stockade.supervisor import errors
from stockade.supervisor.fronts.mcp.convert import Caller, call_from_mcp, sandbox_of
from stockade.supervisor.fronts.mcp.json_answers import first_event, plain_kind, response_data

INSTRUMENT = ("stockade", "mcp_types", "mcp")
REFUSALS: tuple[type[BaseException], ...] = (ValueError, errors.InvalidRequest)

PARAMS: dict[str, type[types.RequestParams]] = {
    "initialize": types.InitializeRequestParams,
    "tools/call": types.CallToolRequestParams,
    "tools/list": types.PaginatedRequestParams,
}
"""The params model the SDK validates a request of each method with (mcp/server/runner.py)."""


def one(data: bytes) -> None:
    plain_kind(data)
    event, complete = first_event(data)
    if complete:
        response_data(event)
    raw: Any = pydantic_core.from_json(data)
    message = types.jsonrpc_message_adapter.validate_python(raw, by_name=False)
    if not isinstance(message, types.JSONRPCRequest):
        return
    params = message.params
    model = PARAMS.get(message.method, types.RequestParams)
    typed = model.model_validate({} if params is None else params, by_name=False)
    if not isinstance(typed, types.CallToolRequestParams):
        return
    meta = types.RequestParams.model_validate(params or {}, by_name=False).meta
    caller = Caller(tenant="acme", session_id="session", sandbox=sandbox_of(meta))
    call_from_mcp(typed.name, typed.arguments, caller, "")
