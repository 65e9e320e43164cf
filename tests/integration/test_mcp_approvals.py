"""Approvals over MCP through the real `stockade serve` on both engines and the MCP SDK's own
client: asked through elicitation (in a session, an elicitation request; sessionless, an
`input_required` result), and the same approval answered with `stockade approvals resolve`
instead, while the client's elicitation is open or when the client cannot be asked."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import mcp_types as types
import pytest
from mcp.client import Client

from tests.integration.harness import an_approver_connected
from tests.integration.test_mcp import FAKE_AWS_KEY, connected, text_of
from tests.integration.test_mcp_protocol import MODERN, SANDBOX, Mcp, fresh
from tests.integration.test_mcp_protocol import mcp as mcp  # the fixture: its own supervisor

pytestmark = pytest.mark.timeout(300)


class SilentApprover:
    """An approver connected to the ApprovalService (tenant acme's) that never answers."""

    def __init__(self, mcp: Mcp) -> None:
        self.client = mcp.grpc()
        self.stream = self.client.watch_approvals("silent")
        self.thread = threading.Thread(target=lambda: list(self.stream), daemon=True)
        self.thread.start()
        an_approver_connected(self.client)

    def close(self) -> None:
        self.client.close()
        self.thread.join(5)


class Elicitor:
    """An elicitation callback: records each question and answers it with `answer` (None:
    never answers, until the server withdraws the question; or, with `release`, dismisses it
    once `release` is set)."""

    def __init__(
        self, answer: types.ElicitResult | None, release: asyncio.Event | None = None
    ) -> None:
        self.answer = answer
        self.release = release
        self.asked: list[types.ElicitRequestParams] = []
        self.withdrawn = False

    async def __call__(self, ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(params)
        if self.answer is not None:
            return self.answer
        if self.release is not None:
            await self.release.wait()
            return types.ElicitResult(action="cancel")
        try:
            await asyncio.Event().wait()
        except BaseException:
            self.withdrawn = True
            raise
        raise AssertionError("unreachable")


def choose(decision: str) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"decision": decision})


Connect = Callable[[str, dict[str, Any]], AbstractAsyncContextManager[Client]]
"""An MCP client of the protocol mode given ("legacy" or 2026-07-28), with the Client's
options (callbacks)."""


ANSWERS = pytest.mark.parametrize(
    ("answer", "runs", "approval"),
    [
        (choose("once"), True, "allow-once"),
        (choose("deny"), False, "deny"),
        (types.ElicitResult(action="decline"), False, "deny"),
    ],
    ids=["once", "deny", "decline"],
)
"""An answer to the question, whether the command then runs, and the audit's approval."""


@pytest.mark.parametrize("mode", ["legacy", MODERN])
@ANSWERS
async def test_an_approval_answered_through_elicitation(
    mcp: Mcp, answer: types.ElicitResult, runs: bool, approval: str, mode: str
) -> None:
    """In a session the question is an elicitation request during the call; sessionless, an
    `input_required` result the SDK's client answers by calling again."""
    key = fresh("elicit")

    def connect(mode: str, options: dict[str, Any]) -> AbstractAsyncContextManager[Client]:
        return connected(mcp.url, mcp.token, mode, **options)

    record, _ = await answered_through_elicitation(
        mcp, key, connect, {SANDBOX: key}, answer, runs, mode
    )
    assert (record.approval, record.approver.startswith("mcp elicitation (ipv4:")) == (
        approval,
        True,
    )
    assert record.front == "mcp"


async def answered_through_elicitation(
    mcp: Mcp,
    key: str,
    connect: Connect,
    meta: dict[str, Any] | None,
    answer: types.ElicitResult,
    runs: bool,
    mode: str,
    progress: Callable[[float, float | None, str | None], Awaitable[None]] | None = None,
) -> tuple[Any, types.ElicitRequestFormParams]:
    """An `exec` needing an approval through a client from `connect` that answers the
    question with `answer`: the question holds the command (scrubbed), the reason and the
    choices; the command ran or not (`runs`); nothing is left pending. The call's audit
    record and the question."""
    name = fresh("f")
    elicitor = Elicitor(answer)
    command = f"touch {name} # {FAKE_AWS_KEY}"
    async with connect(mode, {"elicitation_callback": elicitor}) as client:
        result = await client.call_tool(
            "exec", {"command": command}, meta=meta, progress_callback=progress
        )
        listed = await client.call_tool("list_files", {"path": "."}, meta=meta)
    [question] = elicitor.asked
    assert isinstance(question, types.ElicitRequestFormParams)
    assert f"touch {name}" in question.message
    assert FAKE_AWS_KEY not in question.message  # scrubbed, as the approvers see it
    assert "on-miss" in question.message  # the reason
    assert question.requested_schema["properties"]["decision"]["enum"] == [
        "once",
        "always",
        "deny",
    ]
    assert (name in json.dumps(listed.structured_content)) == runs
    if runs:
        assert not result.is_error, text_of(result)
    else:
        assert text_of(result).startswith("Error (APPROVAL_DENIED): command not approved")
    with mcp.grpc() as grpc_client:
        [record] = grpc_client.list_audit(sandbox_key=key, tool="exec")
        assert grpc_client.list_approvals().pending == []
    return record, question


def pending_id(mcp: Mcp, name: str) -> str:
    """The id of the pending approval of the command naming `name`, as
    `stockade approvals list` shows it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in mcp.cli("approvals", "list").stdout.splitlines():
            if name in line:
                return line.split()[0]
        time.sleep(0.1)
    raise AssertionError(f"no pending approval for {name}")


HOWS = pytest.mark.parametrize(
    "how",
    [
        "elicitation pending",
        "no elicitation",
        "sessionless elicitation pending",
        "sessionless no elicitation",
    ],
)
"""Who decides while the call waits: see resolved_with_the_cli."""


@HOWS
async def test_the_same_approval_resolved_with_the_cli(mcp: Mcp, how: str) -> None:
    """`stockade approvals resolve` decides the approval the MCP call waits for (see
    resolved_with_the_cli)."""
    key = fresh("resolve")

    def connect(mode: str, options: dict[str, Any]) -> AbstractAsyncContextManager[Client]:
        return connected(mcp.url, mcp.token, mode, **options)

    record = await resolved_with_the_cli(mcp, how, key, connect, {SANDBOX: key})
    assert (record.approval, record.approver, record.front) == ("allow-once", "carol", "mcp")


async def resolved_with_the_cli(
    mcp: Mcp, how: str, key: str, connect: Connect, meta: dict[str, Any] | None
) -> Any:
    """An `exec` needing an approval, through a client from `connect` (its calls with
    `meta`), decided by `stockade approvals resolve`: while the client's elicitation is open
    (in a session it is then withdrawn; sessionless, the client's later answer, here a
    dismissal, finds the call decided), or when the client cannot be asked (no elicitation
    capability): then, as for a gRPC caller, an approver must be connected (here one that
    never answers). The call's audit record."""
    name = fresh("f")
    asks = "elicitation pending" in how
    sessionless = how.startswith("sessionless")
    resolved = asyncio.Event()
    elicitor = Elicitor(None, resolved if sessionless else None)
    options: dict[str, Any] = {"elicitation_callback": elicitor} if asks else {}
    mode = MODERN if sessionless else "legacy"
    watcher = None if asks else SilentApprover(mcp)
    messages: list[str] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    try:
        async with connect(mode, options) as client:
            call = asyncio.create_task(
                client.call_tool(
                    "exec", {"command": f"touch {name}"}, progress_callback=progress, meta=meta
                )
            )
            approval = await asyncio.to_thread(pending_id, mcp, name)
            done = await asyncio.to_thread(
                mcp.cli, "approvals", "resolve", approval, "allow-once", "--approver", "carol"
            )
            assert done.returncode == 0, done.stderr
            resolved.set()
            result = await call
            assert not result.is_error, text_of(result)
            listed = await client.call_tool("list_files", {"path": "."}, meta=meta)
            assert name in json.dumps(listed.structured_content)
    finally:
        if watcher is not None:
            watcher.close()
    if not (sessionless and asks):  # there, the question goes out before the stream has it
        # the client learns the id to give a human, on the call's progress stream
        assert f"[waiting for approval {approval}: approvals mode on-miss" in messages[0]
    if asks:
        assert len(elicitor.asked) == 1
        assert approval in elicitor.asked[0].message
        assert elicitor.withdrawn == (not sessionless)
    with mcp.grpc() as grpc_client:
        [record] = grpc_client.list_audit(sandbox_key=key, tool="exec")
    return record
