"""Human approval of commands.

Modes (per agent, else approvals.mode): `off` never asks; `on-miss` asks unless the command
matches the configured allowlist or was approved with allow-always; `always` asks unless the
command was approved with allow-always. A request waits for an approver's decision; no
decision within the timeout is a deny; with no approver connected the configured fallback
applies at once; a caller that goes away withdraws its request. Approvers watch a stream of
events and may come and go without losing pending requests."""

from __future__ import annotations

import asyncio
import fnmatch
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from stockade.supervisor import store
from stockade.supervisor.config import AgentConfig, ApprovalsConfig
from stockade.supervisor.errors import ApprovalNotFound, InvalidRequest

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


@dataclass(frozen=True)
class Closed:
    id: str
    outcome: str
    approver: str = ""


Event = Pending | Closed


@dataclass
class _Waiting:
    request: Pending
    decided: asyncio.Future[tuple[Decision, str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class AllowAlways:
    """Commands approved with allow-always, persisted in SQLite."""

    def __init__(self, path: Path) -> None:
        self._db: sqlite3.Connection = store.connect(path)
        rows = self._db.execute("SELECT command FROM approved_commands").fetchall()
        self._commands = {row[0] for row in rows}

    def __contains__(self, command: str) -> bool:
        return command in self._commands

    def add(self, command: str, approver: str) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO approved_commands VALUES (?, ?, ?)",
            (command, approver, time.time()),
        )
        self._commands.add(command)

    def commands(self) -> list[str]:
        return sorted(self._commands)

    def close(self) -> None:
        self._db.close()


class ApprovalManager:
    def __init__(
        self, config: ApprovalsConfig, agents: Mapping[str, AgentConfig], always: AllowAlways
    ) -> None:
        self._config = config
        self._modes = {a: c.approvals for a, c in agents.items() if c.approvals}
        self._always = always
        self._waiting: dict[str, _Waiting] = {}
        self._watchers: set[asyncio.Queue[Event]] = set()

    def reason_to_ask(self, agent_id: str, command: str) -> str | None:
        """Why this command needs a decision, or None when it may run as is."""
        mode = self._modes.get(agent_id, self._config.mode)
        if mode == "off" or command in self._always:
            return None
        if mode == "always":
            return "approvals mode always: every command needs a decision"
        if any(fnmatch.fnmatchcase(command, p) for p in self._config.allowlist):
            return None
        return "approvals mode on-miss: the command is not in the allowlist"

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
    ) -> Outcome:
        """Decide whether the command may run, asking an approver when policy says so
        (or when `must_ask` gives a reason, e.g. the guard could not parse the command)."""
        reason = must_ask or self.reason_to_ask(agent_id, command)
        if reason is None:
            mode = self._modes.get(agent_id, self._config.mode)
            return Outcome(True, "" if mode == "off" else "allowlist")
        if not self._watchers:
            return Outcome(self._config.no_approver == "allow", "no-approver")
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
        )
        if on_pending is not None:
            on_pending(request)
        return await self._wait(_Waiting(request))

    async def _wait(self, waiting: _Waiting) -> Outcome:
        request = waiting.request
        self._waiting[request.id] = waiting
        self._publish(request)
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
        return Outcome(decision != "deny", decision, approver)

    def resolve(self, request_id: str, decision: str, approver: str) -> None:
        if decision not in DECISIONS:  # narrows str to Decision below
            raise InvalidRequest(f"decision must be one of {', '.join(DECISIONS)}")
        waiting = self._waiting.get(request_id)
        if waiting is None:
            raise ApprovalNotFound(f"no pending approval {request_id!r}")
        if decision == "allow-always":
            self._always.add(waiting.request.command, approver)
        waiting.decided.set_result((decision, approver))
        self._close(request_id, decision, approver)

    def _close(self, request_id: str, outcome: str, approver: str = "") -> None:
        if self._waiting.pop(request_id, None) is not None:
            self._publish(Closed(request_id, outcome, approver))

    def _publish(self, event: Event) -> None:
        for queue in self._watchers:
            queue.put_nowait(event)

    def pending(self) -> list[Pending]:
        return [w.request for w in self._waiting.values()]

    def always_allowed(self) -> list[str]:
        return self._always.commands()

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    async def watch(self) -> AsyncIterator[Event]:
        """Pending requests, then every new request and close, until the caller stops."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        for waiting in self._waiting.values():
            queue.put_nowait(waiting.request)
        self._watchers.add(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._watchers.discard(queue)
