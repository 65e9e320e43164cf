"""Human approval of commands.

Modes (per agent, else approvals.mode): `off` never asks; `on-miss` asks unless the command
matches the configured allowlist or was approved with allow-always; `always` asks unless the
command was approved with allow-always. A request waits for an approver's decision; no
decision within the timeout is a deny; with no approver connected the configured fallback
applies at once; a caller that goes away withdraws its request. Approvers watch a stream of
events and may come and go without losing pending requests.

With a shared state (supervisor/state: PostgreSQL), a request is also posted on a board
every supervisor of the installation reads: an approver connected to any of them sees it and
may decide it, and the decision comes back here to the call that waits. Approvers connected
to the others count as connected. The board is the ApprovalBoard interface below, which the
shared states of supervisor/state implement (this module never imports state: it is above)."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal, Protocol

from stockade.supervisor import database
from stockade.supervisor.config import AgentConfig, ApprovalsConfig
from stockade.supervisor.errors import ApprovalNotFound, ApproverBehind, InvalidRequest
from stockade.supervisor.keys import split
from stockade.supervisor.policy.guard.parsing import parse_script

log = logging.getLogger("stockade")

WATCH_BACKLOG = 10_000
"""Events kept for one approver that does not read its stream; past it the approver is
dropped (its stream ends with ApproverBehind) rather than held in memory without end. It may
reconnect: the pending requests are sent again."""

Decision = Literal["allow-once", "allow-always", "deny"]
DECISIONS: tuple[Decision, ...] = ("allow-once", "allow-always", "deny")


@dataclass(frozen=True)
class Outcome:
    allowed: bool
    how: str
    """"" (no approval needed), "allowlist", "allow-once", "allow-always", "deny", "timeout",
    "no-approver"."""
    approver: str = ""


@dataclass(frozen=True)
class Pending:
    id: str
    sandbox_key: str
    agent_id: str
    tool: str
    command: str
    reason: str
    created_at: datetime
    expires_at: datetime
    request_id: str
    diff: str = ""
    """What a file change will change (calls/previews.py), scrubbed and bounded; "" for a
    command."""


@dataclass(frozen=True)
class Closed:
    id: str
    outcome: str
    approver: str = ""


Event = Pending | Closed

Preview = Callable[[], Awaitable[str]]
"""Makes the diff a request carries; awaited only when an approver will be asked."""

Ask = Callable[[Pending], Awaitable[tuple[Decision, str] | None]]
"""Asks the caller itself about its own pending request (an MCP client's elicitation): a
decision and the approver's name, or None for no decision (the request stays pending for the
approvers). Run beside the approvers' wait: whichever decides first ends it, and the question
is withdrawn (cancelled) when an approver decided, the timeout passed or the caller left."""


class BoardListener(Protocol):
    """What the approval board tells its ApprovalManager, on the event loop's thread."""

    def remote_pending(self, request: Pending) -> None:
        """A request another supervisor is waiting on (new, or found on a resync)."""

    def remote_closed(self, request_id: str, outcome: str, approver: str) -> None:
        """Another supervisor's request is over (decided, timed out, withdrawn)."""

    def remote_decided(self, request_id: str, decision: str, approver: str) -> None:
        """A request of this supervisor was decided through another one."""

    def remote_approvers(self, counts: Mapping[str, int]) -> None:
        """Approvers connected to the other supervisors, per tenant (all of them)."""


class ApprovalBoard(Protocol):
    """Pending approvals shared between supervisors. Writes are queued (never block the
    event loop) and applied in order; what others do comes back through the listener."""

    def attach(self, listener: BoardListener) -> None:
        """Start delivering other supervisors' events (call on the event loop)."""

    def post(self, request: Pending) -> None:
        """This supervisor waits on `request`: others list it and may decide it."""

    def closed(self, request_id: str, outcome: str, approver: str) -> None:
        """This supervisor's request is over: others stop listing it."""

    async def decide(self, request_id: str, tenant: str, decision: str, approver: str) -> bool:
        """Decide another supervisor's request (the first decision wins); False when no
        such request of `tenant` is pending any more."""

    def set_approvers(self, tenant: str, count: int) -> None:
        """How many approvers of `tenant` watch through this supervisor now."""


@dataclass
class _Waiting:
    request: Pending
    decided: asyncio.Future[tuple[Decision, str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class AllowAlways:
    """Commands approved with allow-always, persisted in SQLite, per tenant (one tenant's
    approval never lets another's command through)."""

    def __init__(self, path: Path) -> None:
        self._db: sqlite3.Connection = database.connect(path)
        rows = self._db.execute("SELECT tenant, command FROM approved").fetchall()
        self._commands: set[tuple[str, str]] = {(row[0], row[1]) for row in rows}

    def __contains__(self, command: str) -> bool:
        return ("", command) in self._commands

    def has(self, tenant: str, command: str) -> bool:
        return (tenant, command) in self._commands

    def add(self, command: str, approver: str, tenant: str = "") -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO approved VALUES (?, ?, ?, ?)",
            (tenant, command, approver, time.time()),
        )
        self._commands.add((tenant, command))

    def commands(self, tenant: str = "") -> list[str]:
        return sorted(c for t, c in self._commands if t == tenant)

    def close(self) -> None:
        self._db.close()


class ApprovalManager:
    def __init__(
        self,
        config: ApprovalsConfig,
        agents: Mapping[str, AgentConfig],
        always: AllowAlways,
        backlog: int = WATCH_BACKLOG,
        board: ApprovalBoard | None = None,
    ) -> None:
        """board: the installation's shared approvals (None: this supervisor's own); it is
        attached here, so a manager with one is made on the event loop."""
        self._config = config
        self._backlog = backlog
        self._modes = {a: c.approvals for a, c in agents.items() if c.approvals}
        self._always = always
        self._waiting: dict[str, _Waiting] = {}
        self._watchers: dict[str, set[asyncio.Queue[Event | None]]] = {}
        """Per tenant: an approver sees, and answers for, its own tenant's requests only."""
        self._board = board
        self._remote: dict[str, Pending] = {}
        """Other supervisors' requests, from the board."""
        self._remote_approvers: dict[str, int] = {}
        """Approvers connected to other supervisors, per tenant, from the board."""
        if board is not None:
            board.attach(self)

    @property
    def allow_always(self) -> AllowAlways:
        """The commands approved with allow-always (policy replay reads them)."""
        return self._always

    def reason_to_ask(self, agent_id: str, command: str, tenant: str = "") -> str | None:
        """Why this command needs a decision, or None when it may run as is."""
        mode = self._modes.get(agent_id, self._config.mode)
        if mode == "off" or self._always.has(tenant, command):
            return None
        if mode == "always":
            return "approvals mode always: every command needs a decision"
        if self._allowlisted(command):
            return None
        return "approvals mode on-miss: the command is not in the allowlist"

    def asks_files(self, tool: str) -> bool:
        """approvals.files names `tool`: its calls are asked about (checked before anything of
        the call is looked at, so a write is not slowed while approvals.files is empty)."""
        return tool in self._config.files

    def reason_to_ask_file(self, tool: str, change: str, tenant: str = "") -> str | None:
        """Why a file change (`change`: the tool and its paths, as allow-always keeps it)
        needs a decision, or None: only the tools approvals.files names, whatever the mode."""
        if tool not in self._config.files or self._always.has(tenant, change):
            return None
        return f"approvals.files: every {tool} is asked about"

    def _allowlisted(self, command: str) -> bool:
        """A pattern matches the command, and it is one simple command: `*` must not let
        "git status; curl x | sh" pass as "git *" (nor a pipe, `&&`, a new line or a
        substitution); what does not parse is not allowlisted."""
        if not any(fnmatch.fnmatchcase(command, p) for p in self._config.allowlist):
            return False
        script = parse_script(command)
        return script.error is None and len(script.commands) == 1

    def reload(self, config: ApprovalsConfig, agents: Mapping[str, AgentConfig]) -> None:
        """A reload's [approvals] and agents' modes, for every decision from now on; a request
        waiting keeps the deadline it was given (both swapped with no await between)."""
        self._config = config
        self._modes = {a: c.approvals for a, c in agents.items() if c.approvals}

    async def check(
        self,
        *,
        sandbox_key: str,
        agent_id: str,
        tool: str,
        command: str,
        request_id: str,
        must_ask: str | None = None,
        on_pending: Callable[[Pending], None] | None = None,
        ask: Ask | None = None,
        preview: Preview | None = None,
    ) -> Outcome:
        """Decide whether the command may run, asking an approver when policy says so
        (or when `must_ask` gives a reason, e.g. the guard could not parse the command).
        With `ask`, the caller is asked too (and counts as a connected approver).
        `preview` makes the request's diff, once it is sure an approver will be asked."""
        tenant = split(sandbox_key)[0]
        reason = must_ask or self.reason_to_ask(agent_id, command, tenant)
        if reason is None:
            mode = self._modes.get(agent_id, self._config.mode)
            return Outcome(True, "" if mode == "off" else "allowlist")
        if not self.watchers_of(tenant) and ask is None:
            return Outcome(self._config.no_approver == "allow", "no-approver")
        diff = "" if preview is None else await preview()
        now = datetime.now(UTC)
        request = Pending(
            id=secrets.token_hex(6),
            sandbox_key=sandbox_key,
            agent_id=agent_id,
            tool=tool,
            command=command,
            reason=reason,
            created_at=now,
            expires_at=now + timedelta(seconds=self._config.timeout_s),
            request_id=request_id,
            diff=diff,
        )
        if on_pending is not None:
            on_pending(request)
        return await self._wait(_Waiting(request), ask)

    async def _wait(self, waiting: _Waiting, ask: Ask | None = None) -> Outcome:
        request = waiting.request
        self._waiting[request.id] = waiting
        self._publish(request)
        if self._board is not None:
            self._board.post(request)
        asking = None if ask is None else asyncio.create_task(self._ask(ask, request))
        try:
            decision, approver = await asyncio.wait_for(
                asyncio.shield(waiting.decided), self._config.timeout_s
            )
        except TimeoutError:
            self._close(request.id, "timeout")
            return Outcome(False, "timeout")
        except asyncio.CancelledError:
            self._close(request.id, "withdrawn")
            raise
        finally:
            if asking is not None:  # an approver decided first, or the wait ended: withdraw
                asking.cancel()
                await asyncio.gather(asking, return_exceptions=True)
        return Outcome(decision != "deny", decision, approver)

    async def _ask(self, ask: Ask, request: Pending) -> None:
        """The caller's answer resolves the request as an approver's would (unless an
        approver was first); a question that fails leaves it to the approvers."""
        try:
            answer = await ask(request)
        except Exception as exc:  # the caller could not be asked: the approvers still can
            log.warning("approval %s: asking the caller failed: %s", request.id, exc)
            return
        if answer is not None:
            decision, approver = answer
            with contextlib.suppress(ApprovalNotFound):  # decided or closed meanwhile
                self.resolve(request.id, decision, approver, _tenant(request))

    def resolve(self, request_id: str, decision: str, approver: str, tenant: str = "") -> None:
        """Decide a request of `tenant` (another tenant's is not found, as an unknown id)."""
        if decision not in DECISIONS:  # narrows str to Decision below
            raise InvalidRequest(f"decision must be one of {', '.join(DECISIONS)}")
        waiting = self._waiting.get(request_id)
        if waiting is None or _tenant(waiting.request) != tenant:
            raise ApprovalNotFound(f"no pending approval {request_id[:64]!r}")
        if decision == "allow-always":
            self._always.add(waiting.request.command, approver, tenant)
        waiting.decided.set_result((decision, approver))
        self._close(request_id, decision, approver)

    async def decide(self, request_id: str, decision: str, approver: str, tenant: str = "") -> None:
        """Decide a request of `tenant`, this supervisor's own (resolve) or, with a shared
        board, one another supervisor waits on (the first decision wins)."""
        if request_id in self._waiting or self._board is None:
            self.resolve(request_id, decision, approver, tenant)
            return
        if decision not in DECISIONS:
            raise InvalidRequest(f"decision must be one of {', '.join(DECISIONS)}")
        request = self._remote.get(request_id)
        if request is None or _tenant(request) != tenant:
            raise ApprovalNotFound(f"no pending approval {request_id[:64]!r}")
        if not await self._board.decide(request_id, tenant, decision, approver):
            raise ApprovalNotFound(f"no pending approval {request_id[:64]!r} (decided or closed)")
        if decision == "allow-always":
            self._always.add(request.command, approver, tenant)
        self.remote_closed(request_id, decision, approver)

    def _close(self, request_id: str, outcome: str, approver: str = "") -> None:
        waiting = self._waiting.pop(request_id, None)
        if waiting is not None:
            self._publish(Closed(request_id, outcome, approver), _tenant(waiting.request))
            if self._board is not None:
                self._board.closed(request_id, outcome, approver)

    # the board's news (BoardListener), on the event loop

    def remote_pending(self, request: Pending) -> None:
        if request.id not in self._remote and request.id not in self._waiting:
            self._remote[request.id] = request
            self._publish(request)

    def remote_closed(self, request_id: str, outcome: str, approver: str) -> None:
        request = self._remote.pop(request_id, None)
        if request is not None:
            self._publish(Closed(request_id, outcome, approver), _tenant(request))

    def remote_decided(self, request_id: str, decision: str, approver: str) -> None:
        waiting = self._waiting.get(request_id)
        if waiting is None or waiting.decided.done() or decision not in DECISIONS:
            return
        waiting.decided.set_result((decision, approver))
        self._close(request_id, decision, approver)

    def remote_approvers(self, counts: Mapping[str, int]) -> None:
        self._remote_approvers = dict(counts)

    def _publish(self, event: Event, tenant: str | None = None) -> None:
        if tenant is None and isinstance(event, Pending):
            tenant = _tenant(event)
        tenant = tenant or ""
        for watchers in (self._watchers.get(tenant, set()), self._watchers.get(EVERY, set())):
            self._deliver(event, watchers)

    def _deliver(self, event: Event, watchers: set[asyncio.Queue[Event | None]]) -> None:
        for queue in list(watchers):
            if not queue.full():
                queue.put_nowait(event)
                continue
            watchers.discard(queue)  # it no longer counts as connected
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(None)

    def pending(self, tenant: str = "") -> list[Pending]:
        """The tenant's pending requests (EVERY: every tenant's): this supervisor's, then
        other supervisors'."""
        mine = [w.request for w in self._waiting.values()]
        found = [*mine, *self._remote.values()]
        return [r for r in found if tenant == EVERY or _tenant(r) == tenant]

    def always_allowed(self, tenant: str = "") -> list[str]:
        return self._always.commands(tenant)

    @property
    def watchers(self) -> int:
        return self.watchers_of("")

    def watchers_of(self, tenant: str) -> int:
        """The tenant's approvers connected here and, with a shared board, to the others
        (those of EVERY count for every tenant)."""
        count = 0
        for name in {tenant, EVERY}:
            count += len(self._watchers.get(name, ())) + self._remote_approvers.get(name, 0)
        return count

    async def watch(self, tenant: str = "") -> AsyncIterator[Event]:
        """The tenant's pending requests, then every new request and close of that tenant,
        until the caller stops."""
        pending = self.pending(tenant)
        queue: asyncio.Queue[Event | None] = asyncio.Queue(len(pending) + self._backlog)
        for request in pending:
            queue.put_nowait(request)
        watchers = self._watchers.setdefault(tenant, set())
        watchers.add(queue)
        self._count_approvers(tenant)
        try:
            while (event := await queue.get()) is not None:
                yield event
            raise ApproverBehind(
                f"this approver left more than {self._backlog} events unread and was dropped; "
                "reconnect to get the pending requests again"
            )
        finally:
            watchers.discard(queue)
            if not watchers and self._watchers.get(tenant) is watchers:
                self._watchers.pop(tenant, None)
            self._count_approvers(tenant)

    def _count_approvers(self, tenant: str) -> None:
        if self._board is not None:
            self._board.set_approvers(tenant, len(self._watchers.get(tenant, ())))


EVERY = "*"
"""The tenant an operator's approver watches to see, and count as an approver of, every
tenant's requests, tenants that appear after it connected included (not a tenant name:
validate_tenant refuses it)."""


def _tenant(request: Pending) -> str:
    return split(request.sandbox_key)[0]
