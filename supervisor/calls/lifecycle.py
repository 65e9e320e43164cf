"""One path for every change a front makes to a sandbox's life: ensure (create), destroy,
pause, resume, quarantine and release, as calls/pipeline.py is the one path of a tool call.
gRPC, MCP, the E2B API and the console each ask through a Lifecycle, and each change (done
or refused) is exactly one audit record naming its front and its caller: the tool is the
change's name (LIFECYCLE_TOOLS), the tenant is the key's, the arguments are what the
front asked for (and in its own words, `as`: E2B's kill is a destroy).

The sandbox manager does the work and records only what the supervisor does on its own
(housekeeping: an idle pause, a prune, a call's resume of a paused sandbox, an alarm's
quarantine); what a front asked for is recorded here, never twice."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from stockade.supervisor.calls.sessions import SessionBook
from stockade.supervisor.errors import InvalidRequest, SandboxNotFound, StockadeError
from stockade.supervisor.keys import shown
from stockade.supervisor.models import NetworkRequest, SandboxInfo
from stockade.supervisor.observe.alarms import Alarm
from stockade.supervisor.observe.audit import AuditRecord
from stockade.supervisor.observe.refusals import Recording
from stockade.supervisor.sandboxes.agent_link import AgentReply
from stockade.supervisor.sandboxes.quarantine import MAX_REASON, Quarantine, Quarantines
from stockade.supervisor.sandboxes.sandbox import Sandbox

T = TypeVar("T")
ENSURE, CREATE, DESTROY = "ensure_sandbox", "create_sandbox", "destroy_sandbox"
PAUSE, RESUME = "pause_sandbox", "resume_sandbox"
QUARANTINE, RELEASE = "quarantine_sandbox", "release_quarantine"
CONNECT, SET_TIMEOUT = "connect_sandbox", "set_timeout"
END_SESSION = "end_session"
LIFECYCLE_TOOLS = frozenset(
    {ENSURE, CREATE, DESTROY, PAUSE, RESUME, QUARANTINE, RELEASE, CONNECT, SET_TIMEOUT}
    | {END_SESSION}
)
"""The audit log's tool of each change (CONNECT and SET_TIMEOUT: E2B's, which change when a
sandbox ends or make it run again)."""
FAILED = "FAILED"
"""The error code of a refused change whose error has no reason of its own."""


@dataclass(frozen=True)
class Actor:
    """Who asks for a change: the front ("grpc", "mcp", "e2b", "console") and the caller as
    that front knows it (a gRPC peer, an E2B client's address, the console's user@address;
    "supervisor" for a front's own timer, such as E2B's expiry)."""

    front: str
    caller: str


SESSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A shell session's name (the agent's shells.py checks it too)."""
SESSION_CALL_S = 10.0


class SessionLease(Protocol):
    """What the session calls ask of a sandbox's lease (sandboxes/lease.py Lease)."""

    async def invoke(
        self, tool: str, arguments: dict[str, Any], timeout: float, request_id: str, /
    ) -> AgentReply: ...


class LifecycleSandboxes(Protocol):
    """What the lifecycle path asks of the sandboxes (sandboxes/manager.py SandboxManager is
    the real one; the console's tests put a recording stand-in in its place)."""

    @property
    def registry(self) -> Mapping[str, Sandbox]: ...

    @property
    def quarantines(self) -> Quarantines: ...

    async def ensure(
        self, key: str, network: NetworkRequest | None = None, profile: str | None = None
    ) -> Sandbox: ...

    async def pause(
        self, key: str, reason: str, *, recorded: bool = True
    ) -> tuple[SandboxInfo, bool]: ...

    async def resume(
        self, key: str, reason: str, *, recorded: bool = True
    ) -> tuple[SandboxInfo, bool]: ...

    async def destroy(self, key: str, *, delete_workspace: bool) -> tuple[bool, bool]: ...

    def lease(self, key: str, /) -> AbstractAsyncContextManager[SessionLease]: ...


S = TypeVar("S", bound=LifecycleSandboxes)
"""The sandboxes a Lifecycle holds, as its front knows them (`Lifecycle.sandboxes`)."""


class Lifecycle(Generic[S]):
    def __init__(
        self,
        sandboxes: S,
        audit: Recording | None,
        sound: Callable[[Alarm], None] | None = None,
    ) -> None:
        """`sound`: where a quarantine by hand's alarm is told (the AlarmHub: the log,
        WatchAlarms, metrics); None: nowhere."""
        self.sandboxes = sandboxes
        self._audit = audit
        self._sound = sound

    async def sessions(self, key: str) -> list[dict[str, Any]]:
        """The shell sessions of the key's running sandbox (its agent's list); none without
        one (no container is made for the question)."""
        if key not in self.sandboxes.registry:
            return []
        sessions = (await self._session_tool(key, {"action": "list"})).get("sessions")
        return sessions if isinstance(sessions, list) else []

    async def end_session(self, actor: Actor, key: str, name: str, book: SessionBook) -> bool:
        """End one shell session (audited): its agent drops its state and the book forgets
        it. Whether there was one."""
        if not SESSION_NAME.fullmatch(name):
            raise InvalidRequest(
                "a session's name is 1 to 64 letters, digits, '.', '_' or '-', starting with a "
                "letter or digit"
            )

        async def act() -> bool:
            book.forget(key, name)
            if key not in self.sandboxes.registry:
                return False
            reply = await self._session_tool(key, {"action": "end", "session": name})
            return reply.get("ended") is True

        return await self._change(actor, key, END_SESSION, {"session": name}, act)

    async def _session_tool(self, key: str, arguments: dict[str, Any]) -> dict[str, Any]:
        async with self.sandboxes.lease(key) as lease:
            reply = await lease.invoke("session", arguments, SESSION_CALL_S, uuid.uuid4().hex)
        if reply.error_code or reply.result is None:
            raise InvalidRequest(f"the sandbox's agent refused: {reply.error_message}")
        return reply.result

    async def ensure(
        self,
        actor: Actor,
        key: str,
        network: NetworkRequest | None = None,
        profile: str | None = None,
        *,
        tool: str = ENSURE,
        arguments: dict[str, Any] | None = None,
    ) -> bool:
        """The key's sandbox running (manager.ensure: made, re-made, adopted or resumed);
        whether a container was made for it. `tool`: CREATE for a front that makes a new
        sandbox (E2B), CONNECT for one that makes an existing one run."""
        asked = dict(arguments or {})
        if network is not None:
            asked["network"] = {"mode": network.mode, "allow": list(network.allow)}
        if profile is not None:
            asked["profile"] = profile
        before = self.sandboxes.registry.get(key)

        async def act() -> bool:
            return await self.sandboxes.ensure(key, network, profile) is not before

        made = await self._change(actor, key, tool, asked, act)
        return made

    async def destroy(
        self,
        actor: Actor,
        key: str,
        *,
        delete_workspace: bool,
        arguments: dict[str, Any] | None = None,
        missing_ok: bool = False,
        audit_failure: bool = True,
    ) -> tuple[bool, bool]:
        """Remove the container (and the workspace when asked): (removed, deleted).
        `missing_ok`: a key without a sandbox is (False, False), recorded, not an error.
        `audit_failure`: False for a front's retry of a failure it audited already."""
        asked = {**(arguments or {}), "delete_workspace": delete_workspace}

        async def act() -> tuple[bool, bool]:
            try:
                return await self.sandboxes.destroy(key, delete_workspace=delete_workspace)
            except SandboxNotFound:
                if missing_ok:
                    return False, False
                raise

        return await self._change(actor, key, DESTROY, asked, act, audit_failure)

    async def pause(
        self, actor: Actor, key: str, arguments: dict[str, Any] | None = None
    ) -> tuple[SandboxInfo, bool]:
        """Freeze the key's sandbox: its info, and False when it was paused already."""
        reason = _reason("pause", actor)

        async def act() -> tuple[SandboxInfo, bool]:
            return await self.sandboxes.pause(key, reason, recorded=False)

        return await self._change(actor, key, PAUSE, dict(arguments or {}), act)

    async def resume(
        self, actor: Actor, key: str, arguments: dict[str, Any] | None = None
    ) -> tuple[SandboxInfo, bool]:
        """Thaw the key's sandbox: its info, and False when it was not paused."""
        reason = _reason("resume", actor)

        async def act() -> tuple[SandboxInfo, bool]:
            return await self.sandboxes.resume(key, reason, recorded=False)

        return await self._change(actor, key, RESUME, dict(arguments or {}), act)

    async def quarantine(self, actor: Actor, key: str, why: str) -> Quarantine:
        """Quarantine the key's sandbox by hand: its alarm ("guard", "operator") is on its
        record and sounded (the log, WatchAlarms, metrics, its own audit record as every
        alarm's); the change is this one record. A reason past MAX_REASON is refused."""
        detail = f"quarantined by an operator ({actor.caller}): {why or 'no reason given'}"
        alarm = Alarm(key, "guard", "operator", detail)

        async def act() -> Quarantine:
            if len(why) > MAX_REASON:
                raise InvalidRequest(f"reason is {len(why)} characters; at most {MAX_REASON}")
            return await self.sandboxes.quarantines.quarantine(key, alarm, recorded=False)

        asked = {"reason": why[:MAX_REASON]}
        record = await self._change(actor, key, QUARANTINE, asked, act)
        if self._sound is not None:
            self._sound(alarm)  # its reaction finds the quarantine done already
        return record

    async def release(self, actor: Actor, key: str) -> Quarantine:
        """End the key's quarantine."""

        async def act() -> Quarantine:
            return await self.sandboxes.quarantines.release(key, recorded=False)

        return await self._change(actor, key, RELEASE, {}, act)

    async def _change(
        self,
        actor: Actor,
        key: str,
        tool: str,
        arguments: dict[str, Any],
        act: Callable[[], Awaitable[T]],
        audit_failure: bool = True,
    ) -> T:
        started = time.monotonic()
        try:
            result = await act()
        except StockadeError as exc:
            if audit_failure:
                self.record(actor, key, tool, arguments, error=exc, started=started)
            raise
        self.record(actor, key, tool, arguments, started=started)
        return result

    def record(
        self,
        actor: Actor,
        key: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        error: StockadeError | str | None = None,
        started: float | None = None,
    ) -> None:
        """The one audit record of a change (or of a front's step that is no change of the
        manager's, such as E2B's set_timeout): `error` when it was refused or failed."""
        if self._audit is None:
            return
        message = str(error) if error is not None else ""
        code = ""
        if error is not None:
            code = error.reason if isinstance(error, StockadeError) else FAILED
        elapsed = int((time.monotonic() - started) * 1000) if started is not None else 0
        self._audit.record(
            AuditRecord(
                time=time.time(),
                request_id="",
                caller=actor.caller,
                sandbox_key=key,
                agent_id="",
                provider="",
                tool=tool,
                arguments_json=json.dumps(
                    {"key": shown(key), **arguments}, ensure_ascii=False, default=str
                ),
                policy_step=f"{actor.front}: {tool}" + (f": {message}" if message else ""),
                duration_ms=elapsed,
                error_code=code,
                is_error=error is not None,
                front=actor.front,
            )
        )


def _reason(verb: str, actor: Actor) -> str:
    """What the manager's log line says of a front's pause or resume."""
    return f"{verb} through {actor.front} by {actor.caller}"
