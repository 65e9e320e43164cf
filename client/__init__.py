"""Python client for Stockade: sync (`Stockade`) and asyncio (`AsyncStockade`).

from stockade.client import Stockade
with Stockade("127.0.0.1:50051") as s:
    print(s.sandbox("demo").exec("uname -a").stdout)
"""

from stockade.client._core import (
    TLS,
    AlreadyExists,
    ApprovalClosed,
    ApprovalPending,
    ApprovalRequest,
    Approvals,
    AuditRecord,
    CallContext,
    DeadlineExceeded,
    FailedPrecondition,
    FileInfo,
    InvalidArgument,
    IsolationReport,
    NotFound,
    Output,
    PermissionDenied,
    ResourceExhausted,
    SandboxInfo,
    Started,
    StockadeError,
    StreamEvent,
    ToolError,
    ToolResult,
    ToolSpec,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from stockade.client._quarantine_calls import Alarm, QuarantineEvidence, QuarantineInfo
from stockade.client._snapshots import Forked, Restored, Rollback, SnapshotInfo, SnapshotList
from stockade.client._watch import AsyncFileWatch, FileEvent, FileWatch
from stockade.client.aio import AsyncInteraction, AsyncSandbox, AsyncStockade
from stockade.client.sync import Interaction, Sandbox, Stockade

__all__ = [
    "TLS",
    "Alarm",
    "AlreadyExists",
    "ApprovalClosed",
    "ApprovalPending",
    "ApprovalRequest",
    "Approvals",
    "AsyncFileWatch",
    "AsyncInteraction",
    "AsyncSandbox",
    "AsyncStockade",
    "AuditRecord",
    "CallContext",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FileEvent",
    "FileInfo",
    "FileWatch",
    "Forked",
    "Interaction",
    "InvalidArgument",
    "IsolationReport",
    "NotFound",
    "Output",
    "PermissionDenied",
    "QuarantineEvidence",
    "QuarantineInfo",
    "ResourceExhausted",
    "Restored",
    "Rollback",
    "Sandbox",
    "SandboxInfo",
    "SnapshotInfo",
    "SnapshotList",
    "Started",
    "Stockade",
    "StockadeError",
    "StreamEvent",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
]
