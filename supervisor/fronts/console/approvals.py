"""The approvals page: the pending queue (live over server-sent events), once / always /
deny, and the decided requests with who decided (from the audit log). Decisions go to the
approval manager the gRPC ApprovalService uses; a browser with this page open is a connected
approver of the tenants it watches, as `stockade approve` is."""

from __future__ import annotations

import asyncio
import contextlib
import json
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
from stockade.supervisor.fronts.console.html import csrf_field, e, page, table, url, when
from stockade.supervisor.fronts.console.sessions import Session
from stockade.supervisor.keys import split
from stockade.supervisor.observe.audit import AuditQuery
from stockade.supervisor.policy.approvals import DECISIONS, Closed, Event, Pending
from stockade.supervisor.policy.scrub.scrubber import scrubbed

LABELS = {"allow-once": "Once", "allow-always": "Always", "deny": "Deny"}
KEEPALIVE_S = 15.0
DECIDED_SHOWN = 50


def watched(ctx: ConsoleContext, session: Session, asked: str) -> list[str]:
    """The tenants whose requests the page shows: a tenant user's own; an operator's chosen
    one, or every tenant the console knows of (operators, [tenants.*] tables, sandboxes)."""
    tenant = ctx.tenant_for(session, asked)
    return [tenant] if tenant else ctx.known_tenants(session)


def pending_json(ctx: ConsoleContext, p: Pending) -> dict[str, Any]:
    scrubber = ctx.policy.scrubber
    tenant, key = split(p.sandbox_key)
    return {
        "id": p.id,
        "tenant": tenant,
        "key": key,
        "agent": p.agent_id,
        "tool": p.tool,
        "command": scrubbed(p.command, scrubber),
        "reason": scrubbed(p.reason, scrubber),
        "created_at": p.created_at.timestamp(),
        "expires_at": p.expires_at.timestamp(),
    }


def pending_cells(p: dict[str, Any], session: Session) -> list[str]:
    buttons = "".join(
        f'<button type="submit" name="decision" value="{d}" class="decide {d}">{LABELS[d]}</button>'
        for d in DECISIONS
    )
    form = (
        f'<form method="post" action="/approvals/decide" class="decision">{csrf_field(session)}'
        f'<input type="hidden" name="id" value="{e(p["id"])}">'
        f'<input type="hidden" name="tenant" value="{e(p["tenant"])}">{buttons}</form>'
    )
    return [
        e(p["tenant"]),
        e(p["key"]),
        e(p["agent"]),
        f"<code>{e(p['command'])}</code>",
        e(p["reason"]),
        f'<span class="deadline" data-expires="{p["expires_at"]}">'
        f"{e(when(p['expires_at']))}</span>",
        form,
    ]


PENDING_HEADERS = ("Tenant", "Key", "Agent", "Command", "Why asked", "Deadline", "Decide")


async def approvals_page(ctx: ConsoleContext, request: Request) -> Response:
    session = ctx.session(request)
    asked = query(request, "tenant")
    tenants = watched(ctx, session, asked)
    pending = [pending_json(ctx, p) for t in tenants for p in ctx.policy.approvals.pending(t)]
    rows = [{"id": p["id"], "cells": pending_cells(p, session)} for p in pending]
    body = (
        '<p class="hint">Keys: <kbd>o</kbd> once, <kbd>a</kbd> always, <kbd>d</kbd> deny '
        "(the first request in the queue).</p>"
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
    for tenant in tenants:
        records = await audit.query(AuditQuery(tenant=tenant, limit=500))
        found += [r for r in records if r.approval in (*DECISIONS, "timeout")]
    found.sort(key=lambda r: -r.time)
    return table(
        ("Time", "Tenant", "Key", "Command", "Decision", "Decided by"),
        (
            [
                e(when(r.time)),
                e(r.tenant),
                e(r.sandbox_key),
                f"<code>{e(command_of(r.arguments_json))}</code>",
                e(r.approval),
                e(r.approver or "-"),
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
    tenants = watched(ctx, session, query(request, "tenant"))
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
    decision = form.get("decision", "")
    if decision not in DECISIONS:
        raise HTTPException(400, f"decision must be one of {', '.join(DECISIONS)}")
    tenant = ctx.tenant_for(session, form.get("tenant")) or session.tenant
    request_id = form.get("id", "")[:64]
    try:
        await ctx.policy.approvals.decide(request_id, decision, session.who, tenant=tenant)
    except StockadeError as exc:
        raise HTTPException(404, str(exc)) from None
    if request.headers.get("x-csrf-token"):  # console.js: no page to load
        return JSONResponse({"decided": request_id, "decision": decision})
    return RedirectResponse("/approvals", status_code=303)
