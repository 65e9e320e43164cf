"""`stockade mcp`, the MCP stdio bridge to the gRPC API, through the real `stockade serve` on
both engines and the MCP SDK's own stdio client (which starts the real CLI entry point): the
tools, each built-in tool, a streamed `exec` as progress notifications, `process` attach, an
approval answered through elicitation (resolved over the ApprovalService), the same approval
answered with `stockade approvals resolve` instead, a guard refusal, a scrubbed secret, a
rate-limit refusal, and the audit records naming the front "mcp-stdio"."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import mcp_types as types
import pytest
from mcp.client import Client

from stockade.client import AsyncStockade, InvalidArgument
from stockade.client._core import call_request
from tests.integration.test_mcp import FAKE_AWS_KEY, bridge_command, text_of
from tests.integration.test_mcp_approvals import (
    ANSWERS,
    HOWS,
    answered_through_elicitation,
    resolved_with_the_cli,
)
from tests.integration.test_mcp_protocol import BURST, MODERN, Mcp, each_built_in_tool, fresh
from tests.integration.test_mcp_protocol import mcp as mcp  # the fixture: its own supervisor

pytestmark = pytest.mark.timeout(300)
APPROVER = "mcp elicitation (stdio bridge)"


@asynccontextmanager
async def bridged(mcp: Mcp, key: str, mode: str = "auto", **options: Any) -> AsyncIterator[Client]:
    """The SDK's stdio client running `stockade mcp --key KEY` against the supervisor, with
    acme's token: by default what the bridge's discover offers (the sessionless 2026-07-28),
    "legacy" for the initialize handshake (a session); `options`: the Client's (callbacks)."""
    command = bridge_command("--key", key, "--server", mcp.sup.target, "--token", mcp.token)
    async with Client(command, mode=mode, **options) as client:
        yield client


async def test_the_tools_and_each_built_in_tool(mcp: Mcp) -> None:
    """tools/list is gRPC ListTools' list, with the endpoint's hints; every built-in tool runs
    in the bridge's sandbox, and each call's audit record names the front."""
    key = fresh("stdio-tools")
    async with bridged(mcp, key) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        await each_built_in_tool(client)
    with mcp.grpc() as grpc_client:
        assert list(listed) == [t.name for t in grpc_client.list_tools()]
        read = grpc_client.call(key, "read_file", {"path": "notes.txt"})
        records = grpc_client.list_audit(sandbox_key=key, limit=50)
    exec_hints = listed["exec"].annotations
    assert exec_hints is not None
    assert (exec_hints.destructive_hint, exec_hints.open_world_hint) == (True, True)
    read_hints = listed["read_file"].annotations
    assert read_hints is not None
    assert read_hints.read_only_hint is True
    assert read.data["content"] == "ONE\nTWO\nthree\n"
    bridged_records = [r for r in records if r.front == "mcp-stdio"]
    assert {r.tool for r in bridged_records} == {
        "write_file",
        "edit_file",
        "apply_patch",
        "read_file",
        "list_files",
        "glob",
        "search",
        "exec",
        "process",
    }
    assert {r.front for r in records} == {"mcp-stdio", "grpc"}  # the test's own read: grpc
    assert all(r.tenant == "acme" for r in records)


async def test_a_streamed_exec_as_progress_notifications(mcp: Mcp) -> None:
    """With a progress token each output chunk is a notification (progress 1, 2, 3, ...; the
    chunk, scrubbed, as its message), all before the result; without one, none."""
    script = f"for i in 1 2 3; do echo line$i; sleep 0.4; done; echo key={FAKE_AWS_KEY}"
    seen: list[tuple[float, str | None, bool]] = []
    call: asyncio.Task[types.CallToolResult] | None = None

    async def progress(value: float, total: float | None, message: str | None) -> None:
        assert call is not None
        seen.append((value, message, call.done()))

    async with bridged(mcp, fresh("stdio-progress")) as client:
        command = {"command": f"sh -c '{script}'"}
        call = asyncio.create_task(client.call_tool("exec", command, progress_callback=progress))
        result = await call
        quiet = await client.call_tool("exec", {"command": "echo quiet"})
    assert not result.is_error, text_of(result)
    assert text_of(result).startswith("line1\nline2\nline3\nkey=")
    assert FAKE_AWS_KEY not in text_of(result)
    assert "[REDACTED]" in text_of(result)
    assert text_of(quiet) == "quiet\n"
    assert len(seen) >= 3, seen  # the sleeps part the lines
    assert [v for v, _, _ in seen] == list(range(1, len(seen) + 1))
    assert not any(done for _, _, done in seen)
    streamed = "".join(m or "" for _, m, _ in seen)
    assert streamed.startswith("line1\nline2\nline3\nkey=")
    assert FAKE_AWS_KEY not in streamed
    assert "quiet" not in streamed


async def test_process_attach(mcp: Mcp) -> None:
    """`process` attach runs streamed (a unary attach does not exist): its output as
    notifications, and in the result's text before the process's summary."""
    messages: list[str] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    script = "for i in 1 2 3; do echo tick $i; sleep 0.3; done"
    async with bridged(mcp, fresh("stdio-attach")) as client:
        started = await client.call_tool(
            "process", {"action": "start", "command": f"sh -c '{script}'"}
        )
        assert started.structured_content is not None, text_of(started)
        attach = {"action": "attach", "id": started.structured_content["id"]}
        result = await client.call_tool("process", attach, progress_callback=progress)
        again = await client.call_tool("process", attach)
    assert "".join(messages).startswith("tick 1\ntick 2\ntick 3\n")
    for followed in (result, again):
        assert not followed.is_error, text_of(followed)
        assert text_of(followed).startswith("tick 1\ntick 2\ntick 3\n")


@pytest.mark.parametrize("mode", ["legacy", MODERN])
@ANSWERS
async def test_an_approval_answered_through_elicitation(
    mcp: Mcp, answer: types.ElicitResult, runs: bool, approval: str, mode: str
) -> None:
    """No gRPC approver is connected: the bridge, whose client can be asked, counts as one.
    The question (in a session an elicitation request; sessionless an `input_required`
    result) is the endpoint's (test_mcp_approvals.answered_through_elicitation); the answer
    resolves that approval over the ApprovalService."""
    key = fresh("stdio-elicit")
    messages: list[str] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    def connect(mode: str, options: dict[str, Any]) -> AbstractAsyncContextManager[Client]:
        return bridged(mcp, key, mode, **options)

    record, question = await answered_through_elicitation(
        mcp, key, connect, None, answer, runs, mode, progress
    )
    if mode == "legacy":  # sessionless, the question goes out before the stream has it
        assert messages[0].startswith("[waiting for approval ")
        approval_id = messages[0].split()[3].rstrip(":")
        assert question.message.endswith(f"Approval id: {approval_id}")
    assert "Approval id: " in question.message
    assert (record.approval, record.approver, record.front) == (approval, APPROVER, "mcp-stdio")


@HOWS
async def test_the_same_approval_resolved_with_the_cli(mcp: Mcp, how: str) -> None:
    """`stockade approvals resolve` decides the approval the bridged call waits for, as for
    the endpoint's (test_mcp_approvals.resolved_with_the_cli): the bridge withdraws its
    question, or, when its client cannot be asked, an approver must be connected."""
    key = fresh("stdio-resolve")

    def connect(mode: str, options: dict[str, Any]) -> AbstractAsyncContextManager[Client]:
        return bridged(mcp, key, mode, **options)

    record = await resolved_with_the_cli(mcp, how, key, connect, None)
    assert (record.approval, record.approver, record.front) == ("allow-once", "carol", "mcp-stdio")


async def test_without_elicitation_nor_approver_no_approver_applies(mcp: Mcp) -> None:
    """A client that cannot be asked changes nothing: with no approver connected the call is
    denied at once (approvals.no_approver = deny), as a gRPC caller's would be."""
    key, name = fresh("stdio-none"), fresh("f")
    async with bridged(mcp, key) as client:
        result = await client.call_tool("exec", {"command": f"touch {name}"})
    assert text_of(result).startswith("Error (APPROVAL_DENIED): command not approved: no approver")
    with mcp.grpc() as grpc_client:
        [record] = grpc_client.list_audit(sandbox_key=key, tool="exec")
    assert (record.approval, record.front) == ("no-approver", "mcp-stdio")


async def test_a_guard_refusal_and_a_rate_limit_refusal(mcp: Mcp) -> None:
    key = fresh("stdio-refusals")
    async with bridged(mcp, key) as client:
        guarded = await client.call_tool("exec", {"command": "rm -rf /"})  # takes no token
        for _ in range(BURST):
            ok = await client.call_tool("exec", {"command": "true"})
            assert not ok.is_error, text_of(ok)
        limited = await client.call_tool("exec", {"command": "true"})
    assert text_of(guarded).startswith("Error (PERMISSION_DENIED): command blocked")
    assert limited.is_error
    assert text_of(limited).startswith("Error (RATE_LIMITED): ")
    with mcp.grpc() as grpc_client:
        records = grpc_client.list_audit(sandbox_key=key, errors_only=True)
    assert sorted((r.error_code, r.front) for r in records) == [
        ("PERMISSION_DENIED", "mcp-stdio"),
        ("RATE_LIMITED", "mcp-stdio"),
    ]


async def test_a_grpc_caller_names_only_an_allowed_front(mcp: Mcp) -> None:
    """CallToolRequest.front takes "" (grpc) or "mcp-stdio", nothing else (not the HTTP
    endpoint's "mcp"); caller_approves needs the streamed call. Nothing refused is run."""
    key = fresh("stdio-front")
    async with AsyncStockade(mcp.sup.target, token=mcp.token) as client:
        for front in ("mcp", "grpc", "anything", "MCP-STDIO"):
            with pytest.raises(InvalidArgument, match="front must be empty or one of mcp-stdio"):
                await client.call(key, "exec", {"command": "echo hi"}, front=front)
        request = call_request(key, "exec", {"command": "echo hi"}, caller_approves=True)
        with pytest.raises(InvalidArgument, match="caller_approves needs CallToolStream"):
            await client._rpc(client._tools.CallTool, request)
        records = await client.list_audit(sandbox_key=key)
    assert records == []
