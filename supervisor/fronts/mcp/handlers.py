"""The MCP request handlers: tools/list, tools/call through the supervisor's one pipeline
(streamed as progress notifications when the client sends a progress token; approvals asked
of the client by elicitation when it can answer), server/discover, and the release of a
session's own sandbox when the session ends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import Any

import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from stockade.supervisor import errors
from stockade.supervisor.calls.pipeline import HostPolicy, ToolPipeline
from stockade.supervisor.calls.render import cap_text, wire_text
from stockade.supervisor.config import Config
from stockade.supervisor.fronts.mcp.convert import (
    Caller,
    call_from_mcp,
    own_session,
    refusal_to_mcp,
    result_to_mcp,
    sandbox_of,
    tool_to_mcp,
)
from stockade.supervisor.fronts.mcp.elicit import asker
from stockade.supervisor.models import (
    ApprovalPendingEvent,
    CallContext,
    OutputEvent,
    ResultEvent,
    ToolCall,
    ToolResult,
)
from stockade.supervisor.policy.approvals import Ask
from stockade.supervisor.sandboxes.manager import SandboxManager

log = logging.getLogger("stockade.mcp")
PROGRESS_TOKEN = "progress_token"
"""The SDK's name for `progressToken` in a request's parsed `_meta`."""


class ShuttingDown(errors.StockadeError):
    """A call that arrived while the supervisor stops (gRPC: UNAVAILABLE, SHUTTING_DOWN)."""

    reason = "SHUTTING_DOWN"

    def __init__(self) -> None:
        super().__init__("the supervisor is shutting down; retry when it has started again")


class Gathered:
    """Output kept within `limit` bytes of UTF-8 (its head and tail, as cap_text keeps them);
    a limit of 0 keeps nothing."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parts: list[str] = []
        self._size = 0

    def add(self, text: str) -> None:
        if not self._limit:
            return
        self._parts.append(text)
        self._size += len(text)
        if self._size > 2 * self._limit:  # compact: memory stays bounded
            self._parts = [self.text]
            self._size = len(self._parts[0])

    @property
    def text(self) -> str:
        return cap_text("".join(self._parts), self._limit)[0] if self._limit else ""


class McpTools:
    """The request handlers: the caller's allowed tools, and a call through the pipeline."""

    def __init__(
        self,
        config: Config,
        pipeline: ToolPipeline,
        policy: HostPolicy,
        authenticated: bool,
        sandboxes: SandboxManager | None = None,
    ) -> None:
        self._config = config
        self._pipeline = pipeline
        self._policy = policy
        self._authenticated = authenticated
        self._sandboxes = sandboxes
        self.draining = False
        """Set when the supervisor stops: new calls are refused, calls in flight finish."""
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._session_keys: dict[str, set[str]] = {}
        """Per MCP session: the keys of its own sandbox that its calls used."""
        self._releases: set[asyncio.Task[None]] = set()

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
            caller = replace(caller, sandbox=sandbox_of(ctx.meta))
            shared = self._config.mcp.key
            call = call_from_mcp(params.name, params.arguments, caller, shared)
            session = own_session(caller, shared)
            if session is not None:
                self._session_keys.setdefault(session, set()).add(call.sandbox_key)
            approver = f"mcp elicitation ({caller.peer or 'local'})"
            ask = asker(ctx.session, ctx.request_id, self._policy.scrubber, approver)
            notify = (ctx.meta or {}).get(PROGRESS_TOKEN) is not None
            attach = self._is_attach(params.name, params.arguments)
            if notify or attach:
                result = await self._streamed(ctx, call, caller.peer, ask, notify, attach)
            else:
                result = await self._pipeline.call(call, caller=caller.peer, ask=ask)
        except errors.StockadeError as exc:
            return refusal_to_mcp(exc)
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()
        return result_to_mcp(result)

    def _is_attach(self, name: str, arguments: dict[str, Any] | None) -> bool:
        """`process` attach, which only a streamed call can run."""
        spec = self._policy.catalog.resolve(name)
        return (
            spec is not None
            and spec.custom is None
            and spec.name == "process"
            and (arguments or {}).get("action") == "attach"
        )

    async def _streamed(
        self,
        ctx: ServerRequestContext[Any, Any],
        call: ToolCall,
        peer: str,
        ask: Ask | None,
        notify: bool,
        gather: bool,
    ) -> ToolResult:
        """The call through `call_stream`. `notify`: each output chunk (scrubbed already) is
        a progress notification whose message is the chunk, the progress the chunk's number;
        a request for an approval is one too, naming its id. `gather`: the output goes into
        the result's text, before it (capped as for_llm is), for a tool whose result does not
        hold its output (process attach)."""
        count = 0
        output = Gathered(self._config.tools.llm_max_bytes if gather else 0)
        async for event in self._pipeline.call_stream(call, caller=peer, ask=ask):
            if isinstance(event, ResultEvent):
                result = event.result
                if output.text and not result.is_error:
                    text = output.text + ("" if output.text.endswith("\n") else "\n")
                    result = replace(result, for_llm=text + result.for_llm)
                return result
            if isinstance(event, OutputEvent) and event.text:
                output.add(event.text)
                message = wire_text(event.text)
            elif isinstance(event, ApprovalPendingEvent):
                message = f"[waiting for approval {event.approval_id}: {event.reason}]"
            else:
                continue
            if notify:
                count += 1
                await ctx.session.report_progress(count, None, message)
        raise RuntimeError("call_stream ended without its result")  # it always ends with one

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
        """Every version served: those with sessions (a sandbox per session) and the
        sessionless 2026-07-28 (the sandbox a call names, else [mcp] key, else the
        tenant's mcp-default)."""
        return types.DiscoverResult(
            supported_versions=[*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS],
            capabilities=types.ServerCapabilities(tools=types.ToolsCapability()),
        )

    def session_ended(self, session_id: str) -> None:
        """An MCP session ended (the client's DELETE, its idle timeout, the supervisor's
        stop): its own sandbox is destroyed, in the background (the caller is the SDK's
        session teardown). A named or shared key is never released here."""
        keys = self._session_keys.pop(session_id, set())
        if not keys or self._sandboxes is None:
            return
        task = asyncio.get_running_loop().create_task(self._release(keys))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, keys: set[str]) -> None:
        """Remove each container; the workspace stays, stamped as retired, so that
        housekeeping deletes it after housekeeping.workspace_retention_s, as any
        destroyed sandbox's."""
        assert self._sandboxes is not None
        for key in sorted(keys):
            try:
                await self._sandboxes.destroy(key, delete_workspace=False)
            except errors.SandboxNotFound:
                continue  # its calls never reached a sandbox
            except Exception as exc:
                log.warning("could not release sandbox %r of an ended MCP session: %s", key, exc)
                continue
            log.info("released sandbox %r: its MCP session ended", key)
            self._sandboxes.record(key, "remove container", "its MCP session ended")

    async def wait_released(self, timeout: float) -> None:
        """Wait up to `timeout` s for the releases under way."""
        if self._releases:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*self._releases, return_exceptions=True), timeout
                )
