"""Domain objects of the call path. No gRPC, no container SDK."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


class ErrorCode(enum.StrEnum):
    """Why a tool call failed; mirrors stockade.v1.ToolErrorCode."""

    NONE = "NONE"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARGS = "INVALID_ARGS"
    EXECUTION_FAILED = "EXECUTION_FAILED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    FILE_NOT_FOUND = "FILE_NOT_FOUND"
    INVALID_PATH = "INVALID_PATH"
    TIMEOUT = "TIMEOUT"
    RATE_LIMITED = "RATE_LIMITED"
    APPROVAL_DENIED = "APPROVAL_DENIED"
    SANDBOX_LOST = "SANDBOX_LOST"


class SandboxState(enum.StrEnum):
    RUNNING = "RUNNING"
    EXITED = "EXITED"
    ABSENT = "ABSENT"
    BROKEN = "BROKEN"
    PAUSED = "PAUSED"


@dataclass(frozen=True)
class CallContext:
    """Who is calling; read by host-side policy."""

    agent_id: str = ""
    provider: str = ""
    channel: str = ""
    chat_id: str = ""
    peer_kind: str = ""
    subagent_depth: int = 0


@dataclass(frozen=True)
class ToolCall:
    sandbox_key: str
    tool: str
    arguments_json: str
    context: CallContext = field(default_factory=CallContext)
    timeout_ms: int = 0
    request_id: str = ""
    traceparent: str = ""
    """The caller's W3C trace context (gRPC metadata `traceparent`), for tracing only."""
    front: str = "grpc"
    """The front the call came in through ("grpc", "mcp", "mcp-stdio"), for its audit
    record only."""


@dataclass(frozen=True)
class ToolResult:
    for_llm: str
    for_user: str
    is_error: bool = False
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    data: dict[str, Any] | None = None
    duration_ms: int = 0
    truncated: bool = False
    redactions: int = 0
    request_id: str = ""


@dataclass(frozen=True)
class SandboxInfo:
    key: str
    container_id: str
    container_name: str
    engine: str
    image: str
    state: SandboxState
    created_at: datetime | None
    last_used_at: datetime | None
    workspace_path: str
    network_mode: str = ""
    network_allow: tuple[str, ...] = ()
    trouble: str = ""
    """BROKEN: why it cannot serve calls (kind: detail); the next call re-creates it."""
    heals: int = 0
    """Times its container was re-created because it could not serve (since the start)."""
    last_heal_reason: str = ""
    last_healed_at: datetime | None = None
    paused_at: datetime | None = None
    """PAUSED: since when."""
    profile: str = ""
    """The sandbox profile its container was made with ("base": the [sandbox] defaults)."""
    cpus: float = 0.0
    memory_mb: int = 0
    quarantined_at: datetime | None = None
    """Set while quarantined (sandboxes/quarantine.py): since when."""


@dataclass(frozen=True)
class NetworkRequest:
    """What EnsureSandbox asks for: an empty mode is the configured one; `allow` narrows the
    configured allowlist (empty: all of it)."""

    mode: str = ""
    allow: tuple[str, ...] = ()


@dataclass(frozen=True)
class StartedEvent:
    pid: int
    process_id: str = ""
    """Interact: the process tool's id of the process."""


@dataclass(frozen=True)
class OutputEvent:
    stream: str
    """"stdout" or "stderr"."""
    text: str


@dataclass(frozen=True)
class ApprovalPendingEvent:
    approval_id: str
    reason: str


@dataclass(frozen=True)
class ResultEvent:
    result: ToolResult


ToolEvent = StartedEvent | OutputEvent | ApprovalPendingEvent | ResultEvent


@dataclass(frozen=True)
class InteractRequest:
    """The first message of an Interact call: a process to attach to, or a command to start."""

    sandbox_key: str
    context: CallContext = field(default_factory=CallContext)
    process_id: str = ""
    command: str = ""
    workdir: str = ""
    env: tuple[tuple[str, str], ...] = ()
    name: str = ""
    pty: bool = False
    cols: int = 0
    rows: int = 0
    """0: the default size (80x24)."""
    offset: int = 0
    keep_running: bool = False
    request_id: str = ""


@dataclass(frozen=True)
class StdinInput:
    data: bytes


@dataclass(frozen=True)
class EofInput:
    pass


@dataclass(frozen=True)
class ResizeInput:
    cols: int
    rows: int


@dataclass(frozen=True)
class SignalInput:
    name: str


InteractInput = StdinInput | EofInput | ResizeInput | SignalInput
