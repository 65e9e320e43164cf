"""Python client for Stockade: sync (`Stockade`) and asyncio (`AsyncStockade`).

from stockade.client import Stockade
with Stockade("127.0.0.1:50051") as s:
    print(s.sandbox("demo").exec("uname -a").stdout)
"""

from stockade.client._core import (
    ApprovalClosed,
    ApprovalRequest,
    Approvals,
    AuditRecord,
    CallContext,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SandboxInfo,
    StockadeError,
    ToolError,
    ToolResult,
    ToolSpec,
    Unavailable,
)
from stockade.client.aio import AsyncSandbox, AsyncStockade
from stockade.client.sync import Sandbox, Stockade

__all__ = [
    "ApprovalClosed",
    "ApprovalRequest",
    "Approvals",
    "AsyncSandbox",
    "AsyncStockade",
    "AuditRecord",
    "CallContext",
    "DeadlineExceeded",
    "InvalidArgument",
    "NotFound",
    "ResourceExhausted",
    "Sandbox",
    "SandboxInfo",
    "Stockade",
    "StockadeError",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "Unavailable",
]
