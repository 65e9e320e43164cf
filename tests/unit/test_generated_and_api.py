"""The committed generated code matches a fresh generation; the public API is __all__."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import stockade.client

ROOT = Path(__file__).resolve().parents[2]


def _load_generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_proto"] = module
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    written = _load_generator().generate(tmp_path)
    assert written
    for fresh in written:
        committed = ROOT / "proto" / fresh.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is not committed; run make proto"
        assert committed.read_text() == fresh.read_text(), f"{committed} is stale; run make proto"


def test_public_client_api() -> None:
    assert sorted(stockade.client.__all__) == [
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
        "ShellSession",
        "SnapshotInfo",
        "SnapshotList",
        "Started",
        "Stockade",
        "StockadeError",
        "StreamEvent",
        "TLS",
        "ToolError",
        "ToolResult",
        "ToolSpec",
        "Unauthenticated",
        "Unavailable",
        "Unimplemented",
    ]
    for name in stockade.client.__all__:
        assert getattr(stockade.client, name) is not None
