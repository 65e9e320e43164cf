"""Undo from the MCP endpoint (the `undo` tool `[mcp] undo` lists) and from the console (a
call's audit record: shown first, then confirmed, POST with the CSRF token), both through the
one RollbackSandbox path, here a recording stand-in of Checkpoints.undo. On a real supervisor
and engine: tests/integration/test_undo_fronts.py."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mcp_types as types
import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from stockade.supervisor.app import build_policy
from stockade.supervisor.config import load_config
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.fronts.console.context import ConsoleContext
from stockade.supervisor.fronts.mcp.handlers import McpTools
from stockade.supervisor.fronts.mcp.undo import MAX_CALL_ID, UNDO_TOOL
from stockade.supervisor.keys import scope
from stockade.supervisor.observe.audit import AuditQuery, AuditRecord
from stockade.supervisor.sandboxes.snapshots.checkpoints import Checkpoint, CheckpointNotFound, Undo
from stockade.supervisor.sandboxes.snapshots.diffs import TreeDiff
from tests.unit.fakes import idle_pipeline
from tests.unit.test_console import ALICE, BOB, ORIGIN, login
from tests.unit.test_console import client as client  # the fixtures
from tests.unit.test_console import ctx as ctx

SECRET = "AKIA" + "Q3EXAMPLE7ZXCVB2"
"""An AWS access key id: the scrubber knows its format, with or without [scrub] secrets."""


class Undoer:
    """Checkpoints.undo's stand-in: what it was asked, and an undo of one changed file."""

    def __init__(self, missing: bool = False) -> None:
        self.asked: list[tuple[str, str, bool, str]] = []
        self.missing = missing

    async def __call__(self, key: str, to_call: str, *, apply: bool, reason: str = "") -> Undo:
        self.asked.append((key, to_call, apply, reason))
        if self.missing:
            raise CheckpointNotFound(f"no checkpoint before call {to_call!r}")
        text = f"--- a/notes.txt\n+++ b/notes.txt\n@@ -1 +1 @@\n-kept {SECRET}\n+<b>gone</b>\n"
        diff = TreeDiff([], [], ["notes.txt"], (0, 0, 1), text)
        return Undo(
            Checkpoint("~ckpt-1", to_call or "newest", "exec", time.time(), 10), diff, apply
        )


# MCP


def tools(tmp_path: Path, undo: str, undoer: Undoer) -> McpTools:
    config = load_config(
        None, {"state_dir": str(tmp_path), "mcp.undo": undo, "scrub.secrets": [SECRET]}
    )
    policy = build_policy(config)
    mcp = McpTools(config, idle_pipeline(config, policy), policy, authenticated=False)
    mcp.undoing = undoer  # what a manager's Checkpoints.undo would be
    return mcp


def context(session: str = "s1") -> Any:
    scope_ = {"type": "http", "headers": [(b"mcp-session-id", session.encode())],
              "client": ("127.0.0.1", 4242)}  # fmt: skip
    return SimpleNamespace(request=Request(scope_), protocol_version="2025-11-25", meta=None)


async def call(mcp: McpTools, arguments: dict[str, Any]) -> types.CallToolResult:
    params = types.CallToolRequestParams(name=UNDO_TOOL, arguments=arguments)
    result = await mcp.call_tool(context(), params)
    assert isinstance(result, types.CallToolResult)
    return result


def text_of(result: types.CallToolResult) -> str:
    first = result.content[0]
    assert isinstance(first, types.TextContent)
    return first.text


async def test_off_by_default_no_undo_tool(tmp_path: Path) -> None:
    mcp = tools(tmp_path, "off", Undoer())
    listed = await mcp.list_tools(context(), None)
    assert UNDO_TOOL not in [t.name for t in listed.tools]
    assert mcp.input_schema(UNDO_TOOL) is None


async def test_show_lists_a_read_only_tool_that_shows_and_never_applies(tmp_path: Path) -> None:
    undoer = Undoer()
    mcp = tools(tmp_path, "show", undoer)
    listed = {t.name: t for t in (await mcp.list_tools(context(), None)).tools}
    assert listed[UNDO_TOOL].annotations is not None
    assert listed[UNDO_TOOL].annotations.read_only_hint is True
    assert mcp.input_schema(UNDO_TOOL) == listed[UNDO_TOOL].input_schema
    shown = await call(mcp, {"to_call_id": "call-7"})
    assert not shown.is_error
    text = text_of(shown)
    assert text.startswith("not applied (apply: true undoes): to before call call-7 (exec)")
    assert "-kept [REDACTED]" in text
    assert SECRET not in text
    assert shown.structured_content == {
        "call_id": "call-7", "tool": "exec", "applied": False,
        "added": 0, "removed": 0, "changed": 1,
    }  # fmt: skip
    assert undoer.asked == [("mcp-s1", "call-7", False, "from MCP (ipv4:127.0.0.1:4242)")]
    refused = await call(mcp, {"apply": True})
    assert refused.is_error
    assert 'undo = "show"' in text_of(refused)
    assert len(undoer.asked) == 1  # never asked to apply


async def test_apply_undoes_through_the_one_path(tmp_path: Path) -> None:
    undoer = Undoer()
    mcp = tools(tmp_path, "apply", undoer)
    done = await call(mcp, {"apply": True})
    assert text_of(done).startswith("undone: to before call newest (exec)")
    assert undoer.asked == [("mcp-s1", "", True, "from MCP (ipv4:127.0.0.1:4242)")]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"key": "other-tenant/k"}, "undo takes to_call_id and apply only"),
        ({"to_call_id": "x" * (MAX_CALL_ID + 1)}, "to_call_id must be a string"),
        ({"to_call_id": 7}, "to_call_id must be a string"),
        ({"apply": "yes"}, "apply must be true or false"),
    ],
)
async def test_wrong_arguments_are_refused(
    tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    undoer = Undoer()
    result = await call(tools(tmp_path, "apply", undoer), arguments)
    assert result.is_error
    assert message in text_of(result)
    assert undoer.asked == []


async def test_no_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    result = await call(tools(tmp_path, "apply", Undoer(missing=True)), {})
    assert result.is_error
    assert "no checkpoint before call" in text_of(result)


def test_config_refuses_a_custom_tool_the_undo_tool_would_hide(tmp_path: Path) -> None:
    custom = [{"name": "undo", "description": "d", "command": "true"}]
    with pytest.raises(ConfigError, match="would be hidden"):
        load_config(None, {"state_dir": str(tmp_path), "mcp.undo": "show", "custom_tools": custom})
    with pytest.raises(ConfigError):
        load_config(None, {"state_dir": str(tmp_path), "mcp.undo": "yes"})


# the console


def write(ctx: ConsoleContext, tenant: str, key: str, checkpoint: str, request_id: str) -> int:
    audit = ctx.policy.audit
    assert audit is not None
    audit.record(
        AuditRecord(
            time=time.time(), request_id=request_id, caller="c",
            sandbox_key=scope(tenant, key), agent_id="", provider="", tool="exec",
            arguments_json=json.dumps({"command": "rm -rf src"}), policy_step="allowed",
            checkpoint=checkpoint,
        )
    )  # fmt: skip
    audit.flush()
    return max(int(r["id"]) for r in _records(ctx, tenant))


def _records(ctx: ConsoleContext, tenant: str) -> list[dict[str, Any]]:
    assert ctx.policy.audit is not None
    found = asyncio.run(ctx.policy.audit.query(AuditQuery(tenant=tenant, limit=100)))
    return [{"id": r.id, "request_id": r.request_id} for r in found]


def csrf_of_page(text: str) -> str:
    return text.split('name="csrf" value="', 1)[1].split('"', 1)[0]


def test_the_console_shows_the_undo_then_applies_it_once_confirmed(
    client: TestClient, ctx: ConsoleContext
) -> None:
    undoer = Undoer()
    ctx.undo = undoer
    with_point = write(ctx, "alice", "a1", "~ckpt-1", "call-1")
    without = write(ctx, "alice", "a1", "", "call-2")
    login(client, ALICE)
    assert 'action="/audit/undo"' not in client.get(f"/audit/record?id={without}").text
    record = client.get(f"/audit/record?id={with_point}").text
    assert 'id="undo-show"' in record
    csrf = csrf_of_page(record)
    form = {"csrf": csrf, "id": str(with_point), "tenant": "alice"}
    shown = client.post("/audit/undo", data=form, headers=ORIGIN)
    assert shown.status_code == 200, shown.text
    assert "1 changed to take back" in shown.text
    assert "&lt;b&gt;gone&lt;/b&gt;" in shown.text  # the diff escaped
    assert SECRET not in shown.text  # scrubbed: the key's format
    assert 'id="undo-confirm"' in shown.text
    assert undoer.asked == [(scope("alice", "a1"), "call-1", False, undoer.asked[0][3])]
    done = client.post("/audit/undo", data={**form, "confirmed": "undo"}, headers=ORIGIN)
    assert done.status_code == 200
    assert "Undone." in done.text
    key, call_id, applied, reason = undoer.asked[1]
    assert (key, call_id, applied) == (scope("alice", "a1"), "call-1", True)
    assert reason.startswith("from the console by console:tenant:alice@")


def test_the_console_undo_refuses_forged_foreign_and_pointless_requests(
    client: TestClient, ctx: ConsoleContext
) -> None:
    undoer = Undoer()
    ctx.undo = undoer
    bobs = write(ctx, "bob", "b1", "~ckpt-9", "bob-call")
    mine = write(ctx, "alice", "a1", "", "no-checkpoint")
    login(client, ALICE)
    csrf = csrf_of_page(client.get(f"/audit/record?id={mine}").text)
    form = {"csrf": csrf, "id": str(bobs), "tenant": "bob", "confirmed": "undo"}
    assert client.post("/audit/undo", data=form, headers=ORIGIN).status_code == 404  # not hers
    forged = {**form, "id": str(mine), "csrf": "0" * len(csrf)}
    assert client.post("/audit/undo", data=forged, headers=ORIGIN).status_code == 403
    other_site = {"origin": "http://evil.example"}
    assert (
        client.post("/audit/undo", data={**form, "id": str(mine)}, headers=other_site).status_code
        == 403
    )
    pointless = {**form, "id": str(mine)}
    assert client.post("/audit/undo", data=pointless, headers=ORIGIN).status_code == 404
    assert client.post("/audit/undo", data={**form, "id": "1e9"}, headers=ORIGIN).status_code == 400
    assert undoer.asked == []
    login(client, BOB)  # bob's own: a checkpoint the store no longer holds is a clear 404
    ctx.undo = Undoer(missing=True)
    csrf = csrf_of_page(client.get(f"/audit/record?id={bobs}").text)
    gone = client.post("/audit/undo", data={"csrf": csrf, "id": str(bobs)}, headers=ORIGIN)
    assert gone.status_code == 404
    assert "no checkpoint before call" in gone.text
