"""The MCP endpoint: the SDK's low-level Server (tools/list, tools/call) behind its
streamable-HTTP session manager, on uvicorn in the supervisor's event loop. Bearer tokens are
checked by the SDK's middleware against the gRPC API's own token table (api/auth.py): a
request without a valid token gets 401 and a WWW-Authenticate header. Every call goes through
the supervisor's one ToolPipeline."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import (
    AuthenticatedUser,
    BearerAuthBackend,
    RequireAuthMiddleware,
)
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route

from stockade.supervisor import errors
from stockade.supervisor.api.auth import Authenticator
from stockade.supervisor.calls.pipeline import HostPolicy, ToolPipeline
from stockade.supervisor.config import Config, split_host_port
from stockade.supervisor.fronts.mcp.convert import (
    Caller,
    call_from_mcp,
    refusal_to_mcp,
    result_to_mcp,
    tool_to_mcp,
)
from stockade.supervisor.fronts.mcp.json_answers import JsonAnswers, SessionManager
from stockade.supervisor.models import CallContext

log = logging.getLogger("stockade.mcp")
SERVER_NAME = "stockade"
FLUSH_S = 1.0
"""At a stop, after the last call in flight ended: time for its result to reach its caller
before the sessions end."""


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


class McpTools:
    """The request handlers: the caller's allowed tools, and a call through the pipeline."""

    def __init__(
        self, config: Config, pipeline: ToolPipeline, policy: HostPolicy, authenticated: bool
    ) -> None:
        self._config = config
        self._pipeline = pipeline
        self._policy = policy
        self._authenticated = authenticated
        self.draining = False
        """Set when the supervisor stops: new calls are refused, calls in flight finish."""
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def caller(self, ctx: ServerRequestContext[Any, Any]) -> Caller:
        """Who sent the request; with auth on, a request the middleware did not
        authenticate is refused here too (never served as tenant "")."""
        request = ctx.request
        if request is None:
            raise errors.Unauthenticated("an MCP request without its HTTP request")
        user = request.scope.get("user")
        if isinstance(user, AuthenticatedUser):
            tenant = user.access_token.client_id
        elif self._authenticated:
            raise errors.Unauthenticated("missing credentials: send `authorization: Bearer TOKEN`")
        else:
            tenant = ""
        client = request.client
        peer = ""
        if client is not None:
            ip = f"ipv6:[{client.host}]" if ":" in client.host else f"ipv4:{client.host}"
            peer = f"{ip}:{client.port}"
        # a 2026-07-28 request has no session: a session id header it carries was never
        # checked by the session manager, so it does not choose the sandbox
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        return Caller(
            tenant=tenant,
            session_id=None if modern else request.headers.get(MCP_SESSION_ID_HEADER),
            peer=peer,
            traceparent=request.headers.get("traceparent", ""),
        )

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self.caller(ctx)
        allowed = self._policy.tools.allowed_tools(CallContext())
        return types.ListToolsResult(tools=[tool_to_mcp(spec) for spec in allowed])

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        caller = self.caller(ctx)
        if self.draining:
            return refusal_to_mcp(ShuttingDown())
        self._active += 1
        self._idle.clear()
        try:
            call = call_from_mcp(params.name, params.arguments, caller, self._config.mcp.key)
            result = await self._pipeline.call(call, caller=caller.peer)
        except errors.StockadeError as exc:
            return refusal_to_mcp(exc)
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()
        return result_to_mcp(result)

    @property
    def busy(self) -> bool:
        return self._active > 0

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the calls in flight to end; whether they all did."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def discover(
        self, ctx: ServerRequestContext[Any, Any], params: types.RequestParams | None
    ) -> types.DiscoverResult:
        """Advertise the protocol versions with sessions only: a client that probes with
        `server/discover` then opens a session (the sandbox is chosen per session)."""
        return types.DiscoverResult(
            supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
            capabilities=types.ServerCapabilities(tools=types.ToolsCapability()),
        )


class ShuttingDown(errors.StockadeError):
    """A call that arrived while the supervisor stops (gRPC: UNAVAILABLE, SHUTTING_DOWN)."""

    reason = "SHUTTING_DOWN"

    def __init__(self) -> None:
        super().__init__("the supervisor is shutting down; retry when it has started again")


@dataclass
class Endpoint:
    """The ASGI app serving config.mcp.path, its handlers and its session manager."""

    app: Starlette
    tools: McpTools
    sessions: StreamableHTTPSessionManager

    async def close_sessions(self) -> None:
        """End every open session (and its GET stream, which would hold uvicorn's shutdown
        open to its timeout). The manager keeps them in a private table: without it, they
        end when the manager stops, after that timeout."""
        table = getattr(self.sessions, "_server_instances", {})
        for transport in list(table.values()):
            with contextlib.suppress(Exception):
                await transport.terminate()


def build_app(
    config: Config,
    pipeline: ToolPipeline,
    policy: HostPolicy,
    authenticator: Authenticator | None,
) -> Endpoint:
    """The endpoint serving config.mcp.path."""
    tools = McpTools(config, pipeline, policy, authenticated=authenticator is not None)
    server: Server[Any] = Server(
        SERVER_NAME,
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
        app=server, security_settings=security, max_request_body_size=config.max_request_bytes
    )
    endpoint: Any = JsonAnswers(StreamableHTTPASGIApp(manager))
    middleware: list[Middleware] = []
    if authenticator is not None:
        backend = BearerAuthBackend(TokenTenants(authenticator))
        middleware = [
            Middleware(AuthenticationMiddleware, backend=backend),
            Middleware(AuthContextMiddleware),
        ]
        endpoint = RequireAuthMiddleware(endpoint, [])
    app = Starlette(
        routes=[Route(config.mcp.path, endpoint=endpoint)],
        middleware=middleware,
        lifespan=lambda _app: manager.run(),
    )
    return Endpoint(app, tools, manager)


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: the supervisor's own stop the front."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class McpFront:
    """The running MCP endpoint; `port` is the bound TCP port."""

    def __init__(self, endpoint: Endpoint, listen: str) -> None:
        self._endpoint = endpoint
        host, port = split_host_port(listen, "mcp.listen")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP
        # (an accepted one inherits it); with proto 0, Nagle held a response's body back
        # for the client's delayed ACK, ~40 ms a request on a kept-alive connection
        self._socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._socket.bind((host, port))
            self._socket.listen(128)
        except OSError as exc:
            self._socket.close()
            raise errors.ConfigError(f"cannot serve MCP on {listen}: {exc}") from exc
        self._socket.setblocking(False)
        self.port: int = self._socket.getsockname()[1]
        self._server = _Uvicorn(
            uvicorn.Config(
                endpoint.app,
                lifespan="on",
                log_config=None,
                access_log=False,
                http="httptools",  # a C parser: h11, pure Python, costs more CPU a request
                # no proxy in front of a loopback endpoint: X-Forwarded-For from a local
                # client would otherwise replace the peer the audit log records
                proxy_headers=False,
            )
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise errors.ConfigError("the MCP endpoint did not start")
            await asyncio.sleep(0.01)

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
        await self._endpoint.close_sessions()
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
) -> McpFront | None:
    """The MCP endpoint when [mcp] listen is set (None otherwise), serving already."""
    if not config.mcp.listen:
        return None
    front = McpFront(build_app(config, pipeline, policy, authenticator), config.mcp.listen)
    await front.start()
    return front
