"""The MCP endpoint: the SDK's low-level Server (tools/list, tools/call) behind its
streamable-HTTP session manager, on uvicorn in the supervisor's event loop. Bearer tokens are
checked by the SDK's middleware against the gRPC API's own token table (auth.py): a
request without a valid token gets 401 and a WWW-Authenticate header. Every call goes through
the supervisor's one ToolPipeline. Bodies: the SDK holds them to max_request_bytes (the
Content-Length first, 413) and answers JSON nested too deep with 400; a Content-Encoding is
refused (415, fronts/bodies.PlainOnly), as no MCP client compresses its requests. Each body
refused, by PlainOnly or by the SDK (413, and 400 for a body that does not parse as JSON), is
audited, bounded per client address (fronts/bodies.BodyAudit, observe/refusals.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import (
    BearerAuthBackend,
    RequireAuthMiddleware,
)
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import stockade
from stockade.supervisor import errors
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.calls.pipeline import HostPolicy, ToolPipeline
from stockade.supervisor.config import Config, HttpConfig, split_host_port
from stockade.supervisor.fronts import bodies
from stockade.supervisor.fronts.backoff import client_of, presents
from stockade.supervisor.fronts.bodies import BodyAudit, BodyRefused, PlainOnly
from stockade.supervisor.fronts.http import http_server, listening_socket, serve
from stockade.supervisor.fronts.mcp.convert import FRONT
from stockade.supervisor.fronts.mcp.handlers import McpTools
from stockade.supervisor.fronts.mcp.json_answers import JsonAnswers
from stockade.supervisor.fronts.mcp.json_answers import SessionManager as JsonSessionManager
from stockade.supervisor.observe.refusals import Refusals
from stockade.supervisor.sandboxes.manager import SandboxManager

log = logging.getLogger("stockade.mcp")
SERVER_NAME = "stockade"
FLUSH_S = 1.0
"""At a stop, after the last call in flight ended: time for its result to reach its caller
before the sessions end."""
RELEASE_S = 10.0
"""At a stop, at least this long for the sessions' own sandboxes to be released."""


class TokenTenants:
    """The SDK's TokenVerifier over the supervisor's Authenticator: a token in the tokens
    file is an AccessToken whose client_id is its tenant; any other is None (401)."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._authenticator = authenticator

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            tenant = self._authenticator.authenticate([f"Bearer {token}"], ())
        except errors.Unauthenticated:
            return None
        return AccessToken(token="", client_id=tenant, scopes=[])  # the token is not kept


class AuditedBearer(BearerAuthBackend):
    """The SDK's bearer check, telling `refusals` of each request to the endpoint's path it
    does not authenticate (RequireAuthMiddleware answers it 401): audited, bounded per
    client address (observe/refusals.py), never the token."""

    def __init__(self, verifier: TokenTenants, refusals: Refusals | None, path: str) -> None:
        super().__init__(verifier)
        self._refusals = refusals
        self._path = path

    async def authenticate(self, conn: HTTPConnection) -> Any:
        found = await super().authenticate(conn)
        if found is None and self._refusals is not None and conn.scope["path"] == self._path:
            sent = any(name.lower() == "authorization" for name in conn.headers)
            why = "invalid bearer token" if sent else "missing credentials"
            self._refusals.refused(FRONT, client_of(conn.scope), why)
        return found


PARSE_ERROR = b'"code":-32700'
"""The SDK's answer to a body that is not JSON (or nests past its parser's limit)."""


class SdkRefusals:
    """ASGI middleware auditing the bodies the SDK refuses itself, seen in its answers: 413
    (past max_request_bytes: its RequestBodyLimitMiddleware) and 400 with a JSON-RPC parse
    error (not JSON, or nested past pydantic's limit). What is audited is ours, never the
    SDK's message (which may quote the body)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self._app = app
        self._limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or bodies.AUDIT not in scope:
            await self._app(scope, receive, send)
            return
        status = 0

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if status == 413:
                    too_large = f"the request body exceeds {self._limit} bytes"
                    bodies.tell(scope, BodyRefused(413, too_large))
            elif message["type"] == "http.response.body" and status == 400:
                status = 0  # the answer's first piece: the SDK's error is one piece
                if PARSE_ERROR in message.get("body", b""):
                    bodies.tell(
                        scope, BodyRefused(400, "the body is not JSON, or nests too deeply")
                    )
            await send(message)

        await self._app(scope, receive, watched)


class SessionManager(JsonSessionManager):
    """The SDK's session manager (its transports answering plain calls in JSON: json_answers),
    telling the handlers when a session ends, and holding each tenant to its own number of
    sessions (per_tenant; 0: no limit). The SDK has no public hook for either:
    `_admit_session` is where a session is opened (for the tenant of the request being
    served: "" with auth off), `_discard_session` where every end of
    a session (the client's DELETE, its idle timeout, a crash, a stop) passes, possibly more
    than once. A tenant at its cap (its sessions and its openings not admitted yet counted)
    gets 429 naming it before the SDK's admission; the SDK's own cap (max_sessions, every
    tenant together) answers 503."""

    def __init__(
        self,
        tools: McpTools,
        per_tenant: int = 0,
        refusals: Refusals | None = None,
        **kwargs: Any,
    ) -> None:
        """`refusals`: where a refusal at the tenant's cap is audited (bounded per client
        address, observe/refusals.py)."""
        super().__init__(**kwargs)
        self._tools = tools
        self.per_tenant = per_tenant
        self._refusals = refusals
        self._tenant_of: dict[str, str] = {}
        """Open session id -> its tenant."""
        self.open: dict[str, int] = {}
        """Tenant -> its sessions open."""
        self.opening: dict[str, int] = {}
        """Tenant -> its requests opening a session, not admitted yet (each holds its room:
        between the cap's check and the SDK's admission the SDK awaits its lock, and
        concurrent openings past the cap got the SDK's 503 instead of this cap's 429)."""

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._opens(scope):
            await super()._handle_stateful_request(scope, receive, send)
            return
        tenant = _tenant(scope.get("user"))
        if self._full(tenant):
            who = f"tenant {tenant!r}" if tenant else "this endpoint (auth off)"
            message = (
                f"Too many open sessions: {who} has {self.per_tenant} open, its limit "
                "(mcp.max_sessions_per_tenant); end one (DELETE) first"
            )
            log.warning("MCP session refused: %s has %d open", who, self.per_tenant)
            if self._refusals is not None:
                self._refusals.capped(
                    FRONT, client_of(scope), "mcp.max_sessions_per_tenant", message
                )
            await _too_many(message)(scope, receive, send)
            return
        opening = _Opening(tenant)  # its room held until admitted: no other opening takes it
        self.opening[tenant] = self.opening.get(tenant, 0) + 1
        opener = _opener.set(opening)
        try:
            await super()._handle_stateful_request(scope, receive, send)
        finally:
            _opener.reset(opener)
            self._settle(opening)

    @staticmethod
    def _opens(scope: Scope) -> bool:
        """Whether the request would open a session (it names none)."""
        return not any(k == b"mcp-session-id" for k, _v in scope.get("headers", ()))

    def _full(self, tenant: str) -> bool:
        held = self.open.get(tenant, 0) + self.opening.get(tenant, 0)
        return bool(self.per_tenant) and held >= self.per_tenant

    def _settle(self, opening: _Opening) -> None:
        """The opening's held room given up (once): it is a session now, or none."""
        if opening.holds:
            opening.holds = False
            left = self.opening[opening.tenant] - 1
            if left:
                self.opening[opening.tenant] = left
            else:
                del self.opening[opening.tenant]

    def _admit_session(self, requestor: Any) -> Any:
        opening = _opener.get() or _Opening("", holds=False)
        transport = super()._admit_session(requestor)
        self._settle(opening)
        if transport is not None and transport.mcp_session_id is not None:
            self._tenant_of[transport.mcp_session_id] = opening.tenant
            self.open[opening.tenant] = self.open.get(opening.tenant, 0) + 1
        return transport

    async def _discard_session(self, session_id: str, transport: Any) -> None:
        tenant = self._tenant_of.pop(session_id, None)
        if tenant is not None:
            left = self.open[tenant] - 1
            if left:
                self.open[tenant] = left
            else:
                del self.open[tenant]
        await super()._discard_session(session_id, transport)
        self._tools.session_ended(session_id)


@dataclass
class _Opening:
    """A request opening a session: its tenant, and whether it still holds a room."""

    tenant: str
    holds: bool = True


_opener: ContextVar[_Opening | None] = ContextVar("stockade_mcp_opener", default=None)
"""The opening request being served, for `_admit_session` (which the SDK calls with an
AuthorizationContext built from parts of the token, not its tenant)."""


def _tenant(user: Any) -> str:
    """The tenant of an authenticated request (the SDK's AuthenticatedUser, whose access
    token's client_id TokenTenants set); "" with auth off."""
    token = getattr(user, "access_token", None)
    return str(getattr(token, "client_id", "") or "")


def _too_many(message: str) -> Response:
    """A JSON-RPC error with no id, as the SDK answers its own refusals; 429 with a
    Retry-After: the caller's own sessions, not the server, are the cause."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}
    return JSONResponse(body, status_code=429, headers={"Retry-After": "60"})


@dataclass
class Endpoint:
    """The ASGI app serving config.mcp.path, its handlers and its session manager."""

    app: Starlette
    tools: McpTools
    sessions: SessionManager

    async def close_sessions(self) -> None:
        """End every open session (and its GET stream, which would hold uvicorn's shutdown
        open to its timeout). The manager keeps them in a private table: without it, they
        end when the manager stops, after that timeout. Each is discarded as a client's
        DELETE would be, so that its sandbox's release starts now (see McpTools)."""
        sessions = self.sessions
        table = getattr(sessions, "_server_instances", {})
        for session_id, transport in list(table.items()):
            with contextlib.suppress(Exception):
                await sessions._discard_session(session_id, transport)


def build_app(
    config: Config,
    pipeline: ToolPipeline,
    policy: HostPolicy,
    authenticator: Authenticator | None,
    sandboxes: SandboxManager | None = None,
) -> Endpoint:
    """The endpoint serving config.mcp.path."""
    tools = McpTools(
        config, pipeline, policy, authenticated=authenticator is not None, sandboxes=sandboxes
    )
    server: Server[Any] = Server(
        SERVER_NAME,
        version=stockade.__version__,
        get_tool_input_schema=tools.input_schema,
        on_list_tools=tools.list_tools,
        on_call_tool=tools.call_tool,
    )
    server.add_request_handler("server/discover", types.RequestParams, tools.discover)
    host, _port = split_host_port(config.mcp.listen, "mcp.listen")
    hosts = sorted({host, "127.0.0.1", "localhost", "[::1]"} - {"::1"})
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{h}:*" for h in hosts] + hosts,
        allowed_origins=[f"http://{h}:*" for h in hosts],
    )
    manager = SessionManager(
        tools,
        app=server,
        security_settings=security,
        max_request_body_size=config.max_request_bytes,
        session_idle_timeout=config.mcp.session_idle_timeout_s,
        per_tenant=config.mcp.max_sessions_per_tenant,
        refusals=policy.refusals,
        max_sessions=config.mcp.max_sessions,
    )
    endpoint: Any = JsonAnswers(StreamableHTTPASGIApp(manager))
    middleware: list[Middleware] = []
    if authenticator is not None:
        backend = AuditedBearer(TokenTenants(authenticator), policy.refusals, config.mcp.path)
        middleware = [
            Middleware(AuthenticationMiddleware, backend=backend),
            Middleware(AuthContextMiddleware),
        ]
        endpoint = RequireAuthMiddleware(endpoint, [])
    app = Starlette(
        routes=[Route(config.mcp.path, endpoint=endpoint)],
        middleware=[
            Middleware(BodyAudit, front=FRONT, refusals=policy.refusals),
            Middleware(PlainOnly),
            Middleware(SdkRefusals, limit=config.max_request_bytes),
            *middleware,
        ],
        lifespan=lambda _app: manager.run(),
    )
    return Endpoint(app, tools, manager)


class McpFront:
    """The running MCP endpoint; `port` is the bound TCP port."""

    def __init__(self, endpoint: Endpoint, listen: str, http: HttpConfig | None = None) -> None:
        self._endpoint = endpoint
        self._socket = listening_socket(listen, "mcp.listen", "MCP", 128)
        self.port: int = self._socket.getsockname()[1]
        credentials = presents(b"authorization")
        self._server = http_server(endpoint.app, http or HttpConfig(), "mcp", credentials)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = await serve(self._server, self._socket, "MCP")

    async def stop(self, grace: float) -> None:
        """New calls are refused at once, calls in flight get `grace` seconds to finish; then
        the sessions end and the server stops."""
        if self._task is None:
            self._socket.close()
            return
        tools = self._endpoint.tools
        tools.draining = True
        if tools.busy:
            if not await tools.wait_idle(grace):
                log.warning("shutdown: MCP calls still in flight after %g s are ended", grace)
            await asyncio.sleep(FLUSH_S)  # their results, on their way to the callers
        await tools.rounds.close()  # sessionless calls waiting for an answer that is too late
        await self._endpoint.close_sessions()
        await tools.wait_released(max(grace, RELEASE_S))  # the ended sessions' sandboxes
        self._server.config.timeout_graceful_shutdown = 1
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await self._task
        self._socket.close()


async def start_mcp(
    config: Config,
    pipeline: ToolPipeline,
    policy: HostPolicy,
    authenticator: Authenticator | None,
    sandboxes: SandboxManager | None = None,
) -> McpFront | None:
    """The MCP endpoint when [mcp] listen is set (None otherwise), serving already.
    `sandboxes`: where an ended session's own sandbox is released (None: never)."""
    if not config.mcp.listen:
        return None
    endpoint = build_app(config, pipeline, policy, authenticator, sandboxes)
    front = McpFront(endpoint, config.mcp.listen, config.http)
    await front.start()
    return front
