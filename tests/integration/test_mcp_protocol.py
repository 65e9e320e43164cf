"""The MCP endpoint's protocol features through the real `stockade serve` on both engines and
the official MCP SDK's own client: a streamed `exec` as progress notifications (and process
attach; a prompt without a line end arriving while the command waits), the sessionless
2026-07-28 protocol (the sandbox a call names in its `_meta`), a session's own sandbox
released when the session ends, a rate-limit refusal, and each built-in tool called once."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from stockade.supervisor.engines.backends.base import LABEL_KEY
from tests.integration.harness import (
    Supervisor,
    backend,
    free_tcp_address,
    running_supervisor,
    serving_front,
)
from tests.integration.test_mcp import FAKE_AWS_KEY, connected, text_of

pytestmark = pytest.mark.timeout(300)
MODERN = "2026-07-28"
SANDBOX = "stockade/sandbox"
BURST = 12
CONFIG = f"""
[approvals]
mode = "on-miss"
allowlist = ["echo *", "sh -c *", "true", "sleep *", "cat *"]
timeout_s = 60
[limits]
rate_per_s = 0.001
burst = {BURST}
"""
"""Commands outside the allowlist (`touch ...`) need an approval; a key takes BURST calls."""


@dataclass
class Mcp:
    sup: Supervisor
    url: str
    token: str

    def grpc(self) -> Any:
        return self.sup.client(token=self.token)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        where = ["--server", self.sup.target, "--token", self.token]
        command = [sys.executable, "-m", "stockade.supervisor.cli", *args, *where]
        return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def mcp(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mcp]:
    folder = tmp_path_factory.mktemp("mcp")
    with serving_front(engine, folder, "mcp", CONFIG, ("acme",)) as (sup, address, (token,)):
        yield Mcp(sup, f"http://{address}/mcp", token)


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# 1. progress notifications


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_a_streamed_exec_as_progress_notifications(mcp: Mcp, mode: str) -> None:
    """With a progress token (the SDK sends one with a progress callback) each output chunk
    is a notification, with a rising progress and the chunk (scrubbed) as its message, all
    before the result; without one, the same call returns only its result."""
    script = f"for i in 1 2 3; do echo line$i; sleep 0.4; done; echo key={FAKE_AWS_KEY}"
    command = f"sh -c '{script}'"
    seen: list[tuple[float, str | None, bool]] = []
    call: asyncio.Task[types.CallToolResult] | None = None

    async def progress(value: float, total: float | None, message: str | None) -> None:
        assert call is not None
        seen.append((value, message, call.done()))

    meta = {SANDBOX: fresh("progress")}
    async with connected(mcp.url, mcp.token, mode) as client:
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else MODERN)
        call = asyncio.create_task(
            client.call_tool("exec", {"command": command}, progress_callback=progress, meta=meta)
        )
        result = await call
        assert not result.is_error, text_of(result)
        assert text_of(result).startswith("line1\nline2\nline3\nkey=")
        quiet = await client.call_tool("exec", {"command": "echo quiet"}, meta=meta)
        assert text_of(quiet) == "quiet\n"
    assert len(seen) >= 3, seen  # the sleeps part the lines
    assert [v for v, _, _ in seen] == list(range(1, len(seen) + 1))
    assert not any(done for _, _, done in seen)  # each before the result
    streamed = "".join(m or "" for _, m, _ in seen)
    assert streamed.startswith("line1\nline2\nline3\nkey=")
    assert FAKE_AWS_KEY not in streamed
    assert "quiet" not in streamed  # no token, no notifications


GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


async def test_a_prompt_and_one_write_arrive_as_written(mcp: Mcp) -> None:
    """A prompt without a line end reaches the client as a notification while the command
    still waits (the test lets it go on only once it has seen the prompt: held back, the
    command would give up waiting and exit 9); one write of a line and an open end is one
    notification; a token written in two pieces, a pause between, is redacted (issue 28)."""
    script = (
        'printf "name? "; i=0; while [ ! -e go ] && [ $i -lt 1200 ]; do sleep 0.05; '
        'i=$((i+1)); done; [ -e go ] || exit 9; printf "Hello,\\nWorld!"; sleep 0.5; '
        f'printf "token {GITHUB_TOKEN[:9]}"; sleep 0.5; printf "{GITHUB_TOKEN[9:]} done\\n"'
    )
    messages: list[str] = []
    prompted = asyncio.Event()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")
        if "name? " in "".join(messages):
            prompted.set()

    meta = {SANDBOX: fresh("prompt")}
    async with connected(mcp.url, mcp.token, MODERN) as client:
        call = asyncio.create_task(
            client.call_tool(
                "exec", {"command": f"sh -c '{script}'"}, progress_callback=progress, meta=meta
            )
        )
        await asyncio.wait_for(prompted.wait(), 60)
        assert not call.done()
        go = await client.call_tool("exec", {"command": "sh -c 'touch go'"}, meta=meta)
        assert not go.is_error, text_of(go)
        result = await call
    assert not result.is_error, text_of(result)
    assert messages[0] == "name? "
    assert messages[1] == "Hello,\nWorld!", messages
    assert "".join(messages[2:]) == "token [REDACTED] done\n", messages
    assert GITHUB_TOKEN[:9] not in text_of(result)


# 3. the sessionless protocol


async def test_the_sessionless_protocol(mcp: Mcp) -> None:
    """2026-07-28 (also what the SDK's client picks by default, from server/discover): tools,
    exec, a file written by one request and read by another through the sandbox the calls
    name in their `_meta`; a call naming none uses the tenant's mcp-default; the guard."""
    key = fresh("stateless")
    async with connected(mcp.url, mcp.token, "auto") as client:
        assert client.protocol_version == MODERN
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"exec", "read_file", "write_file", "apply_patch"} <= names
        hi = await client.call_tool("exec", {"command": "echo hi"})
        assert (hi.is_error, text_of(hi)) == (False, "hi\n")
        wrote = await client.call_tool(
            "write_file", {"path": "s.txt", "content": "kept\n"}, meta={SANDBOX: key}
        )
        assert not wrote.is_error, text_of(wrote)
        refused = await client.call_tool("exec", {"command": "rm -rf /"}, meta={SANDBOX: key})
        assert text_of(refused).startswith("Error (PERMISSION_DENIED): command blocked")
        bad = await client.call_tool("exec", {"command": "true"}, meta={SANDBOX: 5})
        assert text_of(bad).startswith("Error (INVALID_REQUEST): _meta['stockade/sandbox']")
    async with connected(mcp.url, mcp.token, MODERN) as again:  # another client, no session
        read = await again.call_tool("read_file", {"path": "s.txt"}, meta={SANDBOX: key})
        assert not read.is_error, text_of(read)
        assert "kept" in text_of(read)
        elsewhere = await again.call_tool("read_file", {"path": "s.txt"})
        assert "FILE_NOT_FOUND" in text_of(elsewhere)
    with mcp.grpc() as grpc_client:
        mine = grpc_client.list_audit(sandbox_key=key)
        default = grpc_client.list_audit(sandbox_key="mcp-default", tool="exec")
    assert {(r.tool, r.front, r.tenant) for r in mine} == {
        ("write_file", "mcp", "acme"),
        ("exec", "mcp", "acme"),
        ("read_file", "mcp", "acme"),
    }
    assert any(json.loads(r.arguments_json) == {"command": "echo hi"} for r in default)


# 4. an ended session releases its sandbox


async def test_an_ended_session_releases_its_own_sandbox(mcp: Mcp) -> None:
    """A session's own sandbox loses its container when the client ends the session (the
    workspace stays, for housekeeping's retention); a sandbox it named is kept running."""
    named = fresh("kept")
    async with connected(mcp.url, mcp.token) as client:
        marker = fresh("marker")
        await client.call_tool("exec", {"command": f"echo {marker}"})
        await client.call_tool("exec", {"command": "echo named"}, meta={SANDBOX: named})
        with mcp.grpc() as grpc_client:
            [record] = [
                r for r in grpc_client.list_audit(tool="exec") if marker in r.arguments_json
            ]
            own = record.sandbox_key
            assert own.startswith("mcp-")
            assert grpc_client.get_sandbox(own).state == "RUNNING"
    with mcp.grpc() as grpc_client:
        deadline = time.monotonic() + 60
        while not (events := grpc_client.list_audit(sandbox_key=own, tool="destroy_sandbox")):
            assert time.monotonic() < deadline, "the session's sandbox was not released"
            await asyncio.sleep(0.1)
        assert [(r.front, r.is_error) for r in events] == [("mcp", False)]
        assert json.loads(events[0].arguments_json)["as"] == "its MCP session ended"
        assert not grpc_client.list_audit(sandbox_key=own, tool="housekeeping")
        listed = {s.key: s.state for s in grpc_client.list_sandboxes()}
        assert listed[own] == "ABSENT"  # no container; the workspace is kept
        assert listed[named] == "RUNNING"


# 5. a rate limit, and every built-in tool


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_a_rate_limit_refusal(mcp: Mcp, mode: str) -> None:
    key = fresh("rate")
    async with connected(mcp.url, mcp.token, mode) as client:
        for _ in range(BURST):
            ok = await client.call_tool("exec", {"command": "true"}, meta={SANDBOX: key})
            assert not ok.is_error, text_of(ok)
        refused = await client.call_tool("exec", {"command": "true"}, meta={SANDBOX: key})
    assert refused.is_error
    assert text_of(refused).startswith("Error (RATE_LIMITED): ")
    with mcp.grpc() as grpc_client:
        records = grpc_client.list_audit(sandbox_key=key, errors_only=True)
    assert [(r.error_code, r.front) for r in records] == [("RATE_LIMITED", "mcp")]


PATCH = """*** Begin Patch
*** Update File: notes.txt
@@
-two
+TWO
*** End Patch
"""


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_each_built_in_tool(mcp: Mcp, mode: str) -> None:
    key = {SANDBOX: fresh("tools")}
    async with connected(mcp.url, mcp.token, mode) as client:
        await each_built_in_tool(client, key)


async def each_built_in_tool(client: Client, meta: dict[str, Any] | None = None) -> None:
    """Every built-in tool once, through `client` (with `meta`), each checked."""

    async def call(tool: str, **args: Any) -> types.CallToolResult:
        result = await client.call_tool(tool, args, meta=meta)
        assert not result.is_error, f"{tool}: {text_of(result)}"
        return result

    await call("write_file", path="notes.txt", content="one\ntwo\nthree\n")
    await call("edit_file", path="notes.txt", old_text="one", new_text="ONE")
    await call("apply_patch", input=PATCH)
    read = await call("read_file", path="notes.txt")
    assert "ONE" in text_of(read)
    assert "TWO" in text_of(read)
    assert "three" in text_of(read)
    listed = await call("list_files", path=".")
    assert "notes.txt" in json.dumps(listed.structured_content)
    found = await call("glob", pattern="*.txt")
    assert "notes.txt" in json.dumps(found.structured_content)
    searched = await call("search", pattern="TWO")
    assert "notes.txt" in text_of(searched)
    ran = await call("exec", command="cat notes.txt")
    assert text_of(ran) == "ONE\nTWO\nthree\n"
    await call("process", action="start", command="sleep 30")
    shown = await call("process", action="list")
    assert "sleep 30" in text_of(shown)


async def test_a_stop_releases_the_open_sessions_sandboxes(engine: str) -> None:
    """At SIGTERM the open sessions end, and their own sandboxes with them (containers that
    would otherwise be left for the next start to adopt, for sessions that no longer exist);
    a shared key's container is kept, as at any stop."""
    address = free_tcp_address()
    with running_supervisor(engine, f'[mcp]\nlisten = "{address}"\n') as sup:
        url = f"http://{address}/mcp"
        async with connected(url, None) as client:
            marker = fresh("marker")
            await client.call_tool("exec", {"command": f"echo {marker}"})
            await client.call_tool("exec", {"command": "true"}, meta={SANDBOX: "shared"})
            with sup.client() as grpc_client:
                [record] = [
                    r for r in grpc_client.list_audit(tool="exec") if marker in r.arguments_json
                ]
            own = record.sandbox_key
            engine_ = backend(engine)
            assert [c.running for c in engine_.list({LABEL_KEY: own})] == [True]
            assert sup.process is not None
            sup.process.send_signal(signal.SIGTERM)
            await asyncio.to_thread(sup.process.wait, 60)
        assert engine_.list({LABEL_KEY: own}) == []
        assert [c.running for c in engine_.list({LABEL_KEY: "shared"})] == [True]


async def test_process_attach_as_progress_notifications(mcp: Mcp) -> None:
    """`process` attach streams as exec does; its result's text holds the output before the
    process's summary (with or without a progress token: a unary attach does not exist)."""
    key = {SANDBOX: fresh("attach")}
    messages: list[str] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    script = f"for i in 1 2 3; do echo tick $i; sleep 0.3; done; echo {FAKE_AWS_KEY}"
    async with connected(mcp.url, mcp.token, MODERN) as client:
        started = await client.call_tool(
            "process", {"action": "start", "command": f"sh -c '{script}'"}, meta=key
        )
        assert started.structured_content is not None, text_of(started)
        attach = {"action": "attach", "id": started.structured_content["id"]}
        result = await client.call_tool("process", attach, progress_callback=progress, meta=key)
        again = await client.call_tool("process", attach, meta=key)
    assert "".join(messages).startswith("tick 1\ntick 2\ntick 3\n")
    assert len(messages) >= 3
    for followed in (result, again):
        assert not followed.is_error, text_of(followed)
        text = text_of(followed)
        assert text.startswith("tick 1\ntick 2\ntick 3\n")
        assert text.endswith("\n[REDACTED]\nProcess p1: exited, exit code 0, 42 bytes output")
        assert FAKE_AWS_KEY not in text
        assert followed.structured_content is not None
        assert followed.structured_content["state"] == "exited"
    assert FAKE_AWS_KEY not in "".join(messages)


async def test_an_idle_session_ends_and_releases_its_sandbox(engine: str) -> None:
    """A client that leaves without ending its session (no DELETE): the session idles out
    after mcp.session_idle_timeout_s, and its own sandbox is released as at a DELETE."""
    address = free_tcp_address()
    config = f'[mcp]\nlisten = "{address}"\nsession_idle_timeout_s = 2\n'
    with running_supervisor(engine, config) as sup:
        url = f"http://{address}/mcp"
        http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120))
        transport = streamable_http_client(url, http_client=http, terminate_on_close=False)
        marker = fresh("marker")
        async with http, Client(transport, mode="legacy") as client:
            await client.call_tool("exec", {"command": f"echo {marker}"})
        with sup.client() as grpc_client:
            [record] = [
                r for r in grpc_client.list_audit(tool="exec") if marker in r.arguments_json
            ]
            own = record.sandbox_key
            deadline = time.monotonic() + 60
            while not (events := grpc_client.list_audit(sandbox_key=own, tool="destroy_sandbox")):
                assert time.monotonic() < deadline, "the idle session's sandbox was not released"
                await asyncio.sleep(0.2)
            assert [(r.front, r.is_error) for r in events] == [("mcp", False)]
            assert grpc_client.get_sandbox(own).state == "ABSENT"
