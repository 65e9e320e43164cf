"""The audit pages: filters (key, tool, agent, tenant, front, outcome, time), a time
histogram of calls and refusals, a record's page, and the filtered records as JSON lines.
Reads go to the audit log the gRPC AuditService reads, always within one tenant (its
indexes lead with the tenant): an operator picks the tenant, a tenant user has its own."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse

from stockade.supervisor.fronts.console.context import ConsoleContext, query
from stockade.supervisor.fronts.console.html import columns, e, page, short, table, url, when
from stockade.supervisor.fronts.console.sessions import Session
from stockade.supervisor.observe.audit import MAX_LIMIT, AuditLog, AuditQuery, AuditRecord
from stockade.supervisor.tools.catalog import ALIASES

FILTERS = ("tenant", "key", "tool", "agent", "front", "outcome", "since", "limit")
OUTCOMES = ("", "ok", "refused")
SHOWN = 200
BUCKETS = 30


@dataclasses.dataclass(frozen=True)
class Filter:
    tenant: str
    key: str = ""
    tool: str = ""
    agent: str = ""
    front: str = ""
    outcome: str = ""
    since: float = 0.0
    limit: int = SHOWN

    def params(self) -> dict[str, object]:
        since = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(self.since)) if self.since else ""
        return {**dataclasses.asdict(self), "since": since, "limit": self.limit}


def parse(ctx: ConsoleContext, session: Session, request: Request) -> Filter:
    tenant = ctx.tenant_for(session, query(request, "tenant")) or session.tenant
    outcome = query(request, "outcome")
    if outcome not in OUTCOMES:
        raise HTTPException(400, "outcome must be ok or refused")
    since_text = query(request, "since", 64)
    since = 0.0
    if since_text:
        try:
            moment = datetime.fromisoformat(since_text)
        except ValueError:
            raise HTTPException(400, "since must be a time like 2026-11-26T06:00") from None
        if moment.tzinfo is None:
            since = moment.replace(tzinfo=UTC).timestamp()
        else:
            since = moment.timestamp()
    limit_text = query(request, "limit", 8) or str(SHOWN)
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIMIT:
        raise HTTPException(400, f"limit must be between 1 and {MAX_LIMIT}")
    return Filter(
        tenant=tenant,
        key=query(request, "key", 256),
        tool=query(request, "tool", 128),
        agent=query(request, "agent", 128),
        front=query(request, "front", 32),
        outcome=outcome,
        since=since,
        limit=int(limit_text),
    )


def audit_log(ctx: ConsoleContext) -> AuditLog:
    if ctx.policy.audit is None:
        raise HTTPException(404, "the audit log is off (audit.enabled = false)")
    return ctx.policy.audit


async def records(ctx: ConsoleContext, f: Filter) -> list[AuditRecord]:
    """The records of a filter, newest first: the indexed filters in the query, front and
    a successful outcome applied to what it returns."""
    found = await audit_log(ctx).query(
        AuditQuery(
            tenant=f.tenant,
            sandbox_key=f.key,
            tool=ALIASES.get(f.tool, f.tool),
            agent_id=f.agent,
            since=f.since,
            limit=f.limit,
            errors_only=f.outcome == "refused",
        )
    )
    if f.front:
        found = [r for r in found if r.front == f.front]
    if f.outcome == "ok":
        found = [r for r in found if not r.is_error]
    return found


def histogram(found: list[AuditRecord]) -> list[tuple[str, int, int]]:
    if not found:
        return []
    first, last = min(r.time for r in found), max(r.time for r in found)
    width = max((last - first) / BUCKETS, 1.0)
    counts = [[0, 0] for _ in range(BUCKETS)]
    for r in found:
        slot = min(int((r.time - first) / width), BUCKETS - 1)
        counts[slot][0] += 1
        counts[slot][1] += r.is_error
    return [(when(first + i * width), c, x) for i, (c, x) in enumerate(counts)]


def form(f: Filter, session: Session) -> str:
    values = f.params()
    fields = []
    for name in FILTERS:
        if name == "tenant" and not session.operator:
            continue
        if name == "outcome":
            options = "".join(
                f'<option value="{o}"{" selected" if o == f.outcome else ""}>{o or "any"}</option>'
                for o in OUTCOMES
            )
            fields.append(f'<label>outcome <select name="outcome">{options}</select></label>')
            continue
        kind = "datetime-local" if name == "since" else "text"
        fields.append(
            f'<label>{name} <input type="{kind}" name="{name}" value="{e(values[name])}"></label>'
        )
    export = url("/audit/export.jsonl", **values)
    return (
        f'<form method="get" action="/audit" class="filters">{"".join(fields)}'
        f'<button type="submit" id="filter">Filter</button></form>'
        f'<p><a href="{e(export)}" id="export">Export as JSON lines</a></p>'
    )


async def audit_page(ctx: ConsoleContext, request: Request) -> Response:
    session = ctx.session(request)
    f = parse(ctx, session, request)
    found = await records(ctx, f)
    rows = (
        [
            f'<a href="{e(url("/audit/record", tenant=f.tenant, id=r.id))}">{e(when(r.time))}</a>',
            short(r.sandbox_key),
            short(r.tool),
            short(r.agent_id),
            e(r.front or "-"),
            e(r.error_code or "ok"),
            e(r.policy_step),
            e(r.duration_ms),
        ]
        for r in found
    )
    body = (
        form(f, session)
        + columns("Calls (and refusals) over time", histogram(found), id="histogram")
        + table(
            ("Time", "Key", "Tool", "Agent", "Front", "Outcome", "Policy", "ms"),
            rows,
            id="records",
            empty="No records match.",
        )
    )
    return HTMLResponse(page("Audit", body, session))


async def record_page(ctx: ConsoleContext, request: Request) -> Response:
    """One record, looked up among its tenant's latest MAX_LIMIT."""
    session = ctx.session(request)
    tenant = ctx.tenant_for(session, query(request, "tenant")) or session.tenant
    wanted = query(request, "id", 20)
    if not wanted.isdigit():
        raise HTTPException(400, "id must be a record number")
    found = await audit_log(ctx).query(AuditQuery(tenant=tenant, limit=MAX_LIMIT))
    record = next((r for r in found if r.id == int(wanted)), None)
    if record is None:
        raise HTTPException(404, f"no record {wanted} among the latest {MAX_LIMIT} of the tenant")
    fields = dataclasses.asdict(record)
    fields["time"] = f"{when(record.time)} ({record.time})"
    with contextlib.suppress(ValueError):
        fields["arguments_json"] = json.dumps(json.loads(record.arguments_json), indent=2)
    rows = (
        [e(k), f"<pre>{e(v)}</pre>" if k == "arguments_json" else e(v)] for k, v in fields.items()
    )
    return HTMLResponse(page(f"Audit record {wanted}", table(("Field", "Value"), rows), session))


async def export(ctx: ConsoleContext, request: Request) -> Response:
    session = ctx.session(request)
    f = parse(ctx, session, request)
    found = await records(ctx, f)

    def lines() -> Iterator[str]:
        for r in found:
            yield json.dumps(dataclasses.asdict(r), ensure_ascii=False) + "\n"

    name = f"stockade-audit-{f.tenant}-{int(time.time())}.jsonl"
    return StreamingResponse(
        lines(),
        media_type="application/x-ndjson",
        headers={"content-disposition": f'attachment; filename="{name}"'},
    )
