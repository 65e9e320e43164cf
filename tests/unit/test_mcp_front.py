"""The MCP front's conversions (catalog tools with their annotations, results, calls and
their sandbox keys), its [mcp] config checks, its token verifier over the gRPC API's token
table, and the audit log's front column. Served for real in tests/integration/test_mcp.py."""

from __future__ import annotations

import json
import socket
import sqlite3
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.requests import Request

from stockade.supervisor import errors
from stockade.supervisor.app import build_policy
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.calls.outcome import failure
from stockade.supervisor.config import AuthConfig, CustomToolConfig, load_config
from stockade.supervisor.errors import ConfigError, InvalidRequest, QuotaExceeded, Unauthenticated
from stockade.supervisor.fronts.grpc.convert import front_from_pb, tool_to_pb
from stockade.supervisor.fronts.mcp.convert import (
    DEFAULT_KEY,
    SANDBOX_META,
    Caller,
    annotations_of,
    call_from_mcp,
    own_session,
    refusal_to_mcp,
    result_to_mcp,
    sandbox_key,
    sandbox_of,
    tool_to_mcp,
)
from stockade.supervisor.fronts.mcp.handlers import Gathered, McpTools
from stockade.supervisor.fronts.mcp.server import McpFront, TokenTenants, build_app
from stockade.supervisor.keys import scope
from stockade.supervisor.models import CallContext, ErrorCode, ToolResult
from stockade.supervisor.observe.audit import AuditLog, AuditQuery, AuditRecord
from stockade.supervisor.tools.catalog import Catalog
from stockade.supervisor.tools.schemas import SchemaFormat
from tests.unit.fakes import audit_record, idle_pipeline, mcp_front_in_process, refused_config

CATALOG = Catalog([CustomToolConfig(name="deploy", description="Deploy.", command="make deploy")])
HINTS = {  # read-only, destructive, idempotent, open world
    "read_file": (True, False, True, False),
    "list_files": (True, False, True, False),
    "glob": (True, False, True, False),
    "search": (True, False, True, False),
    "write_file": (False, True, True, False),
    "edit_file": (False, True, False, False),
    "apply_patch": (False, True, False, False),
    "exec": (False, True, False, True),
    "process": (False, True, False, True),
    "deploy": (False, True, False, True),
}


def test_every_catalog_tool_has_the_annotations_chosen_for_it() -> None:
    assert set(HINTS) == set(CATALOG.tools)  # a new tool must be given its hints here
    for name, spec in CATALOG.tools.items():
        a = annotations_of(spec)
        got = (a.read_only_hint, a.destructive_hint, a.idempotent_hint, a.open_world_hint)
        assert got == HINTS[name], name


def test_a_tool_is_what_grpc_list_tools_gives() -> None:
    for spec in CATALOG.tools.values():
        ours = tool_to_mcp(spec)
        theirs = tool_to_pb(spec, SchemaFormat.JSON_SCHEMA, ())
        assert (ours.name, ours.description) == (theirs.name, theirs.description)
        assert ours.input_schema == json.loads(theirs.parameters_json_schema)
        wire = ours.model_dump(by_alias=True, exclude_none=True)
        assert set(wire["annotations"]) == {
            "readOnlyHint",
            "destructiveHint",
            "idempotentHint",
            "openWorldHint",
        }


def test_results_as_mcp_content() -> None:
    ok = ToolResult(for_llm="hi\n", for_user="hi\n", data={"exit_code": 0, "stdout": "hi\n"})
    converted = result_to_mcp(ok)
    assert (converted.content[0].text, converted.is_error) == ("hi\n", False)  # type: ignore[union-attr]
    assert converted.structured_content == {"exit_code": 0, "stdout": "hi\n"}

    refused = result_to_mcp(failure(ErrorCode.PERMISSION_DENIED, "blocked"))
    assert refused.is_error
    assert refused.structured_content is None
    assert refused.content[0].text == "Error (PERMISSION_DENIED): blocked"  # type: ignore[union-attr]

    exited = ToolResult(
        for_llm="exit code 3\nboom",
        for_user="",
        is_error=True,
        error_code=ErrorCode.EXECUTION_FAILED,
        error_message="command exited with code 3",
        data={"exit_code": 3, "name": "bad\udcff"},
    )
    text = result_to_mcp(exited).content[0].text  # type: ignore[union-attr]
    assert text == "Error (EXECUTION_FAILED): command exited with code 3\nexit code 3\nboom"
    assert result_to_mcp(exited).structured_content == {"exit_code": 3, "name": "bad?"}

    quota = refusal_to_mcp(QuotaExceeded("tenant acme has 2 sandboxes"))
    assert quota.is_error
    assert quota.content[0].text == "Error (QUOTA_EXCEEDED): tenant acme has 2 sandboxes"  # type: ignore[union-attr]


def test_the_sandbox_key_per_session_shared_and_scoped() -> None:
    session = Caller(tenant="acme", session_id="abc123")
    assert sandbox_key(session, "") == scope("acme", "mcp-abc123")
    assert sandbox_key(session, "team") == scope("acme", "team")
    assert sandbox_key(Caller(tenant="", session_id=None), "team") == "team"
    other = Caller(tenant="other", session_id="abc123")
    assert sandbox_key(other, "") != sandbox_key(session, "")
    # sessionless (2026-07-28): the configured key, else the tenant's default
    sessionless = Caller(tenant="acme", session_id=None)
    assert DEFAULT_KEY == "mcp-default"
    assert sandbox_key(sessionless, "") == scope("acme", DEFAULT_KEY)
    assert sandbox_key(sessionless, "team") == scope("acme", "team")
    # a key named in _meta wins over both, with or without a session, within the tenant
    named = Caller(tenant="acme", session_id="abc123", sandbox="work")
    assert sandbox_key(named, "team") == scope("acme", "work")
    assert sandbox_key(replace(named, session_id=None), "") == scope("acme", "work")
    assert sandbox_key(replace(named, tenant="other"), "") == scope("other", "work")
    # only a session's own key is released with the session
    assert own_session(session, "") == "abc123"
    assert own_session(session, "team") is None
    assert own_session(named, "") is None
    assert own_session(sessionless, "") is None
    with pytest.raises(InvalidRequest, match="sandbox key is"):
        sandbox_key(Caller(tenant="acme", session_id="x" * 300), "")
    with pytest.raises(InvalidRequest, match="NUL"):
        sandbox_key(replace(sessionless, sandbox="a\x00b"), "")


def test_the_sandbox_a_request_names_in_its_meta() -> None:
    assert sandbox_of(None) == sandbox_of({}) == sandbox_of({"progress_token": 1}) == ""
    assert sandbox_of({SANDBOX_META: "work"}) == "work"
    for wrong in ("", 5, None, ["work"]):
        with pytest.raises(InvalidRequest, match="must be a sandbox key"):
            sandbox_of({SANDBOX_META: wrong})


def test_a_call_is_the_domain_call_of_the_grpc_front() -> None:
    caller = Caller(tenant="acme", session_id="s1", peer="ipv4:127.0.0.1:5", traceparent="tp")
    call = call_from_mcp("exec", {"command": "echo hi"}, caller, "")
    assert (call.tool, json.loads(call.arguments_json)) == ("exec", {"command": "echo hi"})
    assert (call.sandbox_key, call.front, call.traceparent) == (
        scope("acme", "mcp-s1"),
        "mcp",
        "tp",
    )
    assert call_from_mcp("glob", None, caller, "").arguments_json == "{}"
    assert (
        call_from_mcp("glob", None, Caller("a", "s", traceparent="x" * 200), "").traceparent == ""
    )
    with pytest.raises(InvalidRequest, match="not a JSON object"):
        call_from_mcp("exec", {"timeout": float("nan")}, caller, "")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[mcp]\nlisten = '0.0.0.0:50052'\n", "mcp.listen must be a loopback address"),
        ("[mcp]\nlisten = 'example.com:50052'\n", "mcp.listen must be a loopback address"),
        ("[mcp]\nlisten = '127.0.0.1'\n", "mcp.listen must be host:port"),
        ("[mcp]\npath = 'mcp'\n", "mcp.path must be an absolute URL path"),
        ("[mcp]\npath = '/a/../b'\n", "mcp.path must be an absolute URL path"),
        ("[mcp]\npath = '/a b'\n", "mcp.path must be an absolute URL path"),
        ('[mcp]\nkey = "a\\u0000b"\n', "mcp.key: sandbox key contains a NUL"),
        ("[mcp]\nport = 5\n", "unknown key(s) in [mcp]: port"),
        ("[mcp]\nsession_idle_timeout_s = 0\n", "mcp.session_idle_timeout_s must be a positive"),
        ("[mcp]\nsession_idle_timeout_s = nan\n", "mcp.session_idle_timeout_s must be a posit"),
    ],
)
def test_mcp_config_refused(tmp_path: Path, text: str, message: str) -> None:
    assert message in refused_config(tmp_path, text)


def test_mcp_config_accepted(tmp_path: Path) -> None:
    assert load_config().mcp.listen == ""  # off by default
    path = tmp_path / "c.toml"
    path.write_text(
        "[mcp]\nlisten = '[::1]:0'\npath = '/v1/mcp'\nkey = 'shared'\nsession_idle_timeout_s = 5\n"
    )
    mcp = load_config(path).mcp
    assert (mcp.listen, mcp.path, mcp.key) == ("[::1]:0", "/v1/mcp", "shared")
    assert mcp.session_idle_timeout_s == 5.0
    assert load_config().mcp.session_idle_timeout_s == 1800.0


async def test_the_token_verifier_is_the_grpc_token_table(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("a" * 32 + " acme\n")
    tokens.chmod(0o600)
    verifier = TokenTenants(Authenticator(AuthConfig(tokens_file=str(tokens))))
    found = await verifier.verify_token("a" * 32)
    assert found is not None
    assert (found.client_id, found.token) == ("acme", "")  # the tenant; the token not kept
    assert await verifier.verify_token("b" * 32) is None
    assert await verifier.verify_token("") is None


def _record(**kw: object) -> AuditRecord:
    return audit_record(**{"agent_id": "", "provider": "", **kw})


async def test_the_audit_log_keeps_the_front_and_migrates_older_files(tmp_path: Path) -> None:
    path = tmp_path / "db"
    log = AuditLog(path)
    log.close()
    db = sqlite3.connect(path)  # a file of the version before the front column
    db.executescript("DROP INDEX IF EXISTS audit_tenant_time; ALTER TABLE audit DROP COLUMN front;")
    db.execute(
        "INSERT INTO audit (time, request_id, caller, sandbox_key, agent_id, provider, tool,"
        " arguments_json, policy_step, guard_rule, approval, approver, duration_ms, exit_code,"
        " output_bytes, redactions, error_code, is_error) VALUES"
        " (1.0, 'old', '', 'k', '', '', 'exec', '{}', 'allowed', '', '', '', 0, 0, 0, 0, '', 0)"
    )
    db.commit()
    db.close()
    log = AuditLog(path)
    log.record(_record(request_id="new", front="mcp"))
    found = {r.request_id: r.front for r in await log.query(AuditQuery())}
    log.close()
    assert found == {"old": "", "new": "mcp"}


def _context(headers: dict[str, str], version: str, user: object = None) -> Any:
    scope = {
        "type": "http",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 4242),
        "user": user,
    }
    return SimpleNamespace(request=Request(scope), protocol_version=version)


def test_the_caller_of_a_request(tmp_path: Path) -> None:
    config = load_config(None, {"state_dir": str(tmp_path)})
    policy = build_policy(config)
    pipeline = idle_pipeline(config, policy)  # the caller is all this test asks
    tools = McpTools(config, pipeline, policy, authenticated=True)
    user = AuthenticatedUser(AccessToken(token="", client_id="acme", scopes=[]))
    headers = {"mcp-session-id": "s1", "traceparent": "tp"}
    caller = tools.caller(_context(headers, "2025-11-25", user))
    assert caller == Caller("acme", "s1", "ipv4:127.0.0.1:4242", "tp")
    # a sessionless (2026-07-28) request's session header was never checked: it is ignored
    assert tools.caller(_context(headers, "2026-07-28", user)).session_id is None
    with pytest.raises(Unauthenticated):  # auth on: never served as tenant ""
        tools.caller(_context(headers, "2025-11-25"))
    open_tools = McpTools(config, pipeline, policy, authenticated=False)
    assert open_tools.caller(_context(headers, "2025-11-25")).tenant == ""


async def test_the_endpoint_in_process(tmp_path: Path) -> None:
    """The endpoint on a free loopback port without an engine: 401 without a token, TCP_NODELAY
    on its connections, 421 for a Host that is not this one (DNS rebinding), tools/list
    through the SDK's client; a port already taken is a ConfigError naming it."""
    tokens = tmp_path / "tokens"
    tokens.write_text("t" * 32 + " acme\n")
    tokens.chmod(0o600)
    config = load_config(
        None,
        {"state_dir": str(tmp_path), "mcp.listen": "127.0.0.1:0", "auth.tokens_file": str(tokens)},
    )
    policy = build_policy(config)
    authenticator = Authenticator(config.auth)
    pipeline = idle_pipeline(config, policy)
    front = McpFront(build_app(config, pipeline, policy, authenticator), config.mcp.listen)
    await front.start()
    url = f"http://127.0.0.1:{front.port}/mcp"
    try:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        accept = {"accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient() as http:
            anonymous = await http.post(url, json=body, headers=accept)
            assert anonymous.status_code == 401
            assert anonymous.headers["www-authenticate"].startswith("Bearer ")
            # the kept-alive connection sends without Nagle's wait for the client's ACK
            connections = front._server.server_state.connections
            sockets = [c.transport.get_extra_info("socket") for c in connections]
            assert sockets
            assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets)
            rebound = await http.post(
                url,
                json=body,
                headers={**accept, "authorization": "Bearer " + "t" * 32, "host": "evil.example"},
            )
            assert rebound.status_code == 421
        http = httpx2.AsyncClient(headers={"authorization": "Bearer " + "t" * 32})
        async with http, Client(streamable_http_client(url, http_client=http)) as client:
            names = [t.name for t in (await client.list_tools()).tools]
        assert names == [t.name for t in policy.tools.allowed_tools(CallContext())]
        with pytest.raises(ConfigError, match=r"cannot serve MCP on 127\.0\.0\.1:"):
            McpFront(build_app(config, pipeline, policy, None), f"127.0.0.1:{front.port}")
    finally:
        await front.stop(1)
        if policy.audit is not None:
            policy.audit.close()


def test_gathered_output_stays_within_its_cap() -> None:
    nothing = Gathered(0)
    nothing.add("x" * 100)
    assert nothing.text == ""
    small = Gathered(1000)
    small.add("a\n")
    small.add("b\n")
    assert small.text == "a\nb\n"
    big = Gathered(200)
    for i in range(1000):
        big.add(f"line {i:04d}\n")
        assert len(big._parts) <= 2 * 200  # compacted as it grows
    text = big.text
    assert len(text.encode()) <= 200
    assert text.startswith("line 0000\n")
    assert text.endswith("line 0999\n")
    assert "bytes omitted" in text


def test_a_grpc_caller_names_only_the_stdio_bridges_front() -> None:
    """CallToolRequest.front: "" is grpc, "mcp-stdio" the bridge; nothing else is taken
    (not the HTTP endpoint's "mcp", not "grpc" spelt out, not a free text)."""
    assert front_from_pb("") == "grpc"
    assert front_from_pb("mcp-stdio") == "mcp-stdio"
    for front in ("mcp", "grpc", "MCP-STDIO", "mcp-stdio ", "x" * 1000):
        with pytest.raises(errors.InvalidRequest, match="front must be empty or one of"):
            front_from_pb(front)


def test_the_input_schema_is_the_listed_one(tmp_path: Path) -> None:
    """What the SDK checks a sessionless call's Mcp-Param-* headers against: the inputSchema
    tools/list gives the tool; None for a name tools/list does not give (unknown, an alias,
    a tool the policy denies)."""
    config = load_config(None, {"state_dir": str(tmp_path), "tools.deny": ["process"]})
    policy = build_policy(config)
    tools = McpTools(config, idle_pipeline(config, policy), policy, authenticated=False)
    listed = [tool_to_mcp(spec) for spec in policy.tools.allowed_tools(CallContext())]
    assert "exec" in [tool.name for tool in listed]
    for tool in listed:
        assert tools.input_schema(tool.name) == tool.input_schema
    for unlisted in ("process", "exec_shell", "nope"):
        assert tools.input_schema(unlisted) is None


async def test_a_sessionless_call_runs_no_tools_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint gives the SDK its input schemas (Server's get_tool_input_schema): the
    SDK ran a whole tools/list for every sessionless call with arguments without it."""
    listed: list[str] = []
    looked_up: list[str] = []
    list_tools, input_schema = McpTools.list_tools, McpTools.input_schema

    async def counted(self: McpTools, ctx: Any, params: Any) -> Any:
        listed.append("tools/list")
        return await list_tools(self, ctx, params)

    def recorded(self: McpTools, name: str) -> Any:
        looked_up.append(name)
        return input_schema(self, name)

    monkeypatch.setattr(McpTools, "list_tools", counted)
    monkeypatch.setattr(McpTools, "input_schema", recorded)
    async with mcp_front_in_process(tmp_path) as (front, endpoint):
        endpoint.tools.draining = True  # a call is refused before the pipeline: none here
        url = f"http://127.0.0.1:{front.port}/mcp"
        http = httpx2.AsyncClient()
        async with http, Client(streamable_http_client(url, http_client=http)) as client:
            assert client.protocol_version == "2026-07-28"
            await client.list_tools()
            assert listed == ["tools/list"]
            result = await client.call_tool("exec", {"command": "true"})
        assert result.is_error
        assert "SHUTTING_DOWN" in result.content[0].text  # type: ignore[union-attr]
        assert listed == ["tools/list"]  # the client's own, none for the call
        assert looked_up == ["exec"]
