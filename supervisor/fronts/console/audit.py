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

from stockade.supervisor.errors import NotFound, PolicyDenied, StockadeError
from stockade.supervisor.fronts.console.context import ConsoleContext, query
from stockade.supervisor.fronts.console.html import (
    columns,
    csrf_field,
    diff_block,
    e,
    folded,
    moment,
    page,
    short,
    table,
    url,
    visible,
    when,
)
from stockade.supervisor.fronts.console.sessions import Session
from stockade.supervisor.keys import scope
from stockade.supervisor.models import ErrorCode
from stockade.supervisor.observe.audit import MAX_LIMIT, AuditLog, AuditQuery, AuditRecord
from stockade.supervisor.policy.scrub.scrubber import Scrubber, scrubbed
from stockade.supervisor.tools.catalog import ALIASES

FILTERS = ("tenant", "key", "tool", "agent", "front", "outcome", "since", "limit")
ALL = "*"
"""The tenant filter's value for every tenant (an operator's default)."""
MAX_TZ_MINUTES = 14 * 60
COMMAND_HEAD, COMMAND_TAIL = 120, 60
"""How much of a command an audit row shows (the record's page has all of it)."""
OUTCOMES = ("", "ok", "refused")
SHOWN = 200
HEADERS = ("Time", "Tenant", "Key", "Tool", "Command", "Decision", "Reason", "Agent", "Front", "ms")
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
    tz: int = 0
    """The viewer's zone, minutes east of UTC (console.js sets it): `since` is read and
    shown in it."""

    def params(self) -> dict[str, object]:
        shifted = time.gmtime(self.since + 60 * self.tz)
        since = time.strftime("%Y-%m-%dT%H:%M", shifted) if self.since else ""
        return {**dataclasses.asdict(self), "since": since, "limit": self.limit}


def parse(ctx: ConsoleContext, session: Session, request: Request) -> Filter:
    asked = query(request, "tenant")
    if session.operator and asked in ("", ALL):
        tenant = ALL  # an operator sees every tenant unless it picks one
    else:
        tenant = ctx.tenant_for(session, asked) or session.tenant
    tz_text = query(request, "tz", 8) or "0"
    try:
        tz = int(tz_text)
    except ValueError:
        raise HTTPException(400, "tz must be the zone's offset in minutes") from None
    if abs(tz) > MAX_TZ_MINUTES:
        raise HTTPException(400, f"tz must be within {MAX_TZ_MINUTES} minutes of UTC")
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
        if moment.tzinfo is None:  # the viewer's zone (tz), UTC without it
            since = moment.replace(tzinfo=UTC).timestamp() - 60 * tz
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
        tz=tz,
    )


def audit_log(ctx: ConsoleContext) -> AuditLog:
    if ctx.policy.audit is None:
        raise HTTPException(404, "the audit log is off (audit.enabled = false)")
    return ctx.policy.audit


async def records(
    ctx: ConsoleContext, f: Filter, session: Session | None = None
) -> list[AuditRecord]:
    """The records of a filter, newest first: the indexed filters in the query, front and
    a successful outcome applied to what it returns. Every tenant (ALL, an operator's): one
    query per tenant the console knows of and the records of none, merged."""
    tenants = [f.tenant]
    if f.tenant == ALL:
        tenants = [*ctx.known_tenants(session), ""] if session is not None else []
    found = []
    for tenant in tenants:
        found += await audit_log(ctx).query(
            AuditQuery(
                tenant=tenant,
                sandbox_key=f.key,
                tool=ALIASES.get(f.tool, f.tool),
                agent_id=f.agent,
                since=f.since,
                limit=f.limit,
                errors_only=f.outcome == "refused",
            )
        )
    if len(tenants) > 1:
        found = sorted(found, key=lambda r: (-r.time, -r.id))[: f.limit]
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


def decision_of(r: AuditRecord) -> tuple[str, str]:
    """What became of a call, and why, from its record: the guard rule, the approval (and
    who gave it), the limit, the tool policy's step, the error. Not policy_step alone: a
    command the guard refused had passed the tool policy ("allowed")."""
    code, step = r.error_code, r.policy_step
    approval = r.approval + (f" by {r.approver}" if r.approver else "")
    if r.tool == "alarm":
        return "alarm", step
    if code == ErrorCode.APPROVAL_DENIED:
        return "refused", f"approval: {approval or 'denied'}"
    if code == ErrorCode.RATE_LIMITED:
        return "refused", f"limit: {step}" if step.startswith("limits.") else "limit: rate"
    if code == ErrorCode.PERMISSION_DENIED:
        if r.guard_rule and r.approval in ("", "withdrawn"):
            return "refused", f"guard: {r.guard_rule}"
        if step == "honeytoken":
            return "refused", "honeytoken"
        return "refused", f"policy: {step}" if step not in ("", "allowed") else f"error: {code}"
    if code and code != ErrorCode.NONE:
        return "failed", f"error: {code}"
    reasons = [f"approval: {approval}"] if r.approval not in ("", "withdrawn", "allowlist") else []
    if r.approval == "allowlist":
        reasons.append("allowlisted")
    if r.guard_rule:
        reasons.insert(0, f"guard asked: {r.guard_rule}")
    if step and step != "allowed":
        reasons.append(step)
    return "allowed", "; ".join(reasons) or "-"


def what_and_why(ctx: ConsoleContext, r: AuditRecord) -> list[str]:
    """A record's Command, Decision and Reason cells: the command folded, the decision with
    its error code, the reason; what could hold a credential scrubbed once more (an alarm's
    detail, a command) before it is shown."""
    decision, reason = decision_of(r)
    code = r.error_code if r.error_code not in ("", ErrorCode.NONE) else ""
    shown = f'<span class="decision {decision}">{decision}</span>'
    if code and decision != "alarm":
        shown += f' <span class="code">{e(code)}</span>'
    scrubber = ctx.policy.scrubber
    return [command_cell(r, scrubber), shown, visible(scrubbed(reason, scrubber))]


def command_cell(r: AuditRecord, scrubber: Scrubber | None = None) -> str:
    """A record's command (exec's; a file call's path), folded; "-" without one."""
    found = ""
    try:
        arguments = json.loads(r.arguments_json) if r.arguments_json else {}
    except ValueError:  # cut when it was recorded: as it is
        arguments, found = {}, r.arguments_json
    if isinstance(arguments, dict):
        for name in ("command", "path", "cmd", "url"):
            if isinstance(arguments.get(name), str):
                found = str(arguments[name])
                break
    return folded(scrubbed(found, scrubber), COMMAND_HEAD, COMMAND_TAIL) if found else "-"


def tenant_select(ctx: ConsoleContext, f: Filter, session: Session) -> str:
    choices = [(ALL, "all tenants"), *((t, t) for t in ctx.known_tenants(session))]
    if f.tenant not in {c for c, _ in choices}:
        choices.append((f.tenant, f.tenant))
    options = "".join(
        f'<option value="{e(v)}"{" selected" if v == f.tenant else ""}>{e(label)}</option>'
        for v, label in choices
    )
    return f'<label>tenant <select name="tenant">{options}</select></label>'


def form(f: Filter, session: Session, ctx: ConsoleContext | None = None) -> str:
    values = f.params()
    fields = [f'<input type="hidden" name="tz" value="{f.tz}" id="tz">']
    for name in FILTERS:
        if name == "tenant":
            if session.operator and ctx is not None:
                fields.append(tenant_select(ctx, f, session))
            continue
        if name == "outcome":
            options = "".join(
                f'<option value="{o}"{" selected" if o == f.outcome else ""}>{o or "any"}</option>'
                for o in OUTCOMES
            )
            fields.append(f'<label>outcome <select name="outcome">{options}</select></label>')
            continue
        kind = "datetime-local" if name == "since" else "text"
        label = name
        if name == "since":  # console.js names the viewer's zone
            label = (
                f'since <span id="since-zone">({"UTC" if not f.tz else f"UTC{f.tz:+d} min"})</span>'
            )
        fields.append(
            f'<label>{label} <input type="{kind}" name="{name}" value="{e(values[name])}"></label>'
        )
    export = url("/audit/export.jsonl", **{k: v for k, v in values.items() if k != "tz" or v})
    return (
        f'<form method="get" action="/audit" class="filters">{"".join(fields)}'
        f'<button type="submit" id="filter">Filter</button></form>'
        f'<p><a href="{e(export)}" id="export">Export as JSON lines</a></p>'
    )


async def audit_page(ctx: ConsoleContext, request: Request) -> Response:
    session = ctx.session(request)
    f = parse(ctx, session, request)
    found = await records(ctx, f, session)
    rows = []
    for r in found:
        rows.append(
            [
                f'<a href="{e(url("/audit/record", tenant=r.tenant, id=r.id))}">'
                f"{moment(r.time)}</a>",
                short(r.tenant or "-"),
                short(r.sandbox_key),
                short(r.tool),
                *what_and_why(ctx, r),
                short(r.agent_id),
                e(r.front or "-"),
                e(r.duration_ms),
            ]
        )
    body = (
        form(f, session, ctx)
        + columns("Calls (and refusals) over time", histogram(found), id="histogram")
        + table(
            HEADERS,
            rows,
            id="records",
            empty="No records match.",
        )
    )
    return HTMLResponse(page("Audit", body, session))


async def find_record(ctx: ConsoleContext, tenant: str, wanted: str) -> AuditRecord:
    """The tenant's record `wanted`, read by its id (400 for a bad id, 404 if the tenant has
    none of that id)."""
    if not wanted.isdigit() or len(wanted) > 20 or not 0 < int(wanted) < 2**63:
        raise HTTPException(400, "id must be a record number")
    found = await audit_log(ctx).query(AuditQuery(tenant=tenant, record_id=int(wanted), limit=1))
    if not found:
        raise HTTPException(404, f"the tenant has no audit record {wanted}")
    return found[0]


async def record_page(ctx: ConsoleContext, request: Request) -> Response:
    """One record, read by its id; with the undo's button when the call took a checkpoint."""
    session = ctx.session(request)
    tenant = ctx.tenant_for(session, query(request, "tenant")) or session.tenant
    wanted = query(request, "id", 20)
    record = await find_record(ctx, tenant, wanted)
    fields = dataclasses.asdict(record)
    fields["time"] = f"{when(record.time)} ({record.time})"
    with contextlib.suppress(ValueError):
        fields["arguments_json"] = json.dumps(json.loads(record.arguments_json), indent=2)
    rows = (
        [e(k), f"<pre>{e(v)}</pre>" if k == "arguments_json" else e(v)] for k, v in fields.items()
    )
    body = table(("Field", "Value"), rows) + undo_button(ctx, session, record, tenant)
    return HTMLResponse(page(f"Audit record {wanted}", body, session))


UNDO_CONFIRMED = "undo"
"""The form field `confirmed`'s value that applies an undo; without it the undo is shown."""


def undo_form(session: Session, record: AuditRecord, tenant: str, label: str, sure: bool) -> str:
    confirmed = f'<input type="hidden" name="confirmed" value="{UNDO_CONFIRMED}">' * sure
    return (
        f'<form method="post" action="/audit/undo" class="undo">{csrf_field(session)}'
        f'<input type="hidden" name="id" value="{record.id}">'
        f'<input type="hidden" name="tenant" value="{e(tenant)}">{confirmed}'
        f'<button type="submit" id="{"undo-confirm" if sure else "undo-show"}">{e(label)}'
        "</button></form>"
    )


def undo_button(ctx: ConsoleContext, session: Session, record: AuditRecord, tenant: str) -> str:
    """For a call that took a checkpoint: the button that shows what its undo takes back."""
    if not record.checkpoint or ctx.undo is None:
        return ""
    return (
        "<h2>Undo</h2><p>A checkpoint of the workspace was taken before this call. The undo "
        "shows what it takes back first (every change since the checkpoint), then asks.</p>"
        + undo_form(session, record, tenant, "Show the undo…", False)
    )


async def undo(ctx: ConsoleContext, request: Request) -> Response:
    """POST /audit/undo (same origin, the session's CSRF token): without `confirmed`, the
    diff the undo of the record's call takes back and a confirming button; with it, the
    undo, through the RollbackSandbox path (one audit record naming the console user)."""
    session, form = await ctx.changing(request)
    if ctx.undo is None:
        raise HTTPException(404, "undo needs checkpoints, which this host does not take")
    tenant = ctx.tenant_for(session, form.get("tenant")) or session.tenant
    record = await find_record(ctx, tenant, form.get("id", "")[:21])
    if not record.checkpoint:
        raise HTTPException(404, f"call {record.request_id} took no checkpoint")
    key = scope(tenant, record.sandbox_key)
    apply = form.get("confirmed") == UNDO_CONFIRMED
    actor = ctx.actor(session, request)
    try:
        done = await ctx.undo(
            key, record.request_id, apply=apply, reason=f"from the console by {actor.caller}"
        )
    except (NotFound, PolicyDenied) as exc:
        raise HTTPException(404 if isinstance(exc, NotFound) else 403, str(exc)) from None
    except StockadeError as exc:
        raise HTTPException(409, str(exc)) from None
    diff = done.diff
    added, removed, changed = diff.counts
    summary = (
        f"<p>To before call <code>{e(record.request_id)}</code> ({e(done.checkpoint.tool)}, "
        f"checkpoint of {e(when(done.checkpoint.created))}): {added} added, {removed} removed, "
        f"{changed} changed {'taken back' if apply else 'to take back'}.</p>"
    )
    text = scrubbed(diff.text, ctx.policy.scrubber)
    if apply:
        body = f"<p>Undone.</p>{summary}" + diff_block(text, "What was taken back")
        return HTMLResponse(page("Undone", body, session))
    body = (
        summary
        + diff_block(text, "What the undo takes back")
        + "<p>The sandbox's container is re-created: every process in it ends. Files only "
        "come back; what a command did outside the workspace stays done.</p>"
        + undo_form(session, record, tenant, "Yes, undo", True)
        + f' <a href="{e(url("/audit/record", id=record.id, tenant=tenant))}" class="button">'
        "Back</a>"
    )
    return HTMLResponse(page("Undo?", body, session))


async def export(ctx: ConsoleContext, request: Request) -> Response:
    session = ctx.session(request)
    f = parse(ctx, session, request)
    found = await records(ctx, f, session)

    def lines() -> Iterator[str]:
        for r in found:
            yield json.dumps(dataclasses.asdict(r), ensure_ascii=False) + "\n"

    name = f"stockade-audit-{'all' if f.tenant == ALL else f.tenant}-{int(time.time())}.jsonl"
    return StreamingResponse(
        lines(),
        media_type="application/x-ndjson",
        headers={"content-disposition": f'attachment; filename="{name}"'},
    )
