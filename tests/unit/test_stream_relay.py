"""The relay of a streamed call (calls/streaming.py): output without a line end reaches the
caller while the command is still quiet (a prompt, `printf abc`), on every front since they
all relay through it; a credential written in two pieces with a pause between is still
redacted; a held partial token does not keep a timer spinning."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from stockade.supervisor.calls import streaming
from stockade.supervisor.calls.streaming import AgentEvent, relay
from stockade.supervisor.models import OutputEvent, ToolEvent
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.sandboxes.agent_link import AgentOutput, AgentReply

TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
WAIT_S = 10.0
"""Far longer than the quiet interval: only a relay that never releases runs into it."""


class Agent:
    """A command's output, written piece by piece: each piece is sent when the test says."""

    def __init__(self) -> None:
        self.pieces: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def source(self) -> AsyncIterator[AgentEvent]:
        while (piece := await self.pieces.get()) is not None:
            yield AgentOutput(1, piece)
        yield AgentReply("", "", {"exit_code": 0})


async def next_text(events: asyncio.Queue[ToolEvent]) -> str:
    event = await asyncio.wait_for(events.get(), WAIT_S)
    assert isinstance(event, OutputEvent)
    return event.text


async def test_a_prompt_and_a_partial_line_arrive_while_the_command_waits() -> None:
    agent, events = Agent(), asyncio.Queue[ToolEvent]()
    task = asyncio.create_task(relay(agent.source(), Scrubber(), events))
    agent.pieces.put_nowait(b"name? ")
    assert await next_text(events) == "name? "  # before the command writes anything more
    agent.pieces.put_nowait(b"abc")
    assert await next_text(events) == "abc"
    agent.pieces.put_nowait(None)
    reply, redactions = await task
    assert reply is not None
    assert redactions == 0


async def test_a_token_written_in_two_pieces_with_a_pause_between_is_redacted() -> None:
    agent, events = Agent(), asyncio.Queue[ToolEvent]()
    task = asyncio.create_task(relay(agent.source(), Scrubber(), events))
    agent.pieces.put_nowait(b"token " + TOKEN[:9].encode())
    assert await next_text(events) == "token "  # the rest waits: it may begin a token
    await asyncio.sleep(0.2)  # a pause far longer than the quiet interval
    assert events.empty()
    agent.pieces.put_nowait(TOKEN[9:].encode() + b" done\n")
    assert await next_text(events) == "[REDACTED] done\n"
    agent.pieces.put_nowait(None)
    _reply, redactions = await task
    assert redactions == 1


async def test_without_a_scrubber_everything_arrives_at_a_pause() -> None:
    agent, events = Agent(), asyncio.Queue[ToolEvent]()
    task = asyncio.create_task(relay(agent.source(), None, events))
    agent.pieces.put_nowait(b"token " + TOKEN[:9].encode())
    assert await next_text(events) == "token " + TOKEN[:9]
    agent.pieces.put_nowait(None)
    await task


class Counting(Scrubber):
    """A scrubber that counts how often a quiet spell asked it what to keep back."""

    __slots__ = ("asked",)

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def open_tail(self, text: str) -> int:
        self.asked += 1
        return super().open_tail(text)


async def test_a_held_tail_waits_for_more_output_without_a_timer() -> None:
    """After a quiet spell's release, what is still held waits for output or the end: the
    relay does not wake every interval meanwhile."""
    scrubber = Counting()
    agent, events = Agent(), asyncio.Queue[ToolEvent]()
    task = asyncio.create_task(relay(agent.source(), scrubber, events))
    agent.pieces.put_nowait(b"token " + TOKEN[:9].encode())
    assert await next_text(events) == "token "
    await asyncio.sleep(0.3)  # twenty quiet intervals
    assert scrubber.asked == 1
    agent.pieces.put_nowait(None)
    await task


async def test_one_write_with_lines_and_an_open_tail_is_one_chunk() -> None:
    """E2B's send_stdin test: `cat` echoes `Hello,\\nWorld!` in one write; it arrives as
    one chunk, and a token after lines in one write is still kept back at the pause."""
    agent, events = Agent(), asyncio.Queue[ToolEvent]()
    task = asyncio.create_task(relay(agent.source(), Scrubber(), events))
    agent.pieces.put_nowait(b"Hello,\nWorld!")
    assert await next_text(events) == "Hello,\nWorld!"
    agent.pieces.put_nowait(b"ok\ntoken " + TOKEN[:9].encode())
    assert await next_text(events) == "ok\ntoken "
    agent.pieces.put_nowait(TOKEN[9:].encode() + b" done\n")
    assert await next_text(events) == "[REDACTED] done\n"
    agent.pieces.put_nowait(None)
    _reply, redactions = await task
    assert redactions == 1


async def test_reads_release_lines_without_waiting_for_a_quiet_spell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a quiet interval no test outlives, lines still arrive: a read that ends a line
    is released at once, and a read that ends mid-line releases the lines held before it."""
    monkeypatch.setattr(streaming, "QUIET_FLUSH_S", 3600.0)
    agent, events = Agent(), asyncio.Queue[ToolEvent]()
    task = asyncio.create_task(relay(agent.source(), Scrubber(), events))
    agent.pieces.put_nowait(b"one\ntwo\n")
    assert await next_text(events) == "one\ntwo\n"
    agent.pieces.put_nowait(b"three\nfo")
    agent.pieces.put_nowait(b"ur\nfi")
    assert await next_text(events) == "three\n"
    agent.pieces.put_nowait(b"ve\n")
    assert await next_text(events) == "four\nfive\n"
    agent.pieces.put_nowait(None)
    await task
