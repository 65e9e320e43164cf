"""A running sandbox seen from its page: its workspace's files (a read-only browser), its
background processes (the agent's `process list`), and its live CPU and memory trend.

Files and processes are tool calls like any other: list_files, read_file and process (list)
go through the tool pipeline the gRPC and MCP fronts use, so the tenant's tool policy,
limits and the audit log apply (front `console`, caller `console:ROLE:TENANT@ADDRESS`), and
their output is scrubbed by the pipeline and once more here before it is shown, cut to
MAX_SHOWN characters. Only a RUNNING sandbox that is not quarantined is asked (a call would
make a container for an absent one; a quarantined one refuses every call)."""

from __future__ import annotations

import itertools
import json
import time
from collections import deque
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from stockade.supervisor.engines.cgroups import sample
from stockade.supervisor.errors import StockadeError
from stockade.supervisor.fronts.console import quarantines
from stockade.supervisor.fronts.console.context import FRONT, ConsoleContext, query
from stockade.supervisor.fronts.console.html import e, lines, message, page, short, table, url
from stockade.supervisor.fronts.console.html import visible as shown_text
from stockade.supervisor.fronts.console.sessions import Session
from stockade.supervisor.keys import split
from stockade.supervisor.models import CallContext, SandboxState, ToolCall, ToolResult
from stockade.supervisor.policy.scrub.scrubber import scrubbed

MAX_PATH = 1024
"""The longest path the browser asks for (the agent checks it stays in the workspace)."""
MAX_SHOWN = 64 * 1024
"""Characters of a file, or of a listing's names, shown (the pipeline caps the output too)."""
MAX_ENTRIES = 500
"""Entries of a directory shown."""
CALL_TIMEOUT_MS = 10_000
HISTORY = 120
"""Samples of a sandbox's CPU and memory kept for its trend (one per read, at most one a
second: two minutes of a page refreshing every second)."""
AGENT = "console"
clock = time.time
"""The samples' clock (tests set their own)."""
HEADERS = ("Id", "Name", "PID", "State", "Command")


def _scoped(ctx: ConsoleContext, request: Request) -> tuple[Session, str]:
    session = ctx.session(request)
    return session, ctx.scoped(session, query(request, "tenant"), query(request, "key"))


async def _running(ctx: ConsoleContext, key: str) -> None:
    """404 for a sandbox this session cannot see; 409 unless it runs and is not
    quarantined (nothing is asked of it then, and nothing audited)."""
    try:
        info = await ctx.manager.get(key)
    except StockadeError as exc:
        raise HTTPException(404, str(exc)) from None
    if quarantines.held(ctx, key) is not None:
        raise HTTPException(409, "the sandbox is quarantined: it answers no call")
    if info.state != SandboxState.RUNNING:
        raise HTTPException(409, f"the sandbox is {info.state}: only a running one is read")


async def _call(
    ctx: ConsoleContext,
    session: Session,
    request: Request,
    key: str,
    tool: str,
    args: dict[str, Any],
) -> ToolResult:
    if ctx.pipeline is None:
        raise HTTPException(404, "this console runs no tool calls")
    call = ToolCall(
        sandbox_key=key,
        tool=tool,
        arguments_json=json.dumps(args),
        context=CallContext(agent_id=AGENT),
        timeout_ms=CALL_TIMEOUT_MS,
        front=FRONT,
    )
    try:
        return await ctx.pipeline.call(call, caller=ctx.actor(session, request).caller)
    except StockadeError as exc:  # a request the pipeline refuses outright (a bad key)
        raise HTTPException(409, str(exc)) from None


def _path(request: Request) -> str:
    path = query(request, "path", MAX_PATH) or "."
    if "\x00" in path:
        raise HTTPException(400, "path holds a NUL")
    return path


def _clean(ctx: ConsoleContext, text: object) -> str:
    return scrubbed(str(text), ctx.policy.scrubber)


def _refused(result: ToolResult) -> str:
    return message(f"{result.error_code}: {result.error_message or result.for_user}", "error")


def _back(tenant: str, key: str) -> str:
    return f'<p><a href="{e(url("/sandbox", tenant=tenant, key=key))}">Back to the sandbox</a></p>'


def _crumbs(tenant: str, key: str, path: str) -> str:
    parts = [p for p in path.split("/") if p and p != "."]
    links = [f'<a href="{e(url("/sandbox/files", tenant=tenant, key=key))}">workspace</a>']
    for i, part in enumerate(parts):
        href = url("/sandbox/files", tenant=tenant, key=key, path="/".join(parts[: i + 1]))
        links.append(f'<a href="{e(href)}">{short(part)}</a>')
    return '<p class="crumbs" id="crumbs">' + " / ".join(links) + "</p>"


async def files_page(ctx: ConsoleContext, request: Request) -> Response:
    """A directory of the workspace: its entries (directories first), each a link."""
    session, key = _scoped(ctx, request)
    tenant, shown_key = split(key)
    path = _path(request)
    await _running(ctx, key)
    result = await _call(ctx, session, request, key, "list_files", {"path": path})
    back = _back(tenant, shown_key)
    if result.is_error:
        body = _crumbs(tenant, shown_key, path) + _refused(result) + back
        return HTMLResponse(page(f"Files of {shown_key}", body, session), status_code=200)
    entries = list((result.data or {}).get("entries", []))
    entries.sort(key=lambda x: (not x.get("is_dir"), str(x.get("name", ""))))
    rows = []
    for entry in entries[:MAX_ENTRIES]:
        name = _clean(ctx, entry.get("name", ""))
        inner = name if path in ("", ".") else f"{path.rstrip('/')}/{name}"
        target = "/sandbox/files" if entry.get("is_dir") else "/sandbox/file"
        href = url(target, tenant=tenant, key=shown_key, path=inner)
        label = short(name) + ("/" if entry.get("is_dir") else "")
        size = "-" if entry.get("is_dir") else e(f"{int(entry.get('size', 0)):,}")
        rows.append([f'<a href="{e(href)}">{label}</a>', size])
    more = (
        message(f"{len(entries) - MAX_ENTRIES:,} more entries not shown.")
        if len(entries) > MAX_ENTRIES
        else ""
    )
    body = (
        _crumbs(tenant, shown_key, path)
        + '<p class="hint">Read through the agent as a <code>list_files</code> call (audited, '
        "front console).</p>"
        + table(("Name", "Bytes"), rows, id="files", empty="An empty directory.")
        + more
        + back
    )
    return HTMLResponse(page(f"Files of {shown_key}", body, session))


async def file_page(ctx: ConsoleContext, request: Request) -> Response:
    """A file of the workspace, as text: its first MAX_SHOWN characters, scrubbed."""
    session, key = _scoped(ctx, request)
    tenant, shown_key = split(key)
    path = _path(request)
    await _running(ctx, key)
    result = await _call(ctx, session, request, key, "read_file", {"path": path})
    folder = path.rsplit("/", 1)[0] if "/" in path else "."
    crumbs = _crumbs(tenant, shown_key, folder)
    if result.is_error:
        return HTMLResponse(page(f"File {path}", crumbs + _refused(result), session))
    text = _clean(ctx, (result.data or {}).get("content", result.for_llm))
    cut = ""
    if len(text) > MAX_SHOWN:
        cut = message(f"Only the first {MAX_SHOWN:,} of {len(text):,} characters are shown.")
        text = text[:MAX_SHOWN]
    if result.truncated:
        cut += message("The pipeline cut the output at its cap ([limits]).")
    body = crumbs + cut + f'<pre id="content">{shown_text(text, lines=True)}</pre>'
    return HTMLResponse(page(f"File {path}", body, session))


async def processes_page(ctx: ConsoleContext, request: Request) -> Response:
    """The sandbox's background processes, as the agent lists them (`process list`)."""
    session, key = _scoped(ctx, request)
    tenant, shown_key = split(key)
    await _running(ctx, key)
    result = await _call(ctx, session, request, key, "process", {"action": "list"})
    back = _back(tenant, shown_key)
    if result.is_error:
        return HTMLResponse(page(f"Processes of {shown_key}", _refused(result) + back, session))
    rows = []
    for p in list((result.data or {}).get("processes", []))[:MAX_ENTRIES]:
        state = p.get("state", "")
        if state == "exited":
            state = f"exited ({p.get('exit_code')})"
        rows.append(
            [
                e(p.get("id", "")),
                short(_clean(ctx, p.get("name") or "-")),
                e(p.get("pid", "")),
                e(state or "running"),
                shown_text(_clean(ctx, str(p.get("command", ""))[:MAX_PATH])),
            ]
        )
    body = (
        '<p class="hint">Listed by the agent as a <code>process</code> call (action list: the '
        "background processes started through Stockade; audited, front console). The "
        "container's every process, as the host sees them, is on the sandbox's page.</p>"
        + table(
            ("Id", "Name", "PID", "State", "Command"),
            rows,
            id="agent-processes",
            empty="No background process.",
        )
        + back
    )
    return HTMLResponse(page(f"Processes of {shown_key}", body, session))


def record_sample(ctx: ConsoleContext, key: str) -> None:
    """Add the sandbox's CPU and memory now to its history (at most one a second)."""
    held = ctx.manager.registry.get(key)
    if held is None or not held.info.running or held.info.pid <= 0:
        return
    history = ctx.usage.get(key)
    now = clock()
    if history and now - history[-1][0] < 1.0:
        return
    found = sample(held.info.pid)
    if found is None:
        return
    if history is None:
        for gone in [k for k in ctx.usage if k not in ctx.manager.registry]:
            del ctx.usage[gone]
        history = ctx.usage[key] = deque(maxlen=HISTORY)
    history.append((now, found.cpu_ns, found.memory))


def usage_chart(ctx: ConsoleContext, key: str) -> str:
    """The trend of CPU (% of one core between two samples) and memory (MiB)."""
    history = list(ctx.usage.get(key, ()))
    cpu: list[float | None] = [None]
    for (t0, c0, _m0), (t1, c1, _m1) in itertools.pairwise(history):
        cpu.append(round(100 * (c1 - c0) / 1e9 / max(t1 - t0, 1e-3), 1))
    memory: list[float | None] = [round(m / 2**20, 1) for _t, _c, m in history]
    if not history:
        return '<p class="hint" id="usage">No figures: the container is not running.</p>'
    span = f"last {int(history[-1][0] - history[0][0])} s"
    return (
        '<div class="charts" id="usage">'
        + lines("CPU, % of a core", {"cpu": cpu[: len(history)]}, ("", span), id="usage-cpu")
        + lines("Memory, MiB", {"memory": memory}, ("", span), id="usage-memory")
        + "</div>"
    )


async def usage_json(ctx: ConsoleContext, request: Request) -> Response:
    """The sandbox's latest sample and its trend's charts (SVG, escaped), for console.js."""
    _session, key = _scoped(ctx, request)
    try:
        await ctx.manager.get(key)
    except StockadeError as exc:
        raise HTTPException(404, str(exc)) from None
    record_sample(ctx, key)
    history = list(ctx.usage.get(key, ()))
    last = history[-1] if history else None
    return JSONResponse(
        {
            "samples": len(history),
            "cpu_s": round(last[1] / 1e9, 2) if last else None,
            "memory_mb": round(last[2] / 2**20, 1) if last else None,
            "chart": usage_chart(ctx, key),
        }
    )
