"""The console's pages over the real approval manager and audit log: tenants and roles,
approvals (decided from the console, the operator's stream across tenants), the audit
filters and export, the overview from metrics or from the audit log. The fixtures and the
sandbox manager's stand-in are test_console.py's."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import pytest
from starlette.testclient import TestClient

from stockade.supervisor import database
from stockade.supervisor.fronts.console.app import build_app
from stockade.supervisor.fronts.console.context import ConsoleContext
from stockade.supervisor.fronts.console.overview import quantile
from stockade.supervisor.keys import scope
from stockade.supervisor.observe.audit import AuditRecord
from stockade.supervisor.observe.telemetry import CallObservation
from stockade.supervisor.policy.approvals import DECISIONS
from tests.unit.test_console import ALICE, BOB, OPS, ORIGIN, csrf_of, info, login, stand_in
from tests.unit.test_console import client as client  # the fixtures
from tests.unit.test_console import ctx as ctx

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
    assert stand_in(ctx).asked == [("destroy", scope("alice", "b1"))]


def test_an_operator_sees_every_tenant(client: TestClient, ctx: ConsoleContext) -> None:
    csrf = login(client, OPS)
    keys = {(s["tenant"], s["key"]) for s in client.get("/sandboxes.json").json()["sandboxes"]}
    assert keys == {("alice", "a1"), ("bob", "b1")}
    only = client.get("/sandboxes.json?tenant=bob").json()["sandboxes"]
    assert [s["key"] for s in only] == ["b1"]
    assert client.get("/sandbox?tenant=bob&key=b1").status_code == 200
    data = {"action": "pause", "tenant": "bob", "key": "b1", "csrf": csrf}  # b1 runs
    assert client.post("/sandbox/action", data=data, headers=ORIGIN).status_code == 303
    assert stand_in(ctx).asked == [("pause", scope("bob", "b1"))]
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
        "/audit/record?id=0",
        "/audit/record?id=99999999999999999999",  # past SQLite's integers
    ):
        assert client.get(path).status_code == 400, path


def test_text_is_escaped(client: TestClient, ctx: ConsoleContext) -> None:
    evil = "<img src=x onerror=alert(1)>"
    stand_in(ctx).infos[scope("alice", evil)] = info(scope("alice", evil))
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


def test_the_decided_list_finds_decisions_behind_many_later_calls(
    client: TestClient, ctx: ConsoleContext
) -> None:
    """Each decided call (an approver's decision or a timeout), however many calls came after
    it, newest first across the watched tenants; never another tenant's for a tenant user;
    and a call that needed no approver, or was allowlisted or withdrawn, is not one."""
    audit = ctx.policy.audit
    assert audit is not None
    start = time.time() - 10_000
    for n, (tenant, approval, command) in enumerate(
        [
            ("alice", "deny", "rm -rf /old"),
            ("bob", "allow-once", "bobs decided command"),
            ("alice", "timeout", "sudo reboot"),
            ("alice", "allowlist", "allowlisted command"),
            ("alice", "withdrawn", "withdrawn command"),
        ]
    ):
        audit.record(
            dataclasses.replace(
                record(tenant, "a1", "exec"), time=start + n, approval=approval,
                arguments_json=json.dumps({"command": command}),
            )
        )  # fmt: skip
    for n in range(600):  # more than the 500 latest calls the list once looked through
        audit.record(dataclasses.replace(record("alice", "a1", "exec"), time=start + 100 + n))
    audit.flush()
    login(client, ALICE)
    decided = client.get("/approvals").text.split('id="decided"', 1)[1]
    assert decided.count("<tr><td>") == 2, decided
    assert decided.index("sudo reboot") < decided.index("rm -rf /old")  # newest first
    for other in ("bobs decided command", "allowlisted command", "withdrawn command", ">ls<"):
        assert other not in decided
    login(client, OPS)
    decided = client.get("/approvals").text.split('id="decided"', 1)[1]
    assert decided.count("<tr><td>") == 3, decided
    assert "bobs decided command" in decided


def test_the_decided_filter_is_every_decision_and_the_timeout() -> None:
    assert (*DECISIONS, "timeout") == database.DECIDED


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
    histogram = page.split('id="histogram"', 1)[1].split("</figure>", 1)[0]
    assert "3 calls, 1 refused" in histogram  # the three records fall in one bucket
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
    assert data["sandboxes"] == {"RUNNING": 2, "QUARANTINED": 0}
    assert 1 <= data["p50_ms"] <= 5
    assert data["p50_ms"] <= data["p95_ms"] <= 5


def test_quantiles_from_buckets() -> None:
    assert quantile({}, 0.5) is None
    assert quantile({0.001: 0, 0.01: 10, float("inf"): 10}, 0.5) == pytest.approx(5.5)
    assert quantile({0.001: 0, 0.01: 0, float("inf"): 4}, 0.95) == 10.0


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
