"""Protobuf <-> domain objects, for the servicers: requests become domain calls (their
strings bounded, their keys scoped to the caller's tenant) and domain results become
replies (their text made safe for the wire). Nothing below the api package sees protobuf."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, TypeVar

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from stockade.supervisor import errors
from stockade.supervisor.calls.transfers import TransferInfo
from stockade.supervisor.fronts.grpc.interceptor import current_tenant
from stockade.supervisor.fronts.grpc.status import Context
from stockade.supervisor.keys import scope, shown
from stockade.supervisor.models import (
    ApprovalPendingEvent,
    CallContext,
    EofInput,
    InteractInput,
    InteractRequest,
    OutputEvent,
    ResizeInput,
    SandboxInfo,
    SignalInput,
    StartedEvent,
    StdinInput,
    ToolCall,
    ToolEvent,
    ToolResult,
)
from stockade.supervisor.observe.audit import AuditRecord
from stockade.supervisor.observe.tracing import MAX_TRACEPARENT
from stockade.supervisor.policy.approvals import Closed, Pending
from stockade.supervisor.policy.scrub.scrubber import Scrubber, scrubbed
from stockade.supervisor.text import wire_json, wire_text
from stockade.supervisor.tools import schemas
from stockade.supervisor.tools.catalog import ToolSpec
from stockade.supervisor.tools.schemas import SchemaFormat
from stockade.v1 import approval_pb2, audit_pb2, file_pb2, sandbox_pb2, tool_pb2

M = TypeVar("M", bound=Message)


def _timestamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def sandbox_to_pb(info: SandboxInfo) -> sandbox_pb2.SandboxInfo:
    return sandbox_pb2.SandboxInfo(
        key=shown(info.key),
        container_id=info.container_id,
        container_name=info.container_name,
        engine=info.engine,
        image=info.image,
        state=sandbox_pb2.SandboxState.Value(f"SANDBOX_STATE_{info.state.value}"),  # type: ignore[arg-type]
        created_at=_timestamp(info.created_at),
        last_used_at=_timestamp(info.last_used_at),
        workspace_path=info.workspace_path,
        network_mode=info.network_mode,
        network_allow=list(info.network_allow),
        trouble=wire_text(info.trouble),
        heals=info.heals,
        last_heal_reason=wire_text(info.last_heal_reason),
        last_healed_at=_timestamp(info.last_healed_at),
        paused_at=_timestamp(info.paused_at),
        profile=info.profile,
        cpus=info.cpus,
        memory_mb=info.memory_mb,
        quarantined_at=_timestamp(info.quarantined_at),
    )


def result_to_pb(result: ToolResult) -> tool_pb2.ToolResult:
    code = "UNSPECIFIED" if result.error_code.value == "NONE" else result.error_code.value
    return tool_pb2.ToolResult(
        for_llm=wire_text(result.for_llm),
        for_user=wire_text(result.for_user),
        is_error=result.is_error,
        error_code=tool_pb2.ToolErrorCode.Value(f"TOOL_ERROR_CODE_{code}"),  # type: ignore[arg-type]
        error_message=wire_text(result.error_message),
        data_json=wire_json(result.data) if result.data is not None else "",
        duration_ms=result.duration_ms,
        truncated=result.truncated,
        redactions=result.redactions,
        request_id=result.request_id,
    )


MAX_NAME_BYTES = 256
"""A request id, an approver's name and each CallContext string: they are echoed in logs,
replies and every audit record, so they are bounded as keys are."""


def bounded(field: str, value: str) -> str:
    """`value`, or InvalidRequest when it is longer than MAX_NAME_BYTES of UTF-8."""
    size = len(value.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        raise errors.InvalidRequest(f"{field} is {size} bytes; the limit is {MAX_NAME_BYTES}")
    return value


def context_from_pb(ctx: tool_pb2.CallContext) -> CallContext:
    return CallContext(
        agent_id=bounded("context.agent_id", ctx.agent_id),
        provider=bounded("context.provider", ctx.provider),
        channel=bounded("context.channel", ctx.channel),
        chat_id=bounded("context.chat_id", ctx.chat_id),
        peer_kind=bounded("context.peer_kind", ctx.peer_kind),
        subagent_depth=ctx.subagent_depth,
    )


def scoped(key: str) -> str:
    """The caller's key within its tenant (see keys.scope): every key a request names
    passes here, so no tenant reaches another's sandboxes."""
    return scope(current_tenant(), key)


def fill_pb(message: M, obj: Any) -> M:
    """Copy a domain dataclass into a message whose fields carry the same names (the
    isolation report mirrors its .proto); an enum takes the value named like the string."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        field = message.DESCRIPTOR.fields_by_name[f.name]
        if field.message_type is not None and field.is_repeated:
            for item in value:
                fill_pb(getattr(message, f.name).add(), item)
        elif field.message_type is not None:
            fill_pb(getattr(message, f.name), value)
        elif field.enum_type is not None:
            suffix = f"_{value.upper()}"
            names = [v.name for v in field.enum_type.values if v.name.endswith(suffix)]
            setattr(message, f.name, field.enum_type.values_by_name[names[0]].number)
        elif field.is_repeated:
            getattr(message, f.name).extend(value)
        else:
            setattr(message, f.name, value)
    return message


_FORMATS = {
    tool_pb2.SCHEMA_FORMAT_UNSPECIFIED: SchemaFormat.JSON_SCHEMA,
    tool_pb2.SCHEMA_FORMAT_JSON_SCHEMA: SchemaFormat.JSON_SCHEMA,
    tool_pb2.SCHEMA_FORMAT_OPENAI: SchemaFormat.OPENAI,
    tool_pb2.SCHEMA_FORMAT_ANTHROPIC: SchemaFormat.ANTHROPIC,
    tool_pb2.SCHEMA_FORMAT_GEMINI: SchemaFormat.GEMINI,
}


def format_from_pb(value: tool_pb2.SchemaFormat) -> SchemaFormat:
    """The schema format a ListTools request names; InvalidRequest for one it does not."""
    fmt = _FORMATS.get(value)
    if fmt is None:
        raise errors.InvalidRequest(f"unknown schema format {value}")
    return fmt


def tool_to_pb(spec: ToolSpec, fmt: SchemaFormat, aliases: tuple[str, ...]) -> tool_pb2.ToolSpec:
    declaration = schemas.declaration(spec.name, spec.description, spec.parameters, fmt)
    return tool_pb2.ToolSpec(
        name=spec.name,
        group=spec.group,
        description=spec.description,
        parameters_json_schema=json.dumps(spec.parameters),
        profiles=list(spec.profiles),
        declaration_json=json.dumps(declaration),
        aliases=list(aliases),
    )


def interact_from_pb(start: tool_pb2.InteractStart) -> InteractRequest:
    return InteractRequest(
        sandbox_key=start.sandbox_key,
        context=context_from_pb(start.context),
        process_id=start.process_id,
        command=start.command,
        workdir=start.workdir,
        env=tuple(sorted(start.env.items())),
        name=start.name,
        pty=start.pty,
        cols=start.window.cols,
        rows=start.window.rows,
        offset=start.offset,
        keep_running=start.keep_running,
        request_id=bounded("request_id", start.request_id),
    )


async def interact_inputs(
    request_iterator: AsyncIterator[tool_pb2.InteractInput],
) -> AsyncIterator[InteractInput]:
    """The caller's messages after the first, as domain inputs."""
    async for message in request_iterator:
        kind = message.WhichOneof("input")
        if kind == "data":
            yield StdinInput(bytes(message.data))
        elif kind == "eof":
            if message.eof:
                yield EofInput()
        elif kind == "resize":
            yield ResizeInput(message.resize.cols, message.resize.rows)
        elif kind == "signal":
            yield SignalInput(message.signal)
        elif kind == "start":
            raise errors.InvalidRequest("only the first message of an Interact call is 'start'")
        else:
            raise errors.InvalidRequest("an Interact message with no input")


NAMED_FRONTS = frozenset({"mcp-stdio"})
"""The fronts a gRPC caller may name for its calls' audit records (CallToolRequest.front):
`stockade mcp`, the MCP stdio bridge. Only the audit reads a call's front."""


def front_from_pb(front: str) -> str:
    """ "grpc" for "", else one of NAMED_FRONTS; InvalidRequest for anything else (a caller
    cannot pass itself off as the MCP endpoint, or write what it likes in the audit)."""
    if not front:
        return "grpc"
    if front not in NAMED_FRONTS:
        raise errors.InvalidRequest(
            f"front must be empty or one of {', '.join(sorted(NAMED_FRONTS))}, got {front[:64]!r}"
        )
    return front


def call_from_pb(request: tool_pb2.CallToolRequest, traceparent: str = "") -> ToolCall:
    return ToolCall(
        sandbox_key=scoped(request.sandbox_key),
        tool=request.tool,
        arguments_json=request.arguments_json,
        context=context_from_pb(request.context),
        timeout_ms=request.timeout_ms,
        request_id=bounded("request_id", request.request_id),
        traceparent=traceparent,
        front=front_from_pb(request.front),
    )


def traceparent_of(context: Context) -> str:
    """The caller's W3C trace context from the call's metadata ("" when absent or too long
    to be one: it only names a parent span, it is never trusted for anything else)."""
    for name, value in context.invocation_metadata() or ():
        if name == "traceparent" and isinstance(value, str) and len(value) <= MAX_TRACEPARENT:
            return value
    return ""


_STREAMS = {"stdout": tool_pb2.OUTPUT_STREAM_STDOUT, "stderr": tool_pb2.OUTPUT_STREAM_STDERR}


def tool_event_to_pb(event: ToolEvent) -> tool_pb2.ToolEvent:
    if isinstance(event, StartedEvent):
        started = tool_pb2.ToolStarted(pid=event.pid, process_id=event.process_id)
        return tool_pb2.ToolEvent(started=started)
    if isinstance(event, OutputEvent):
        chunk = tool_pb2.OutputChunk(stream=_STREAMS[event.stream], text=wire_text(event.text))
        return tool_pb2.ToolEvent(output=chunk)
    if isinstance(event, ApprovalPendingEvent):
        pending = tool_pb2.ApprovalPending(approval_id=event.approval_id, reason=event.reason)
        return tool_pb2.ToolEvent(approval_pending=pending)
    return tool_pb2.ToolEvent(result=result_to_pb(event.result))


_DECISIONS = {
    approval_pb2.APPROVAL_DECISION_ALLOW_ONCE: "allow-once",
    approval_pb2.APPROVAL_DECISION_ALLOW_ALWAYS: "allow-always",
    approval_pb2.APPROVAL_DECISION_DENY: "deny",
}


def decision_from_pb(value: approval_pb2.ApprovalDecision) -> str:
    """The approver's decision; InvalidRequest for none or an unknown one."""
    decision = _DECISIONS.get(value)
    if decision is None:
        raise errors.InvalidRequest("decision must be ALLOW_ONCE, ALLOW_ALWAYS or DENY")
    return decision


def pending_to_pb(p: Pending, scrubber: Scrubber | None = None) -> approval_pb2.ApprovalRequest:
    """An approval request as the approver sees it: a credential in the command is shown as
    `[REDACTED]` (the approver is a client like any other)."""
    return approval_pb2.ApprovalRequest(
        id=p.id,
        sandbox_key=shown(p.sandbox_key),
        agent_id=p.agent_id,
        tool=p.tool,
        command=scrubbed(p.command, scrubber),
        reason=scrubbed(p.reason, scrubber),
        created_at=_timestamp(p.created_at),
        expires_at=_timestamp(p.expires_at),
        request_id=p.request_id,
        diff=wire_text(scrubbed(p.diff, scrubber)),
    )


def event_to_pb(
    event: Pending | Closed, scrubber: Scrubber | None = None
) -> approval_pb2.ApprovalEvent:
    if isinstance(event, Pending):
        return approval_pb2.ApprovalEvent(pending=pending_to_pb(event, scrubber))
    closed = approval_pb2.ApprovalClosed(
        id=event.id, outcome=event.outcome, approver=event.approver
    )
    return approval_pb2.ApprovalEvent(closed=closed)


def info_to_pb(info: TransferInfo) -> file_pb2.FileInfo:
    return file_pb2.FileInfo(
        path=wire_text(info.path),
        size=info.size,
        sha256=info.sha256,
        tar=info.tar,
        files=info.files,
        redactions=info.redactions,
    )


_AUDIT_FIELDS = tuple(f.name for f in dataclasses.fields(AuditRecord) if f.name != "time")


def audit_to_pb(rec: AuditRecord) -> audit_pb2.AuditRecord:
    """Field by field: dataclasses.asdict deep-copies, and took most of a 10,000-record reply."""
    values: dict[str, Any] = {}
    for name in _AUDIT_FIELDS:
        value = getattr(rec, name)
        values[name] = wire_text(value) if isinstance(value, str) else value
    values["time"] = _timestamp(datetime.fromtimestamp(rec.time, UTC))
    return audit_pb2.AuditRecord(**values)
