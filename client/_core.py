"""What the sync and asyncio clients share: result types, protobuf conversion, the
status-code-to-exception table, channel options and request building."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import grpc

from stockade.v1 import (
    approval_pb2,
    approval_pb2_grpc,
    audit_pb2,
    audit_pb2_grpc,
    file_pb2,
    file_pb2_grpc,
    quarantine_pb2_grpc,
    sandbox_pb2,
    sandbox_pb2_grpc,
    tool_pb2,
    tool_pb2_grpc,
)

DEFAULT_TARGET = "127.0.0.1:50051"
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


def default_target() -> str:
    return os.environ.get("STOCKADE_ADDR") or DEFAULT_TARGET


class StockadeError(Exception):
    """Root of the client's errors. `code` is the gRPC status name, `reason` the server's
    stable reason string (empty when the server gave none)."""

    def __init__(self, message: str, *, code: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class InvalidArgument(StockadeError):
    """The request was wrong (e.g. a malformed key)."""


class NotFound(StockadeError):
    """No such sandbox, snapshot, approval or process (another tenant's is not found either)."""


class Unavailable(StockadeError):
    """The supervisor, its engine or the sandbox cannot work right now."""


class ResourceExhausted(StockadeError):
    """A size or rate limit was hit (e.g. a message larger than the server accepts, or a
    tenant's sandbox, memory or snapshot quota)."""


class AlreadyExists(StockadeError):
    """A new name or key that is taken (a snapshot's name; a fork's new key that has a
    container or a workspace)."""


class PermissionDenied(StockadeError):
    """Policy forbids it (e.g. a file transfer, or a snapshot operation the tenant may not
    do: [snapshots] operations)."""


class Unimplemented(StockadeError):
    """The server cannot do it on this host (reason MEMORY_CHECKPOINT_UNAVAILABLE: a
    snapshot with process memory, which needs CRIU), or does not know the call at all (an
    older supervisor)."""


class FailedPrecondition(StockadeError):
    """The sandbox's state does not allow the request (reason SANDBOX_PAUSED: a call to a
    paused sandbox on a supervisor that refuses those; SANDBOX_STATE_CONFLICT: pausing a
    sandbox whose container exited; SANDBOX_QUARANTINED: a call to a quarantined sandbox)."""


class DeadlineExceeded(StockadeError):
    """The client's own deadline passed."""


class Unauthenticated(StockadeError):
    """No credentials, or wrong ones (see the `token` and `tls` arguments of the client)."""


@dataclass(frozen=True)
class TLS:
    """TLS for the connection; file contents (PEM), not paths. `ca`: the CA that signed the
    server's certificate (None: the system's roots); `cert` and `key`: this client's
    certificate for mutual TLS; `server_name`: the name to check the server's certificate
    against when it differs from the target's host."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    server_name: str = ""

    @classmethod
    def from_files(
        cls,
        ca: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        server_name: str = "",
    ) -> TLS:
        def read(path: str | None) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return cls(read(ca), read(cert), read(key), server_name)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.ca, self.key, self.cert)

    def options(self) -> list[tuple[str, Any]]:
        override = [("grpc.ssl_target_name_override", self.server_name)]
        return [*CHANNEL_OPTIONS, *(override if self.server_name else [])]


def default_token() -> str | None:
    return os.environ.get("STOCKADE_TOKEN") or None


def bearer(token: str) -> tuple[str, str]:
    """The metadata entry that carries a token."""
    if not token or any(c in token for c in "\r\n"):
        raise InvalidArgument("a token must be one non-empty line")
    return ("authorization", f"Bearer {token}")


class Authorized:
    """A stub whose every call carries `authorization: Bearer TOKEN` as call metadata: the
    same for sync and asyncio stubs, and for a channel the caller passed in."""

    def __init__(self, stub: Any, token: str | None) -> None:
        self._stub = stub
        self._metadata = (bearer(token),) if token else None

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        if self._metadata is None:
            return method
        return functools.partial(method, metadata=self._metadata)


@dataclass(frozen=True)
class Stubs:
    """The services' stubs on one channel, each carrying the token."""

    sandboxes: Authorized
    tools: Authorized
    approvals: Authorized
    audit: Authorized
    files: Authorized
    quarantine: Authorized


def stubs(channel: grpc.Channel | grpc.aio.Channel, token: str | None) -> Stubs:
    """Stubs for a sync or asyncio channel (the generated stubs serve both); token None:
    $STOCKADE_TOKEN, if set."""
    token = token or default_token()
    return Stubs(
        Authorized(sandbox_pb2_grpc.SandboxServiceStub(channel), token),
        Authorized(tool_pb2_grpc.ToolServiceStub(channel), token),
        Authorized(approval_pb2_grpc.ApprovalServiceStub(channel), token),
        Authorized(audit_pb2_grpc.AuditServiceStub(channel), token),
        Authorized(file_pb2_grpc.FileServiceStub(channel), token),
        Authorized(quarantine_pb2_grpc.QuarantineServiceStub(channel), token),
    )


def sync_channel(target: str, tls: TLS | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(target, CHANNEL_OPTIONS)
    return grpc.secure_channel(target, tls.credentials(), tls.options())


def aio_channel(target: str, tls: TLS | None) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(target, CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(target, tls.credentials(), tls.options())


class ToolError(StockadeError):
    """A convenience method's tool call returned is_error; the result is attached."""

    def __init__(self, result: ToolResult) -> None:
        super().__init__(
            f"{result.error_code}: {result.error_message}", code="OK", reason=result.error_code
        )
        self.result = result


_BY_STATUS: dict[grpc.StatusCode, type[StockadeError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
}


def error_from_rpc(exc: grpc.RpcError) -> StockadeError:
    """The most specific client error for a failed RPC."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    # (key, value) pairs: a tuple from sync stubs, grpc.aio.Metadata from asyncio ones (which
    # dict() cannot take in every grpcio release: its keys() gave the pairs before 1.80)
    reason = next((v for k, v in (trailers or ()) if k == "stockade-error-reason"), "")
    cls = _BY_STATUS.get(code, StockadeError)
    return cls(f"{code.name}: {details}", code=code.name, reason=str(reason))


@dataclass(frozen=True)
class ToolResult:
    for_llm: str
    for_user: str
    is_error: bool
    error_code: str
    """Short name, e.g. "TIMEOUT"; empty on success."""
    error_message: str
    data: dict[str, Any] = field(default_factory=dict)
    duration_ms: int = 0
    truncated: bool = False
    redactions: int = 0
    request_id: str = ""

    @property
    def stdout(self) -> str:
        return str(self.data.get("stdout", ""))

    @property
    def stderr(self) -> str:
        return str(self.data.get("stderr", ""))

    @property
    def exit_code(self) -> int | None:
        code = self.data.get("exit_code")
        return code if isinstance(code, int) else None

    def to_dict(self) -> dict[str, Any]:
        """The result with the protobuf field names (error_code as the enum's name)."""
        return {
            "for_llm": self.for_llm,
            "for_user": self.for_user,
            "is_error": self.is_error,
            "error_code": f"TOOL_ERROR_CODE_{self.error_code or 'UNSPECIFIED'}",
            "error_message": self.error_message,
            "data_json": json.dumps(self.data, ensure_ascii=False) if self.data else "",
            "duration_ms": self.duration_ms,
            "truncated": self.truncated,
            "redactions": self.redactions,
            "request_id": self.request_id,
        }


@dataclass(frozen=True)
class Started:
    """A streamed call's command started (pid inside the sandbox); for Interact also the
    process tool's id of the process (p1, ...)."""

    pid: int
    process_id: str = ""


@dataclass(frozen=True)
class Output:
    """A chunk of a streamed call's output, already scrubbed."""

    stream: str
    """"stdout" or "stderr"."""
    text: str


@dataclass(frozen=True)
class ApprovalPending:
    """A streamed call waits for a human's decision."""

    approval_id: str
    reason: str


StreamEvent = Started | Output | ApprovalPending | ToolResult
"""What a streamed call yields; the ToolResult comes last."""


@dataclass(frozen=True)
class FileInfo:
    """A finished transfer: what was written (upload) or sent (download)."""

    path: str
    size: int
    sha256: str
    tar: bool
    files: int
    """With tar: entries unpacked or packed."""
    redactions: int
    """Downloads: credentials the supervisor replaced (the bytes then differ from the file)."""


@dataclass(frozen=True)
class ShellSession:
    """A shell session of a sandbox (exec's `session`)."""

    name: str
    cwd: str
    """The folder its next call starts in."""
    calls: int
    busy: bool
    """A call runs in it now."""


def sessions_from_pb(reply: Any) -> list[ShellSession]:
    return [ShellSession(s.name, s.cwd, s.calls, s.busy) for s in reply.sessions]


@dataclass(frozen=True)
class SandboxInfo:
    key: str
    container_id: str
    container_name: str
    engine: str
    image: str
    state: str
    """RUNNING, PAUSED, EXITED, BROKEN (recreated on the next call) or ABSENT."""
    created_at: datetime | None
    last_used_at: datetime | None
    workspace_path: str
    network_mode: str = ""
    """none, egress or open."""
    network_allow: tuple[str, ...] = ()
    """egress: the domain patterns the sandbox may reach."""
    trouble: str = ""
    """BROKEN: why it cannot serve calls ("kind: detail"); the next call re-creates it."""
    heals: int = 0
    """Times its container was re-created because it could not serve calls."""
    last_heal_reason: str = ""
    """The last such re-creation's "kind: detail"."""
    last_healed_at: datetime | None = None
    paused_at: datetime | None = None
    """PAUSED: since when."""
    profile: str = ""
    """The sandbox profile its container was made with ("base": the supervisor's defaults)."""
    cpus: float = 0.0
    memory_mb: int = 0
    quarantined_at: datetime | None = None
    """Set while the sandbox is quarantined (its calls refused; see get_quarantine)."""


@dataclass(frozen=True)
class IsolationReport:
    """A sandbox's effective isolation (SandboxService.InspectIsolation), as a dict with the
    .proto's field names: `inside` (uid/gid, capabilities, no_new_privs, seccomp, root,
    mounts, cgroup limits, interfaces, routes), `outside` (the engine's inspect), `namespaces`
    (private or shared with the host) and `runtime` (version, package, CVE verdicts)."""

    data: dict[str, Any]

    @property
    def key(self) -> str:
        return str(self.data["key"])

    @property
    def engine(self) -> str:
        return str(self.data["engine"])

    @property
    def inside(self) -> dict[str, Any]:
        return dict(self.data["inside"])

    @property
    def outside(self) -> dict[str, Any]:
        return dict(self.data["outside"])

    @property
    def namespaces(self) -> list[dict[str, Any]]:
        return list(self.data["namespaces"])

    @property
    def runtime(self) -> dict[str, Any]:
        return dict(self.data["runtime"])

    def to_dict(self) -> dict[str, Any]:
        return self.data


@dataclass(frozen=True)
class ToolSpec:
    name: str
    group: str
    description: str
    parameters: dict[str, Any]
    profiles: tuple[str, ...]
    declaration: dict[str, Any] = field(default_factory=dict)
    """The tool in the requested provider format, ready for a model request."""
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class CallContext:
    """Who is calling: host-side policy decides with it."""

    agent_id: str = ""
    provider: str = ""
    channel: str = ""
    chat_id: str = ""
    peer_kind: str = ""
    subagent_depth: int = 0


@dataclass(frozen=True)
class ApprovalRequest:
    id: str
    sandbox_key: str
    agent_id: str
    tool: str
    command: str
    reason: str
    created_at: datetime | None
    expires_at: datetime | None
    request_id: str
    diff: str = ""
    """For a file change: what it will change (a unified diff, scrubbed, at most 64 KiB)."""


@dataclass(frozen=True)
class ApprovalClosed:
    id: str
    outcome: str
    """allow-once, allow-always, deny, timeout or withdrawn."""
    approver: str


@dataclass(frozen=True)
class Approvals:
    pending: list[ApprovalRequest]
    always_allowed: list[str]
    """Commands approved with allow-always."""
    approvers: int
    """Approvers watching right now."""


@dataclass(frozen=True)
class AuditRecord:
    id: int
    time: datetime | None
    request_id: str
    caller: str
    sandbox_key: str
    agent_id: str
    provider: str
    tool: str
    arguments_json: str
    policy_step: str
    guard_rule: str
    approval: str
    approver: str
    duration_ms: int
    exit_code: int
    output_bytes: int
    redactions: int
    error_code: str
    is_error: bool
    tenant: str = ""
    front: str = ""
    context_json: str = ""
    prev_hash: str = ""
    """The hash chain: the previous record's hash and this one's (docs/audit.md)."""
    hash: str = ""
    checkpoint: str = ""
    """The checkpoint taken before the call, "" when none was (docs/undo.md)."""


FORMATS = {
    "json": tool_pb2.SCHEMA_FORMAT_JSON_SCHEMA,
    "openai": tool_pb2.SCHEMA_FORMAT_OPENAI,
    "anthropic": tool_pb2.SCHEMA_FORMAT_ANTHROPIC,
    "gemini": tool_pb2.SCHEMA_FORMAT_GEMINI,
}
DECISIONS = {
    "allow-once": approval_pb2.APPROVAL_DECISION_ALLOW_ONCE,
    "allow-always": approval_pb2.APPROVAL_DECISION_ALLOW_ALWAYS,
    "deny": approval_pb2.APPROVAL_DECISION_DENY,
}


def result_from_pb(msg: Any) -> ToolResult:
    name = tool_pb2.ToolErrorCode.Name(msg.error_code).removeprefix("TOOL_ERROR_CODE_")
    return ToolResult(
        for_llm=msg.for_llm,
        for_user=msg.for_user,
        is_error=msg.is_error,
        error_code="" if name == "UNSPECIFIED" else name,
        error_message=msg.error_message,
        data=json.loads(msg.data_json) if msg.data_json else {},
        duration_ms=msg.duration_ms,
        truncated=msg.truncated,
        redactions=msg.redactions,
        request_id=msg.request_id,
    )


def _time(msg: Any, name: str) -> datetime | None:
    return msg.__getattribute__(name).ToDatetime(tzinfo=UTC) if msg.HasField(name) else None


def sandbox_from_pb(msg: Any) -> SandboxInfo:
    return SandboxInfo(
        key=msg.key,
        container_id=msg.container_id,
        container_name=msg.container_name,
        engine=msg.engine,
        image=msg.image,
        state=sandbox_pb2.SandboxState.Name(msg.state).removeprefix("SANDBOX_STATE_"),
        created_at=_time(msg, "created_at"),
        last_used_at=_time(msg, "last_used_at"),
        workspace_path=msg.workspace_path,
        network_mode=msg.network_mode,
        network_allow=tuple(msg.network_allow),
        trouble=msg.trouble,
        heals=msg.heals,
        last_heal_reason=msg.last_heal_reason,
        last_healed_at=_time(msg, "last_healed_at"),
        paused_at=_time(msg, "paused_at"),
        profile=msg.profile,
        cpus=msg.cpus,
        memory_mb=msg.memory_mb,
        quarantined_at=_time(msg, "quarantined_at"),
    )


def ensure_request(
    key: str, network: str | None, allow: Sequence[str] | None, profile: str | None = None
) -> Any:
    """EnsureSandboxRequest; network or allow set asks for that network (allow alone: egress
    limited to those patterns), profile for that sandbox profile."""
    request = sandbox_pb2.EnsureSandboxRequest(key=key, profile=profile or "")
    if network is not None or allow is not None:
        request.network.mode = network or ("egress" if allow else "")
        request.network.allow.extend(allow or ())
    return request


def isolation_from_pb(msg: Any) -> IsolationReport:
    return IsolationReport(message_dict(msg))


def message_dict(msg: Any) -> dict[str, Any]:
    """Every field by its .proto name, defaults included; integers stay integers; an enum
    by its value's name without the enum's prefix (CVE_VERDICT_FIXED -> "FIXED")."""
    out: dict[str, Any] = {}
    for fd in msg.DESCRIPTOR.fields:
        value = getattr(msg, fd.name)
        if fd.message_type is not None:
            out[fd.name] = (
                [message_dict(v) for v in value] if fd.is_repeated else message_dict(value)
            )
        elif fd.enum_type is not None:
            prefix = fd.enum_type.values[0].name.removesuffix("UNSPECIFIED")
            out[fd.name] = fd.enum_type.values_by_number[value].name.removeprefix(prefix)
        else:
            out[fd.name] = list(value) if fd.is_repeated else value
    return out


def tool_from_pb(msg: Any) -> ToolSpec:
    return ToolSpec(
        name=msg.name,
        group=msg.group,
        description=msg.description,
        parameters=json.loads(msg.parameters_json_schema or "{}"),
        profiles=tuple(msg.profiles),
        declaration=json.loads(msg.declaration_json or "{}"),
        aliases=tuple(msg.aliases),
    )


def stream_event_from_pb(msg: Any) -> StreamEvent:
    kind = msg.WhichOneof("event")
    if kind == "started":
        return Started(msg.started.pid, msg.started.process_id)
    if kind == "output":
        name = "stderr" if msg.output.stream == tool_pb2.OUTPUT_STREAM_STDERR else "stdout"
        return Output(name, msg.output.text)
    if kind == "approval_pending":
        return ApprovalPending(msg.approval_pending.approval_id, msg.approval_pending.reason)
    return result_from_pb(msg.result)


def context_pb(context: CallContext | None) -> Any:
    c = context or CallContext()
    return tool_pb2.CallContext(
        agent_id=c.agent_id,
        provider=c.provider,
        channel=c.channel,
        chat_id=c.chat_id,
        peer_kind=c.peer_kind,
        subagent_depth=c.subagent_depth,
    )


def list_tools_request(fmt: str, context: CallContext | None) -> Any:
    if fmt not in FORMATS:
        raise InvalidArgument(f"format must be one of {', '.join(FORMATS)}", code="CLIENT")
    return tool_pb2.ListToolsRequest(context=context_pb(context), format=FORMATS[fmt])


def resolve_request(approval_id: str, decision: str, approver: str) -> Any:
    if decision not in DECISIONS:
        raise InvalidArgument(f"decision must be one of {', '.join(DECISIONS)}", code="CLIENT")
    return approval_pb2.ResolveApprovalRequest(
        id=approval_id, decision=DECISIONS[decision], approver=approver
    )


def approval_from_pb(msg: Any) -> ApprovalRequest:
    return ApprovalRequest(
        id=msg.id,
        sandbox_key=msg.sandbox_key,
        agent_id=msg.agent_id,
        tool=msg.tool,
        command=msg.command,
        reason=msg.reason,
        created_at=_time(msg, "created_at"),
        expires_at=_time(msg, "expires_at"),
        request_id=msg.request_id,
        diff=msg.diff,
    )


def approvals_from_pb(msg: Any) -> Approvals:
    return Approvals(
        pending=[approval_from_pb(p) for p in msg.pending],
        always_allowed=list(msg.always_allowed),
        approvers=msg.approvers,
    )


def event_from_pb(msg: Any) -> ApprovalRequest | ApprovalClosed:
    if msg.HasField("pending"):
        return approval_from_pb(msg.pending)
    c = msg.closed
    return ApprovalClosed(id=c.id, outcome=c.outcome, approver=c.approver)


MAX_UINT32 = 2**32 - 1


def audit_request(
    sandbox_key: str,
    tool: str,
    agent_id: str,
    since: datetime | None,
    limit: int,
    errors_only: bool,
) -> Any:
    if isinstance(limit, bool) or not 0 <= limit <= MAX_UINT32:
        raise InvalidArgument(
            f"limit must be between 0 (the server's default) and {MAX_UINT32}, got {limit}",
            code="CLIENT",
        )
    request = audit_pb2.ListAuditRequest(
        sandbox_key=sandbox_key, tool=tool, agent_id=agent_id, limit=limit, errors_only=errors_only
    )
    if since is not None:
        try:
            request.since.FromDatetime(since)
        except (ValueError, OverflowError) as exc:
            raise InvalidArgument(f"since: {exc}", code="CLIENT") from None
    return request


def audit_from_pb(msg: Any) -> AuditRecord:
    names = [f for f in AuditRecord.__dataclass_fields__ if f != "time"]
    return AuditRecord(time=_time(msg, "time"), **{n: getattr(msg, n) for n in names})


def call_request(
    key: str,
    tool: str,
    arguments: dict[str, Any] | str | None,
    *,
    timeout_ms: int = 0,
    context: CallContext | None = None,
    request_id: str = "",
    front: str = "",
    caller_approves: bool = False,
) -> Any:
    """A CallToolRequest; arguments may be a dict or already-encoded JSON."""
    if arguments is None:
        arguments_json = ""
    elif isinstance(arguments, str):
        arguments_json = arguments
    else:
        arguments_json = json.dumps(arguments)
    return tool_pb2.CallToolRequest(
        sandbox_key=key,
        tool=tool,
        arguments_json=arguments_json,
        context=context_pb(context),
        timeout_ms=timeout_ms,
        request_id=request_id,
        front=front,
        caller_approves=caller_approves,
    )


def interact_start(
    key: str,
    command: str | None,
    process: str | None,
    *,
    pty: bool,
    cols: int,
    rows: int,
    workdir: str,
    env: dict[str, str] | None,
    name: str,
    offset: int,
    keep_running: bool,
    context: CallContext | None,
    request_id: str,
) -> Any:
    """The first message of an Interact call."""
    start = tool_pb2.InteractStart(
        sandbox_key=key,
        context=context_pb(context),
        process_id=process or "",
        command=command or "",
        workdir=workdir,
        env=env or {},
        name=name,
        pty=pty,
        offset=offset,
        keep_running=keep_running,
        request_id=request_id,
    )
    if cols or rows:
        start.window.cols, start.window.rows = cols, rows
    return tool_pb2.InteractInput(start=start)


def stdin_message(data: bytes | str) -> Any:
    return tool_pb2.InteractInput(data=data.encode() if isinstance(data, str) else data)


def eof_message() -> Any:
    return tool_pb2.InteractInput(eof=True)


def resize_message(cols: int, rows: int) -> Any:
    return tool_pb2.InteractInput(resize=tool_pb2.WindowSize(cols=cols, rows=rows))


def signal_message(name: str) -> Any:
    return tool_pb2.InteractInput(signal=name)


class OutputBuffer:
    """An Interact session's events as they are read: output text not yet consumed by
    read_until, the Started event and the final result."""

    def __init__(self) -> None:
        self.text = ""
        self.started: Started | None = None
        self.result: ToolResult | None = None

    def add(self, event: StreamEvent) -> None:
        if isinstance(event, Output):
            self.text += event.text
        elif isinstance(event, Started):
            self.started = event
        elif isinstance(event, ToolResult):
            self.result = event

    def take_until(self, marker: str) -> str | None:
        """The text up to and including `marker`, once it is there."""
        at = self.text.find(marker)
        if at < 0:
            return None
        end = at + len(marker)
        taken, self.text = self.text[:end], self.text[end:]
        return taken

    def take_all(self) -> str:
        taken, self.text = self.text, ""
        return taken


Op = tuple[str, dict[str, Any], Callable[[ToolResult], Any]]
"""A helper call: tool name, arguments, and what to make of the result."""


def _field(name: str) -> Callable[[ToolResult], Any]:
    def take(result: ToolResult) -> Any:
        if result.is_error:
            raise ToolError(result)
        return result.data[name]

    return take


def _nothing(result: ToolResult) -> None:
    if result.is_error:
        raise ToolError(result)


def exec_op(
    command: str,
    timeout: float | None,
    workdir: str | None,
    env: dict[str, str] | None,
    stdin: str | None = None,
    session: str | None = None,
) -> Op:
    args: dict[str, Any] = {"command": command}
    given = (
        ("timeout", timeout),
        ("workdir", workdir),
        ("env", env),
        ("stdin", stdin),
        ("session", session),
    )
    for name, value in given:
        if value is not None:
            args[name] = value
    return "exec", args, lambda result: result


def read_file_op(path: str, start_line: int | None, end_line: int | None) -> Op:
    args: dict[str, Any] = {"path": path}
    for name, value in (("start_line", start_line), ("end_line", end_line)):
        if value is not None:
            args[name] = value
    return "read_file", args, _field("content")


def write_file_op(path: str, content: str) -> Op:
    return "write_file", {"path": path, "content": content}, _nothing


def edit_file_op(path: str, old_text: str, new_text: str) -> Op:
    return "edit_file", {"path": path, "old_text": old_text, "new_text": new_text}, _nothing


def list_files_op(path: str) -> Op:
    return "list_files", {"path": path}, _field("entries")


def glob_op(pattern: str, path: str) -> Op:
    return "glob", {"pattern": pattern, "path": path}, _field("matches")


def search_op(pattern: str, path: str, extra: dict[str, Any]) -> Op:
    return "search", {"pattern": pattern, "path": path, **extra}, _field("matches")


CHUNK = 1 << 20
Source = str | os.PathLike[str] | bytes | BinaryIO


def upload_requests(
    key: str, path: str, source: Source, tar: bool, mode: int,
    context: CallContext | None, progress: Callable[[int], None] | None,
) -> Iterator[Any]:  # fmt: skip
    """The FileChunk messages of an upload: the header, then the data in 1 MiB chunks.
    A path that is not UTF-8 raises InvalidArgument here, before anything is sent."""
    header = file_pb2.FileHeader(
        sandbox_key=key, path=_wire_path(path), tar=tar, mode=mode, context=context_pb(context)
    )
    return _upload_chunks(header, source, progress)


def _upload_chunks(
    header: Any, source: Source, progress: Callable[[int], None] | None
) -> Iterator[Any]:
    yield file_pb2.FileChunk(header=header)
    for data in _read_source(source):
        if progress is not None:
            progress(len(data))
        yield file_pb2.FileChunk(data=data)


def _read_source(source: Source) -> Iterator[bytes]:
    if isinstance(source, bytes):
        for start in range(0, len(source), CHUNK):
            yield source[start : start + CHUNK]
        return
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as file:
            yield from iter(lambda: file.read(CHUNK), b"")
        return
    yield from iter(lambda: source.read(CHUNK), b"")


def download_request(key: str, path: str, tar: bool, context: CallContext | None) -> Any:
    return file_pb2.DownloadFileRequest(
        sandbox_key=key, path=_wire_path(path), tar=tar, context=context_pb(context)
    )


def _wire_path(path: str) -> str:
    """Transfer paths are protobuf strings: UTF-8 only. A name that is not (a str with lone
    surrogates, as os.fsdecode and the file tools' results give it) travels in a tar of its
    folder instead."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(
            f"path {path!r} is not valid UTF-8 (byte {exc.start}); file transfers take UTF-8 "
            "paths: transfer its folder with tar instead"
        ) from None
    return path


def info_from_pb(msg: Any) -> FileInfo:
    return FileInfo(
        path=msg.path, size=msg.size, sha256=msg.sha256, tar=msg.tar, files=msg.files,
        redactions=msg.redactions,
    )  # fmt: skip


class Sink:
    """Where downloaded bytes go: a path (written to a temporary file, renamed at the end) or
    a binary file object."""

    def __init__(self, dest: str | os.PathLike[str] | BinaryIO) -> None:
        self._path = None if hasattr(dest, "write") else Path(dest)
        if self._path is None:
            self._file: BinaryIO = dest  # type: ignore[assignment]
        else:
            self._file = open(f"{self._path}.part", "wb")  # noqa: SIM115

    def write(self, data: bytes) -> None:
        self._file.write(data)

    def finish(self, ok: bool) -> None:
        if self._path is None:
            return
        self._file.close()
        part = Path(f"{self._path}.part")
        if ok:
            part.replace(self._path)
        else:
            part.unlink(missing_ok=True)
