"""The overview: counts that link to their filtered lists (a quarantined sandbox counted
apart from the paused ones, alarms apart from calls and refusals), the trends of 1 h / 24 h
/ 7 d from the audit log (refusals by reason, p50/p95), their charts, the JSON, and the
trends' fold of a log read a bounded number of records at a time. The fixtures and the
sandbox manager's stand-in are test_console.py's."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.testclient import TestClient

from stockade.supervisor.app import build_policy
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.config import load_config
from stockade.supervisor.fronts.console import trends as trends_module
from stockade.supervisor.fronts.console.app import build_app
from stockade.supervisor.fronts.console.audit import decision_of
from stockade.supervisor.fronts.console.context import ConsoleContext
from stockade.supervisor.fronts.console.trends import LATENCY_MS, Trends, quantile
from stockade.supervisor.keys import scope
from stockade.supervisor.models import ErrorCode, SandboxState
from stockade.supervisor.observe.audit import AuditLog, AuditRecord
from stockade.supervisor.observe.metrics import Metrics
from stockade.supervisor.sandboxes.quarantine import Quarantine
from tests.unit.fakes import tokens_file
from tests.unit.test_console import ALICE, OPS, Manager, info, login, stand_in
from tests.unit.test_console import client as client  # the fixtures
from tests.unit.test_console import ctx as ctx


def call(
    tenant: str = "alice",
    tool: str = "exec",
    error: str = "",
    *,
    ago: float = 0.0,
    ms: int = 3,
    **fields: Any,
) -> AuditRecord:
    return AuditRecord(
        time=time.time() - ago, request_id="r", caller="c", sandbox_key=scope(tenant, "a1"),
        agent_id="agent", provider="", tool=tool, arguments_json=json.dumps({"command": "ls"}),
        policy_step=fields.pop("policy_step", "allowed"), error_code=error,
        is_error=bool(error), front="grpc", duration_ms=ms, **fields,
    )  # fmt: skip


def audit_of(ctx: ConsoleContext) -> AuditLog:
    assert ctx.policy.audit is not None
    return ctx.policy.audit


def by_id(counts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in counts}


def test_counts_link_to_their_lists_and_a_quarantine_is_not_paused(
    client: TestClient, ctx: ConsoleContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = stand_in(ctx)
    paused, quarantined = scope("bob", "p1"), scope("bob", "q1")
    for key in (paused, quarantined):
        manager.infos[key] = dataclasses.replace(info(key), state=SandboxState.PAUSED)
        held = SimpleNamespace(running=False, pid=0)
        manager.registry[key] = SimpleNamespace(state=SandboxState.PAUSED, info=held)
    counted = {"RUNNING": 2, "PAUSED": 2, "BROKEN": 0, "EXITED": 0}
    monkeypatch.setattr(manager, "state_counts", lambda: counted)
    manager.quarantines.held[quarantined] = Quarantine(quarantined, time.time(), frozen=True)
    login(client, OPS)
    data = client.get("/overview.json").json()
    assert data["sandboxes"] == {
        "RUNNING": 2,
        "PAUSED": 1,
        "BROKEN": 0,
        "EXITED": 0,
        "QUARANTINED": 1,
    }
    counts = by_id(data["counts"])
    assert counts["state-paused"]["value"] == 1
    assert counts["state-quarantined"] == {
        "id": "state-quarantined", "label": "quarantined", "value": 1, "href": "/quarantines",
    }  # fmt: skip
    assert counts["broken"]["href"] == "/sandboxes?state=BROKEN"
    assert counts["pending-approvals"] == {
        "id": "pending-approvals", "label": "pending approvals", "value": 0, "href": "/approvals",
    }  # fmt: skip
    # each count is the length of the list it links to
    for state in ("RUNNING", "PAUSED"):
        href = counts[f"state-{state.lower()}"]["href"]
        assert href == f"/sandboxes?state={state}"
        listed = client.get(href.replace("/sandboxes", "/sandboxes.json")).json()["sandboxes"]
        assert len(listed) == counts[f"state-{state.lower()}"]["value"], state
    listed = client.get("/sandboxes.json?state=QUARANTINED").json()["sandboxes"]
    assert [s["key"] for s in listed] == ["q1"]
    page = client.get("/overview").text
    assert 'href="/quarantines" id="state-quarantined"><span class="n">1</span>' in page


def test_alarms_are_counted_apart_from_calls_and_refusals(
    client: TestClient, ctx: ConsoleContext
) -> None:
    ctx.metrics = None  # the live figures from the audit log too
    audit = audit_of(ctx)
    audit.record(call())
    audit.record(call(error=ErrorCode.PERMISSION_DENIED, guard_rule="rm-root"))
    for _ in range(3):
        audit.record(call(tool="alarm", error="ALARM", policy_step="guard"))
    audit.flush()
    login(client, OPS)
    data = client.get("/overview.json").json()
    assert data["calls"] == 2  # the live figures: alarms are no calls
    assert data["refusals"] == {"PERMISSION_DENIED": 1}
    hour = data["trends"]["1h"]
    assert (hour["calls"], hour["refused"], hour["alarms"]) == (2, 1, 3)
    assert hour["refusals"] == {"guard: rm-root": 1}
    counts = by_id(data["counts"])
    assert counts["window-alarms"]["value"] == 3
    href = counts["window-alarms"]["href"]
    assert href.startswith("/audit?tenant=%2A&since=")
    assert href.endswith("&tool=alarm")
    listed = client.get(href)
    assert listed.status_code == 200
    assert listed.text.count('<span class="decision alarm">') == 3  # the list it counts
    refused = client.get(counts["window-refused"]["href"]).text
    assert "guard: rm-root" in refused


def test_the_windows_hold_what_is_theirs(client: TestClient, ctx: ConsoleContext) -> None:
    audit = audit_of(ctx)  # written as they happened: oldest first
    audit.record(call(ago=8 * 86400))  # older than the week: in no window
    audit.record(call(ago=3 * 86400, ms=400, error=ErrorCode.APPROVAL_DENIED, approval="deny",
                      approver="console:operator:ops"))  # fmt: skip
    audit.record(call(ago=2 * 3600, ms=40, error=ErrorCode.RATE_LIMITED, policy_step="rate"))
    audit.record(call(ago=60, ms=4))
    audit.flush()
    login(client, OPS)
    windows = client.get("/overview.json").json()["trends"]
    assert [windows[w]["calls"] for w in ("1h", "24h", "7d")] == [1, 2, 3]
    assert windows["24h"]["refusals"] == {"limit: rate": 1}
    assert windows["7d"]["refusals"] == {"limit: rate": 1, "approval: deny": 1}  # no approver
    assert 2 <= windows["1h"]["p50_ms"] <= windows["1h"]["p95_ms"] <= 5  # 4 ms: bin 2-5
    assert 20 <= windows["24h"]["p95_ms"] <= 50
    assert [len(windows[w]["points"]) for w in ("1h", "24h", "7d")] == [12, 48, 84]
    assert sum(p["calls"] for p in windows["7d"]["points"]) == 3
    assert client.get("/overview.json?window=7d").json()["window"] == "7d"


def test_the_page_draws_its_charts_within_the_csp(client: TestClient, ctx: ConsoleContext) -> None:
    audit = audit_of(ctx)
    for ms in (1, 5, 50):
        audit.record(call(ms=ms))
    audit.record(call(error=ErrorCode.PERMISSION_DENIED, guard_rule="<b>x</b>"))
    audit.flush()
    login(client, OPS)
    page = client.get("/overview?window=24h").text
    for chart in ("trend-calls", "trend-latency", "trend-refusals", "states"):
        assert f'id="{chart}"' in page, chart
    assert "<polyline" in page or "<circle" in page
    assert "<script>" not in page
    assert " style=" not in page
    assert "<style" not in page
    assert "guard: <b>" not in page
    assert "guard: &lt;b&gt;x&lt;/b&gt;" in page
    assert 'id="window-24h" aria-current="page"' in page


def test_hostile_overview_and_list_requests_are_refused(client: TestClient) -> None:
    login(client, OPS)
    for path in (
        "/overview?window=1y",
        "/overview.json?window=%00",
        "/sandboxes?state=running;drop",
        "/sandboxes.json?state=" + "R" * 100,
    ):
        assert client.get(path).status_code == 400, path
    login(client, ALICE)
    assert client.get("/overview.json").status_code == 403  # a tenant user has no overview


def test_quantiles_from_the_histogram() -> None:
    bins = [0] * (len(LATENCY_MS) + 1)
    assert quantile(bins, 0.5) is None
    bins[2] = 10  # ten calls of 2-5 ms
    assert quantile(bins, 0.5) == pytest.approx(3.5)
    bins[-1] = 90  # and ninety over the last bound
    assert quantile(bins, 0.95) == float(LATENCY_MS[-1])


def test_a_read_folds_a_bounded_number_and_the_rest_catches_up(
    ctx: ConsoleContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trends_module, "FOLD_ROWS", 10)
    monkeypatch.setattr(trends_module, "FOLD_CHUNK", 7)
    audit = audit_of(ctx)
    for i in range(45):
        audit.record(call(ms=i))
    audit.flush()
    trends = Trends(audit, decision_of)
    assert trends.refresh() is False  # 10 folded here, the rest behind
    assert trends.window("1h", False)["complete"] is False
    assert trends._catching_up is not None
    trends._catching_up.join(30)
    assert trends.refresh() is True
    assert trends.folded == 45
    assert trends.window("1h")["calls"] == 45
    audit.record(call())  # each record read once: a new one is the only one read next
    audit.flush()
    assert trends.refresh() is True
    assert trends.folded == 46
    assert trends.window("1h")["calls"] == 46


def test_partial_trends_say_so(
    client: TestClient, ctx: ConsoleContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trends_module, "FOLD_ROWS", 1)
    monkeypatch.setattr(trends_module.Trends, "catch_up", lambda self: None)
    audit = audit_of(ctx)
    audit.record(call())
    audit.record(call())
    audit.flush()
    login(client, OPS)
    page = client.get("/overview").text
    assert re.search(r'id="partial">Still reading the audit log', page)


def test_the_sandbox_list_is_read_a_page_at_a_time(client: TestClient, ctx: ConsoleContext) -> None:
    from stockade.supervisor.fronts.console.sandboxes import PAGE_ROWS

    manager = stand_in(ctx)
    for i in range(PAGE_ROWS + 48):
        key = scope("bob", f"many-{i:03d}")
        manager.infos[key] = info(key)
    total = len(manager.infos)
    login(client, OPS)
    first = client.get("/sandboxes.json").json()
    assert (len(first["sandboxes"]), first["total"], first["offset"]) == (PAGE_ROWS, total, 0)
    rest = client.get(f"/sandboxes.json?offset={PAGE_ROWS}").json()["sandboxes"]
    assert len(rest) == total - PAGE_ROWS
    seen = {s["key"] for s in first["sandboxes"]} | {s["key"] for s in rest}
    assert len(seen) == total  # every sandbox on one page or the other
    page = client.get("/sandboxes").text
    assert f'href="/sandboxes?offset={PAGE_ROWS}" id="next"' in page
    assert f"Sandboxes 1-{PAGE_ROWS} of {total}." in page
    assert client.get("/sandboxes.json?offset=99999").json()["sandboxes"] == []
    for hostile in ("-1", "1e3", "abc", "9" * 9):
        assert client.get(f"/sandboxes.json?offset={hostile}").status_code == 400, hostile


def test_without_an_audit_log_the_overview_has_no_trends(tmp_path: Path) -> None:
    tokens = tokens_file(tmp_path, f"{OPS} ops\n")
    config = load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "auth.tokens_file": str(tokens),
            "console.listen": "127.0.0.1:0",
            "console.operators": ["ops"],
            "audit.enabled": False,
        },
    )
    policy = build_policy(config)
    assert policy.audit is None
    manager = Manager(config, [scope("ops", "o1")])
    context = ConsoleContext(config, policy, Authenticator(config.auth), manager, Metrics())
    client = TestClient(build_app(context), follow_redirects=False)
    login(client, OPS)
    data = client.get("/overview.json").json()
    assert data["trends"] == {}
    assert not [c for c in data["counts"] if c["id"].startswith("window-")]
    assert "No trends: the audit log is off." in client.get("/overview").text
