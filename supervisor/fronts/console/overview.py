"""The overview (operators only: the figures are the whole installation's): counts that
link to their lists (sandboxes by state, quarantined apart, pending approvals, broken,
alarms, calls and refusals in the window), the trends of the last hour, day or week
(trends.py) as inline SVG, and the live figures: calls per second, refusals by reason,
scrub redactions, p50/p95 latency. The same as JSON (/overview.json). Read
when the page asks, never per call: from the supervisor's own metrics registry
(observe/metrics.py) when observability.metrics_listen has it count calls; otherwise from
the audit log's records of the last minutes (the console adds no observer of calls: a page
nobody opens costs the calls nothing)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from stockade.supervisor.fronts.console.audit import decision_of
from stockade.supervisor.fronts.console.context import ConsoleContext, Rates
from stockade.supervisor.fronts.console.html import bars, e, lines, page, table, url, when
from stockade.supervisor.fronts.console.sessions import Session
from stockade.supervisor.fronts.console.trends import WINDOWS, Trends
from stockade.supervisor.models import SandboxState
from stockade.supervisor.observe.audit import MAX_LIMIT, AuditQuery
from stockade.supervisor.observe.metrics import Metrics
from stockade.supervisor.policy.approvals import EVERY


def figures(metrics: Metrics, rates: Rates, states: Mapping[str, int]) -> dict[str, Any]:
    calls: dict[str, float] = {}
    redactions = 0.0
    buckets: dict[float, float] = {}
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name == "stockade_tool_calls_total":
                result = s.labels.get("result", "")
                calls[result] = calls.get(result, 0) + s.value
            elif s.name == "stockade_redactions_total":
                redactions += s.value
            elif s.name == "stockade_tool_call_seconds_bucket":
                bound = float(s.labels["le"])
                buckets[bound] = buckets.get(bound, 0) + s.value
    total = sum(calls.values())
    refusals = {k: v for k, v in calls.items() if k != "ok"}
    return {
        "calls": total,
        "calls_per_s": rates.rate(total, time.time()),
        "refusals": refusals,
        "redactions": redactions,
        "p50_ms": quantile(buckets, 0.5),
        "p95_ms": quantile(buckets, 0.95),
        "sandboxes": dict(states),
    }


AUDIT_WINDOW_S = 300.0
NOT_CALLS = ("network", "housekeeping", "alarm")
"""Audit records that are no tool call (egress decisions, housekeeping, alarms: counted
apart, never as calls or refusals); console.* neither."""


async def from_audit(ctx: ConsoleContext, tenants: list[str]) -> dict[str, Any]:
    """The figures of the calls the audit log holds of the last AUDIT_WINDOW_S seconds."""
    audit = ctx.policy.audit
    now = time.time()
    durations: list[int] = []
    refusals: dict[str, float] = {}
    redactions = 0
    for tenant in tenants:
        query = AuditQuery(tenant=tenant, since=now - AUDIT_WINDOW_S, limit=MAX_LIMIT)
        for r in await audit.query(query) if audit is not None else []:
            if r.tool in NOT_CALLS or r.tool.startswith("console."):
                continue
            durations.append(r.duration_ms)
            redactions += r.redactions
            if r.is_error:
                reason = r.error_code or "error"
                refusals[reason] = refusals.get(reason, 0) + 1
    durations.sort()

    def pick(q: float) -> float | None:
        return (
            float(durations[min(len(durations) - 1, int(q * len(durations)))])
            if durations
            else None
        )

    return {
        "calls": len(durations),
        "calls_per_s": round(len(durations) / AUDIT_WINDOW_S, 2),
        "refusals": refusals,
        "redactions": redactions,
        "p50_ms": pick(0.5),
        "p95_ms": pick(0.95),
        "sandboxes": states(ctx),
        "source": f"the audit log, last {AUDIT_WINDOW_S / 60:g} minutes",
    }


def quantile(buckets: Mapping[float, float], q: float) -> float | None:
    """The q-quantile in ms from cumulative histogram buckets (linear within a bucket)."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] == 0:
        return None
    wanted = q * ordered[-1][1]
    low_bound, low_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= wanted:
            if bound == float("inf"):
                return round(low_bound * 1000, 2)
            share = (wanted - low_count) / (count - low_count) if count > low_count else 1.0
            return round((low_bound + (bound - low_bound) * share) * 1000, 2)
        low_bound, low_count = bound, count
    return None


def operator(ctx: ConsoleContext, request: Request) -> Session:
    session = ctx.session(request)
    if not session.operator:
        raise HTTPException(403, "the overview is for operators ([console] operators)")
    return session


QUARANTINED = "QUARANTINED"


def states(ctx: ConsoleContext) -> dict[str, int]:
    """Sandboxes by state, a quarantined one counted as QUARANTINED, never as the state
    (PAUSED) its freeze puts it in."""
    counts = dict(ctx.manager.state_counts())
    held = ctx.manager.quarantines.held
    for key in held:
        sandbox = ctx.manager.registry.get(key)
        state = getattr(getattr(sandbox, "state", None), "name", None)
        if state in counts and counts[state] > 0:
            counts[state] -= 1
    counts[QUARANTINED] = len(held)
    return counts


def state_list(state: str) -> str:
    """The list behind a state's count."""
    return "/quarantines" if state == QUARANTINED else url("/sandboxes", state=state)


def trends_of(ctx: ConsoleContext) -> Trends | None:
    if ctx.trends is None and ctx.policy.audit is not None:
        ctx.trends = Trends(ctx.policy.audit, decision_of)
    return ctx.trends


def iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="seconds")


def counts(
    ctx: ConsoleContext, held: Mapping[str, int], window: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The overview's counts, each with the list it counts (the same filters)."""
    found = [
        {"id": f"state-{s.lower()}", "label": s.lower(), "value": n, "href": state_list(s)}
        for s, n in held.items()
        if s != SandboxState.BROKEN.name  # its own count, below
    ]
    found.append(
        {
            "id": "pending-approvals",
            "label": "pending approvals",
            "value": len(ctx.policy.approvals.pending(EVERY)),
            "href": "/approvals",
        }
    )
    found.append(
        {
            "id": "broken",
            "label": "broken",
            "value": held.get(SandboxState.BROKEN.name, 0),
            "href": state_list(SandboxState.BROKEN.name),
        }
    )
    if window:
        since = iso(window["since"])
        for name, label, filters in (
            ("alarms", "alarms", {"tool": "alarm"}),
            ("calls", "calls", {}),
            ("refused", "refusals", {"outcome": "refused"}),
        ):
            found.append(
                {
                    "id": f"window-{name}",
                    "label": f"{label} in {window['window']}",
                    "value": window[name],
                    "href": url("/audit", tenant="*", since=since, **filters),
                }
            )
    return found


async def current(ctx: ConsoleContext, session: Session, asked: str = "1h") -> dict[str, Any]:
    if ctx.metrics is None:
        found = await from_audit(ctx, ctx.known_tenants(session))
    else:
        found = figures(ctx.metrics, ctx.rates, states(ctx))
        found["source"] = "the metrics registry, since the start"
    trends = trends_of(ctx)
    windows: dict[str, Any] = {}
    if trends is not None:
        complete = await asyncio.to_thread(trends.refresh)
        windows = {name: trends.window(name, complete) for name in WINDOWS}
    found["window"] = asked
    found["trends"] = windows
    found["counts"] = counts(ctx, found["sandboxes"], windows.get(asked, {}))
    return found


def window_asked(request: Request) -> str:
    asked = request.query_params.get("window", "1h")
    if asked not in WINDOWS:
        raise HTTPException(400, f"window must be one of {', '.join(WINDOWS)}")
    return asked


def shown(value: Any, unit: str = "") -> str:
    return "-" if value is None else f"{value:g}{unit}"


def count_list(found: list[dict[str, Any]]) -> str:
    items = "".join(
        f'<li><a href="{e(c["href"])}" id="{e(c["id"])}"><span class="n">{e(c["value"])}</span> '
        f"{e(c['label'])}</a></li>"
        for c in found
    )
    return f'<ul class="counts" id="counts">{items}</ul>'


def trend_section(window: Mapping[str, Any]) -> str:
    if not window:
        return '<p class="hint">No trends: the audit log is off.</p>'
    points = window["points"]
    first, last = when(window["since"]), "now"
    calls = {"calls": [p["calls"] for p in points], "refused": [p["refused"] for p in points]}
    latency = {"p50": [p["p50_ms"] for p in points], "p95": [p["p95_ms"] for p in points]}
    partial = (
        ""
        if window["complete"]
        else '<p class="note" role="status" id="partial">Still reading the audit log: '
        "these trends are partial.</p>"
    )
    return (
        partial
        + f'<p class="hint">Since {e(first)} (UTC), one point per {e(window["step_s"] // 60)} '
        f"minutes. Latency p50 {e(shown(window['p50_ms'], ' ms'))}, p95 "
        f"{e(shown(window['p95_ms'], ' ms'))}; {e(window['failed'])} failed, "
        f"{e(window['redactions'])} redactions.</p>"
        '<div class="charts">'
        + lines("Calls and refusals", calls, (first, last), id="trend-calls")
        + lines("Latency p50 / p95 (ms)", latency, (first, last), id="trend-latency")
        + bars(f"Refusals by reason, {window['window']}", window["refusals"], id="trend-refusals")
        + "</div>"
    )


async def overview_page(ctx: ConsoleContext, request: Request) -> Response:
    session = operator(ctx, request)
    asked = window_asked(request)
    now = await current(ctx, session, asked)
    numbers = table(
        ("Figure", "Value"),
        [
            ["Calls per second", f'<span id="calls-per-s">{e(shown(now["calls_per_s"]))}</span>'],
            ["Calls", f'<span id="calls">{e(shown(now["calls"]))}</span>'],
            ["Scrub redactions", f'<span id="redactions">{e(shown(now["redactions"]))}</span>'],
            ["Latency p50", f'<span id="p50">{e(shown(now["p50_ms"], " ms"))}</span>'],
            ["Latency p95", f'<span id="p95">{e(shown(now["p95_ms"], " ms"))}</span>'],
        ],
        id="figures",
    )
    picker = " ".join(
        f'<a href="{e(url("/overview", window=name))}" id="window-{e(name)}"'
        + (' aria-current="page" class="current"' if name == asked else "")
        + f">{e(name)}</a>"
        for name in WINDOWS
    )
    body = (
        count_list(now["counts"])
        + f'<h2>Trends</h2><p class="windows">Window: {picker}</p>'
        + trend_section(now["trends"].get(asked, {}))
        + "<h2>Now</h2>"
        + f'<p class="hint">From <span id="source">{e(now["source"])}</span>.</p>'
        + numbers
        + '<div class="charts">'
        + bars("Refusals by reason", now["refusals"], id="refusals")
        + bars("Sandboxes by state", now["sandboxes"], id="states")
        + "</div>"
    )
    live = url("/overview.json", window=asked)
    return HTMLResponse(
        page("Overview", body, session, data={"live-overview": live, "refresh": ctx.refresh})
    )


async def overview_json(ctx: ConsoleContext, request: Request) -> Response:
    session = operator(ctx, request)
    return JSONResponse(await current(ctx, session, window_asked(request)))
