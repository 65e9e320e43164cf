"""Quarantine in the console: the list of quarantined sandboxes (an operator's across
tenants, a tenant user's own), a quarantined sandbox's evidence on its page (the data of
`stockade quarantine show`), and the two actions, quarantine and release. Every one goes
through the sandbox manager's Quarantines, as the QuarantineService does, and a quarantine by
hand sounds its alarm on the supervisor's AlarmHub as the RPC does (the log, the audit log,
the metric, the watchers)."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from stockade.supervisor.calls.lifecycle import Actor
from stockade.supervisor.fronts.console.context import ConsoleContext, query
from stockade.supervisor.fronts.console.html import (
    e,
    message,
    page,
    short,
    table,
    url,
    visible,
    when,
)
from stockade.supervisor.keys import split
from stockade.supervisor.observe.alarms import MAX_EVIDENCE
from stockade.supervisor.sandboxes.quarantine import MAX_REASON, Quarantine, evidence

MAX_LISTED_REASON = 200
"""Characters of a reason the lists show (the sandbox's page shows it whole)."""


def clean(ctx: ConsoleContext, text: str) -> str:
    """Scrubbed once more, as the QuarantineService does before it answers (evidence is
    scrubbed where it is taken; this is the last line)."""
    scrubber = ctx.policy.scrubber
    return text if scrubber is None else scrubber.scrub(text)[0]


def held(ctx: ConsoleContext, key: str) -> Quarantine | None:
    """The key's quarantine (a scoped key), None when it is not quarantined."""
    return ctx.manager.quarantines.held.get(key)


def reason(ctx: ConsoleContext, record: Quarantine, limit: int = MAX_LISTED_REASON) -> str:
    why = clean(ctx, record.why)
    return why if len(why) <= limit else why[: limit - 1] + "…"


async def list_page(ctx: ConsoleContext, request: Request) -> Response:
    session = ctx.session(request)
    tenant = ctx.tenant_for(session, query(request, "tenant"))
    found = [
        r
        for r in ctx.manager.quarantines.list()
        if ctx.visible(session, r.key) and (not tenant or split(r.key)[0] == tenant)
    ]
    rows = []
    for r in found:
        owner, key = split(r.key)
        href = url("/sandbox", tenant=owner, key=key)
        rows.append(
            [
                short(owner),
                f'<a href="{e(href)}">{short(key)}</a>',
                e(when(r.since)),
                visible(reason(ctx, r)),
                e("yes" if r.frozen else "no"),
                e(r.network_cut or "-"),
                e(len(r.alarms)),
                e(clean(ctx, r.note) or "-"),
            ]
        )
    headers = ("Tenant", "Key", "Since", "Why", "Frozen", "Network cut", "Alarms", "Note")
    body = table(headers, rows, id="quarantines", empty="No sandbox is quarantined.")
    return HTMLResponse(page("Quarantine", body, session))


async def evidence_section(ctx: ConsoleContext, key: str) -> str:
    """A quarantined sandbox's evidence for its page ("" when it is not quarantined): what
    `stockade quarantine show` prints."""
    record = held(ctx, key)
    if record is None:
        return ""
    tenant, _ = split(key)
    facts = table(
        ("Field", "Value"),
        [
            [e("since"), e(when(record.since))],
            [e("why"), e(clean(ctx, record.why))],
            [e("frozen"), e("yes" if record.frozen else "no")],
            [e("network cut"), e(record.network_cut or "nothing to cut")],
            [e("note"), e(clean(ctx, record.note) or "-")],
        ],
        id="quarantine-record",
    )
    alarms = table(
        ("Time", "Kind", "Where", "Detail", "Evidence"),
        (
            [
                e(when(a.time)),
                e(a.kind),
                e(a.where),
                e(clean(ctx, a.detail)),
                f"<pre>{e(clean(ctx, a.evidence[:MAX_EVIDENCE]))}</pre>" if a.evidence else "-",
            ]
            for a in record.alarms
        ),
        id="alarms",
        empty="No alarm on record (a damaged or unreadable record still quarantines).",
    )
    window = ctx.manager.config.quarantine.evidence_window_s
    records = await evidence(ctx.policy.audit, record, window)
    calls = table(
        ("Time", "Tool", "Agent", "Step", "Outcome"),
        (
            [
                f'<a href="{e(url("/audit/record", tenant=tenant, id=r.id))}">'
                f"{e(when(r.time))}</a>",
                short(r.tool),
                short(r.agent_id),
                e(clean(ctx, r.policy_step)),
                e(r.error_code or "ok"),
            ]
            for r in records
        ),
        id="evidence",
        empty="No audit records around the alarms.",
    )
    audit_note = (
        message("The audit log is off: no records around the alarms.")
        if ctx.policy.audit is None
        else f'<p class="hint">Audit records from {window:g} s before the first alarm to '
        f"{window:g} s after the last, oldest first.</p>"
    )
    return (
        '<h2 class="quarantined">Quarantined</h2>'
        + message(
            "Every call on this sandbox is refused until it is released or destroyed.", "error"
        )
        + facts
        + "<h2>Alarms</h2>"
        + alarms
        + "<h2>Evidence</h2>"
        + audit_note
        + calls
    )


def reason_field() -> str:
    """The quarantine's confirmation page asks why (kept with the alarm)."""
    return (
        f'<p><label>Why <input type="text" name="reason" id="reason" maxlength="{MAX_REASON}" '
        'size="60" placeholder="no reason given"></label></p>'
    )


async def act(ctx: ConsoleContext, who: Actor, key: str, action: str, form: dict[str, str]) -> None:
    """Quarantine or release the key's sandbox (a scoped key the session may act on),
    through the lifecycle path (its alarm sounded on the supervisor's AlarmHub)."""
    if action == "release":
        await ctx.lifecycle.release(who, key)
        return
    why = form.get("reason", "").strip()
    if len(why) > MAX_REASON:
        raise HTTPException(400, f"reason is {len(why)} characters; at most {MAX_REASON}")
    await ctx.lifecycle.quarantine(who, key, why)
