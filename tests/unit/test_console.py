"""The console's app without an engine: sign-in, sessions, CSRF, the security headers and
hostile requests, tenant scoping, approvals and audit over the real approval manager and
audit log (SQLite in a temporary folder). The sandbox manager is a stand-in recording what
it is asked; the console against a real supervisor and engine, in a browser, is
tests/integration/test_console_browser.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from stockade.supervisor.app import build_policy
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.config import Config, load_config
from stockade.supervisor.engines.isolation import IsolationReport
from stockade.supervisor.errors import ConfigError, SandboxNotFound
from stockade.supervisor.fronts.console.app import build_app
from stockade.supervisor.fronts.console.context import ConsoleContext, ConsoleSandboxes
from stockade.supervisor.fronts.console.security import CSP, MAX_BODY_BYTES
from stockade.supervisor.fronts.console.sessions import COOKIE, MAX_SESSIONS, Sessions
from stockade.supervisor.keys import scope
from stockade.supervisor.models import NetworkRequest, SandboxInfo, SandboxState
from stockade.supervisor.observe.metrics import Metrics
from stockade.supervisor.sandboxes.sandbox import Sandbox
from tests.unit.fakes import FakeBackend, fake_manager, tokens_file

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef00"
OPS = "ops-token-0123456789abcdef00"
ORIGIN = {"origin": "http://testserver"}


class Manager:
    """Stands in for the SandboxManager: the sandboxes it holds, and what it was asked."""

    def __init__(self, config: Config, keys: list[str]) -> None:
        self.config = config
        self.infos = {k: info(k) for k in keys}
        self.registry: dict[str, Any] = {}
        self.asked: list[tuple[str, str]] = []
        self.quarantines = fake_manager(config, FakeBackend()).quarantines  # none held here

    async def list(self) -> list[SandboxInfo]:
        return list(self.infos.values())

    async def get(self, key: str) -> SandboxInfo:
        if key not in self.infos:
            raise SandboxNotFound(f"no sandbox for key {key!r}")
        return self.infos[key]

    async def ensure(
        self, key: str, network: NetworkRequest | None = None, profile: str | None = None
    ) -> Sandbox:
        raise NotImplementedError("the console makes no sandbox")

    async def pause(self, key: str, reason: str, recorded: bool = True) -> tuple[SandboxInfo, bool]:
        self.asked.append(("pause", key))
        return await self.get(key), True

    async def resume(
        self, key: str, reason: str, recorded: bool = True
    ) -> tuple[SandboxInfo, bool]:
        self.asked.append(("resume", key))
        return await self.get(key), True

    async def destroy(self, key: str, *, delete_workspace: bool) -> tuple[bool, bool]:
        self.asked.append(("destroy", key))
        await self.get(key)
        return True, False

    def state_counts(self) -> dict[str, int]:
        return {"RUNNING": len(self.infos)}

    async def inspect_isolation(self, key: str) -> IsolationReport:
        raise NotImplementedError("the stand-in has no containers to inspect")


def stand_in(ctx: ConsoleContext) -> Manager:
    """The `ctx` fixture's manager: the stand-in, with what it was asked."""
    assert isinstance(ctx.manager, Manager)
    return ctx.manager


def _are_console_sandboxes(manager: Manager) -> ConsoleSandboxes:
    """Type-checked only: mypy says here when the stand-in no longer satisfies
    ConsoleSandboxes."""
    return manager


def info(key: str) -> SandboxInfo:
    now = datetime.now(UTC)
    return SandboxInfo(
        key=key, container_id="c", container_name="n", engine="podman", image="i",
        state=SandboxState.RUNNING, created_at=now, last_used_at=now, workspace_path="/w",
        network_mode="none",
    )  # fmt: skip


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[ConsoleContext]:
    tokens = tokens_file(tmp_path, f"{ALICE} alice\n{BOB} bob\n{OPS} ops\n")
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
    manager = Manager(config, [scope("alice", "a1"), scope("bob", "b1")])
    manager.registry = {k: None for k in manager.infos}
    metrics = Metrics()
    context = ConsoleContext(config, policy, Authenticator(config.auth), manager, metrics)
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
        assert client.get("/sandboxes", headers={b"cookie": raw}).status_code == 303, bad[:20]
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
    manager = stand_in(ctx)
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


# config, the port


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


def test_the_console_needs_tokens_and_serves_on_its_port(ctx: ConsoleContext) -> None:
    """start_console: refused without an authenticator (auth off); otherwise a real uvicorn
    on the loopback port, answering with the headers, then stopped."""
    import urllib.error
    import urllib.request

    from stockade.supervisor.fronts.console.server import start_console

    async def scenario() -> tuple[int, str, int]:
        with pytest.raises(ConfigError, match="tokens_file"):
            await start_console(ctx.config, ctx.policy, None, ctx.manager, None)
        front = await start_console(
            ctx.config,
            ctx.policy,
            ctx.authenticator,
            ctx.manager,
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
