"""The MCP request handlers: tools/list, tools/call through the supervisor's one pipeline
(streamed as progress notifications when the client sends a progress token; approvals asked
of the client by elicitation when it can answer), server/discover, and the release of a
session's own sandbox when the session ends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import Any

import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from stockade.supervisor import errors
from stockade.supervisor.calls.lifecycle import Actor, Lifecycle
from stockade.supervisor.calls.pipeline import HostPolicy, ToolPipeline
from stockade.supervisor.config import Config
from stockade.supervisor.fronts.mcp.convert import (
    FRONT,
    Caller,
    call_from_mcp,
    own_session,
    refusal_to_mcp,
    result_to_mcp,
    sandbox_of,
    tool_to_mcp,
    with_shell_session,
)
from stockade.supervisor.fronts.mcp.elicit import asker, supports_forms
from stockade.supervisor.fronts.mcp.rounds import Progress, Rounds
from stockade.supervisor.fronts.mcp.undo import SCHEMA as UNDO_SCHEMA
from stockade.supervisor.fronts.mcp.undo import UNDO_TOOL, Undoing, undo_call, undo_tool
from stockade.supervisor.models import (
    ApprovalPendingEvent,
    CallContext,
    OutputEvent,
    ResultEvent,
    ToolCall,
    ToolEvent,
    ToolResult,
)
from stockade.supervisor.policy.approvals import Ask
from stockade.supervisor.policy.limits import LimitExceeded
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.supervisor.text import wire_text
from stockade.supervisor.tools.render import cap_text

log = logging.getLogger("stockade.mcp")
ROUNDS_GRACE_S = 60.0
"""How long after its approval's timeout a sessionless client's answer still finds its call
(and gets its result)."""
PROGRESS_TOKEN = "progress_token"
"""The SDK's name for `progressToken` in a request's parsed `_meta`."""


class ShuttingDown(errors.StockadeError):
    """A call that arrived while the supervisor stops (gRPC: UNAVAILABLE, SHUTTING_DOWN)."""

    reason = "SHUTTING_DOWN"

    def __init__(self) -> None:
        super().__init__("the supervisor is shutting down; retry when it has started again")


def reporter(ctx: ServerRequestContext[Any, Any]) -> Callable[[int, str], Awaitable[None]]:
    """Progress notifications on this request's stream."""

    async def send(count: int, message: str) -> None:
        await ctx.session.report_progress(count, None, message)

    return send


def _askable_later(ctx: ServerRequestContext[Any, Any]) -> bool:
    """A sessionless request from a client that answers form elicitations: asked through an
    `input_required` result (rounds.py), as it cannot be asked during the request."""
    session = ctx.session
    return (
        ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        and not session.can_send_request
        and supports_forms(session.client_capabilities)
    )


def wants_progress(ctx: ServerRequestContext[Any, Any]) -> bool:
    """The request carries a progress token: its call's output goes out as notifications."""
    return (ctx.meta or {}).get(PROGRESS_TOKEN) is not None


Run = Callable[["Ask | None", Progress], Coroutine[Any, Any, ToolResult]]
"""A call, given how to ask its client about an approval (None: it cannot be asked) and
where its progress goes."""


@dataclass(frozen=True)
class Asking:
    """How a tools/call's client is asked about an approval, by the endpoint and by the stdio
    bridge alike: by an elicitation request in a session that can take one; through an
    `input_required` result when sessionless (rounds); not at all otherwise."""

    rounds: Rounds
    tenant: str
    approver: str
    scrubber: Scrubber | None

    async def answer(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: types.CallToolRequestParams,
        run: Run,
    ) -> ToolResult | types.InputRequiredResult:
        """The call's result, or the question for a sessionless client (whose answer, a
        later request with its `requestState`, gets the result)."""
        send = reporter(ctx) if wants_progress(ctx) else None
        if params.request_state is not None:  # a sessionless client's answer
            parked = self.rounds.resume(
                params.request_state, self.tenant, params.input_responses, send
            )
            return await self.rounds.outcome(parked)
        progress = Progress(send)
        if _askable_later(ctx):
            parked = self.rounds.start(
                self.tenant, self.approver, progress, lambda ask: run(ask, progress)
            )
            return await self.rounds.outcome(parked)
        ask = asker(ctx.session, ctx.request_id, self.scrubber, self.approver)
        return await run(ask, progress)


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

    def prefixed(self, result: ToolResult) -> ToolResult:
        """The result with the output kept before its text (a successful one's)."""
        text = self.text
        if not text or result.is_error:
            return result
        text += "" if text.endswith("\n") else "\n"
        return replace(result, for_llm=text + result.for_llm)


async def follow(
    events: AsyncIterator[ToolEvent], progress: Progress, output: Gathered
) -> ToolResult:
    """A streamed call's result: each output chunk (scrubbed already) goes to `progress` (a
    notification whose message is the chunk) and into `output`, a request for an approval
    to `progress` too, naming its id; the result comes with `output` before its text (for
    `process` attach, whose result does not hold the output it followed)."""
    async for event in events:
        if isinstance(event, ResultEvent):
            return output.prefixed(event.result)
        if isinstance(event, OutputEvent) and event.text:
            output.add(event.text)
            await progress(wire_text(event.text))
        elif isinstance(event, ApprovalPendingEvent):
            await progress(f"[waiting for approval {event.approval_id}: {event.reason}]")
    raise RuntimeError("the call's stream ended without its result")  # it always ends with one


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
        self._lifecycle = Lifecycle(sandboxes, policy.audit) if sandboxes is not None else None
        self.undoing: Undoing | None = sandboxes.checkpoints.undo if sandboxes is not None else None
        """The RollbackSandbox path the undo tool takes (None: no sandboxes here)."""
        self.draining = False
        """Set when the supervisor stops: new calls are refused, calls in flight finish."""
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._session_keys: dict[str, set[str]] = {}
        """Per MCP session: the keys of its own sandbox that its calls used."""
        self._session_peers: dict[str, str] = {}
        """Per MCP session: the peer of its last call (the caller of its release's record)."""
        self._releases: set[asyncio.Task[None]] = set()
        self.rounds = Rounds(config.approvals.timeout_s + ROUNDS_GRACE_S, policy.scrubber)
        """Sessionless calls waiting for their caller's answer to an approval."""

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
        tools = [tool_to_mcp(spec) for spec in allowed]
        if self._undo_on:
            tools.append(undo_tool(self._config.mcp.undo))
        return types.ListToolsResult(tools=tools)

    @property
    def _undo_on(self) -> bool:
        """[mcp] undo lists the undo tool (and there are sandboxes to undo in)."""
        return self._config.mcp.undo != "off" and self.undoing is not None

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        """The inputSchema tools/list gives the tool `name` (None when it lists none of that
        name): the SDK checks a sessionless call's `Mcp-Param-*` headers against it. Without
        this lookup the SDK ran a whole tools/list for every sessionless call to find it."""
        if name == UNDO_TOOL and self._undo_on:
            return UNDO_SCHEMA
        spec = self._policy.catalog.tools.get(name)
        if spec is None or not self._policy.tools.decide(spec.name, CallContext()).allowed:
            return None
        return spec.parameters

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        caller = self.caller(ctx)
        if self.draining:
            return refusal_to_mcp(ShuttingDown())
        self._active += 1
        self._idle.clear()
        try:
            caller = replace(caller, sandbox=sandbox_of(ctx.meta))
            shared = self._config.mcp.key
            if params.name == UNDO_TOOL and self._undo_on:
                return await self._undo(caller, params.arguments)
            session = own_session(caller, shared)
            spec = self._policy.catalog.resolve(params.name)
            tool = spec.name if spec is not None else params.name
            arguments = with_shell_session(tool, params.arguments, session)
            call = call_from_mcp(params.name, arguments, caller, shared)
            if session is not None:
                self._session_keys.setdefault(session, set()).add(call.sandbox_key)
                self._session_peers[session] = caller.peer
            approver = f"mcp elicitation ({caller.peer or 'local'})"
            attach = self._is_attach(params.name, params.arguments)
            stream = wants_progress(ctx) or attach

            def run(ask: Ask | None, progress: Progress) -> Coroutine[Any, Any, ToolResult]:
                return self._run(call, caller.peer, ask, progress, stream, attach)

            asking = Asking(self.rounds, caller.tenant, approver, self._policy.scrubber)
            result = await asking.answer(ctx, params, run)
        except errors.StockadeError as exc:
            return refusal_to_mcp(exc)
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()
        if isinstance(result, types.InputRequiredResult):
            return result
        return result_to_mcp(result)

    async def _undo(self, caller: Caller, arguments: dict[str, Any] | None) -> types.CallToolResult:
        """The undo tool on the caller's sandbox (the key its calls use), paced by the key's
        rate limit as any call is."""
        assert self.undoing is not None
        key = call_from_mcp(UNDO_TOOL, {}, caller, self._config.mcp.key).sandbox_key
        try:
            self._policy.limiter.take(key)
        except LimitExceeded as exc:
            return refusal_to_mcp(errors.QuotaExceeded(str(exc)))
        return await undo_call(
            self.undoing, key, arguments, self._config.mcp.undo,
            caller.peer, self._policy.scrubber, self._config.tools.llm_max_bytes,
        )  # fmt: skip

    def _is_attach(self, name: str, arguments: dict[str, Any] | None) -> bool:
        """`process` attach, which only a streamed call can run."""
        spec = self._policy.catalog.resolve(name)
        return (
            spec is not None
            and spec.custom is None
            and spec.name == "process"
            and (arguments or {}).get("action") == "attach"
        )

    async def _run(
        self,
        call: ToolCall,
        peer: str,
        ask: Ask | None,
        progress: Progress,
        stream: bool,
        gather: bool,
    ) -> ToolResult:
        """The call through `call`, or, with `stream`, through `call_stream` (see follow;
        with `gather`, `process` attach's output goes into the result's text, before it,
        capped as for_llm is)."""
        if not stream:
            return await self._pipeline.call(call, caller=peer, ask=ask)
        output = Gathered(self._config.tools.llm_max_bytes if gather else 0)
        return await follow(
            self._pipeline.call_stream(call, caller=peer, ask=ask), progress, output
        )

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
        peer = self._session_peers.pop(session_id, "")
        if not keys or self._lifecycle is None:
            return
        who = Actor(FRONT, peer or f"mcp session {session_id}")
        task = asyncio.get_running_loop().create_task(self._release(keys, who, session_id))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, keys: set[str], who: Actor, session_id: str) -> None:
        """Remove each container through the lifecycle path (one audit record each, front
        "mcp", the session's peer); the workspace stays, stamped as retired, so that
        housekeeping deletes it after housekeeping.workspace_retention_s, as any
        destroyed sandbox's."""
        assert self._lifecycle is not None
        manager = self._lifecycle.sandboxes
        why = {"as": "its MCP session ended", "session": session_id}
        for key in sorted(keys):
            if key not in manager.registry and not manager.layout.of(key).root.is_dir():
                continue  # its calls never reached a sandbox: nothing to release
            try:
                await self._lifecycle.destroy(
                    who, key, delete_workspace=False, arguments=why, missing_ok=True
                )
            except Exception as exc:
                log.warning("could not release sandbox %r of an ended MCP session: %s", key, exc)
                continue
            log.info("released sandbox %r: its MCP session ended", key)

    async def wait_released(self, timeout: float) -> None:
        """Wait up to `timeout` s for the releases under way."""
        if self._releases:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(*self._releases, return_exceptions=True), timeout
                )
