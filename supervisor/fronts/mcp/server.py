"""The MCP endpoint: the SDK's low-level Server (tools/list, tools/call) behind its
streamable-HTTP session manager, on uvicorn in the supervisor's event loop. Bearer tokens are
checked by the SDK's middleware against the gRPC API's own token table (auth.py): a
request without a valid token gets 401 and a WWW-Authenticate header. Every call goes through
the supervisor's one ToolPipeline."""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
from starlette.routing import Route

import stockade
from stockade.supervisor import errors
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.calls.pipeline import HostPolicy, ToolPipeline
from stockade.supervisor.config import Config, HttpConfig, split_host_port
from stockade.supervisor.fronts.backoff import presents
from stockade.supervisor.fronts.http import http_server, listening_socket, serve
from stockade.supervisor.fronts.mcp.handlers import McpTools
from stockade.supervisor.fronts.mcp.json_answers import JsonAnswers
from stockade.supervisor.fronts.mcp.json_answers import SessionManager as JsonSessionManager
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


class SessionManager(JsonSessionManager):
    """The SDK's session manager (its transports answering plain calls in JSON: json_answers),
    telling the handlers when a session ends. The SDK has no
    public hook for it: `_discard_session` is where every end of a session (the client's
    DELETE, its idle timeout, a crash, a stop) passes, possibly more than once."""

    def __init__(self, tools: McpTools, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._tools = tools

    async def _discard_session(self, session_id: str, transport: Any) -> None:
        await super()._discard_session(session_id, transport)
        self._tools.session_ended(session_id)


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
