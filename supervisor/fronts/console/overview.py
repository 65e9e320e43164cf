"""The overview (operators only: the figures are the whole installation's): calls per
second, refusals by reason, scrub redactions, p50/p95 latency and sandboxes by state. Read
when the page asks, never per call: from the supervisor's own metrics registry
(observe/metrics.py) when observability.metrics_listen has it count calls; otherwise from
the audit log's records of the last minutes (the console adds no observer of calls: a page
nobody opens costs the calls nothing)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from stockade.supervisor.fronts.console.context import ConsoleContext, Rates
from stockade.supervisor.fronts.console.html import bars, e, page, table
from stockade.supervisor.fronts.console.sessions import Session
from stockade.supervisor.observe.audit import MAX_LIMIT, AuditQuery
from stockade.supervisor.observe.metrics import Metrics


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
NOT_CALLS = ("network", "housekeeping")
"""Audit records that are no tool call (egress decisions, housekeeping); console.* neither."""


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
        "sandboxes": dict(ctx.manager.state_counts()),
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


async def current(ctx: ConsoleContext, session: Session) -> dict[str, Any]:
    if ctx.metrics is None:
        return await from_audit(ctx, ctx.known_tenants(session))
    found = figures(ctx.metrics, ctx.rates, ctx.manager.state_counts())
    return {**found, "source": "the metrics registry, since the start"}


async def overview_page(ctx: ConsoleContext, request: Request) -> Response:
    session = operator(ctx, request)
    now = await current(ctx, session)

    def shown(value: Any, unit: str = "") -> str:
        return "-" if value is None else f"{value:g}{unit}"

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
    body = (
        f'<p class="hint">From <span id="source">{e(now["source"])}</span>.</p>'
        + numbers
        + '<div class="charts">'
        + bars("Refusals by reason", now["refusals"], id="refusals")
        + bars("Sandboxes by state", now["sandboxes"], id="states")
        + "</div>"
    )
    return HTMLResponse(
        page(
            "Overview",
            body,
            session,
            data={"live-overview": "/overview.json", "refresh": ctx.refresh},
        )
    )


async def overview_json(ctx: ConsoleContext, request: Request) -> Response:
    return JSONResponse(await current(ctx, operator(ctx, request)))
