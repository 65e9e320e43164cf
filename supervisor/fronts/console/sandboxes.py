"""The sandboxes pages: the live list, a sandbox's page (recent calls from the audit log,
processes, cgroup figures, a quarantine's evidence), its isolation report, and pause /
resume / quarantine / release / destroy behind a confirmation page. Every action goes to the
sandbox manager the gRPC servicers use (quarantine and release: quarantines.py)."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import psutil
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from stockade.supervisor.engines.cgroups import sample
from stockade.supervisor.errors import StockadeError
from stockade.supervisor.fronts.console import audit, quarantines, workspace
from stockade.supervisor.fronts.console.context import ConsoleContext, query
from stockade.supervisor.fronts.console.html import (
    csrf_field,
    duration,
    e,
    message,
    moment,
    page,
    short,
    table,
    url,
    visible,
    when,
)
from stockade.supervisor.keys import split
from stockade.supervisor.models import SandboxInfo, SandboxState
from stockade.supervisor.observe.audit import AuditQuery

ACTIONS = {
    "pause": "Pause: freeze every process of the sandbox until it is resumed.",
    "resume": "Resume: thaw the sandbox's processes.",
    "quarantine": "Quarantine: freeze the sandbox, cut its network and refuse every call on it "
    "until it is released; its container and workspace are kept as evidence.",
    "release": "Release: end the quarantine: the network back, the processes thawed, calls "
    "served again.",
    "destroy": "Destroy: remove the container (the workspace is kept; the next call makes a "
    "new container).",
}
WHEN_QUARANTINED = ("release", "destroy")
"""The actions a quarantined sandbox's page offers (pause and resume are refused)."""
BY_STATE = {
    SandboxState.RUNNING: ("pause", "quarantine", "destroy"),
    SandboxState.PAUSED: ("resume", "quarantine", "destroy"),
    SandboxState.BROKEN: ("destroy",),
    SandboxState.EXITED: ("destroy",),
    SandboxState.ABSENT: (),
}
"""What applies in each state: nothing that would do nothing (Resume on a running sandbox)."""
ABSENT_TEXT = (
    "no container: destroyed, or not made yet (the workspace is kept; the next call makes "
    "a new container)"
)


def applicable(info: SandboxInfo, quarantined: bool) -> tuple[str, ...]:
    """The actions that apply to a sandbox now, in the order the page offers them."""
    if quarantined:
        return WHEN_QUARANTINED
    return BY_STATE.get(SandboxState(info.state), ("destroy",))


MAX_PROCESSES = 50


def row(ctx: ConsoleContext, info: SandboxInfo, now: float) -> dict[str, Any]:
    """A sandbox as the list shows it (JSON for the live refresh, cells for the page)."""
    tenant, key = split(info.key)
    held = ctx.manager.registry.get(info.key)
    cpu_s = memory_mb = None
    if held is not None and held.info.running and held.info.pid > 0:
        found = sample(held.info.pid)
        if found is not None:
            cpu_s, memory_mb = round(found.cpu_ns / 1e9, 2), round(found.memory / 2**20, 1)
    record = quarantines.held(ctx, info.key)
    created = info.created_at.timestamp() if info.created_at else None
    used = info.last_used_at.timestamp() if info.last_used_at else None
    return {
        "tenant": tenant,
        "key": key,
        "state": info.state.value,
        "engine": info.engine,
        "profile": info.profile,
        "network": info.network_mode,
        "age": duration(now - created) if created else "-",
        "idle": duration(now - used) if used else "-",
        "cpu_s": cpu_s,
        "memory_mb": memory_mb,
        "paused_since": when(info.paused_at) if info.paused_at else "",
        "trouble": info.trouble,
        "quarantined_since": when(record.since) if record else "",
        "quarantine_reason": quarantines.reason(ctx, record) if record else "",
        "href": url("/sandbox", tenant=tenant, key=key),
    }


STATES = (*(s.value for s in SandboxState), "QUARANTINED")
"""The list's state filter (?state=, the overview's counts link to it): a quarantined
sandbox is QUARANTINED, never the state its freeze puts it in."""


def state_asked(request: Request) -> str:
    state = query(request, "state", 16)
    if state and state not in STATES:
        raise HTTPException(400, f"state must be one of {', '.join(STATES)}")
    return state


def in_state(ctx: ConsoleContext, i: SandboxInfo, state: str) -> bool:
    if not state:
        return True
    if quarantines.held(ctx, i.key) is not None:
        return state == "QUARANTINED"
    return bool(i.state == state)


PAGE_ROWS = 200
"""Sandboxes a list page shows (and reads the cgroup figures of), from ?offset=."""


def offset_asked(request: Request) -> int:
    text = query(request, "offset", 8) or "0"
    if not text.isdigit():
        raise HTTPException(400, "offset must be a number of rows")
    return int(text)


async def listed(ctx: ConsoleContext, request: Request) -> tuple[list[dict[str, Any]], int]:
    """The rows of the list's page (at most PAGE_ROWS from ?offset=, of the ?tenant= and
    ?state= asked) and how many sandboxes match in all."""
    session = ctx.session(request)
    tenant = ctx.tenant_for(session, query(request, "tenant"))
    state, offset = state_asked(request), offset_asked(request)
    infos = await ctx.manager.list()
    now = time.time()
    matching = [
        i
        for i in infos
        if ctx.visible(session, i.key)
        and (not tenant or split(i.key)[0] == tenant)
        and in_state(ctx, i, state)
    ]
    found = [row(ctx, i, now) for i in matching[offset : offset + PAGE_ROWS]]
    for r in found:  # console.js shows these as they are
        r["state_text"], r["state_class"] = state_text(r)
    return found, len(matching)


async def rows(ctx: ConsoleContext, request: Request) -> list[dict[str, Any]]:
    return (await listed(ctx, request))[0]


HEADERS = ("Tenant", "Key", "State", "Engine", "Network", "Age", "Idle", "CPU s", "Memory MiB")


def state_text(r: dict[str, Any]) -> tuple[str, str]:
    """(text, class) of a row's state; console.js builds the same from the JSON."""
    if r["quarantined_since"]:
        text = f"QUARANTINED since {r['quarantined_since']}: {r['quarantine_reason']}"
        return text, "quarantined"
    since = f" since {r['paused_since']}" if r["paused_since"] else ""
    if r["state"] == SandboxState.ABSENT:
        return f"ABSENT: {ABSENT_TEXT}", "absent"
    return r["state"] + since, r["state"].lower()


def cells(r: dict[str, Any]) -> list[str]:
    state, kind = state_text(r)
    return [
        short(r["tenant"]),
        f'<a href="{e(r["href"])}">{short(r["key"])}</a>',
        f'<span class="state {e(kind)}">{e(state)}</span>',
        e(r["engine"]),
        e(r["network"] or "-"),
        e(r["age"]),
        e(r["idle"]),
        e("-" if r["cpu_s"] is None else r["cpu_s"]),
        e("-" if r["memory_mb"] is None else r["memory_mb"]),
    ]


async def list_page(ctx: ConsoleContext, request: Request) -> Response:
    session = ctx.session(request)
    found, total = await listed(ctx, request)
    tenant, state, offset = query(request, "tenant"), state_asked(request), offset_asked(request)
    body = table(HEADERS, (cells(r) for r in found), id="sandboxes", empty="No sandboxes.")
    if state:
        body = message(f"Only the sandboxes that are {state}.") + body
    if total > PAGE_ROWS or offset:
        pages = []
        if offset:
            back = url("/sandboxes", tenant=tenant, state=state, offset=max(offset - PAGE_ROWS, 0))
            pages.append(f'<a href="{e(back)}" id="previous">Previous {PAGE_ROWS}</a>')
        if offset + PAGE_ROWS < total:
            more = url("/sandboxes", tenant=tenant, state=state, offset=offset + PAGE_ROWS)
            pages.append(f'<a href="{e(more)}" id="next">Next {PAGE_ROWS}</a>')
        shown = f"{offset + 1:,}-{offset + len(found):,}" if found else "none"
        body += f'<p class="pages">Sandboxes {shown} of {total:,}. {" ".join(pages)}</p>'
    source = url("/sandboxes.json", tenant=tenant, state=state, offset=offset or "")
    live = {"live-sandboxes": source, "refresh": ctx.refresh}
    return HTMLResponse(page("Sandboxes", body, session, data=live))


async def list_json(ctx: ConsoleContext, request: Request) -> Response:
    found, total = await listed(ctx, request)
    return JSONResponse({"sandboxes": found, "total": total, "offset": offset_asked(request)})


async def sandbox_page(ctx: ConsoleContext, request: Request) -> Response:
    session = ctx.session(request)
    key = ctx.scoped(session, query(request, "tenant"), query(request, "key"))
    tenant, shown_key = split(key)
    try:
        info = await ctx.manager.get(key)
    except StockadeError as exc:
        raise HTTPException(404, str(exc)) from None
    r = row(ctx, info, time.time())
    facts = table(("Field", "Value"), ([e(k), visible(v)] for k, v in r.items() if k != "href"))
    quarantined = quarantines.held(ctx, key) is not None
    offered = applicable(info, quarantined)
    confirm = {a: url("/sandbox/confirm", action=a, tenant=tenant, key=shown_key) for a in offered}
    actions = "".join(
        f'<a class="button" id="{a}" href="{e(href)}">{e(a.capitalize())}</a>'
        for a, href in confirm.items()
    )
    isolation = url("/sandbox/isolation", tenant=tenant, key=shown_key)
    done = query(request, "done", 16)
    reads = f'<a href="{e(isolation)}" id="isolation">Isolation report</a>'
    if info.state == SandboxState.RUNNING and not quarantined and ctx.pipeline is not None:
        files = url("/sandbox/files", tenant=tenant, key=shown_key)
        agent = url("/sandbox/processes", tenant=tenant, key=shown_key)
        reads += (
            f' <a href="{e(files)}" id="files-link">Files</a>'
            f' <a href="{e(agent)}" id="processes-link">Background processes</a>'
        )
    workspace.record_sample(ctx, key)
    parts = [
        message(f"{done.capitalize()}: done.") if done in ACTIONS else "",
        message(f"This sandbox has {ABSENT_TEXT}.") if info.state == SandboxState.ABSENT else "",
        facts,
        f'<p class="actions">{actions} {reads}</p>',
        "<h2>CPU and memory</h2>",
        workspace.usage_chart(ctx, key),
        await quarantines.evidence_section(ctx, key),
        "<h2>Processes</h2>",
        processes(ctx, key),
        "<h2>Recent calls</h2>",
        await recent_calls(ctx, tenant, shown_key),
    ]
    live = {
        "live-usage": url("/sandbox/usage.json", tenant=tenant, key=shown_key),
        "refresh": ctx.refresh,
    }
    return HTMLResponse(page(f"Sandbox {shown_key}", "".join(parts), session, data=live))


def link(href: str, text: str) -> str:
    return f'<a href="{e(href)}">{e(text)}</a>'


def processes(ctx: ConsoleContext, key: str) -> str:
    """The container's processes as the host sees them (command lines scrubbed)."""
    held = ctx.manager.registry.get(key)
    if held is None or not held.info.running or held.info.pid <= 0:
        return message("No running container.")
    scrubber = ctx.policy.scrubber
    found: list[list[str]] = []
    try:
        root = psutil.Process(held.info.pid)
        for proc in [root, *root.children(recursive=True)][:MAX_PROCESSES]:
            with proc.oneshot():
                command = " ".join(proc.cmdline())[:300]
                if scrubber is not None:
                    command = scrubber.scrub(command)[0]
                found.append([e(proc.pid), e(proc.status()), e(command)])
    except (psutil.Error, OSError):
        return message("The container's processes cannot be read from here.")
    return table(("PID (host)", "Status", "Command"), found)


async def recent_calls(ctx: ConsoleContext, tenant: str, key: str) -> str:
    if ctx.policy.audit is None:
        return message("The audit log is off.")
    records = await ctx.policy.audit.query(AuditQuery(tenant=tenant, sandbox_key=key, limit=20))
    rows = []
    for r in records:
        rows.append(
            [
                f'<a href="{e(url("/audit/record", tenant=tenant, id=r.id))}">{moment(r.time)}</a>',
                short(r.tool),
                *audit.what_and_why(ctx, r),
                short(r.agent_id),
                e(r.duration_ms),
            ]
        )
    headers = ("Time", "Tool", "Command", "Decision", "Reason", "Agent", "ms")
    return table(headers, rows, id="recent", empty="No calls on record.")


async def isolation_page(ctx: ConsoleContext, request: Request) -> Response:
    session = ctx.session(request)
    key = ctx.scoped(session, query(request, "tenant"), query(request, "key"))
    try:
        report = await ctx.manager.inspect_isolation(key)
    except StockadeError as exc:
        raise HTTPException(404, str(exc)) from None
    data = dataclasses.asdict(dataclasses.replace(report, key=split(report.key)[1]))
    raw = e(json.dumps(data, indent=2, default=str))
    body = (
        report_tables(data)
        + f'<details id="raw"><summary>Raw JSON</summary><pre>{raw}</pre></details>'
    )
    return HTMLResponse(page(f"Isolation of {split(key)[1]}", body, session))


OPEN_ROWS = 12
"""A list of the isolation report longer than this is folded (a click shows it)."""
MAX_REPORT_ROWS = 100
"""Rows of one list in the isolation report's tables (the raw JSON has them all)."""


def _scalar(value: Any) -> bool:
    return not isinstance(value, dict | list | tuple)


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        if all(_scalar(v) for v in value):
            return short(", ".join(str(v) for v in value) or "-", 160)
        return short(json.dumps(value, default=str), 160)
    if isinstance(value, dict):
        return short(json.dumps(value, default=str), 160)
    return short("-" if value in ("", None) else value, 160)


def _fields(value: dict[str, Any], prefix: str = "") -> list[list[str]]:
    """A mapping's scalar fields as rows, nested mappings' with dotted names."""
    rows = []
    for name, item in value.items():
        label = f"{prefix}{name}"
        if isinstance(item, dict):
            rows += _fields(item, f"{label}.")
        elif not (isinstance(item, list | tuple) and item and isinstance(item[0], dict)):
            rows.append([e(label), _cell(item)])
    return rows


def _lists(value: dict[str, Any], prefix: str = "") -> list[tuple[str, list[dict[str, Any]]]]:
    """A mapping's lists of records (mounts, routes, namespaces...), nested ones too."""
    found = []
    for name, item in value.items():
        if isinstance(item, dict):
            found += _lists(item, f"{prefix}{name}.")
        elif isinstance(item, list | tuple) and item and isinstance(item[0], dict):
            found.append((f"{prefix}{name}", list(item)))
    return found


def report_tables(data: dict[str, Any]) -> str:
    """The isolation report as tables: its fields (name, value), then each list of records
    (mounts, namespaces, interfaces...) as a table of its own, MAX_REPORT_ROWS at most."""
    parts = [table(("Field", "Value"), _fields(data), id="isolation-fields")]
    for name, records in _lists(data):
        headers = list(records[0])
        rows = [[_cell(r.get(h)) for h in headers] for r in records[:MAX_REPORT_ROWS]]
        more = len(records) - MAX_REPORT_ROWS
        listed = table(headers, rows, id=f"isolation-{name.replace('.', '-')}")
        if more > 0:
            listed += message(f"{more} more in the raw JSON.")
        if len(records) <= OPEN_ROWS:
            parts.append(f"<h2>{e(name)} ({len(records)})</h2>{listed}")
        else:  # a long list (the mounts) folded under its heading
            parts.append(
                f'<details class="list"><summary><h2>{e(name)} ({len(records)})</h2></summary>'
                f"{listed}</details>"
            )
    return "".join(parts)


async def confirm_page(ctx: ConsoleContext, request: Request) -> Response:
    session = ctx.session(request)
    action = query(request, "action")
    if action not in ACTIONS:
        raise HTTPException(400, f"action must be one of {', '.join(ACTIONS)}")
    key = ctx.scoped(session, query(request, "tenant"), query(request, "key"))
    await applies(ctx, key, action)
    tenant, shown_key = split(key)
    body = (
        f"<p>{e(ACTIONS[action])}</p>"
        f'<form method="post" action="/sandbox/action">{csrf_field(session)}'
        f'<input type="hidden" name="action" value="{e(action)}">'
        f'<input type="hidden" name="tenant" value="{e(tenant)}">'
        f'<input type="hidden" name="key" value="{e(shown_key)}">'
        + (quarantines.reason_field() if action == "quarantine" else "")
        + f'<button type="submit" id="confirm">{e(action.capitalize())} '
        f"{short(shown_key)}</button> "
        f'<a href="{e(url("/sandbox", tenant=tenant, key=shown_key))}">Cancel</a></form>'
    )
    return HTMLResponse(page(f"{action.capitalize()} {shown_key}?", body, session))


async def act(ctx: ConsoleContext, request: Request) -> Response:
    session, form = await ctx.changing(request)
    action = form.get("action", "")
    if action not in ACTIONS:
        raise HTTPException(400, f"action must be one of {', '.join(ACTIONS)}")
    key = ctx.scoped(session, form.get("tenant"), form.get("key", ""))
    who = ctx.actor(session, request)
    await applies(ctx, key, action)
    try:  # one audit record each, through the lifecycle path
        if action == "pause":
            await ctx.lifecycle.pause(who, key)
        elif action == "resume":
            await ctx.lifecycle.resume(who, key)
        elif action in ("quarantine", "release"):
            await quarantines.act(ctx, who, key, action, form)
        else:
            await ctx.lifecycle.destroy(who, key, delete_workspace=False)
    except StockadeError as exc:
        raise HTTPException(409, str(exc)) from None
    tenant, shown_key = split(key)
    target = (
        "/sandboxes"
        if action == "destroy"
        else url("/sandbox", tenant=tenant, key=shown_key, done=action)
    )
    return RedirectResponse(target, status_code=303)


async def applies(ctx: ConsoleContext, key: str, action: str) -> None:
    """409, with nothing done and nothing audited, for an action that does not apply to the
    sandbox's state now (a no-op such as Resume on a running sandbox). A sandbox that cannot
    be read is left to the lifecycle path, which refuses it as every front does."""
    try:
        info = await ctx.manager.get(key)
    except StockadeError:
        return
    offered = applicable(info, quarantines.held(ctx, key) is not None)
    if action not in offered:
        state = "QUARANTINED" if offered == WHEN_QUARANTINED else str(info.state)
        raise HTTPException(
            409, f"{action} does not apply to a sandbox that is {state}: nothing was done"
        )
