"""The E2B endpoint: one plain-HTTP port (uvicorn in the supervisor's event loop) serving
both E2B's control plane (control.py) and envd, the API E2B runs inside each sandbox. A
request carrying `E2b-Sandbox-Id` is envd's: it must present that sandbox's access token in
`X-Access-Token` (compared in constant time; missing or wrong: 401), and goes to the envd app
with the sandbox's record in `scope["state"]["e2b_sandbox"]`; an unknown or ended sandbox is
502 "The sandbox ... was not found", as E2B's edge answers (the SDKs then say it is not
running). Any other request is the control plane's, authenticated by its X-API-KEY. A
background task removes the sandboxes whose timeout has passed. A body refused on either
(fronts/bodies.py) is audited, bounded per client address (BodyAudit, observe/refusals.py)."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from stockade.supervisor.auth import Authenticator
from stockade.supervisor.calls.pipeline import HostPolicy, ToolPipeline
from stockade.supervisor.config import Config
from stockade.supervisor.fronts.backoff import Presented, client_of, presents
from stockade.supervisor.fronts.bodies import BodyAudit
from stockade.supervisor.fronts.e2b import signed
from stockade.supervisor.fronts.e2b.context import FRONT, E2bContext
from stockade.supervisor.fronts.e2b.control import Control
from stockade.supervisor.fronts.e2b.envd import build_envd_app
from stockade.supervisor.fronts.e2b.records import E2bSandbox, Records
from stockade.supervisor.fronts.e2b.wire import ApiError, error_response
from stockade.supervisor.fronts.http import http_server, listening_socket, serve
from stockade.supervisor.sandboxes.manager import SandboxManager

log = logging.getLogger("stockade.e2b")
SANDBOX_HEADER = b"e2b-sandbox-id"
TOKEN_HEADER = b"x-access-token"
SANDBOX_STATE = "e2b_sandbox"
"""Where the envd app finds the request's sandbox: scope["state"][SANDBOX_STATE]."""


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of a request header (names are lowercase in ASGI)."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def _answer(scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
    await error_response(status, message)(scope, receive, send)


class Dispatch:
    """Requests with an E2b-Sandbox-Id header to envd (after the token check), the rest to
    the control plane."""

    def __init__(self, ctx: E2bContext, control: ASGIApp, envd: ASGIApp, handlers: Control) -> None:
        self._ctx = ctx
        self._control = control
        self._envd = envd
        self._handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sandbox_id = header(scope, SANDBOX_HEADER) if scope["type"] == "http" else None
        if sandbox_id is None:
            if scope["type"] == "http" and await self._signed(scope, receive, send):
                return
            await self._control(scope, receive, send)
            return
        sandbox = self.sandbox_for(sandbox_id)
        if sandbox is None:
            await _answer(scope, receive, send, 502, f"The sandbox {sandbox_id[:64]} was not found")
            return
        if not token_matches(header(scope, TOKEN_HEADER), sandbox):
            self._refused(scope, "invalid envd access token")
            message = "unauthorized access, please provide a valid access token (X-Access-Token)"
            await _answer(scope, receive, send, 401, message)
            return
        await self._to_envd(scope, receive, send, sandbox)

    async def _signed(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """A signed `/files` URL (signed.py) goes to envd as its sandbox's: True when the
        request was one (answered here or by envd)."""
        query = Request(scope).query_params
        if not signed.is_signed(scope["method"], scope["path"], query):
            return False
        try:
            sandbox = signed.signed_sandbox(scope["method"], query, self._ctx.records, time.time())
        except signed.SignatureRefused as exc:
            self._refused(scope, f"signed URL: {exc.message}")
            await _answer(scope, receive, send, 401, exc.message)
            return True
        await self._to_envd(scope, receive, send, sandbox)
        return True

    def _refused(self, scope: Scope, why: str) -> None:
        refusals = self._ctx.policy.refusals
        if refusals is not None:
            refusals.refused(FRONT, client_of(scope), why)

    async def _to_envd(
        self, scope: Scope, receive: Receive, send: Send, sandbox: E2bSandbox
    ) -> None:
        if not await self._awake(scope, sandbox):
            message = (
                f"The sandbox {sandbox.sandbox_id} was not found: it is paused (connect resumes it)"
            )
            await _answer(scope, receive, send, 502, message)
            return
        scope = dict(scope)
        scope["state"] = {**scope.get("state", {}), SANDBOX_STATE: sandbox}
        await self._envd(scope, receive, send)

    async def _awake(self, scope: Scope, sandbox: E2bSandbox) -> bool:
        """Whether the sandbox runs for this request (Control.wake: a paused one answers 502
        unless created with auto_resume). A resume that fails is a 502 too."""
        try:
            return await self._handlers.wake(Request(scope), sandbox)
        except ApiError as exc:
            log.warning("E2B sandbox %s: auto-resume failed: %s", sandbox.sandbox_id, exc.message)
            return False

    def sandbox_for(self, sandbox_id: str) -> E2bSandbox | None:
        """The live sandbox of that id (any tenant: its token decides), None when unknown or
        its timeout has passed."""
        sandbox = self._ctx.records.by_id(sandbox_id)
        if sandbox is None or sandbox.ended(time.time()):
            return None
        return sandbox


def token_matches(given: str | None, sandbox: E2bSandbox) -> bool:
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"), sandbox.access_token.encode())


def _credentials(headers: Presented) -> Presented:
    """Credentials are presented by those headers or, on `/files`, a signed URL's signature:
    a refused one earns the back-off as a wrong token does."""

    def presented(scope: Scope) -> bytes | None:
        found = headers(scope)
        if found is None and scope.get("path") == "/files":
            query = bytes(scope.get("query_string", b"")).decode("latin-1")
            for name, value in parse_qsl(query):
                if name == "signature":
                    return b"signature=" + value.encode("latin-1", "replace")
        return found

    return presented


async def _api_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, exc.headers)


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, str(exc.detail), exc.headers)


async def _crash(request: Request, exc: Exception) -> Response:
    log.error("E2B %s %s failed: %r", request.method, request.url.path, exc, exc_info=exc)
    return error_response(500, "internal error (see the supervisor's log)")


async def _health(_request: Request) -> Response:
    return JSONResponse({"code": 200, "message": "ok"})


def control_routes(control: Control) -> list[Route]:
    c, sid = control, "/sandboxes/{sandbox_id}"
    return [
        Route("/health", _health, methods=["GET"]),
        Route("/v2/sandboxes", c.create, methods=["POST"]),
        Route("/sandboxes", c.create, methods=["POST"]),
        Route("/v2/sandboxes", c.list_v2, methods=["GET"]),
        Route("/sandboxes", c.list_v1, methods=["GET"]),
        Route("/v2" + sid + "/connect", c.connect, methods=["POST"]),
        Route(sid + "/connect", c.connect, methods=["POST"]),
        Route(sid + "/resume", c.resume, methods=["POST"]),
        Route(sid, c.info, methods=["GET"]),
        Route(sid, c.kill, methods=["DELETE"]),
        Route(sid + "/timeout", c.set_timeout, methods=["POST"]),
        Route(sid + "/metrics", c.metrics_of, methods=["GET"]),
        Route(sid + "/pause", c.pause, methods=["POST"]),
        Route(sid + "/fork", c.snapshots.fork, methods=["POST"]),
        Route(sid + "/snapshots", c.snapshots.create_snapshot, methods=["POST"]),
        Route("/snapshots", c.snapshots.list_snapshots, methods=["GET"]),
        Route("/templates/{template_id}", c.snapshots.delete_template, methods=["DELETE"]),
    ]


def build_app(ctx: E2bContext) -> tuple[ASGIApp, Control]:
    """The endpoint's ASGI app and its control-plane handlers."""
    control = Control(ctx)
    envd = build_envd_app(ctx)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        router = getattr(envd, "router", None)  # a Starlette envd app's own startup
        if router is None:
            yield
            return
        async with router.lifespan_context(envd):
            yield

    handlers: dict[Any, Any] = {ApiError: _api_error, HTTPException: _http_error, Exception: _crash}
    app = Starlette(routes=control_routes(control), exception_handlers=handlers, lifespan=lifespan)
    return BodyAudit(Dispatch(ctx, app, envd, control), FRONT, ctx.policy.refusals), control


class E2bFront:
    """The running E2B endpoint; `port` is the bound TCP port."""

    def __init__(self, ctx: E2bContext) -> None:
        listen = ctx.config.e2b.listen
        self.ctx = ctx
        app, self.control = build_app(ctx)
        self._socket = listening_socket(listen, "e2b.listen", "E2B", 512)
        self.port: int = self._socket.getsockname()[1]
        credentials = _credentials(presents(b"x-api-key", TOKEN_HEADER))
        self._server = http_server(app, ctx.config.http, "e2b", credentials)
        self._task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = await serve(self._server, self._socket, "E2B")
        self._sweeper = asyncio.create_task(self._sweep())

    async def _sweep(self) -> None:
        """Remove the sandboxes whose timeout passed, every sweep_interval_s."""
        interval = self.ctx.config.e2b.sweep_interval_s
        while True:
            try:
                await self.control.expire()
            except Exception:  # a failed sweep must not end the sweeper
                log.exception("E2B timeout sweep failed")
            await asyncio.sleep(interval)

    async def stop(self, grace: float) -> None:
        """Stop taking requests; those in flight get `grace` seconds."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._task is None:
            self._socket.close()
            return
        self._server.config.timeout_graceful_shutdown = max(1, int(grace))
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await self._task
        self._socket.close()


async def start_e2b(
    config: Config,
    pipeline: ToolPipeline,
    policy: HostPolicy,
    authenticator: Authenticator | None,
    manager: SandboxManager,
) -> E2bFront | None:
    """The E2B endpoint when [e2b] listen is set (None otherwise), serving already."""
    if not config.e2b.listen:
        return None
    records = await asyncio.to_thread(Records, config.state_dir)
    ctx = E2bContext(config, pipeline, policy, authenticator, manager, records)
    front = E2bFront(ctx)
    await front.start()
    log.info("E2B endpoint on %s (%d sandboxes on record)", config.e2b.listen, len(records))
    return front
