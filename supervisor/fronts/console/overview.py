"""The overview (operators only: the figures are the whole installation's): calls per
second, refusals by reason, scrub redactions, p50/p95 latency and sandboxes by state, read
from the supervisor's own metrics registry (observe/metrics.py) when the page asks, never
per call."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from stockade.supervisor.fronts.console.context import ConsoleContext, Rates
from stockade.supervisor.fronts.console.html import bars, e, page, table
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


def operator(ctx: ConsoleContext, request: Request) -> Any:
    session = ctx.session(request)
    if not session.operator:
        raise HTTPException(403, "the overview is for operators ([console] operators)")
    return session


def current(ctx: ConsoleContext) -> dict[str, Any]:
    if ctx.metrics is None:
        raise HTTPException(404, "no metrics registry")
    return figures(ctx.metrics, ctx.rates, ctx.manager.state_counts())


async def overview_page(ctx: ConsoleContext, request: Request) -> Response:
    session = operator(ctx, request)
    now = current(ctx)

    def shown(value: Any, unit: str = "") -> str:
        return "-" if value is None else f"{value:g}{unit}"

    numbers = table(
        ("Figure", "Value"),
        [
            ["Calls per second", f'<span id="calls-per-s">{e(shown(now["calls_per_s"]))}</span>'],
            ["Calls since start", f'<span id="calls">{e(shown(now["calls"]))}</span>'],
            ["Scrub redactions", f'<span id="redactions">{e(shown(now["redactions"]))}</span>'],
            ["Latency p50", f'<span id="p50">{e(shown(now["p50_ms"], " ms"))}</span>'],
            ["Latency p95", f'<span id="p95">{e(shown(now["p95_ms"], " ms"))}</span>'],
        ],
        id="figures",
    )
    body = (
        numbers
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
    operator(ctx, request)
    return JSONResponse(current(ctx))
