"""The console's ASGI app: sign-in and sign-out, the pages' routes, the two static files,
and the answers to a missing session (a page: to /login; anything else: 401) and to refused
requests (a short page with the reason)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from stockade.supervisor.errors import Unauthenticated
from stockade.supervisor.fronts.console import (
    approvals,
    audit,
    overview,
    quarantines,
    sandboxes,
    workspace,
)
from stockade.supervisor.fronts.console.context import ConsoleContext, NeedLogin, read_form
from stockade.supervisor.fronts.console.html import message, page
from stockade.supervisor.fronts.console.security import Guard, same_origin
from stockade.supervisor.fronts.console.sessions import COOKIE

log = logging.getLogger("stockade.console")
STATIC_DIR = Path(__file__).parent / "static"
STATIC_TYPES = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
Handler = Callable[[ConsoleContext, Request], Awaitable[Response]]


def login_form(note: str = "") -> str:
    return (
        (message(note, "error") if note else "")
        + '<form method="post" action="/login" class="login">'
        '<label>Token <input type="password" name="token" autocomplete="off" required '
        'autofocus id="token"></label> <button type="submit" id="sign-in">Sign in</button></form>'
        "<p>The same bearer token as for the gRPC API (<code>[auth] tokens_file</code>).</p>"
    )


async def login_page(ctx: ConsoleContext, request: Request) -> Response:
    return HTMLResponse(page("Sign in", login_form()))


async def login(ctx: ConsoleContext, request: Request) -> Response:
    if not same_origin(request):
        raise HTTPException(403, "forbidden: sign in from the console's own page")
    form = await read_form(request)
    token = form.get("token", "").strip()
    try:
        tenant = ctx.authenticator.authenticate([f"Bearer {token}"], ()) if token else None
    except Unauthenticated:
        tenant = None
    if tenant is None:
        log.warning("console: a sign-in with a wrong token from %s", _peer(request))
        ctx.refused(request, "wrong token" if token else "no token")
        return HTMLResponse(page("Sign in", login_form("That token is not valid.")), 401)
    operator = ctx.is_operator(tenant)
    session, cookie = ctx.sessions.create(token, tenant, operator)
    log.info("console: %s signed in from %s", session.who, _peer(request))
    response = RedirectResponse("/overview" if operator else "/sandboxes", status_code=303)
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=int(ctx.config.console.session_ttl_s),
        path="/",
        httponly=True,
        samesite="strict",
        secure=ctx.config.console.secure_cookies,
    )
    return response


async def logout(ctx: ConsoleContext, request: Request) -> Response:
    session, _form = await ctx.changing(request)
    ctx.sessions.end(session)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


async def home(ctx: ConsoleContext, request: Request) -> Response:
    session = ctx.session(request)
    return RedirectResponse("/overview" if session.operator else "/sandboxes", status_code=303)


def static(files: dict[str, bytes]) -> Callable[[Request], Awaitable[Response]]:
    async def serve(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in files:  # a fixed set: no path is ever joined from the request
            raise HTTPException(404, "not found")
        return Response(files[name], media_type=STATIC_TYPES[name])

    return serve


def _peer(request: Request) -> str:
    return request.client.host if request.client else "?"


def build_app(ctx: ConsoleContext) -> ASGIApp:
    files = {name: (STATIC_DIR / name).read_bytes() for name in STATIC_TYPES}

    def bind(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await handler(ctx, request)

        return endpoint

    get, post = ["GET", "HEAD"], ["POST"]
    table: list[tuple[str, Handler, list[str]]] = [
        ("/", home, get),
        ("/login", login_page, get),
        ("/login", login, post),
        ("/logout", logout, post),
        ("/overview", overview.overview_page, get),
        ("/overview.json", overview.overview_json, get),
        ("/sandboxes", sandboxes.list_page, get),
        ("/sandboxes.json", sandboxes.list_json, get),
        ("/sandbox", sandboxes.sandbox_page, get),
        ("/sandbox/isolation", sandboxes.isolation_page, get),
        ("/sandbox/usage.json", workspace.usage_json, get),
        ("/sandbox/files", workspace.files_page, get),
        ("/sandbox/file", workspace.file_page, get),
        ("/sandbox/processes", workspace.processes_page, get),
        ("/sandbox/confirm", sandboxes.confirm_page, get),
        ("/sandbox/action", sandboxes.act, post),
        ("/quarantines", quarantines.list_page, get),
        ("/approvals", approvals.approvals_page, get),
        ("/approvals/events", approvals.events, get),
        ("/approvals/decide", approvals.decide, post),
        ("/audit", audit.audit_page, get),
        ("/audit/record", audit.record_page, get),
        ("/audit/undo", audit.undo, post),
        ("/audit/export.jsonl", audit.export, get),
    ]
    routes = [Route(path, bind(h), methods=m) for path, h, m in table]
    routes.append(Route("/static/{name}", static(files), methods=get))
    handlers: dict[Any, Any] = {
        NeedLogin: _need_login,
        HTTPException: _refused,
        Exception: _crash,
    }
    return Guard(Starlette(routes=routes, exception_handlers=handlers))


PAGES_WITHOUT_JSON = (".json", ".jsonl", "/events")


async def _need_login(request: Request, _exc: Exception) -> Response:
    path = request.url.path
    if request.method == "GET" and not path.endswith(PAGES_WITHOUT_JSON):
        return RedirectResponse("/login", status_code=303)
    return PlainTextResponse("sign in first\n", status_code=401)


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    status, detail = exc.status_code, str(exc.detail)
    if request.headers.get("x-csrf-token") or request.url.path.endswith(PAGES_WITHOUT_JSON):
        return PlainTextResponse(detail + "\n", status_code=status)
    body = message(detail, "error") + '<p><a href="/">Back</a></p>'
    return HTMLResponse(page(f"{status}: {detail[:60]}", body), status_code=status)


async def _crash(request: Request, exc: Exception) -> Response:
    log.error("console %s %s failed: %r", request.method, request.url.path, exc, exc_info=exc)
    return PlainTextResponse("internal error (see the supervisor's log)\n", status_code=500)
