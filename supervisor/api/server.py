"""The gRPC edge: servicers translate protobuf to domain objects and back; one table maps
domain errors to status codes. Nothing below this module sees protobuf."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from stockade.supervisor import errors
from stockade.supervisor.api.auth import Authenticator
from stockade.supervisor.api.interceptor import AuthInterceptor, current_tenant
from stockade.supervisor.calls import schemas
from stockade.supervisor.calls.catalog import ALIASES, ToolSpec
from stockade.supervisor.calls.interact import Interaction
from stockade.supervisor.calls.pipeline import HostPolicy, ToolPipeline
from stockade.supervisor.calls.render import wire_json, wire_text
from stockade.supervisor.calls.schemas import SchemaFormat
from stockade.supervisor.calls.transfers import FileTransfers, Transfer, TransferInfo
from stockade.supervisor.config import AuthConfig, Config
from stockade.supervisor.keys import scope, shown, split
from stockade.supervisor.models import (
    ApprovalPendingEvent,
    CallContext,
    EofInput,
    InteractInput,
    InteractRequest,
    NetworkRequest,
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
from stockade.supervisor.observe.audit import AuditLog, AuditQuery, AuditRecord
from stockade.supervisor.observe.telemetry import Observer
from stockade.supervisor.policy.approvals import ApprovalManager, Closed, Pending
from stockade.supervisor.policy.scrub import Scrubber
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.v1 import (
    approval_pb2,
    approval_pb2_grpc,
    audit_pb2,
    audit_pb2_grpc,
    file_pb2,
    file_pb2_grpc,
    sandbox_pb2,
    sandbox_pb2_grpc,
    tool_pb2,
    tool_pb2_grpc,
)

log = logging.getLogger("stockade.server")
REASON_KEY = "stockade-error-reason"
_STATUS = {
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.QuotaExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.ApproverBehind: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.PolicyDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.EngineUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.HostExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.SandboxBroken: grpc.StatusCode.UNAVAILABLE,
    errors.SandboxLost: grpc.StatusCode.UNAVAILABLE,
    errors.ConfigError: grpc.StatusCode.FAILED_PRECONDITION,
}
SERVICES = (
    "stockade.v1.SandboxService",
    "stockade.v1.ToolService",
    "stockade.v1.ApprovalService",
    "stockade.v1.AuditService",
    "stockade.v1.FileService",
    "grpc.health.v1.Health",
)

R = TypeVar("R")
Handler = Callable[[Any, Any, Any], Awaitable[R]]


def status_for(exc: errors.StockadeError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return grpc.StatusCode.INTERNAL


async def _abort(context: Any, exc: Exception, where: str, scrubber: Scrubber | None) -> None:
    """End the RPC with the status for `exc` (its message scrubbed) and a stable reason in
    trailing metadata; a bug shows as INTERNAL, never as a Python class path."""
    if isinstance(exc, errors.StockadeError):
        message = str(exc) if scrubber is None else scrubber.scrub(str(exc))[0]
        context.set_trailing_metadata(((REASON_KEY, exc.reason),))
        await context.abort(status_for(exc), message)
    log.error("internal error in %s", where, exc_info=exc)
    context.set_trailing_metadata(((REASON_KEY, "INTERNAL"),))
    await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the supervisor log")


def _scrubber_of(servicer: Any) -> Scrubber | None:
    """The scrubber a servicer was given (`scrubber`), for its error messages."""
    return getattr(servicer, "scrubber", None)


def mapped(handler: Handler[R]) -> Handler[R]:
    """Turn domain errors into gRPC statuses (unary handlers)."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: Any) -> R:
        try:
            return await handler(self, request, context)
        except Exception as exc:
            await _abort(context, exc, handler.__name__, _scrubber_of(self))
        raise AssertionError("unreachable")

    return wrapper


def mapped_stream(
    handler: Callable[[Any, Any, Any], AsyncIterator[Any]],
) -> Callable[[Any, Any, Any], AsyncIterator[Any]]:
    """mapped() for server-streaming handlers."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            async for item in handler(self, request, context):
                yield item
        except Exception as exc:
            await _abort(context, exc, handler.__name__, _scrubber_of(self))

    return wrapper


def _timestamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def sandbox_to_pb(info: SandboxInfo) -> Any:
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
    )


def result_to_pb(result: ToolResult) -> Any:
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


def context_from_pb(ctx: Any) -> CallContext:
    return CallContext(
        agent_id=bounded("context.agent_id", ctx.agent_id),
        provider=bounded("context.provider", ctx.provider),
        channel=bounded("context.channel", ctx.channel),
        chat_id=bounded("context.chat_id", ctx.chat_id),
        peer_kind=bounded("context.peer_kind", ctx.peer_kind),
        subagent_depth=ctx.subagent_depth,
    )


class SandboxServicer(sandbox_pb2_grpc.SandboxServiceServicer):
    def __init__(self, sandboxes: SandboxManager, scrubber: Scrubber | None = None) -> None:
        self._sandboxes = sandboxes
        self.scrubber = scrubber

    @mapped
    async def EnsureSandbox(self, request: Any, context: Any) -> Any:
        network = None
        if request.HasField("network"):
            network = NetworkRequest(request.network.mode, tuple(request.network.allow))
        key = scoped(request.key)
        await self._sandboxes.ensure(key, network)
        return sandbox_to_pb(await self._sandboxes.get(key))

    @mapped
    async def GetSandbox(self, request: Any, context: Any) -> Any:
        return sandbox_to_pb(await self._sandboxes.get(scoped(request.key)))

    @mapped
    async def ListSandboxes(self, request: Any, context: Any) -> Any:
        tenant = current_tenant()
        infos = [i for i in await self._sandboxes.list() if split(i.key)[0] == tenant]
        return sandbox_pb2.ListSandboxesResponse(sandboxes=[sandbox_to_pb(i) for i in infos])

    @mapped
    async def DestroySandbox(self, request: Any, context: Any) -> Any:
        removed, deleted = await self._sandboxes.destroy(
            scoped(request.key), delete_workspace=request.delete_workspace
        )
        return sandbox_pb2.DestroySandboxResponse(removed=removed, workspace_deleted=deleted)

    @mapped
    async def InspectIsolation(self, request: Any, context: Any) -> Any:
        report = await self._sandboxes.inspect_isolation(scoped(request.key))
        report = dataclasses.replace(report, key=shown(report.key))
        return fill_pb(sandbox_pb2.IsolationReport(), report)


def scoped(key: str) -> str:
    """The caller's key within its tenant (see keys.scope): every key a request names
    passes here, so no tenant reaches another's sandboxes."""
    return scope(current_tenant(), key)


def fill_pb(message: Any, obj: Any) -> Any:
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


def tool_to_pb(spec: ToolSpec, fmt: SchemaFormat, aliases: tuple[str, ...]) -> Any:
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


class ToolServicer(tool_pb2_grpc.ToolServiceServicer):
    def __init__(
        self, pipeline: ToolPipeline, policy: HostPolicy, interaction: Interaction
    ) -> None:
        self._pipeline = pipeline
        self._policy = policy
        self._interaction = interaction
        self.scrubber = policy.scrubber

    @mapped
    async def ListTools(self, request: Any, context: Any) -> Any:
        fmt = _FORMATS.get(request.format)
        if fmt is None:
            raise errors.InvalidRequest(f"unknown schema format {request.format}")
        catalog = self._policy.catalog
        allowed = self._policy.tools.allowed_tools(context_from_pb(request.context))
        specs = [tool_to_pb(t, fmt, catalog.aliases_of(t.name)) for t in allowed]
        return tool_pb2.ListToolsResponse(tools=specs)

    @mapped
    async def CallTool(self, request: Any, context: Any) -> Any:
        call = call_from_pb(request, traceparent_of(context))
        result = await self._pipeline.call(call, caller=context.peer())
        return result_to_pb(result)

    @mapped_stream
    async def CallToolStream(self, request: Any, context: Any) -> AsyncIterator[Any]:
        call = call_from_pb(request, traceparent_of(context))
        stream = self._pipeline.call_stream(call, caller=context.peer())
        async for event in stream:
            yield tool_event_to_pb(event)

    @mapped_stream
    async def Interact(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("input") != "start":
            raise errors.InvalidRequest("an Interact call starts with a 'start' message")
        request = interact_from_pb(first.start)
        request = dataclasses.replace(request, sandbox_key=scoped(request.sandbox_key))
        events = self._interaction.run(
            request, interact_inputs(request_iterator), caller=context.peer()
        )
        async for event in events:
            yield tool_event_to_pb(event)


def interact_from_pb(start: Any) -> InteractRequest:
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


async def interact_inputs(request_iterator: Any) -> AsyncIterator[InteractInput]:
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


def call_from_pb(request: Any, traceparent: str = "") -> ToolCall:
    return ToolCall(
        sandbox_key=scoped(request.sandbox_key),
        tool=request.tool,
        arguments_json=request.arguments_json,
        context=context_from_pb(request.context),
        timeout_ms=request.timeout_ms,
        request_id=bounded("request_id", request.request_id),
        traceparent=traceparent,
    )


MAX_TRACEPARENT = 128


def traceparent_of(context: Any) -> str:
    """The caller's W3C trace context from the call's metadata ("" when absent or too long
    to be one: it only names a parent span, it is never trusted for anything else)."""
    for name, value in context.invocation_metadata() or ():
        if name == "traceparent" and isinstance(value, str) and len(value) <= MAX_TRACEPARENT:
            return value
    return ""


_STREAMS = {"stdout": tool_pb2.OUTPUT_STREAM_STDOUT, "stderr": tool_pb2.OUTPUT_STREAM_STDERR}


def tool_event_to_pb(event: ToolEvent) -> Any:
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


def _scrubbed(text: str, scrubber: Scrubber | None) -> str:
    return wire_text(text if scrubber is None else scrubber.scrub(text)[0])


def pending_to_pb(p: Pending, scrubber: Scrubber | None = None) -> Any:
    """An approval request as the approver sees it: a credential in the command is shown as
    `[REDACTED]` (the approver is a client like any other)."""
    return approval_pb2.ApprovalRequest(
        id=p.id,
        sandbox_key=shown(p.sandbox_key),
        agent_id=p.agent_id,
        tool=p.tool,
        command=_scrubbed(p.command, scrubber),
        reason=_scrubbed(p.reason, scrubber),
        created_at=_timestamp(p.created_at),
        expires_at=_timestamp(p.expires_at),
        request_id=p.request_id,
    )


def event_to_pb(event: Pending | Closed, scrubber: Scrubber | None = None) -> Any:
    if isinstance(event, Pending):
        return approval_pb2.ApprovalEvent(pending=pending_to_pb(event, scrubber))
    closed = approval_pb2.ApprovalClosed(
        id=event.id, outcome=event.outcome, approver=event.approver
    )
    return approval_pb2.ApprovalEvent(closed=closed)


class ApprovalServicer(approval_pb2_grpc.ApprovalServiceServicer):
    def __init__(self, approvals: ApprovalManager, scrubber: Scrubber | None = None) -> None:
        self._approvals = approvals
        self.scrubber = scrubber

    @mapped_stream
    async def WatchApprovals(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for event in self._approvals.watch(current_tenant()):
            yield event_to_pb(event, self.scrubber)

    @mapped
    async def ResolveApproval(self, request: Any, context: Any) -> Any:
        decision = _DECISIONS.get(request.decision)
        if decision is None:
            raise errors.InvalidRequest("decision must be ALLOW_ONCE, ALLOW_ALWAYS or DENY")
        approver = bounded("approver", request.approver) or context.peer()
        self._approvals.resolve(request.id, decision, approver, tenant=current_tenant())
        return approval_pb2.ResolveApprovalResponse()

    @mapped
    async def ListApprovals(self, request: Any, context: Any) -> Any:
        tenant = current_tenant()
        return approval_pb2.ListApprovalsResponse(
            pending=[pending_to_pb(p, self.scrubber) for p in self._approvals.pending(tenant)],
            always_allowed=[
                _scrubbed(c, self.scrubber) for c in self._approvals.always_allowed(tenant)
            ],
            approvers=self._approvals.watchers_of(tenant),
        )


class FileServicer(file_pb2_grpc.FileServiceServicer):
    def __init__(self, transfers: FileTransfers, scrubber: Scrubber | None = None) -> None:
        self._transfers = transfers
        self.scrubber = scrubber

    @mapped
    async def UploadFile(self, request_iterator: Any, context: Any) -> Any:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("part") != "header":
            raise errors.InvalidRequest("an upload starts with a FileChunk carrying the header")
        h = first.header
        transfer = Transfer(
            scoped(h.sandbox_key), h.path, h.tar, context_from_pb(h.context), context.peer(), h.mode
        )

        async def chunks() -> AsyncIterator[bytes]:
            async for chunk in request_iterator:
                if chunk.WhichOneof("part") != "data":
                    raise errors.InvalidRequest("after the header an upload carries only data")
                yield chunk.data

        return info_to_pb(await self._transfers.upload(transfer, chunks()))

    @mapped_stream
    async def DownloadFile(self, request: Any, context: Any) -> AsyncIterator[Any]:
        key, context_ = scoped(request.sandbox_key), context_from_pb(request.context)
        transfer = Transfer(key, request.path, request.tar, context_, context.peer())
        async for item in self._transfers.download(transfer):
            if isinstance(item, bytes):
                yield file_pb2.FileChunk(data=item)
            else:
                yield file_pb2.FileChunk(info=info_to_pb(item))


def info_to_pb(info: TransferInfo) -> Any:
    return file_pb2.FileInfo(
        path=wire_text(info.path),
        size=info.size,
        sha256=info.sha256,
        tar=info.tar,
        files=info.files,
        redactions=info.redactions,
    )


_AUDIT_FIELDS = tuple(f.name for f in dataclasses.fields(AuditRecord) if f.name != "time")


def audit_to_pb(rec: AuditRecord) -> Any:
    """Field by field: dataclasses.asdict deep-copies, and took most of a 10,000-record reply."""
    values: dict[str, Any] = {}
    for name in _AUDIT_FIELDS:
        value = getattr(rec, name)
        values[name] = wire_text(value) if isinstance(value, str) else value
    values["time"] = _timestamp(datetime.fromtimestamp(rec.time, UTC))
    return audit_pb2.AuditRecord(**values)


class AuditServicer(audit_pb2_grpc.AuditServiceServicer):
    def __init__(self, audit: AuditLog | None, scrubber: Scrubber | None = None) -> None:
        self._audit = audit
        self.scrubber = scrubber

    @mapped
    async def ListAudit(self, request: Any, context: Any) -> Any:
        if self._audit is None:
            raise errors.ConfigError("the audit log is off (audit.enabled = false)")
        since = request.since.seconds + request.since.nanos / 1e9  # any value: no datetime
        tenant = current_tenant()
        query = AuditQuery(
            tenant=tenant,
            sandbox_key=shown(scope(tenant, request.sandbox_key)) if request.sandbox_key else "",
            tool=ALIASES.get(request.tool, request.tool),  # records hold the tool's own name
            agent_id=request.agent_id,
            since=since,
            limit=request.limit or 100,
            errors_only=request.errors_only,
        )
        records = await self._audit.query(query)
        return audit_pb2.ListAuditResponse(records=[audit_to_pb(r) for r in records])


def _add_port(server: Any, auth: AuthConfig, listen: str) -> int:
    """Bind `listen`: TLS when a certificate is configured, requiring a client certificate
    signed by client_ca when one is set (gRPC can only require it or not ask)."""
    if not auth.tls_cert:
        return int(server.add_insecure_port(listen))
    try:
        chain, key = Path(auth.tls_cert).read_bytes(), Path(auth.tls_key).read_bytes()
        ca = Path(auth.client_ca).read_bytes() if auth.client_ca else None
    except OSError as exc:
        raise errors.ConfigError(f"auth: cannot read a TLS file: {exc}") from exc
    credentials = grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=ca, require_client_auth=ca is not None
    )
    return int(server.add_secure_port(listen, credentials))


class Drain(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Graceful shutdown at the edge: once draining, every new call except health checks and
    reflection gets UNAVAILABLE; calls in flight are counted so that stop() can wait for
    them. An approver's watch stream is not counted (it would hold the drain open to its
    end) but stays open until the server stops, so a call in flight can still be approved."""

    _EXEMPT = ("/grpc.health.v1.Health/", "/grpc.reflection.")
    _UNCOUNTED = ("/stockade.v1.ApprovalService/WatchApprovals",)

    def __init__(self) -> None:
        self.draining = False
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or details.method.startswith(self._EXEMPT):
            return handler
        counted = details.method not in self._UNCOUNTED
        kinds = {
            "unary_unary": (grpc.unary_unary_rpc_method_handler, self._unary),
            "stream_unary": (grpc.stream_unary_rpc_method_handler, self._unary),
            "unary_stream": (grpc.unary_stream_rpc_method_handler, self._stream),
            "stream_stream": (grpc.stream_stream_rpc_method_handler, self._stream),
        }
        for attribute, (make, wrap) in kinds.items():
            behavior = getattr(handler, attribute)
            if behavior is not None:
                return make(
                    wrap(behavior, counted),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler

    def _unary(self, behavior: Any, counted: bool) -> Any:
        async def run(request: Any, context: Any) -> Any:
            await self._admit(context)
            with self._counting(counted):
                return await behavior(request, context)

        return run

    def _stream(self, behavior: Any, counted: bool) -> Any:
        async def run(request: Any, context: Any) -> AsyncIterator[Any]:
            await self._admit(context)
            with self._counting(counted):
                async for item in behavior(request, context):
                    yield item

        return run

    async def _admit(self, context: Any) -> None:
        if self.draining:
            context.set_trailing_metadata(((REASON_KEY, "SHUTTING_DOWN"),))
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                "the supervisor is shutting down; retry when it has started again",
            )

    @contextlib.contextmanager
    def _counting(self, counted: bool) -> Iterator[None]:
        if not counted:
            yield
            return
        self._active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the counted calls to end; whether they all did."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True


FLUSH_S = 1.0
"""After the drain: time for replies just produced to reach their callers."""


class Server:
    """The running gRPC server; `port` is the bound TCP port (0 for a unix socket)."""

    def __init__(
        self,
        config: Config,
        sandboxes: SandboxManager,
        policy: HostPolicy,
        authenticator: Authenticator | None = None,
        observers: tuple[Observer, ...] = (),
    ) -> None:
        self.config = config
        self.sandboxes = sandboxes
        self.policy = policy
        self.health = HealthServicer()
        self._drain = Drain()
        self._server = grpc.aio.server(
            interceptors=[self._drain, AuthInterceptor(authenticator)],
            options=[
                ("grpc.max_receive_message_length", config.max_request_bytes),
                ("grpc.max_send_message_length", config.max_response_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        pipeline = ToolPipeline(config, sandboxes, policy, observers)
        server = self._server
        sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(
            SandboxServicer(sandboxes, policy.scrubber), server
        )
        interaction = Interaction(pipeline, sandboxes, policy.scrubber)
        tool_pb2_grpc.add_ToolServiceServicer_to_server(
            ToolServicer(pipeline, policy, interaction), server
        )
        approval_pb2_grpc.add_ApprovalServiceServicer_to_server(
            ApprovalServicer(policy.approvals, policy.scrubber), server
        )
        audit_pb2_grpc.add_AuditServiceServicer_to_server(
            AuditServicer(policy.audit, policy.scrubber), server
        )
        transfers = FileTransfers(config, sandboxes, policy)
        file_pb2_grpc.add_FileServiceServicer_to_server(
            FileServicer(transfers, policy.scrubber), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection((*SERVICES, reflection.SERVICE_NAME), self._server)
        self.port = _add_port(self._server, config.auth, config.listen)
        if self.port == 0 and not config.listen.startswith("unix:"):
            raise errors.ConfigError(f"cannot listen on {config.listen}")

    async def start(self) -> None:
        await self._server.start()
        for name in ("", *SERVICES[:-1]):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def wait(self) -> None:
        await self._server.wait_for_termination()

    async def stop(self, grace: float = 5.0) -> None:
        """Graceful: health goes NOT_SERVING and new calls get UNAVAILABLE at once, calls in
        flight get `grace` seconds to finish; then the server stops (ending what is left)
        and the sandbox manager closes (containers keep running for the next start)."""
        self._drain.draining = True
        await self.health.enter_graceful_shutdown()
        if not await self._drain.wait_idle(grace):
            log.warning("shutdown: calls still in flight after %g s are ended", grace)
        await self._server.stop(FLUSH_S)
        await self.sandboxes.close()
        if self.policy.audit is not None:
            await asyncio.to_thread(self.policy.audit.close)
