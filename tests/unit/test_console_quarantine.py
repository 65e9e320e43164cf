"""Quarantine in the console, over the real gRPC server, sandbox manager and alarm hub on an
in-memory engine (the console's app through httpx's ASGI transport, in the same event loop):
a sandbox quarantined from its page refuses gRPC calls with FAILED_PRECONDITION, shows its
evidence, is listed; release serves it again; both are audited and need the session's CSRF
token; a tenant user sees and acts on its own tenant's quarantines only; hostile reasons and
keys are refused or escaped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from stockade.client import AsyncStockade, FailedPrecondition
from stockade.supervisor.app import build_policy
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.fronts.console.app import build_app
from stockade.supervisor.fronts.console.context import ConsoleContext
from stockade.supervisor.fronts.grpc.server import Server
from stockade.supervisor.keys import scope
from stockade.supervisor.observe.audit import AuditQuery
from tests.unit.fakes import FakeBackend, fake_manager, served_config

ALICE, BOB, OPS = "alice-" + "a" * 26, "bob-" + "b" * 28, "ops-" + "o" * 28
ORIGIN = {"origin": "http://testserver"}


@dataclass
class World:
    server: Server
    ctx: ConsoleContext
    target: str

    def browser(self) -> httpx.AsyncClient:
        app = build_app(self.ctx)
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 5000)),
            base_url="http://testserver",
        )


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    config = served_config(
        tmp_path,
        f"{ALICE} alice\n{BOB} bob\n{OPS} ops\n",
        **{"console.listen": "127.0.0.1:0", "console.operators": ["ops"]},
    )
    backend = FakeBackend()
    manager = fake_manager(config, backend)
    await manager.start()
    policy = build_policy(config)
    authenticator = Authenticator(config.auth)
    server = Server(config, manager, policy, authenticator)
    await server.start()
    ctx = ConsoleContext(config, policy, authenticator, manager, None, server.alarms)
    try:
        yield World(server, ctx, f"127.0.0.1:{server.port}")
    finally:
        await server.stop(0)
        if policy.audit is not None:
            policy.audit.close()


async def login(browser: httpx.AsyncClient, token: str) -> str:
    answer = await browser.post("/login", data={"token": token}, headers=ORIGIN)
    assert answer.status_code == 303, answer.text
    page = (await browser.get("/sandboxes")).text
    return page.split('data-csrf="', 1)[1].split('"', 1)[0]


async def act(
    browser: httpx.AsyncClient, csrf: str, action: str, key: str, tenant: str = "", **more: str
) -> httpx.Response:
    form = {"action": action, "key": key, "csrf": csrf, **more}
    if tenant:
        form["tenant"] = tenant
    return await browser.post("/sandbox/action", data=form, headers=ORIGIN)


async def audited(world: World, tenant: str, key: str) -> list[tuple[str, str]]:
    audit = world.ctx.policy.audit
    assert audit is not None
    audit.flush()
    found = await audit.query(AuditQuery(tenant=tenant, sandbox_key=key))
    return [(r.tool, r.caller) for r in found]


async def test_quarantine_from_the_page_refuses_grpc_until_released(world: World) -> None:
    async with AsyncStockade(world.target, token=ALICE) as grpc, world.browser() as browser:
        await grpc.call("box", "exec", {"command": "echo hi"})
        csrf = await login(browser, ALICE)
        page = (await browser.get("/sandbox?key=box")).text
        assert 'id="quarantine"' in page
        assert 'id="release"' not in page
        confirm = (await browser.get("/sandbox/confirm?action=quarantine&key=box")).text
        assert 'name="reason"' in confirm
        assert 'name="csrf"' in confirm
        answer = await act(browser, csrf, "quarantine", "box", reason="odd <b>traffic</b>")
        assert answer.status_code == 303, answer.text

        with pytest.raises(FailedPrecondition, match="quarantined"):
            await grpc.call("box", "exec", {"command": "echo again"})
        held = await grpc.get_quarantine("box")
        assert "console:tenant:alice@127.0.0.1" in held.quarantine.reason
        assert "odd <b>traffic</b>" in held.quarantine.reason

        page = (await browser.get("/sandbox?key=box")).text
        assert 'id="release"' in page
        assert 'id="quarantine"' not in page
        assert 'id="pause"' not in page
        evidence = page.split('<h2 class="quarantined">', 1)[1]
        assert "odd &lt;b&gt;traffic&lt;/b&gt;" in evidence  # escaped
        assert "<b>traffic" not in page
        assert 'id="alarms"' in evidence
        assert "operator" in evidence
        assert "exec" in evidence.split('id="evidence"', 1)[1]  # the call before, from the audit
        listed = (await browser.get("/quarantines")).text
        assert ">box</a>" in listed
        assert "odd &lt;b&gt;" in listed
        row = next(
            s
            for s in (await browser.get("/sandboxes.json")).json()["sandboxes"]
            if s["key"] == "box"
        )
        assert row["quarantined_since"]
        assert "odd <b>traffic</b>" in row["quarantine_reason"]
        assert 'class="state quarantined"' in (await browser.get("/sandboxes")).text
        # pause and resume are the quarantine's, not the console's
        assert (await act(browser, csrf, "resume", "box")).status_code == 409

        answer = await act(browser, csrf, "release", "box")
        assert answer.status_code == 303, answer.text
        assert not (await grpc.call("box", "exec", {"command": "echo back"})).is_error
        assert "No sandbox is quarantined." in (await browser.get("/quarantines")).text
        assert (await act(browser, csrf, "release", "box")).status_code == 409  # not any more

    tools = await audited(world, "alice", "box")
    assert ("quarantine_sandbox", "console:tenant:alice@127.0.0.1") in tools
    assert ("release_quarantine", "console:tenant:alice@127.0.0.1") in tools
    assert any(tool == "alarm" for tool, _ in tools), "the alarm was sounded and recorded"


async def test_a_forged_or_missing_csrf_token_quarantines_nothing(world: World) -> None:
    async with AsyncStockade(world.target, token=ALICE) as grpc, world.browser() as browser:
        await grpc.call("box", "exec", {"command": "echo hi"})
        await login(browser, ALICE)
        for csrf in ("forged", ""):
            assert (await act(browser, csrf, "quarantine", "box")).status_code == 403
        other_origin = await browser.post(
            "/sandbox/action",
            data={"action": "quarantine", "key": "box", "csrf": await login(browser, ALICE)},
            headers={"origin": "http://evil.example"},
        )
        assert other_origin.status_code == 403
        assert not world.ctx.manager.quarantines.held
        assert not (await grpc.call("box", "exec", {"command": "echo fine"})).is_error


async def test_a_tenant_sees_and_acts_on_its_own_quarantines_only(world: World) -> None:
    async with (
        AsyncStockade(world.target, token=ALICE) as a,
        AsyncStockade(world.target, token=BOB) as b,
        world.browser() as alice,
        world.browser() as ops,
    ):
        await a.call("box", "exec", {"command": "echo hi"})
        await b.call("bobs-box", "exec", {"command": "echo hi"})
        await b.quarantine_sandbox("bobs-box", "bob's own reason")
        csrf = await login(alice, ALICE)
        listed = (await alice.get("/quarantines?tenant=bob")).text
        assert "bobs-box" not in listed
        assert "bob&#x27;s own reason" not in listed
        assert (await alice.get("/sandbox?tenant=bob&key=bobs-box")).status_code == 404
        # alice's session acts in alice's tenant whatever it names: no bobs-box there
        assert (await act(alice, csrf, "release", "bobs-box", tenant="bob")).status_code == 409
        assert (await act(alice, csrf, "quarantine", "bobs-box", tenant="bob")).status_code == 409
        assert scope("bob", "bobs-box") in world.ctx.manager.quarantines.held
        assert scope("alice", "bobs-box") not in world.ctx.manager.quarantines.held

        ops_csrf = await login(ops, OPS)
        everyone = (await ops.get("/quarantines")).text
        assert "bobs-box" in everyone
        assert "bob&#x27;s own reason" in everyone
        assert "bobs-box" not in (await ops.get("/quarantines?tenant=alice")).text
        assert (await act(ops, ops_csrf, "quarantine", "box", tenant="alice")).status_code == 303
        with pytest.raises(FailedPrecondition):
            await a.call("box", "exec", {"command": "echo no"})
        assert "console:operator:ops" in (await a.get_quarantine("box")).quarantine.reason
        assert (await act(ops, ops_csrf, "release", "bobs-box", tenant="bob")).status_code == 303
        assert not (await b.call("bobs-box", "exec", {"command": "echo yes"})).is_error
        assert ("release_quarantine", "console:operator:ops@127.0.0.1") in await audited(
            world, "bob", "bobs-box"
        )


@pytest.mark.parametrize(
    ("key", "status"),
    [("", 400), ("a\x00b", 400), ("x" * 5000, 400), ("../../etc", 409), ("nobody", 409)],
)
async def test_hostile_keys_are_refused(world: World, key: str, status: int) -> None:
    """A malformed key is 400; a path-like one is a key like any other (no such sandbox)."""
    async with world.browser() as browser:
        csrf = await login(browser, ALICE)
        assert (await act(browser, csrf, "quarantine", key)).status_code == status
        assert (await act(browser, csrf, "release", key)).status_code == status
        assert not world.ctx.manager.quarantines.held


async def test_huge_and_hostile_reasons(world: World) -> None:
    async with AsyncStockade(world.target, token=ALICE) as grpc, world.browser() as browser:
        await grpc.call("box", "exec", {"command": "echo hi"})
        csrf = await login(browser, ALICE)
        huge = await act(browser, csrf, "quarantine", "box", reason="x" * 1025)
        assert huge.status_code == 400
        assert "at most 1024" in huge.text
        assert not world.ctx.manager.quarantines.held
        too_big = await act(browser, csrf, "quarantine", "box", reason="x" * 20_000)
        assert too_big.status_code == 413  # the console's body cap
        hostile = "\x1b[2J <script>alert(1)</script> AKIAIOSFODNN7EXAMPLE \"'"
        assert (await act(browser, csrf, "quarantine", "box", reason=hostile)).status_code == 303
        for path in ("/sandbox?key=box", "/quarantines"):
            page = (await browser.get(path)).text
            assert "<script>alert" not in page, path
            assert "AKIAIOSFODNN7EXAMPLE" not in page, f"{path}: scrubbed on the way out"
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, path
        data = (await browser.get("/sandboxes.json")).json()["sandboxes"]
        assert "AKIAIOSFODNN7EXAMPLE" not in str(data)


async def test_without_a_session_nothing_is_shown_or_done(world: World) -> None:
    async with world.browser() as browser:
        assert (await browser.get("/quarantines")).status_code == 303
        answer = await browser.post(
            "/sandbox/action", data={"action": "quarantine", "key": "box"}, headers=ORIGIN
        )
        assert answer.status_code == 401
        assert not world.ctx.manager.quarantines.held
