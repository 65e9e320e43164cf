"""The MCP front door through the real `stockade serve`, real containers on both engines and
the official MCP SDK's streamable-HTTP client: the tools the catalog lists, calls through the
one pipeline (exec, files, the guard, the scrubber), a sandbox per MCP session, bearer tokens
from the same file as the gRPC API (401 without one), and the audit log naming the front; and
`stockade mcp`, the stdio bridge to the gRPC API, through the SDK's stdio client."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.integration.harness import (
    Supervisor,
    free_tcp_address,
    running_supervisor,
    serving_front,
)

pytestmark = pytest.mark.timeout(300)
FAKE_AWS_KEY = "AKIA" + "Q3EXAMPLE7ZXCVB2"
"""The shape of an AWS access key id (AKIA and 16 upper-case letters and digits); not one."""


@dataclass
class McpSupervisor:
    sup: Supervisor
    url: str
    token: str
    """Tenant acme's."""
    other_token: str
    """Tenant other's."""


@contextmanager
def serving_mcp(engine: str, folder: Path) -> Iterator[McpSupervisor]:
    """A real supervisor with its MCP endpoint on a free loopback port, bearer tokens of two
    tenants (acme, other) from a tokens file in `folder`, which the gRPC API takes too."""
    with serving_front(engine, folder, "mcp") as (sup, address, tokens):
        token, other = tokens
        yield McpSupervisor(sup, f"http://{address}/mcp", token, other)


@pytest.fixture(scope="module")
def mcp_sup(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpSupervisor]:
    with serving_mcp(engine, tmp_path_factory.mktemp("mcp")) as served:
        yield served


@asynccontextmanager
async def connected(
    url: str,
    token: str | None,
    mode: str = "legacy",
    extra_headers: dict[str, str] | None = None,
    **options: Any,
) -> AsyncIterator[Client]:
    """The SDK's streamable-HTTP client with a bearer token (and `extra_headers`): an MCP
    session (the initialize handshake, mode "legacy") unless `mode` says otherwise
    ("2026-07-28": sessionless; "auto": what the server's discover offers). `options`: the
    Client's (callbacks)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    headers.update(extra_headers or {})
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120))
    transport = streamable_http_client(url, http_client=http)
    async with http, Client(transport, mode=mode, **options) as client:
        yield client


def text_of(result: types.CallToolResult) -> str:
    assert len(result.content) == 1
    content = result.content[0]
    assert isinstance(content, types.TextContent)
    return content.text


async def test_tools_calls_and_the_audit(mcp_sup: McpSupervisor) -> None:
    with mcp_sup.sup.client(token=mcp_sup.token) as grpc_client:
        expected = {t.name: t for t in grpc_client.list_tools()}
    name = f"note-{uuid.uuid4().hex[:8]}.txt"
    # a local client's X-Forwarded-For does not replace the peer the audit log records
    spoof = {"X-Forwarded-For": "203.0.113.9"}
    async with connected(mcp_sup.url, mcp_sup.token, extra_headers=spoof) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert set(listed) == set(expected)
        for tool in listed.values():  # what gRPC ListTools gives, word for word
            assert tool.description == expected[tool.name].description
            assert tool.input_schema == expected[tool.name].parameters
        read, run = listed["read_file"].annotations, listed["exec"].annotations
        assert read is not None
        assert run is not None
        assert (read.read_only_hint, read.destructive_hint, read.open_world_hint) == (
            True,
            False,
            False,
        )
        assert (run.read_only_hint, run.destructive_hint, run.open_world_hint) == (
            False,
            True,
            True,
        )

        hi = await client.call_tool("exec", {"command": "echo hi"})
        assert not hi.is_error
        assert text_of(hi) == "hi\n"
        assert hi.structured_content is not None
        assert (hi.structured_content["exit_code"], hi.structured_content["stdout"]) == (0, "hi\n")

        wrote = await client.call_tool("write_file", {"path": name, "content": "from mcp\n"})
        assert not wrote.is_error, text_of(wrote)
        got = await client.call_tool("read_file", {"path": name})
        assert not got.is_error, text_of(got)
        assert "from mcp" in text_of(got)

        failed = await client.call_tool("exec", {"command": "exit 3"})
        assert failed.is_error
        assert text_of(failed).startswith("Error (EXECUTION_FAILED): command exited with code 3")

    async with connected(mcp_sup.url, mcp_sup.token) as other:  # another session, sandbox
        elsewhere = await other.call_tool("read_file", {"path": name})
        assert elsewhere.is_error
        assert "FILE_NOT_FOUND" in text_of(elsewhere)

    with mcp_sup.sup.client(token=mcp_sup.token) as grpc_client:
        records = [r for r in grpc_client.list_audit(limit=50) if r.tool != "housekeeping"]
    ours = [r for r in records if name in r.arguments_json]
    assert {(r.tool, r.front, r.tenant) for r in ours} == {
        ("write_file", "mcp", "acme"),
        ("read_file", "mcp", "acme"),
    }
    keys = {r.sandbox_key for r in ours}
    assert len(keys) == 2  # one per session
    assert all(k.startswith("mcp-") for k in keys)
    where = ["--server", mcp_sup.sup.target, "--token", mcp_sup.token]
    shown = subprocess.run(
        [sys.executable, "-m", "stockade.supervisor.cli", "audit", "--tool", "write_file", *where],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "write_file" in shown
    assert "via mcp" in shown
    # the MCP session's commands run in its shell session "mcp" (docs/mcp.md)
    echo = next(r for r in records if json.loads(r.arguments_json).get("command") == "echo hi")
    assert json.loads(echo.arguments_json).get("session") == "mcp", echo.arguments_json
    assert (echo.front, echo.exit_code, echo.caller.startswith("ipv4:127.0.0.1:")) == (
        "mcp",
        0,
        True,
    )


async def test_guard_and_scrubber_apply(mcp_sup: McpSupervisor) -> None:
    async with connected(mcp_sup.url, mcp_sup.token) as client:
        refused = await client.call_tool("exec", {"command": "rm -rf /"})
        assert refused.is_error
        assert text_of(refused).startswith(
            "Error (PERMISSION_DENIED): command blocked by the guard"
        )

        leaked = await client.call_tool("exec", {"command": f"echo key={FAKE_AWS_KEY}"})
        assert not leaked.is_error, text_of(leaked)
        assert FAKE_AWS_KEY not in text_of(leaked)
        assert "key=" in text_of(leaked)
        assert FAKE_AWS_KEY not in json.dumps(leaked.structured_content)

        unknown = await client.call_tool("no_such_tool", {})
        assert unknown.is_error
        assert text_of(unknown).startswith("Error (NOT_FOUND): unknown tool 'no_such_tool'")
    with mcp_sup.sup.client(token=mcp_sup.token) as grpc_client:
        denied = grpc_client.list_audit(errors_only=True, limit=20)
    rm = next(r for r in denied if "rm -rf /" in r.arguments_json)
    assert (rm.front, rm.error_code, rm.guard_rule) == (
        "mcp",
        "PERMISSION_DENIED",
        "destructive-rm",
    )


async def test_another_tenant_cannot_use_a_session(mcp_sup: McpSupervisor) -> None:
    """Tenant other, with its own valid token and acme's session id, gets 404 (the SDK binds
    a session to the credentials that opened it); acme's sandbox never sees the call."""
    marker = uuid.uuid4().hex
    async with connected(mcp_sup.url, mcp_sup.token) as client:
        await client.call_tool("exec", {"command": f"echo {marker}"})
        with mcp_sup.sup.client(token=mcp_sup.token) as grpc_client:
            mine = [r for r in grpc_client.list_audit(tool="exec") if marker in r.arguments_json]
        session = mine[0].sandbox_key.removeprefix("mcp-")
        body = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "exec", "arguments": {"command": "echo intruder > mine"}},
        }
        headers = {
            "accept": "application/json, text/event-stream",
            "authorization": f"Bearer {mcp_sup.other_token}",
            "mcp-session-id": session,
            "mcp-protocol-version": "2025-11-25",
        }
        async with httpx2.AsyncClient() as http:
            reply = await http.post(mcp_sup.url, json=body, headers=headers)
        assert reply.status_code == 404
        seen = await client.call_tool("list_files", {"path": "."})
        assert "mine" not in json.dumps(seen.structured_content)
    with mcp_sup.sup.client(token=mcp_sup.other_token) as grpc_client:
        assert [
            r for r in grpc_client.list_audit(tool="exec") if "intruder" in r.arguments_json
        ] == []


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789abcdef"], ids=["none", "wrong"])
async def test_without_a_valid_token_401(mcp_sup: McpSupervisor, token: str | None) -> None:
    headers = {"accept": "application/json, text/event-stream"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with httpx2.AsyncClient() as http:
        reply = await http.post(mcp_sup.url, json=body, headers=headers)
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"].startswith("Bearer ")
    assert "tools" not in reply.text
    with pytest.raises(ExceptionGroup) as refused:  # the SDK client does not connect either
        async with connected(mcp_sup.url, token) as client:
            await client.list_tools()
    assert refused.group_contains(MCPError), repr(refused.value)


def bridge_command(*flags: str) -> StdioServerParameters:
    """`stockade mcp FLAGS` as the SDK's stdio client starts it (this tree's package)."""
    env = {k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}
    args = ["-m", "stockade.supervisor.cli", "mcp", *flags]
    return StdioServerParameters(command=sys.executable, args=args, env=env)


async def test_the_stdio_bridge(mcp_sup: McpSupervisor) -> None:
    """`stockade mcp --key K` started by the SDK's stdio client: the same tools and hints,
    calls over gRPC into the sandbox K (its audit records name the front "mcp-stdio")."""
    key = f"bridge-{uuid.uuid4().hex[:8]}"
    bridge = bridge_command("--key", key, "--server", mcp_sup.sup.target, "--token", mcp_sup.token)
    async with Client(bridge) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert "exec" in listed
        assert listed["glob"].annotations is not None
        assert listed["glob"].annotations.read_only_hint is True
        hi = await client.call_tool("exec", {"command": f"echo hi > out && echo {FAKE_AWS_KEY}"})
        assert not hi.is_error, text_of(hi)
        assert FAKE_AWS_KEY not in text_of(hi)
        refused = await client.call_tool("exec", {"command": "rm -rf /"})
        assert text_of(refused).startswith("Error (PERMISSION_DENIED): command blocked")
    with mcp_sup.sup.client(token=mcp_sup.token) as grpc_client:
        assert grpc_client.call(key, "read_file", {"path": "out"}).data["content"] == "hi\n"
        records = grpc_client.list_audit(sandbox_key=key, tool="exec")
    assert {(r.front, r.error_code) for r in records} == {
        ("mcp-stdio", ""),
        ("mcp-stdio", "PERMISSION_DENIED"),
    }


async def test_the_stdio_bridge_with_a_wrong_token(mcp_sup: McpSupervisor) -> None:
    wrong = "wrong-token-0123456789abcdef"
    bridge = bridge_command("--server", mcp_sup.sup.target, "--token", wrong)
    async with Client(bridge) as client:
        refused = await client.call_tool("exec", {"command": "echo hi"})
    assert refused.is_error
    assert text_of(refused).startswith("Error (UNAUTHENTICATED): ")


async def test_without_auth_a_shared_key_and_a_graceful_stop(engine: str) -> None:
    """auth.enabled = false (the harness's default, on loopback) and [mcp] key: two sessions
    share one sandbox, as tenant "". At SIGTERM a call in flight finishes and reaches its
    caller, a new call is refused, and an open (idle) session does not hold the stop."""
    address = free_tcp_address()
    config = f'[mcp]\nlisten = "{address}"\nkey = "shared"\n'
    with running_supervisor(engine, config) as sup:
        url = f"http://{address}/mcp"
        async with connected(url, None) as first, connected(url, None) as second:
            wrote = await first.call_tool("write_file", {"path": "s.txt", "content": "one"})
            assert not wrote.is_error, text_of(wrote)
            read = await second.call_tool("read_file", {"path": "s.txt"})
            assert "one" in text_of(read)
            with sup.client() as grpc_client:
                mine = grpc_client.list_audit(sandbox_key="shared", tool="read_file")
            assert [(r.front, r.tenant) for r in mine] == [("mcp", "")]

            slow = asyncio.create_task(first.call_tool("exec", {"command": "sleep 2; echo slept"}))
            await asyncio.sleep(0.5)
            assert sup.process is not None
            started = time.monotonic()
            sup.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            late = await second.call_tool("exec", {"command": "echo late"})
            assert late.is_error
            assert text_of(late).startswith("Error (SHUTTING_DOWN): ")
            done = await slow
            assert (done.is_error, text_of(done)) == (False, "slept\n")
            await asyncio.to_thread(sup.process.wait, 30)
            assert time.monotonic() - started < 8  # not the 10 s grace: nothing held it


async def test_sessionless_tenants_never_share_a_sandbox(mcp_sup: McpSupervisor) -> None:
    """Without a session, each tenant's calls use its own mcp-default, and a key a call names
    is its own tenant's: the same names never reach another tenant's files."""
    name = f"secret-{uuid.uuid4().hex[:8]}.txt"
    named = {"stockade/sandbox": f"shared-{uuid.uuid4().hex[:8]}"}
    async with connected(mcp_sup.url, mcp_sup.token, "2026-07-28") as acme:
        for meta in (None, named):
            wrote = await acme.call_tool("write_file", {"path": name, "content": "acme"}, meta=meta)
            assert not wrote.is_error, text_of(wrote)
            mine = await acme.call_tool("read_file", {"path": name}, meta=meta)
            assert "acme" in text_of(mine)
    async with connected(mcp_sup.url, mcp_sup.other_token, "2026-07-28") as other:
        for meta in (None, named):
            theirs = await other.call_tool("read_file", {"path": name}, meta=meta)
            assert theirs.is_error
            assert "FILE_NOT_FOUND" in text_of(theirs)
    with mcp_sup.sup.client(token=mcp_sup.other_token) as grpc_client:
        reads = grpc_client.list_audit(tool="read_file")
    keys = {r.sandbox_key for r in reads if name in r.arguments_json}
    assert keys == {"mcp-default", named["stockade/sandbox"]}  # as other named them: its own
