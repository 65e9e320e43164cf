"""The approvals page: the pending queue (live over server-sent events), once / always /
deny, and the decided requests with who decided (from the audit log). Decisions go to the
approval manager the gRPC ApprovalService uses; a browser with this page open is a connected
approver of the tenants it watches, as `stockade approve` is."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)

from stockade.supervisor.errors import StockadeError
from stockade.supervisor.fronts.console.context import ConsoleContext, query
from stockade.supervisor.fronts.console.html import (
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
from stockade.supervisor.keys import split
from stockade.supervisor.observe.audit import AuditQuery
from stockade.supervisor.policy.approvals import DECISIONS, EVERY, Closed, Event, Pending
from stockade.supervisor.policy.guard.parsing import parse_script
from stockade.supervisor.policy.scrub.scrubber import scrubbed

LABELS = {"allow-once": "Once", "allow-always": "Always", "deny": "Deny"}
MARKED_BYTES = 16 * 1024
"""The longest command whose chaining and redirections are marked (parsed as the guard
parses it); a longer one is marked as too long to read."""
KEEPALIVE_S = 15.0
DECIDED_SHOWN = 50


def watched(ctx: ConsoleContext, session: Session, asked: str) -> list[str]:
    """The tenants whose decided requests the page shows: a tenant user's own; an
    operator's chosen one, or every tenant the console knows of (operators, [tenants.*]
    tables, sandboxes)."""
    tenant = ctx.tenant_for(session, asked)
    return [tenant] if tenant else ctx.known_tenants(session)


def followed(ctx: ConsoleContext, session: Session, asked: str) -> list[str]:
    """The tenants whose pending requests the page follows live: as `watched`, but an
    operator who picked none follows EVERY tenant, those that appear later included (a
    new tenant's first call waits for the open page instead of finding no approver)."""
    if session.operator and not ctx.tenant_for(session, asked):
        return [EVERY]
    return watched(ctx, session, asked)


def pending_json(ctx: ConsoleContext, p: Pending) -> dict[str, Any]:
    scrubber = ctx.policy.scrubber
    tenant, key = split(p.sandbox_key)
    return {
        "id": p.id,
        "tenant": tenant,
        "key": key,
        "agent": p.agent_id,
        "tool": p.tool,
        "command": (command := scrubbed(p.command, scrubber)),
        "reason": (reason := scrubbed(p.reason, scrubber)),
        "marks": [] if p.diff else marks(p.command),
        "matched": matched(ctx, command, reason),
        "diff": scrubbed(p.diff, scrubber),
        "created_at": p.created_at.timestamp(),
        "expires_at": p.expires_at.timestamp(),
    }


ALWAYS = "allow-always"
CONFIRMED = "confirmed"
"""The form field an Always decision must carry (its value: allow-always): the Always button
only asks (console.js shows the confirming button in the row; without script, a page)."""


def decision_form(p: dict[str, Any], session: Session) -> str:
    buttons = "".join(
        f'<button type="submit" name="decision" value="{d}" class="decide {d}">{LABELS[d]}</button>'
        for d in DECISIONS
    )
    confirm = (
        f'<span class="confirm-always" hidden>Allow this command always, for the tenant? '
        f'<button type="submit" name="{CONFIRMED}" value="{ALWAYS}" class="decide always-yes">'
        'Yes, always</button> <button type="button" class="always-no">Cancel</button></span>'
    )
    return (
        f'<form method="post" action="/approvals/decide" class="decision">{csrf_field(session)}'
        f'<input type="hidden" name="id" value="{e(p["id"])}">'
        f'<input type="hidden" name="tenant" value="{e(p["tenant"])}">{buttons}{confirm}</form>'
    )


def marks(command: str) -> list[str]:
    """What a reader of the command should not miss: several commands, pipes, redirections,
    substitutions, a background job, text that is not plain shell."""
    if len(command.encode("utf-8", "surrogatepass")) > MARKED_BYTES:
        return ["too long to read here: check both ends"]
    script = parse_script(command)
    found = []
    if script.error:
        found.append("does not parse as shell")
    inner = sum(len(sub.commands) for c in script.commands for w in c.words for sub in w.subs)
    top = len([c for c in script.commands if c.words]) - inner
    if top > 1:
        found.append(f"{top} commands")
    if script.pipelines:
        found.append("pipe |")
    ops = sorted({r.op for c in script.commands for r in c.redirects})
    if ops:
        found.append("redirects " + " ".join(ops))
    if any(w.subs for c in script.commands for w in c.words):
        found.append("substitution $(…)")
    if any(c.background for c in script.commands):
        found.append("background &")
    return found


RULE_NAMED = re.compile(r"\(rule ([\w.:-]+)\)|blocked by rule ([\w.:-]+)")
QUOTED = re.compile(r"'((?:[^'\\]|\\.){2,200})'|`([^`]{2,200})`")
MAX_MATCHES = 50


def matched(ctx: ConsoleContext, command: str, reason: str) -> list[tuple[int, int]]:
    """The parts of the command the guard or a rule matched, as (start, end) spans: a
    configured guard rule named by the reason (its pattern searched in the command), and
    the command's words the guard's reason quotes ('…' or `…`). The guard's verdict gives
    its rule and a reason, not a position: these are found again here, in the command as it
    is shown (scrubbed). None for a command over MARKED_BYTES."""
    if len(command.encode("utf-8", "surrogatepass")) > MARKED_BYTES:
        return []
    spans: list[tuple[int, int]] = []
    named = RULE_NAMED.search(reason)
    rule = next((g for g in named.groups() if g), "") if named else ""
    for configured in ctx.config.guard.rules:
        if configured.name == rule:
            with contextlib.suppress(re.error):
                spans += [
                    m.span()
                    for m in re.finditer(configured.pattern, command)
                    if m.end() > m.start()
                ]
    for quote in QUOTED.finditer(reason):
        part = quote.group(1) or quote.group(2) or ""
        at = command.find(part)
        while at >= 0 and len(spans) < MAX_MATCHES:
            spans.append((at, at + len(part)))
            at = command.find(part, at + len(part))
    spans = sorted(set(spans))[:MAX_MATCHES]
    merged: list[tuple[int, int]] = []
    for start, end in spans:  # overlapping matches as one
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def pending_cells(p: dict[str, Any], session: Session) -> list[str]:
    badges = "".join(f'<span class="mark">{e(m)}</span>' for m in p["marks"])
    return [
        short(p["tenant"]),
        short(p["key"]),
        short(p["agent"]),
        (f'<span class="marks">{badges}</span>' if badges else "")
        + folded(p["command"], spans=p.get("matched", ()))
        + diff_block(p.get("diff", "")),
        visible(p["reason"]),
        f'<span class="deadline" data-expires="{p["expires_at"]}">'
        f"{e(when(p['expires_at']))}</span>",
        decision_form(p, session),
    ]


PENDING_HEADERS = ("Tenant", "Key", "Agent", "Command", "Why asked", "Deadline", "Decide")


async def approvals_page(ctx: ConsoleContext, request: Request) -> Response:
    session = ctx.session(request)
    asked = query(request, "tenant")
    tenants = watched(ctx, session, asked)
    followed_now = followed(ctx, session, asked)
    pending = [pending_json(ctx, p) for t in followed_now for p in ctx.policy.approvals.pending(t)]
    rows = [{"id": p["id"], "cells": pending_cells(p, session)} for p in pending]
    body = (
        '<p class="hint">Keys, on the request that has the focus (<kbd>Tab</kbd> to it, or '
        "click its row): <kbd>o</kbd> once, <kbd>a</kbd> always (then confirm), <kbd>d</kbd> "
        "deny.</p>"
        + table(PENDING_HEADERS, [r["cells"] for r in rows], id="pending", empty="Nothing waits.")
        + "<h2>Decided</h2>"
        + await decided(ctx, tenants)
    )
    live = url("/approvals/events", tenant=asked)
    return HTMLResponse(page("Approvals", body, session, data={"live-approvals": live}))


async def decided(ctx: ConsoleContext, tenants: list[str]) -> str:
    """The latest decided requests of those tenants, from the audit log's call records."""
    audit = ctx.policy.audit
    if audit is None:
        return "<p>The audit log is off.</p>"
    found = []
    for tenant in tenants:  # each its newest decided, through their index: however old
        found += await audit.query(
            AuditQuery(tenant=tenant, decided_only=True, limit=DECIDED_SHOWN)
        )
    found.sort(key=lambda r: -r.time)
    return table(
        ("Time", "Tenant", "Key", "Command", "Decision", "Decided by"),
        (
            [
                moment(r.time),
                short(r.tenant),
                short(r.sandbox_key),
                folded(command_of(r.arguments_json)),
                e(r.approval),
                short(r.approver or "-"),
            ]
            for r in found[:DECIDED_SHOWN]
        ),
        id="decided",
        empty="No decisions on record.",
    )


def command_of(arguments_json: str) -> str:
    try:
        arguments = json.loads(arguments_json)
    except ValueError:
        return arguments_json[:200]
    if isinstance(arguments, dict) and isinstance(arguments.get("command"), str):
        return str(arguments["command"])[:300]
    return arguments_json[:200]


async def events(ctx: ConsoleContext, request: Request) -> Response:
    """Server-sent events: `pending` (a request, as JSON, with its cells' HTML) and `closed`
    (its id, outcome and approver), for the watched tenants, until the browser leaves."""
    session = ctx.session(request)
    tenants = followed(ctx, session, query(request, "tenant"))
    return StreamingResponse(
        _stream(ctx, session, tenants),
        media_type="text/event-stream",
        headers={"x-accel-buffering": "no"},
    )


async def _stream(ctx: ConsoleContext, session: Session, tenants: list[str]) -> AsyncIterator[str]:
    queue: asyncio.Queue[Event | None] = asyncio.Queue()

    async def follow(tenant: str) -> None:
        try:
            async for event in ctx.policy.approvals.watch(tenant):
                await queue.put(event)
        finally:
            await queue.put(None)  # dropped as a slow approver: end, the page reconnects

    tasks = [asyncio.create_task(follow(t)) for t in tenants]
    try:
        yield "retry: 2000\n\n"
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            if event is None:
                return
            if isinstance(event, Closed):
                data = {"id": event.id, "outcome": event.outcome, "approver": event.approver}
                yield f"event: closed\ndata: {json.dumps(data)}\n\n"
                continue
            item = pending_json(ctx, event)
            item["cells"] = pending_cells(item, session)
            yield f"event: pending\ndata: {json.dumps(item)}\n\n"
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


async def decide(ctx: ConsoleContext, request: Request) -> Response:
    session, form = await ctx.changing(request)
    confirmed = form.get(CONFIRMED) == ALWAYS
    decision = ALWAYS if confirmed else form.get("decision", "")
    if decision not in DECISIONS:
        raise HTTPException(400, f"decision must be one of {', '.join(DECISIONS)}")
    tenant = ctx.tenant_for(session, form.get("tenant")) or session.tenant
    request_id = form.get("id", "")[:64]
    if decision == ALWAYS and not confirmed:
        return confirm_always(ctx, request, session, tenant, request_id)
    try:
        await ctx.policy.approvals.decide(request_id, decision, session.who, tenant=tenant)
    except StockadeError as exc:
        raise HTTPException(404, str(exc)) from None
    if request.headers.get("x-csrf-token"):  # console.js: no page to load
        return JSONResponse({"decided": request_id, "decision": decision})
    return RedirectResponse("/approvals", status_code=303)


def confirm_always(
    ctx: ConsoleContext, request: Request, session: Session, tenant: str, request_id: str
) -> Response:
    """Always without its confirmation: nothing decided. console.js is told so (428); a
    browser without it gets a page that shows the command and asks again."""
    if request.headers.get("x-csrf-token"):
        return JSONResponse({"confirm": ALWAYS, "id": request_id}, status_code=428)
    found = next((p for p in ctx.policy.approvals.pending(tenant) if p.id == request_id), None)
    if found is None:
        raise HTTPException(404, f"no pending approval {request_id!r}")
    p = pending_json(ctx, found)
    body = (
        "<p>Allow this command <strong>always</strong>, for every sandbox of the tenant "
        f"{short(p['tenant'])}? It will run from now on without asking.</p>"
        f"<p>{folded(p['command'])}</p>"
        f'<form method="post" action="/approvals/decide">{csrf_field(session)}'
        f'<input type="hidden" name="id" value="{e(p["id"])}">'
        f'<input type="hidden" name="tenant" value="{e(p["tenant"])}">'
        f'<button type="submit" name="{CONFIRMED}" value="{ALWAYS}" id="confirm">'
        'Yes, allow always</button> <a href="/approvals" class="button">Back</a></form>'
    )
    return HTMLResponse(page("Allow always?", body, session))
