"""The console's app without an engine: sign-in, sessions, CSRF, the security headers and
hostile requests, tenant scoping, approvals and audit over the real approval manager and
audit log (SQLite in a temporary folder). The sandbox manager is a stand-in recording what
it is asked; the console against a real supervisor and engine, in a browser, is
tests/integration/test_console_browser.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from stockade.supervisor.api.auth import Authenticator
from stockade.supervisor.app import build_policy
from stockade.supervisor.config import load_config
from stockade.supervisor.errors import ConfigError, SandboxNotFound
from stockade.supervisor.fronts.console.app import build_app
from stockade.supervisor.fronts.console.context import ConsoleContext
from stockade.supervisor.fronts.console.overview import quantile
from stockade.supervisor.fronts.console.security import CSP, MAX_BODY_BYTES
from stockade.supervisor.fronts.console.sessions import COOKIE, MAX_SESSIONS, Sessions
from stockade.supervisor.keys import scope
from stockade.supervisor.models import SandboxInfo, SandboxState
from stockade.supervisor.observe.audit import AuditRecord
from stockade.supervisor.observe.metrics import Metrics
from stockade.supervisor.observe.telemetry import CallObservation

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef00"
OPS = "ops-token-0123456789abcdef00"
ORIGIN = {"origin": "http://testserver"}


class Manager:
    """Stands in for the SandboxManager: the sandboxes it holds, and what it was asked."""

    def __init__(self, keys: list[str]) -> None:
        self.infos = {k: info(k) for k in keys}
        self.registry: dict[str, Any] = {}
        self.asked: list[tuple[str, str]] = []

    async def list(self) -> list[SandboxInfo]:
        return list(self.infos.values())

    async def get(self, key: str) -> SandboxInfo:
        if key not in self.infos:
            raise SandboxNotFound(f"no sandbox for key {key!r}")
        return self.infos[key]

    async def pause(self, key: str, reason: str) -> tuple[SandboxInfo, bool]:
        self.asked.append(("pause", key))
        return await self.get(key), True

    async def resume(self, key: str, reason: str) -> tuple[SandboxInfo, bool]:
        self.asked.append(("resume", key))
        return await self.get(key), True

    async def destroy(self, key: str, *, delete_workspace: bool) -> tuple[bool, bool]:
        self.asked.append(("destroy", key))
        await self.get(key)
        return True, False

    def state_counts(self) -> dict[str, int]:
        return {"RUNNING": len(self.infos)}


def info(key: str) -> SandboxInfo:
    now = datetime.now(UTC)
    return SandboxInfo(
        key=key, container_id="c", container_name="n", engine="podman", image="i",
        state=SandboxState.RUNNING, created_at=now, last_used_at=now, workspace_path="/w",
        network_mode="none",
    )  # fmt: skip


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[ConsoleContext]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ALICE} alice\n{BOB} bob\n{OPS} ops\n")
    tokens.chmod(0o600)
    config = load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "auth.tokens_file": str(tokens),
            "console.listen": "127.0.0.1:0",
            "console.operators": ["ops"],
            "approvals.mode": "always",
        },
    )
    policy = build_policy(config)
    manager = Manager([scope("alice", "a1"), scope("bob", "b1")])
    manager.registry = {k: None for k in manager.infos}
    metrics = Metrics()
    context = ConsoleContext(config, policy, Authenticator(config.auth), manager, metrics)  # type: ignore[arg-type]
    yield context
    if policy.audit is not None:
        policy.audit.close()


@pytest.fixture
def client(ctx: ConsoleContext) -> TestClient:
    return TestClient(build_app(ctx), follow_redirects=False)


def login(client: TestClient, token: str) -> str:
    answer = client.post("/login", data={"token": token}, headers=ORIGIN)
    assert answer.status_code == 303, answer.text
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert "Path=/" in cookie
    assert "Secure" not in cookie  # plain loopback: a Secure cookie would not come back
    return csrf_of(client)


def csrf_of(client: TestClient) -> str:
    page = client.get("/sandboxes").text
    return page.split('data-csrf="', 1)[1].split('"', 1)[0]


# sign-in, sessions


def test_every_page_needs_a_session(client: TestClient) -> None:
    for path in ("/", "/sandboxes", "/approvals", "/audit", "/overview", "/sandbox?key=a1"):
        answer = client.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"] == "/login", path
    for path in ("/sandboxes.json", "/overview.json", "/approvals/events", "/audit/export.jsonl"):
        assert client.get(path).status_code == 401, path
    answer = client.post("/sandbox/action", data={"action": "pause", "key": "a1"}, headers=ORIGIN)
    assert answer.status_code == 401
    assert client.post("/approvals/decide", data={}, headers=ORIGIN).status_code == 401


def test_a_wrong_token_is_refused(client: TestClient) -> None:
    for token in ("", "nope", ALICE + "x", ALICE[:-1], "x" * 10000, "Bearer " + ALICE, "\x00"):
        answer = client.post("/login", data={"token": token}, headers=ORIGIN)
        assert answer.status_code == 401, token[:20]
        assert COOKIE not in answer.headers.get("set-cookie", "")
    assert client.get("/sandboxes").status_code == 303


def test_sign_in_from_another_origin_is_refused(client: TestClient) -> None:
    answer = client.post("/login", data={"token": ALICE}, headers={"origin": "http://evil"})
    assert answer.status_code == 403
    assert client.post("/login", data={"token": ALICE}).status_code == 403  # no origin at all


def test_a_forged_or_altered_cookie_is_no_session(client: TestClient) -> None:
    login(client, ALICE)
    good = client.cookies[COOKIE]
    sid, mac = good.split(".")
    for bad in (
        sid + "." + mac[:-1] + ("A" if mac[-1] != "A" else "B"),
        sid[:-1] + "x." + mac,
        sid,
        "." + mac,
        "x" * 5000,
        "é" * 10,
        "",
        good + good,
        good + "; " + COOKIE + "=x",
    ):
        client.cookies.clear()
        raw = f"{COOKIE}={bad}".encode()
        assert client.get("/sandboxes", headers={"cookie": raw}).status_code == 303, bad[:20]  # type: ignore[dict-item]
    client.cookies.set(COOKIE, good)
    assert client.get("/sandboxes").status_code == 200


def test_sign_out_ends_the_session(client: TestClient) -> None:
    csrf = login(client, ALICE)
    cookie = client.cookies[COOKIE]
    answer = client.post("/logout", data={"csrf": csrf}, headers=ORIGIN)
    assert answer.status_code == 303
    client.cookies.set(COOKIE, cookie)  # the old cookie, replayed
    assert client.get("/sandboxes").status_code == 303


def test_a_token_removed_from_the_file_ends_its_sessions(
    client: TestClient, ctx: ConsoleContext
) -> None:
    login(client, ALICE)
    path = Path(ctx.config.auth.tokens_file)
    path.write_text(f"{BOB} bob\n{OPS} ops\n# alice's token is gone\n")
    path.chmod(0o600)
    assert client.get("/sandboxes").status_code == 303


def test_sessions_expire_and_are_bounded() -> None:
    sessions = Sessions(ttl_s=60)
    first, cookie = sessions.create("t", "alice", False)
    assert sessions.find(cookie) is first
    first.expires_at = time.time() - 1
    assert sessions.find(cookie) is None
    cookies = [sessions.create("t", "alice", False)[1] for _ in range(MAX_SESSIONS + 5)]
    assert len(sessions) == MAX_SESSIONS
    assert sessions.find(cookies[0]) is None
    assert sessions.find(cookies[-1]) is not None
    other = Sessions(ttl_s=60)  # another start: another key
    assert other.find(cookies[-1]) is None


# CSRF, origin, headers, hostile requests


def test_a_change_without_the_csrf_token_is_refused(
    client: TestClient, ctx: ConsoleContext
) -> None:
    csrf = login(client, ALICE)
    manager: Manager = ctx.manager  # type: ignore[assignment]
    form = {"action": "pause", "key": "a1"}
    for headers, data in (
        (ORIGIN, form),
        (ORIGIN, {**form, "csrf": csrf[:-1]}),
        (ORIGIN, {**form, "csrf": "x" * len(csrf)}),
        ({**ORIGIN, "x-csrf-token": "forged"}, form),
        ({"origin": "http://evil.example"}, {**form, "csrf": csrf}),
        ({"referer": "http://evil.example/x"}, {**form, "csrf": csrf}),
        ({}, {**form, "csrf": csrf}),  # neither Origin nor Referer
    ):
        answer = client.post("/sandbox/action", data=data, headers=headers)
        assert answer.status_code == 403, (headers, data)
    assert manager.asked == []
    answer = client.post("/sandbox/action", data={**form, "csrf": csrf}, headers=ORIGIN)
    assert answer.status_code == 303
    assert manager.asked == [("pause", scope("alice", "a1"))]


def test_another_sessions_csrf_token_does_not_pass(ctx: ConsoleContext) -> None:
    one, two = (TestClient(build_app(ctx), follow_redirects=False) for _ in range(2))
    login(one, ALICE)
    other = login(two, ALICE)
    answer = one.post(
        "/sandbox/action", data={"action": "pause", "key": "a1", "csrf": other}, headers=ORIGIN
    )
    assert answer.status_code == 403


def test_security_headers_on_every_answer(client: TestClient) -> None:
    for answer in (client.get("/login"), client.get("/sandboxes"), client.get("/static/x")):
        assert answer.headers["content-security-policy"] == CSP
        assert "default-src 'self'" in CSP
        assert "unsafe-inline" not in CSP
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "same-origin"
        assert answer.headers["cache-control"] == "no-store"


def test_pages_hold_no_inline_script_or_style(client: TestClient) -> None:
    login(client, OPS)
    for path in (
        "/login",
        "/sandboxes",
        "/approvals",
        "/audit",
        "/overview",
        "/sandbox?tenant=alice&key=a1",
    ):
        text = client.get(path).text
        assert "<script>" not in text, path
        assert "<script " not in text.replace('<script src="/static/console.js" defer>', ""), path
        assert " style=" not in text
        assert "<style" not in text
        assert " on" + "click=" not in text
        assert "http://" not in text, path  # no third-party assets
        assert "https://" not in text, path


def test_huge_bodies_and_urls_are_refused(client: TestClient) -> None:
    csrf = login(client, ALICE)
    big = {"token": "x" * (MAX_BODY_BYTES + 1)}
    assert client.post("/login", data=big, headers=ORIGIN).status_code == 413
    chunks = (b"a" * 4096 for _ in range(10))  # streamed, no content-length
    headers = {**ORIGIN, "content-type": "application/x-www-form-urlencoded"}
    answer = client.post(
        "/approvals/decide", content=chunks, headers={**headers, "x-csrf-token": csrf}
    )
    assert answer.status_code == 413
    bad_length = {**headers, "content-length": "-1"}
    assert client.post("/login", content=b"token=x", headers=bad_length).status_code in (400, 413)
    assert client.get("/audit?key=" + "k" * 5000).status_code == 414
    assert client.put("/login").status_code == 405
    assert client.delete("/sandbox").status_code == 405


def test_other_bodies_and_forms_are_refused(client: TestClient) -> None:
    csrf = login(client, ALICE)
    headers = {**ORIGIN, "x-csrf-token": csrf}
    answer = client.post("/approvals/decide", json={"id": "x"}, headers=headers)
    assert answer.status_code == 415
    answer = client.post(
        "/approvals/decide",
        content=b"\xff\xfe",
        headers={**headers, "content-type": "application/x-www-form-urlencoded"},
    )
    assert answer.status_code == 400


def test_static_files_are_a_fixed_set(client: TestClient) -> None:
    assert client.get("/static/console.js").status_code == 200
    assert client.get("/static/console.css").headers["content-type"].startswith("text/css")
    for path in (
        "/static/../app.py",
        "/static/%2e%2e/app.py",
        "/static/..%2fapp.py",
        "/static/static/console.js",
        "/static/__init__.py",
        "/static/",
        "/../../etc/passwd",
    ):
        answer = client.get(path)
        assert answer.status_code == 404, path
        assert "import" not in answer.text
        assert "root:" not in answer.text


# tenants and roles


def test_a_tenant_sees_only_its_own_sandboxes(client: TestClient) -> None:
    login(client, ALICE)
    data = client.get("/sandboxes.json").json()
    assert [(s["tenant"], s["key"]) for s in data["sandboxes"]] == [("alice", "a1")]
    assert client.get("/sandboxes.json?tenant=bob").json() == data  # asking does not help
    assert ">b1<" not in client.get("/sandboxes").text
    assert client.get("/sandbox?tenant=bob&key=b1").status_code == 404  # alice's b1: none
    assert client.get("/overview").status_code == 403


def test_a_tenant_cannot_act_on_anothers_sandbox(client: TestClient, ctx: ConsoleContext) -> None:
    csrf = login(client, ALICE)
    data = {"action": "destroy", "tenant": "bob", "key": "b1", "csrf": csrf}
    answer = client.post("/sandbox/action", data=data, headers=ORIGIN)
    assert answer.status_code == 409  # it acted in alice's tenant, where b1 is not
    assert ctx.manager.asked == [("destroy", scope("alice", "b1"))]  # type: ignore[attr-defined]


def test_an_operator_sees_every_tenant(client: TestClient, ctx: ConsoleContext) -> None:
    csrf = login(client, OPS)
    keys = {(s["tenant"], s["key"]) for s in client.get("/sandboxes.json").json()["sandboxes"]}
    assert keys == {("alice", "a1"), ("bob", "b1")}
    only = client.get("/sandboxes.json?tenant=bob").json()["sandboxes"]
    assert [s["key"] for s in only] == ["b1"]
    assert client.get("/sandbox?tenant=bob&key=b1").status_code == 200
    data = {"action": "resume", "tenant": "bob", "key": "b1", "csrf": csrf}
    assert client.post("/sandbox/action", data=data, headers=ORIGIN).status_code == 303
    assert ctx.manager.asked == [("resume", scope("bob", "b1"))]  # type: ignore[attr-defined]
    assert client.get("/overview").status_code == 200


def test_hostile_keys_and_tenants_are_refused(client: TestClient) -> None:
    login(client, OPS)
    for path in (
        "/sandbox?tenant=bob&key=",
        "/sandbox?tenant=bob&key=a%00b",
        "/sandbox?tenant=..%2Fx&key=b1",
        "/sandbox?key=b1",  # an operator names the tenant
        "/sandboxes.json?tenant=%00",
        "/sandbox/confirm?action=rm&tenant=bob&key=b1",
        "/audit?outcome=maybe",
        "/audit?since=yesterday",
        "/audit?limit=0",
        "/audit?limit=99999999",
        "/audit/record?id=abc",
    ):
        assert client.get(path).status_code == 400, path


def test_text_is_escaped(client: TestClient, ctx: ConsoleContext) -> None:
    evil = "<img src=x onerror=alert(1)>"
    ctx.manager.infos[scope("alice", evil)] = info(scope("alice", evil))  # type: ignore[attr-defined]
    login(client, ALICE)
    text = client.get("/sandboxes").text
    assert evil not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text


# approvals


def test_an_approval_is_decided_from_the_console(client: TestClient, ctx: ConsoleContext) -> None:
    csrf = login(client, ALICE)
    approvals = ctx.policy.approvals

    async def scenario() -> Any:
        watching = approvals.watch("alice")  # an approver, so that the request waits
        first = asyncio.ensure_future(watching.__anext__())
        check = asyncio.ensure_future(
            approvals.check(
                sandbox_key=scope("alice", "a1"), agent_id="", tool="exec",
                command="rm -rf /tmp/x", request_id="r1",
            )
        )  # fmt: skip
        pending = await first
        page = await asyncio.to_thread(client.get, "/approvals")
        assert "rm -rf /tmp/x" in page.text
        assert pending.id in page.text
        other = await asyncio.to_thread(login_other, ctx, BOB)
        form = {"id": pending.id, "decision": "allow-once", "tenant": "alice"}
        form["csrf"] = await asyncio.to_thread(csrf_of, other)
        answer = await asyncio.to_thread(other.post, "/approvals/decide", data=form, headers=ORIGIN)
        assert answer.status_code == 404  # bob decides in bob's tenant: no such request
        answer = await asyncio.to_thread(
            client.post, "/approvals/decide",
            data={"id": pending.id, "decision": "allow-once"},
            headers={**ORIGIN, "x-csrf-token": csrf},
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        outcome = await check
        await watching.aclose()
        return outcome

    outcome = asyncio.run(scenario())
    assert outcome.allowed
    assert outcome.how == "allow-once"
    assert outcome.approver == "console:tenant:alice"


def login_other(ctx: ConsoleContext, token: str) -> TestClient:
    other = TestClient(build_app(ctx), follow_redirects=False)
    login(other, token)
    return other


def test_a_bad_decision_is_refused(client: TestClient) -> None:
    csrf = login(client, ALICE)
    headers = {**ORIGIN, "x-csrf-token": csrf}
    for data in ({"id": "x", "decision": "maybe"}, {"id": "x" * 5000, "decision": "deny"}):
        assert client.post("/approvals/decide", data=data, headers=headers).status_code in (
            400,
            404,
        )
    assert (
        client.post(
            "/approvals/decide", data={"id": "nope", "decision": "deny"}, headers=headers
        ).status_code
        == 404
    )


# audit


def record(tenant: str, key: str, tool: str, error: str = "", front: str = "grpc") -> AuditRecord:
    return AuditRecord(
        time=time.time(), request_id="r", caller="c", sandbox_key=scope(tenant, key),
        agent_id="agent", provider="", tool=tool, arguments_json=json.dumps({"command": "ls"}),
        policy_step="allowed", error_code=error, is_error=bool(error), front=front,
    )  # fmt: skip


def test_audit_filters_and_export_stay_in_the_tenant(
    client: TestClient, ctx: ConsoleContext
) -> None:
    audit = ctx.policy.audit
    assert audit is not None
    audit.record(record("alice", "a1", "exec"))
    audit.record(record("alice", "a1", "read_file", "PERMISSION_DENIED"))
    audit.record(record("alice", "a2", "exec", front="mcp"))
    audit.record(record("bob", "bobs-own-key", "exec"))
    audit.flush()
    login(client, ALICE)
    page = client.get("/audit").text
    assert page.count("<tr><td>") == 3
    assert "bobs-own-key" not in page
    # a tenant user sees its own tenant only, whichever it names
    assert client.get("/audit?tenant=bob").text.count("bobs-own-key") == 0
    refused = client.get("/audit?outcome=refused").text
    assert "PERMISSION_DENIED" in refused
    assert refused.count("<tr><td>") == 1
    assert client.get("/audit?front=mcp").text.count("a2") >= 1
    assert client.get("/audit?front=mcp").text.count("<tr><td>") == 1
    assert client.get("/audit?key=a2&outcome=ok").text.count("<tr><td>") == 1
    lines = client.get("/audit/export.jsonl?tool=exec").text.splitlines()
    assert len(lines) == 2
    assert all(json.loads(x)["tenant"] == "alice" for x in lines)
    first = json.loads(lines[0])
    assert client.get(f"/audit/record?id={first['id']}").status_code == 200
    bobs = client.get("/audit/export.jsonl?tenant=bob").text
    assert "bobs-own-key" not in bobs
    # bob's record, asked for by id from alice's session: not found
    login(client, OPS)
    theirs = json.loads(client.get("/audit/export.jsonl?tenant=bob").text.splitlines()[0])
    assert theirs["sandbox_key"] == "bobs-own-key"
    login(client, ALICE)
    assert client.get(f"/audit/record?id={theirs['id']}").status_code == 404


# overview, config


def test_the_overview_reads_the_metrics(client: TestClient, ctx: ConsoleContext) -> None:
    assert ctx.metrics is not None
    for result, seconds in (("ok", 0.002), ("ok", 0.004), ("PERMISSION_DENIED", 0.001)):
        ctx.metrics.observe(
            CallObservation(
                request_id="r",
                sandbox_key="k",
                tool="exec",
                result=result,
                start_ns=0,
                end_ns=int(seconds * 1e9),
                stages=(),
                redactions=2,
            )
        )
    login(client, OPS)
    data = client.get("/overview.json").json()
    assert data["calls"] == 3
    assert data["refusals"] == {"PERMISSION_DENIED": 3 - 2}
    assert data["redactions"] == 6
    assert data["sandboxes"] == {"RUNNING": 2}
    assert 1 <= data["p50_ms"] <= 5
    assert data["p50_ms"] <= data["p95_ms"] <= 5


def test_quantiles_from_buckets() -> None:
    assert quantile({}, 0.5) is None
    assert quantile({0.001: 0, 0.01: 10, float("inf"): 10}, 0.5) == pytest.approx(5.5)
    assert quantile({0.001: 0, 0.01: 0, float("inf"): 4}, 0.95) == 10.0


def test_console_config_is_checked(tmp_path: Path) -> None:
    assert load_config(None, {}).console.listen == ""  # off by default
    for overrides in (
        {"console.listen": "0.0.0.0:8470"},
        {"console.listen": "10.1.2.3:80"},
        {"console.listen": "nonsense"},
        {"console.operators": ["bad tenant"]},
        {"console.session_ttl_s": 1},
        {"console.session_ttl_s": 10**9},
        {"console.refresh_s": 0},
        {"console.unknown": 1},
    ):
        with pytest.raises(ConfigError):
            load_config(None, overrides)
    assert load_config(None, {"console.listen": "[::1]:0"}).console.listen == "[::1]:0"


def test_without_metrics_the_overview_reads_the_audit_log(
    client: TestClient, ctx: ConsoleContext
) -> None:
    ctx.metrics = None  # observability.metrics_listen unset: the console adds no observer
    audit = ctx.policy.audit
    assert audit is not None
    for tenant, error in (("alice", ""), ("alice", "APPROVAL_DENIED"), ("bob", ""), ("ops", "")):
        audit.record(record(tenant, "k", "exec", error))
    audit.record(record("alice", "k", "network", "PERMISSION_DENIED"))  # no call: not counted
    audit.flush()
    login(client, OPS)
    data = client.get("/overview.json").json()
    assert data["calls"] == 4  # alice's two, bob's (a sandbox's tenant) and ops's own
    assert data["refusals"] == {"APPROVAL_DENIED": 1}
    assert data["source"].startswith("the audit log")
    assert "the audit log" in client.get("/overview").text


def test_an_operators_stream_follows_every_tenant_and_escapes(ctx: ConsoleContext) -> None:
    """The operator's event stream merges the tenants' approval streams; a command's HTML
    reaches the page escaped (console.js inserts the server's cells as they are)."""
    from stockade.supervisor.fronts.console import approvals as page

    session, _cookie = ctx.sessions.create(OPS, "ops", True)
    tenants = page.watched(ctx, session, "")
    assert tenants == ["alice", "bob", "ops"]
    manager = ctx.policy.approvals

    async def scenario() -> list[str]:
        stream = page._stream(ctx, session, tenants)
        assert await anext(stream) == "retry: 2000\n\n"
        got: list[str] = []
        reader = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)
        while manager.watchers_of("bob") == 0:  # the stream's watchers are connected
            await asyncio.sleep(0.01)
        checks = [
            asyncio.ensure_future(
                manager.check(
                    sandbox_key=scope(tenant, "k"),
                    agent_id="",
                    tool="exec",
                    command=command,
                    request_id="r",
                )
            )
            for tenant, command in (("alice", "<script>alert(1)</script>"), ("bob", "ls"))
        ]
        got.append(await reader)
        got.append(await anext(stream))
        ids = [json.loads(g.split("data: ", 1)[1])["id"] for g in got]
        for tenant, request_id in zip(("alice", "bob"), ids, strict=True):
            await manager.decide(request_id, "deny", session.who, tenant=tenant)
        got.append(await anext(stream))
        got.append(await anext(stream))
        await asyncio.gather(*checks)
        await stream.aclose()
        return got

    events = asyncio.run(scenario())
    pending = [json.loads(e.split("data: ", 1)[1]) for e in events[:2]]
    assert {p["tenant"] for p in pending} == {"alice", "bob"}
    cells = "".join(next(p for p in pending if p["tenant"] == "alice")["cells"])
    assert "<script>alert" not in cells
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in cells
    assert all(e.startswith("event: closed") for e in events[2:])
    assert manager.watchers_of("alice") == 0  # the stream's end left no approver behind


def test_the_console_needs_tokens_and_serves_on_its_port(ctx: ConsoleContext) -> None:
    """start_console: refused without an authenticator (auth off); otherwise a real uvicorn
    on the loopback port, answering with the headers, then stopped."""
    import urllib.error
    import urllib.request

    from stockade.supervisor.fronts.console.server import start_console

    async def scenario() -> tuple[int, str, int]:
        with pytest.raises(ConfigError, match="tokens_file"):
            await start_console(ctx.config, ctx.policy, None, ctx.manager, None)  # type: ignore[arg-type]
        front = await start_console(
            ctx.config,
            ctx.policy,
            ctx.authenticator,
            ctx.manager,  # type: ignore[arg-type]
            None,
        )
        assert front is not None
        try:
            url = f"http://127.0.0.1:{front.port}"
            answer = await asyncio.to_thread(urllib.request.urlopen, url + "/login", timeout=10)
            try:
                await asyncio.to_thread(urllib.request.urlopen, url + "/sandboxes.json", timeout=10)
                refused = 200
            except urllib.error.HTTPError as exc:
                refused = exc.code
            return answer.status, answer.headers["content-security-policy"], refused
        finally:
            await front.stop(1)

    status, csp, refused = asyncio.run(scenario())
    assert status == 200
    assert csp == CSP
    assert refused == 401
