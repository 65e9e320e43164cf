"""Per-tenant caps (issue 26): streams and file watches (every front, in HostPolicy), MCP
sessions, E2B sandboxes and their metadata. Each: past the cap a clear refusal naming the
setting, audited; another tenant's at the same moment unaffected; room again once one ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from stockade.supervisor import errors
from stockade.supervisor.app import build_policy
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.calls.pipeline import Sandboxes, ToolPipeline
from stockade.supervisor.calls.streaming import AgentEvent
from stockade.supervisor.calls.watching import FileWatches, Started, Watch, WatchSandboxes
from stockade.supervisor.config import AuthConfig, Config, HttpConfig, LimitsConfig, load_config
from stockade.supervisor.fronts.e2b.context import E2bContext
from stockade.supervisor.fronts.e2b.records import Records
from stockade.supervisor.fronts.e2b.server import build_app as build_e2b
from stockade.supervisor.fronts.mcp.server import McpFront
from stockade.supervisor.fronts.mcp.server import build_app as build_mcp
from stockade.supervisor.keys import scope
from stockade.supervisor.models import CallContext, ErrorCode, ResultEvent, ToolCall
from stockade.supervisor.observe.audit import AuditQuery
from stockade.supervisor.observe.refusals import CAP_TOOL, Refusals
from stockade.supervisor.policy.limits import TenantSlots
from stockade.supervisor.sandboxes.agent_link import (
    AgentReply,
    AgentStarted,
    AgentWatchEvent,
    AgentWatchStarted,
)
from stockade.supervisor.sandboxes.lease import Deadline
from tests.unit.fakes import STATE, Audited, e2b_context, idle_pipeline

pytestmark = [pytest.mark.usefixtures("state_dir"), pytest.mark.timeout(60)]
A, B = scope("acme", "k"), scope("bravo", "k")


def test_slots_count_each_tenant_apart() -> None:
    slots = TenantSlots(2, "streams", "limits.max_streams_per_tenant")
    with slots.hold(A), slots.hold(scope("acme", "other")):
        with pytest.raises(errors.QuotaExceeded) as refused, slots.hold(A):
            pass
        assert "'acme' has 2 streams open" in str(refused.value)
        assert "limits.max_streams_per_tenant = 2" in str(refused.value)
        with slots.hold(B), slots.hold(B):  # another tenant: its own two
            assert (slots.held("acme"), slots.held("bravo")) == (2, 2)
    assert (slots.held("acme"), slots.held("bravo")) == (0, 0)
    with TenantSlots(0, "streams", "x").hold(A):  # 0: no limit
        pass


class Gated:
    """A sandbox manager whose streamed calls and watches stay open until `gate` is set; its
    lease is itself (as the pipeline and the watches see a lease: CallLease, WatchLease)."""

    generation = "gated"
    """Which container serves the key (CallLease): always the one."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    @contextlib.asynccontextmanager
    async def _held(self) -> AsyncIterator[Gated]:
        yield self

    def lease(self, key: str, /) -> contextlib.AbstractAsyncContextManager[Gated]:
        return self._held()

    async def invoke(
        self,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        request_id: str,
        /,
        *,
        deadline: Deadline = "caller",
    ) -> AgentReply:
        raise NotImplementedError("only streamed calls here")

    async def stream(
        self,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        request_id: str,
        /,
        *,
        deadline: Deadline = "caller",
    ) -> AsyncIterator[AgentEvent]:
        yield AgentStarted(7)
        await self.gate.wait()
        yield AgentReply("", "", {"exit_code": 0, "stdout": "", "stderr": ""})

    async def watch_files(self, path: str, recursive: bool, /) -> AsyncIterator[AgentWatchEvent]:
        yield AgentWatchStarted(path)
        await self.gate.wait()
        yield AgentReply("", "", {})


def _fits(gated: Gated) -> tuple[Sandboxes, WatchSandboxes]:
    """Type-checked only: mypy says here when the fake no longer fits the protocols."""
    return gated, gated


def capped(**limits: int) -> tuple[Config, Any]:
    config = Config(state_dir=STATE[-1], limits=LimitsConfig(**limits))
    return config, build_policy(config)


async def test_streams_past_a_tenants_cap_are_refused_and_audited() -> None:
    config, policy = capped(max_streams_per_tenant=1)
    sandboxes = Gated()
    pipe = ToolPipeline(config, sandboxes, policy)
    exec_true = json.dumps({"command": "true"})
    first = pipe.call_stream(ToolCall(A, "exec", exec_true))
    assert not isinstance(await anext(first), ResultEvent)  # open, its process started
    refused = [e async for e in pipe.call_stream(ToolCall(A, "exec", exec_true))]
    assert len(refused) == 1
    assert isinstance(refused[0], ResultEvent)
    result = refused[0].result
    assert result.error_code == ErrorCode.RATE_LIMITED
    assert "limits.max_streams_per_tenant = 1" in result.error_message
    other = pipe.call_stream(ToolCall(B, "exec", exec_true))  # another tenant, meanwhile
    assert not isinstance(await anext(other), ResultEvent)
    sandboxes.gate.set()
    ends = [[e async for e in s] for s in (first, other)]
    assert all(not e[-1].result.is_error for e in ends if isinstance(e[-1], ResultEvent))
    again = [e async for e in pipe.call_stream(ToolCall(A, "exec", exec_true))]
    assert isinstance(again[-1], ResultEvent)
    assert not again[-1].result.is_error  # room again
    assert policy.audit is not None
    steps = [r.policy_step for r in await policy.audit.query(AuditQuery(tenant="acme", limit=20))]
    assert steps.count("limits.max_streams_per_tenant") == 1


async def test_watches_past_a_tenants_cap_are_refused_and_audited() -> None:
    _config, policy = capped(max_watches_per_tenant=1)
    sandboxes = Gated()
    watches = FileWatches(sandboxes, policy)

    def watch(key: str) -> Any:
        return watches.watch(Watch(key, ".", False, CallContext(), "test", "e2b"))

    first = watch(A)
    assert isinstance(await anext(first), Started)
    with pytest.raises(errors.QuotaExceeded, match=r"limits\.max_watches_per_tenant = 1"):
        await anext(watch(A))
    other = watch(B)  # another tenant, meanwhile
    assert isinstance(await anext(other), Started)
    await first.aclose()
    again = watch(A)
    assert isinstance(await anext(again), Started)
    for open_one in (other, again):
        await open_one.aclose()
    assert policy.audit is not None
    refused = [
        r for r in await policy.audit.query(AuditQuery(tenant="acme", limit=20)) if r.is_error
    ]
    assert [(r.policy_step, r.error_code, r.front) for r in refused] == [
        ("limits.max_watches_per_tenant", "QUOTA_EXCEEDED", "e2b")
    ]


def tokens(tmp_path: Path) -> Authenticator:
    path = tmp_path / "tokens"
    path.write_text("token-of-acme-0123456789 acme\ntoken-of-bravo-0123456789 bravo\n")
    path.chmod(0o600)
    return Authenticator(AuthConfig(enabled=True, tokens_file=str(path)))


INIT = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "t", "version": "1"}},
}  # fmt: skip


@contextlib.asynccontextmanager
async def mcp_front(
    tmp_path: Path, cap: int, refusals: Refusals | None = None, http: HttpConfig | None = None
) -> AsyncIterator[tuple[str, McpFront, Any]]:
    config = load_config(
        None,
        {"state_dir": str(tmp_path), "mcp.listen": "127.0.0.1:0",
         "mcp.max_sessions_per_tenant": cap},
    )  # fmt: skip
    policy = build_policy(config)
    if refusals is not None:
        policy = replace(policy, refusals=refusals)
    endpoint = build_mcp(config, idle_pipeline(config, policy), policy, tokens(tmp_path))
    front = McpFront(endpoint, config.mcp.listen, http)
    await front.start()
    try:
        yield f"http://127.0.0.1:{front.port}/mcp", front, endpoint
    finally:
        await front.stop(1)
        if policy.audit is not None:
            policy.audit.close()


def headers(who: str, session: str = "") -> dict[str, str]:
    return mcp_headers(f"token-of-{who}-0123456789", session)


def mcp_headers(token: str, session: str = "") -> dict[str, str]:
    """A raw streamable-HTTP request's headers: the bearer token, and the session if any
    (tests/integration/test_tenant_caps.py too)."""
    h = {
        "authorization": f"Bearer {token}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": "2025-06-18",
    }
    return {**h, "mcp-session-id": session} if session else h


async def test_mcp_sessions_past_a_tenants_cap_get_429_and_others_still_open(
    tmp_path: Path,
) -> None:
    async with mcp_front(tmp_path, 3) as (url, _front, endpoint), httpx.AsyncClient() as c:
        opened = [await c.post(url, json=INIT, headers=headers("acme")) for _ in range(3)]
        assert [r.status_code for r in opened] == [200] * 3
        refused = await c.post(url, json=INIT, headers=headers("acme"))
        assert refused.status_code == 429
        message = refused.json()["error"]["message"]
        assert "'acme' has 3 open" in message
        assert "mcp.max_sessions_per_tenant" in message
        theirs = await c.post(url, json=INIT, headers=headers("bravo"))  # meanwhile
        assert theirs.status_code == 200
        assert theirs.json()["result"]["serverInfo"]["name"] == "stockade"
        session = opened[0].headers["mcp-session-id"]
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        used = await c.post(url, json=call, headers=headers("acme", session))
        assert used.status_code == 200  # its open sessions are served as before
        gone = await c.delete(url, headers=headers("acme", session))
        assert gone.status_code == 200
        assert endpoint.sessions.open == {"acme": 2, "bravo": 1}
        again = await c.post(url, json=INIT, headers=headers("acme"))
        assert again.status_code == 200  # room again
        for r in [*opened[1:], theirs, again]:
            owner = "bravo" if r is theirs else "acme"
            await c.delete(url, headers=headers(owner, r.headers["mcp-session-id"]))
        assert endpoint.sessions.open == {}


async def test_mcp_sessions_opened_at_once_past_a_tenants_cap_get_429(tmp_path: Path) -> None:
    """All at once: between the cap's check and the SDK's admission the SDK awaits its lock;
    the openings past the cap got the SDK's 503 ("Too many open sessions", its own cap's
    answer) instead of this cap's 429 until each opening held its room."""
    audit = Audited()
    refusals = Refusals(audit)
    # the cap's race, not the back-off of a tenant refused again and again (test_fair_share)
    front = mcp_front(tmp_path, 3, refusals, HttpConfig(refusal_free_count=1000))
    async with front as (url, _front, endpoint), httpx.AsyncClient() as c:
        answers = await asyncio.gather(
            *(c.post(url, json=INIT, headers=headers("acme")) for _ in range(40))
        )
        assert sorted(r.status_code for r in answers) == [200] * 3 + [429] * 37
        assert all(
            "mcp.max_sessions_per_tenant" in r.json()["error"]["message"]
            for r in answers
            if r.status_code == 429
        )
        assert endpoint.sessions.open == {"acme": 3}
        assert endpoint.sessions.opening == {}  # every opening settled
        theirs = await c.post(url, json=INIT, headers=headers("bravo"))
        assert theirs.status_code == 200
    refusals.close()  # the window's end: its count written
    first, rest = audit.records  # 37 refusals from one address: two records, bounded
    assert (first.tool, first.front, first.error_code) == (CAP_TOOL, "mcp", "QUOTA_EXCEEDED")
    assert first.is_error
    assert "mcp.max_sessions_per_tenant" in first.policy_step
    counts = [json.loads(r.arguments_json)["count"] for r in (first, rest)]
    assert counts == [1, 36]
    assert all("mcp.max_sessions_per_tenant" in r.arguments_json for r in audit.records)
    assert not any("token-of-acme" in r.arguments_json + r.policy_step for r in audit.records)


async def e2b(tmp_path: Path, **settings: Any) -> tuple[Any, Records, E2bContext]:
    config = load_config(
        None, {"state_dir": str(tmp_path), "e2b.listen": "127.0.0.1:0", **settings}
    )
    records = Records(tmp_path)
    ctx = e2b_context(config, records, tokens(tmp_path))  # sandboxes on a fake engine
    app, _control = build_e2b(ctx)
    return app, records, ctx


def create(client: httpx.AsyncClient, who: str, body: dict[str, Any]) -> Any:
    key = {"X-API-KEY": f"token-of-{who}-0123456789"}
    return client.post("http://e2b/sandboxes", json=body, headers=key)


async def test_e2b_sandboxes_past_a_tenants_cap_get_429(tmp_path: Path) -> None:
    app, records, ctx = await e2b(tmp_path, **{"e2b.max_sandboxes_per_tenant": 2})
    manager, policy = ctx.manager, ctx.policy
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as c:
        made = await asyncio.gather(*(create(c, "acme", {}) for _ in range(4)))
        assert sorted(r.status_code for r in made) == [201, 201, 429, 429]
        refused = next(r for r in made if r.status_code == 429).json()
        assert refused["code"] == 429
        assert "e2b.max_sandboxes_per_tenant" in refused["message"]
        assert (await create(c, "bravo", {})).status_code == 201  # meanwhile
        assert (records.count("acme"), records.count("bravo"), len(manager.registry)) == (2, 1, 3)
        sid = next(r for r in made if r.status_code == 201).json()["sandboxID"]
        key = {"X-API-KEY": "token-of-acme-0123456789"}
        records_only = await records.remove(sid)  # as a kill or an expiry does
        assert records_only is not None
        assert (await create(c, "acme", {})).status_code == 201  # room again
        listed = (await c.get("http://e2b/sandboxes", headers=key)).json()
        assert len(listed) == 2
    assert policy.audit is not None
    failed = [
        r for r in await policy.audit.query(AuditQuery(tenant="acme", limit=50)) if r.is_error
    ]
    assert len(failed) == 2
    assert all("e2b.max_sandboxes_per_tenant" in r.policy_step for r in failed)


@pytest.mark.parametrize("field", ["metadata", "envVars"])
async def test_e2b_metadata_past_its_size_is_refused(tmp_path: Path, field: str) -> None:
    app, records, ctx = await e2b(tmp_path, **{"e2b.max_metadata_bytes": 1000})
    manager = ctx.manager
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as c:
        fits = {"a": "x" * 499}  # 500 bytes
        assert (await create(c, "acme", {field: {**fits, "b": "y" * 499}})).status_code == 201
        for big in ({"a": "x" * 1000}, {f"k{i}": "é" * 10 for i in range(50)}):
            answer = await create(c, "acme", {field: big})
            assert answer.status_code == 400
            assert "e2b.max_metadata_bytes" in answer.json()["message"]
    assert (len(records), len(manager.registry)) == (1, 1)


def test_the_caps_have_safe_defaults_and_refuse_negatives() -> None:
    config = load_config(None, {})
    assert config.mcp.max_sessions_per_tenant == 100
    assert config.e2b.max_sandboxes_per_tenant == 100
    assert config.e2b.max_metadata_bytes == 65536
    assert config.limits.max_streams_per_tenant == 100
    assert config.limits.max_watches_per_tenant == 64
    for name in (
        "mcp.max_sessions_per_tenant", "e2b.max_sandboxes_per_tenant",
        "limits.max_streams_per_tenant", "limits.max_watches_per_tenant",
    ):  # fmt: skip
        with pytest.raises(errors.ConfigError, match=name):
            load_config(None, {name: -1})
    for name in ("e2b.max_metadata_bytes", "mcp.max_sessions"):
        with pytest.raises(errors.ConfigError, match=name):
            load_config(None, {name: 0})
