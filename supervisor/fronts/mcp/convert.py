"""Catalog tools and domain results as MCP objects, and MCP tool calls as domain calls. No
transport here: server.py serves these."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from stockade.supervisor import errors
from stockade.supervisor.keys import scope, validate_key
from stockade.supervisor.models import CallContext, ToolCall, ToolResult
from stockade.supervisor.observe.tracing import MAX_TRACEPARENT
from stockade.supervisor.text import wire_text
from stockade.supervisor.tools.catalog import ToolSpec

FRONT = "mcp"
"""What the audit log names as the front of a call that came in over MCP."""
SESSION_KEY_PREFIX = "mcp-"
DEFAULT_KEY = "mcp-default"
"""The sandbox of a sessionless (2026-07-28) call that names none, without [mcp] key: one per
tenant."""
SANDBOX_META = "stockade/sandbox"
"""The `_meta` entry of a tools/call that names its sandbox (a key within the caller's
tenant), with or without a session."""

READ_ONLY = frozenset({"read_file", "list_files", "glob", "search"})
"""Built-in tools that change nothing: read-only, idempotent, closed world."""
COMMANDS = frozenset({"exec", "process"})
"""Built-in tools that run a command of the caller's choosing (custom tools run one too):
anything may happen, so destructive and open world (the sandbox's network mode decides what
the command can reach, not the tool)."""
IDEMPOTENT_WRITES = frozenset({"write_file"})
"""Writing the same content twice leaves the same file; an edit or a patch applied twice
does not."""


def annotations_of(spec: ToolSpec) -> types.ToolAnnotations:
    """MCP's hints for a catalog tool (see hints)."""
    return hints(spec.name, custom=spec.custom is not None)


def hints(name: str, custom: bool) -> types.ToolAnnotations:
    """MCP's hints for a tool by its name (custom: a configured custom tool): read/list/glob/
    search read only; write, edit and patch destructive (they overwrite) but closed world;
    exec, process and custom tools destructive and open world."""
    if not custom and name in READ_ONLY:
        return types.ToolAnnotations(
            read_only_hint=True,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        )
    command = custom or name in COMMANDS
    return types.ToolAnnotations(
        read_only_hint=False,
        destructive_hint=True,
        idempotent_hint=not custom and name in IDEMPOTENT_WRITES,
        open_world_hint=command,
    )


def tool_to_mcp(spec: ToolSpec) -> types.Tool:
    """The tool as tools/list gives it: ListTools' name, description and JSON Schema."""
    return types.Tool(
        name=spec.name,
        description=spec.description,
        input_schema=dict(spec.parameters),
        annotations=annotations_of(spec),
    )


def result_to_mcp(result: ToolResult) -> types.CallToolResult:
    """Text content: `for_llm` (a failure's code first, when the text does not say it);
    structured content: the tool's data object, when there is one."""
    text = result.for_llm
    if result.is_error:
        code = result.error_code.value
        if f"({code})" not in text.partition("\n")[0]:
            text = f"Error ({code}): {result.error_message}\n{text}".rstrip("\n")
    structured = None
    if result.data is not None:  # a lone surrogate (a file name that is not UTF-8) as "?"
        structured = json.loads(
            json.dumps(result.data, ensure_ascii=False).encode("utf-8", "replace")
        )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=wire_text(text))],
        structured_content=structured,
        is_error=result.is_error,
    )


def refusal_to_mcp(exc: errors.StockadeError) -> types.CallToolResult:
    """A call the supervisor refused before it had a result (a wrong request, a quota, the
    engine down): a tool error naming the reason, as the gRPC front's status would."""
    text = f"Error ({exc.reason}): {exc}"
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=wire_text(text))], is_error=True
    )


@dataclass(frozen=True)
class Caller:
    """Who sent an MCP request, as the transport knows it."""

    tenant: str
    """"" with auth off."""
    session_id: str | None
    """The MCP session's id; None for a request outside a session."""
    peer: str = ""
    traceparent: str = ""
    sandbox: str = ""
    """The key the call named in its `_meta` (SANDBOX_META); "" when it named none."""


def sandbox_of(meta: Mapping[str, Any] | None) -> str:
    """The sandbox key a request's `_meta` names, "" for none; InvalidRequest when the entry
    is not a non-empty string."""
    if not meta or SANDBOX_META not in meta:
        return ""
    key = meta[SANDBOX_META]
    if not isinstance(key, str) or not key:
        raise errors.InvalidRequest(f"_meta[{SANDBOX_META!r}] must be a sandbox key (a string)")
    return key


def own_session(caller: Caller, shared: str) -> str | None:
    """The MCP session whose own sandbox the call uses (released when the session ends), or
    None when the call uses a named, configured or default key."""
    if caller.sandbox or shared or not caller.session_id:
        return None
    return caller.session_id


def sandbox_key(caller: Caller, shared: str) -> str:
    """The caller's sandbox, scoped to its tenant: the key the call names in its `_meta`,
    else the configured shared key, else its MCP session's own, else (a sessionless call)
    the tenant's DEFAULT_KEY."""
    if caller.sandbox:
        key = caller.sandbox
    elif shared:
        key = shared
    elif caller.session_id:
        key = SESSION_KEY_PREFIX + caller.session_id
    else:
        key = DEFAULT_KEY
    return scope(caller.tenant, validate_key(key))


SHELL_SESSION = "mcp"
"""The shell session an MCP session's commands run in, in its own sandbox."""


def with_shell_session(
    tool: str, arguments: dict[str, Any] | None, own: str | None
) -> dict[str, Any] | None:
    """An MCP session's exec and process start, in its own sandbox (`own`: not a named or
    shared key), run in its shell session, so `cd`, `export` and `source` carry over between
    its calls as in the agents' bash tools; a call that names a session keeps its own."""
    if own is None or not isinstance(arguments, dict) or "session" in arguments:
        return arguments
    if tool == "exec" or (tool == "process" and arguments.get("action") == "start"):
        return {**arguments, "session": SHELL_SESSION}
    return arguments


def call_from_mcp(
    name: str, arguments: dict[str, Any] | None, caller: Caller, shared_key: str
) -> ToolCall:
    """The domain call the gRPC front would build for the same tool and arguments.
    InvalidRequest for arguments that cannot be written as JSON."""
    try:
        arguments_json = json.dumps(arguments or {}, allow_nan=False)
    except (ValueError, TypeError, RecursionError) as exc:
        raise errors.InvalidRequest(f"the arguments are not a JSON object: {exc}") from None
    traceparent = caller.traceparent if len(caller.traceparent) <= MAX_TRACEPARENT else ""
    return ToolCall(
        sandbox_key=sandbox_key(caller, shared_key),
        tool=name,
        arguments_json=arguments_json,
        context=CallContext(),
        traceparent=traceparent,
        front=FRONT,
    )
