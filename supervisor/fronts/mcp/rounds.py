"""Approvals asked of a sessionless (2026-07-28) client: the protocol has no request from the
server to the client, so the question goes back as the call's result, an `input_required`
result holding a form elicitation, and the client answers by calling again with its response
and the result's `requestState`. Meanwhile the call itself waits in the background, in the
pipeline's approval step, on the same pending approval the ApprovalService lists: an
approver may decide it first (the client's answer is then ignored), and no decision within
approvals.timeout_s is a deny, as for any call."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types

from stockade.supervisor import errors
from stockade.supervisor.fronts.mcp.elicit import SCHEMA, decision_of, message_of
from stockade.supervisor.models import ToolResult
from stockade.supervisor.policy.approvals import Ask, Decision, Pending
from stockade.supervisor.policy.scrub.scrubber import Scrubber

INPUT = "approval"
"""The key of the elicitation in `inputRequests` (and of its answer in `inputResponses`)."""
Answer = tuple[Decision, str] | None


@dataclass
class Progress:
    """Where a call's progress notifications go: the request now waiting for the call (the
    first, then the one that answered), or nowhere while no request waits."""

    send: Callable[[int, str], Awaitable[None]] | None = None
    count: int = 0

    async def __call__(self, message: str) -> None:
        if self.send is None:
            return
        self.count += 1
        with contextlib.suppress(Exception):  # that request is gone: the call goes on
            await self.send(self.count, message)


@dataclass
class Parked:
    """A call waiting for its caller's answer between two requests."""

    tenant: str
    approver: str
    task: asyncio.Task[ToolResult]
    question: asyncio.Future[Pending]
    answer: asyncio.Future[Answer]
    progress: Progress
    expires: float = field(default=0.0)


class Rounds:
    """The calls parked between an `input_required` result and the client's answer, by an
    unguessable `requestState` token bound to the tenant that got it. A token is forgotten
    when it is answered, or `ttl` seconds after it was given."""

    def __init__(self, ttl: float, scrubber: Scrubber | None) -> None:
        self._ttl = ttl
        self._scrubber = scrubber
        self._parked: dict[str, Parked] = {}

    def start(
        self,
        tenant: str,
        approver: str,
        progress: Progress,
        run: Callable[[Ask], Coroutine[Any, Any, ToolResult]],
    ) -> Parked:
        """Run the call in the background with an `ask` hook that parks it."""
        loop = asyncio.get_running_loop()
        question: asyncio.Future[Pending] = loop.create_future()
        answer: asyncio.Future[Answer] = loop.create_future()

        async def ask(pending: Pending) -> Answer:
            if not question.done():
                question.set_result(pending)
            return await answer

        task: asyncio.Task[ToolResult] = loop.create_task(run(ask))
        task.add_done_callback(_retrieve)
        return Parked(tenant, approver, task, question, answer, progress)

    async def outcome(self, parked: Parked) -> ToolResult | types.InputRequiredResult:
        """The call's result, or, when it waits for its caller's answer (not asked yet), the
        question."""
        waits: set[asyncio.Future[Any]] = {parked.task}
        if not parked.question.done():
            waits.add(parked.question)
        try:
            await asyncio.wait(waits, return_when="FIRST_COMPLETED")
        except asyncio.CancelledError:  # the request went away: so does its call
            parked.task.cancel()
            raise
        if parked.task.done():
            return parked.task.result()
        parked.progress.send = None
        self._expire()
        token = secrets.token_urlsafe(32)
        parked.expires = time.monotonic() + self._ttl
        self._parked[token] = parked
        form = types.ElicitRequestFormParams(
            message=message_of(parked.question.result(), self._scrubber),
            requested_schema=SCHEMA,
        )
        return types.InputRequiredResult(
            input_requests={INPUT: types.ElicitRequest(params=form)}, request_state=token
        )

    def resume(
        self,
        token: str,
        tenant: str,
        responses: dict[str, Any] | None,
        send: Callable[[int, str], Awaitable[None]] | None,
    ) -> Parked:
        """The parked call this answer belongs to, given the answer (a response that is no
        decision leaves the approval to the approvers). InvalidRequest for a token this
        tenant was not given, or that expired."""
        self._expire()
        parked = self._parked.get(token)
        if parked is None or parked.tenant != tenant:
            raise errors.InvalidRequest(
                "requestState names no call waiting for an answer (it was answered already, "
                "or expired): call the tool again"
            )
        del self._parked[token]
        response = (responses or {}).get(INPUT)
        decision = decision_of(response) if isinstance(response, types.ElicitResult) else None
        if not parked.answer.done():
            parked.answer.set_result(None if decision is None else (decision, parked.approver))
        parked.progress.send = send
        return parked

    def _expire(self) -> None:
        now = time.monotonic()
        for token, parked in list(self._parked.items()):
            if parked.expires <= now:
                del self._parked[token]

    async def close(self) -> None:
        """End every parked call (the supervisor stops)."""
        parked, self._parked = list(self._parked.values()), {}
        for each in parked:
            each.task.cancel()
        await asyncio.gather(*(p.task for p in parked), return_exceptions=True)


def _retrieve(task: asyncio.Task[ToolResult]) -> None:
    """A parked call nobody collects: its failure is not an unhandled one."""
    if not task.cancelled():
        task.exception()
