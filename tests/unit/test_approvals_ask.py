"""The approvals' `ask` hook (a caller asked about its own request, beside the approvers)
and the MCP front's elicitation built on it, without an engine."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mcp_types as types
import pytest

from stockade.supervisor.config import ApprovalsConfig
from stockade.supervisor.errors import InvalidRequest
from stockade.supervisor.fronts.mcp.elicit import (
    SCHEMA,
    asker,
    decision_of,
    message_of,
    supports_forms,
)
from stockade.supervisor.fronts.mcp.rounds import Progress, Rounds
from stockade.supervisor.models import ToolResult
from stockade.supervisor.policy.approvals import (
    AllowAlways,
    ApprovalManager,
    Ask,
    Closed,
    Decision,
    Outcome,
    Pending,
)
from stockade.supervisor.policy.scrub.scrubber import Scrubber

FAKE_AWS_KEY = "AKIA" + "Q3EXAMPLE7ZXCVB2"


def manager(tmp_path: Path, **cfg: Any) -> ApprovalManager:
    config = ApprovalsConfig(mode="always", **cfg)
    return ApprovalManager(config, {}, AllowAlways(tmp_path / "db"))


async def check(mgr: ApprovalManager, ask: Any, command: str = "make deploy") -> Outcome:
    return await mgr.check(
        sandbox_key="k", agent_id="", tool="exec", command=command, request_id="r", ask=ask
    )


async def until_pending(mgr: ApprovalManager) -> Pending:
    while not mgr.pending():
        await asyncio.sleep(0.001)
    return mgr.pending()[0]


@pytest.mark.parametrize("decision", ["allow-once", "allow-always", "deny"])
async def test_the_caller_decides_without_an_approver(tmp_path: Path, decision: Decision) -> None:
    """With `ask`, no approver connected is no longer an immediate no-approver outcome."""
    mgr = manager(tmp_path)
    asked: list[Pending] = []

    async def ask(p: Pending) -> tuple[Decision, str]:
        asked.append(p)
        assert mgr.pending() == [p]  # the same request the ApprovalService lists
        return decision, "mcp client"

    outcome = await check(mgr, ask)
    assert outcome == Outcome(decision != "deny", decision, "mcp client")
    assert [p.command for p in asked] == ["make deploy"]
    assert mgr.pending() == []
    assert (mgr.always_allowed() == ["make deploy"]) == (decision == "allow-always")


async def test_an_approver_first_withdraws_the_question(tmp_path: Path) -> None:
    mgr = manager(tmp_path)
    withdrawn = asyncio.Event()

    async def ask(p: Pending) -> tuple[Decision, str]:
        try:
            await asyncio.Event().wait()  # the user never answers
        except asyncio.CancelledError:
            withdrawn.set()
            raise
        raise AssertionError("unreachable")

    call = asyncio.create_task(check(mgr, ask))
    pending = await until_pending(mgr)
    mgr.resolve(pending.id, "allow-once", "alice")
    assert await call == Outcome(True, "allow-once", "alice")
    assert withdrawn.is_set()


async def test_no_decision_or_a_failed_question_leaves_it_to_the_approvers(
    tmp_path: Path,
) -> None:
    mgr = manager(tmp_path, timeout_s=0.2)

    async def dismissed(p: Pending) -> None:
        return None

    assert await check(mgr, dismissed) == Outcome(False, "timeout")

    async def broken(p: Pending) -> None:
        raise ConnectionError("the client went away")

    call = asyncio.create_task(check(mgr, broken))
    pending = await until_pending(mgr)
    await asyncio.sleep(0.01)
    assert mgr.pending() == [pending]  # still waiting for an approver
    mgr.resolve(pending.id, "deny", "bob")
    assert await call == Outcome(False, "deny", "bob")


async def test_the_caller_leaving_withdraws_both(tmp_path: Path) -> None:
    mgr = manager(tmp_path)
    events: list[object] = []

    async def watch() -> None:
        async for event in mgr.watch():
            events.append(event)

    watcher = asyncio.create_task(watch())
    cancelled = asyncio.Event()

    async def ask(p: Pending) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    while not mgr.watchers:
        await asyncio.sleep(0.001)
    call = asyncio.create_task(check(mgr, ask))
    await until_pending(mgr)
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)
    assert cancelled.is_set()
    assert mgr.pending() == []
    await asyncio.sleep(0.01)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    assert isinstance(events[-1], Closed)
    assert events[-1].outcome == "withdrawn"


def test_forms_supported() -> None:
    caps = types.ClientCapabilities
    assert not supports_forms(None)
    assert not supports_forms(caps())
    assert supports_forms(caps(elicitation=types.ElicitationCapability()))  # empty: form
    assert supports_forms(
        caps(elicitation=types.ElicitationCapability(form=types.FormElicitationCapability()))
    )
    url_only = types.ElicitationCapability(url=types.UrlElicitationCapability())
    assert not supports_forms(caps(elicitation=url_only))


def choose(decision: str) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"decision": decision})


def test_the_question_and_its_answers() -> None:
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    pending = Pending(
        "abc", "acme\x00work", "", "exec", f"deploy --key {FAKE_AWS_KEY}", "why not", now, now, "r"
    )
    text = message_of(pending, Scrubber())
    assert FAKE_AWS_KEY not in text
    assert "deploy --key " in text
    assert "'work'" in text  # the key as the caller wrote it, not the tenant's scoped one
    assert "why not" in text
    assert "abc" in text
    assert SCHEMA["properties"]["decision"]["enum"] == ["once", "always", "deny"]

    def result(action: str, content: dict[str, Any] | None = None) -> types.ElicitResult:
        return types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    assert decision_of(result("accept", {"decision": "once"})) == "allow-once"
    assert decision_of(result("accept", {"decision": "always"})) == "allow-always"
    assert decision_of(result("accept", {"decision": "deny"})) == "deny"
    assert decision_of(result("decline")) == "deny"
    assert decision_of(result("cancel")) is None
    assert decision_of(result("accept", {"decision": "maybe"})) is None
    assert decision_of(result("accept")) is None


def test_who_can_be_asked() -> None:
    form = types.ClientCapabilities(elicitation=types.ElicitationCapability())

    def session(can_send: bool, caps: types.ClientCapabilities | None) -> Any:
        return SimpleNamespace(can_send_request=can_send, client_capabilities=caps)

    assert asker(session(True, form), 7, None, "mcp") is not None
    assert asker(session(False, form), 7, None, "mcp") is None  # sessionless: no way back
    assert asker(session(True, types.ClientCapabilities()), 7, None, "mcp") is None
    assert asker(session(True, form), None, None, "mcp") is None


def _pending() -> Pending:
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    return Pending("abc", "acme\x00k", "", "exec", "make deploy", "why", now, now, "r")


def _done(text: str) -> ToolResult:
    return ToolResult(for_llm=text, for_user=text)


async def test_a_sessionless_question_parks_the_call_until_its_answer() -> None:
    rounds = Rounds(ttl=60, scrubber=None)
    answers: list[object] = []

    async def run(ask: Ask) -> ToolResult:
        answers.append(await ask(_pending()))
        return _done("ran")

    parked = rounds.start("acme", "mcp client", Progress(), run)
    asked = await rounds.outcome(parked)
    assert isinstance(asked, types.InputRequiredResult)
    assert asked.request_state
    [(name, request)] = (asked.input_requests or {}).items()
    assert isinstance(request, types.ElicitRequest)
    assert isinstance(request.params, types.ElicitRequestFormParams)
    assert "make deploy" in request.params.message
    with pytest.raises(InvalidRequest, match="requestState names no call"):
        rounds.resume(asked.request_state, "other", {name: choose("once")}, None)  # not theirs
    with pytest.raises(InvalidRequest, match="requestState names no call"):
        rounds.resume("forged", "acme", {name: choose("once")}, None)
    again = rounds.resume(asked.request_state, "acme", {name: choose("always")}, None)
    assert again is parked
    assert await rounds.outcome(again) == _done("ran")
    assert answers == [("allow-always", "mcp client")]
    with pytest.raises(InvalidRequest):  # answered: the token is spent
        rounds.resume(asked.request_state, "acme", {name: choose("once")}, None)


async def test_a_call_that_asks_nothing_returns_at_once_and_tokens_expire() -> None:
    rounds = Rounds(ttl=0, scrubber=None)

    async def quiet(ask: Ask) -> ToolResult:
        return _done("no question")

    assert await rounds.outcome(rounds.start("acme", "a", Progress(), quiet)) == _done(
        "no question"
    )

    async def asks(ask: Ask) -> ToolResult:
        await ask(_pending())
        return _done("late")

    asked = await rounds.outcome(rounds.start("acme", "a", Progress(), asks))
    assert isinstance(asked, types.InputRequiredResult)
    assert asked.request_state is not None
    with pytest.raises(InvalidRequest):  # ttl 0: expired already
        rounds.resume(asked.request_state, "acme", None, None)
    await rounds.close()


async def test_a_dismissal_is_no_decision_and_a_stop_ends_parked_calls() -> None:
    rounds = Rounds(ttl=60, scrubber=None)
    answers: list[object] = []
    ended = asyncio.Event()

    async def run(ask: Ask) -> ToolResult:
        answers.append(await ask(_pending()))
        try:
            await asyncio.Event().wait()  # the approvers still decide
        finally:
            ended.set()
        raise AssertionError("unreachable")

    parked = rounds.start("acme", "a", Progress(), run)
    asked = await rounds.outcome(parked)
    assert isinstance(asked, types.InputRequiredResult)
    assert asked.request_state is not None
    dismissed = {"approval": types.ElicitResult(action="cancel")}
    rounds.resume(asked.request_state, "acme", dismissed, None)
    await asyncio.sleep(0)
    assert answers == [None]
    parked.task.cancel()  # (its retry's request owns it now; here it is done with)
    stopped = asyncio.Event()

    async def waits(ask: Ask) -> ToolResult:
        try:
            await ask(_pending())
        finally:
            stopped.set()
        raise AssertionError("unreachable")

    other = await rounds.outcome(rounds.start("acme", "a", Progress(), waits))
    assert isinstance(other, types.InputRequiredResult)
    await rounds.close()  # the supervisor stops: a call still waiting for its answer ends
    assert stopped.is_set()


async def test_progress_goes_to_the_request_that_waits() -> None:
    sent: list[tuple[int, str]] = []

    async def send(count: int, message: str) -> None:
        sent.append((count, message))

    async def broken(count: int, message: str) -> None:
        raise ConnectionError("gone")

    progress = Progress(send)
    await progress("a")
    progress.send = None
    await progress("dropped")
    progress.send = broken
    await progress("lost")  # a gone request does not end the call
    progress.send = send
    await progress("b")
    assert sent == [(1, "a"), (3, "b")]
