"""A second, independent MCP client: examples/mcp-typescript, the official TypeScript MCP SDK
(@modelcontextprotocol/sdk from npm) compiled by tsc, run as a subprocess against the real
`stockade serve`'s MCP endpoint (streamable HTTP, bearer tokens on) on both engines. What it
prints must be what the catalog lists and what the sandbox did, and the audit log must show its
calls with the front "mcp"."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import stockade
from tests.integration.clients_kit import node_example
from tests.integration.harness import Supervisor, free_tcp_address
from tests.integration.test_mcp import serving_mcp

ROOT = Path(__file__).resolve().parents[2]
MCP_TYPESCRIPT = ROOT / "examples" / "mcp-typescript"
RUN_TIMEOUT_S = 240
CONTENT = "written by stockade-example-mcp-typescript\n"

pytestmark = pytest.mark.timeout(600)


@dataclass
class Endpoint:
    sup: Supervisor
    url: str
    token: str
    """Tenant acme's."""


@pytest.fixture(scope="session")
def mcp_typescript() -> list[str]:
    """tsc-compiled from the current sources."""
    return node_example(MCP_TYPESCRIPT, "@modelcontextprotocol/sdk")


@pytest.fixture(scope="module")
def endpoint(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoint]:
    """The MCP endpoint on a free loopback port, with bearer tokens from a tokens file (the
    gRPC API's, on its unix socket, takes the same tokens)."""
    with serving_mcp(engine, tmp_path_factory.mktemp("mcp-ts")) as served:
        yield Endpoint(served.sup, served.url, served.token)


def run(argv: list[str], *args: str, token: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_TOKEN"}
    if token is not None:
        env["STOCKADE_TOKEN"] = token
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env
    )


def lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_lists_the_tools_and_calls_them(mcp_typescript: list[str], endpoint: Endpoint) -> None:
    path = f"notes/ts-{uuid.uuid4().hex[:8]}.txt"
    done = run(mcp_typescript, endpoint.url, path, token=endpoint.token)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    hello, tools, *calls = lines(done.stdout)
    assert hello["server"] == {"name": "stockade", "version": stockade.__version__}
    assert hello["protocol"] == "2025-11-25"  # the SDK's newest, a version with sessions
    session = hello["session"]
    assert re.fullmatch(r"[0-9a-f]{32}", session), session
    with endpoint.sup.client(token=endpoint.token) as grpc_client:
        catalog = [t.name for t in grpc_client.list_tools()]
    assert tools == {"tools": catalog}  # the same tools, in the same order, as gRPC ListTools

    assert [(c["tool"], c["arguments"]) for c in calls] == [
        ("exec", {"command": "echo hi"}),
        ("write_file", {"path": path, "content": CONTENT}),
        ("read_file", {"path": path}),
    ]
    executed, wrote, read = (c["result"] for c in calls)
    assert executed["content"] == [{"type": "text", "text": "hi\n"}]
    assert executed["structuredContent"]["exit_code"] == 0
    assert executed["structuredContent"]["stdout"] == "hi\n"
    assert not any(r.get("isError") for r in (executed, wrote, read))
    assert wrote["structuredContent"]["bytes_written"] == len(CONTENT.encode())
    assert read["structuredContent"]["content"] == CONTENT

    # The calls went through the pipeline into the session's own sandbox, mcp-SESSION in
    # tenant acme: the audit log names the front, and the file is there for a gRPC caller.
    sandbox = f"mcp-{session}"
    with endpoint.sup.client(token=endpoint.token) as grpc_client:
        records = grpc_client.list_audit(sandbox_key=sandbox)
        assert sorted(r.tool for r in records) == ["exec", "read_file", "write_file"]
        assert {(r.front, r.tenant, r.is_error) for r in records} == {("mcp", "acme", False)}
        assert all(r.caller.startswith("ipv4:127.0.0.1:") for r in records)
        there = grpc_client.call(sandbox, "read_file", {"path": path})
    assert there.data["content"] == CONTENT


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789abcdef"], ids=["none", "wrong"])
def test_without_a_valid_token_401(
    mcp_typescript: list[str], endpoint: Endpoint, token: str | None
) -> None:
    marker = f"notes/refused-{uuid.uuid4().hex[:8]}.txt"
    done = run(mcp_typescript, endpoint.url, marker, token=token)
    assert done.returncode == 1, done.stdout
    assert done.stdout == ""  # refused at initialize: no session, no tool listed or called
    assert re.match(r"error: HTTP 401: .*invalid_token", done.stderr), done.stderr
    with endpoint.sup.client(token=endpoint.token) as grpc_client:
        assert [r for r in grpc_client.list_audit(limit=200) if marker in r.arguments_json] == []


def test_a_tool_error_fails_the_client(mcp_typescript: list[str], endpoint: Endpoint) -> None:
    """A path out of the workspace: write_file's result has isError, the client prints it,
    says why on stderr and exits 1 without reading."""
    done = run(mcp_typescript, endpoint.url, "../../etc/stockade-ts", token=endpoint.token)
    assert done.returncode == 1, done.stdout
    assert re.fullmatch(
        r"error: write_file failed: Error \(INVALID_PATH\): .+ leaves the workspace\n", done.stderr
    ), done.stderr
    *_, wrote = lines(done.stdout)
    assert wrote["tool"] == "write_file"
    assert wrote["result"]["isError"] is True


def test_bad_arguments(mcp_typescript: list[str]) -> None:
    assert run(mcp_typescript, token=None).returncode == 2
    done = run(mcp_typescript, "not a url", token=None)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", "error: not a URL: not a url\n")
    done = run(mcp_typescript, f"http://{free_tcp_address()}/mcp", token=None)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("error: "), done.stderr
