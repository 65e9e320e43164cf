"""Relaying a streamed tool call from the agent to the caller: bytes become text (UTF-8 split
across chunks is kept whole), every chunk is scrubbed across chunk boundaries, a read that
ends mid-line is held whole (one write of the process is one chunk: StreamScrubber's
whole_reads), an open line is released after QUIET_FLUSH_S of silence but for a tail that may
still begin a credential (policy/scrub/stream.py flush_open), and a slow caller slows the
command down instead of growing memory (a bounded queue, then gRPC flow control, then the
agent pauses its pipes)."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from stockade.supervisor.calls.tripwires import StreamWatch
from stockade.supervisor.models import OutputEvent, StartedEvent, ToolEvent
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.policy.scrub.stream import StreamScrubber
from stockade.supervisor.sandboxes.agent_link import AgentOutput, AgentReply, AgentStarted

QUIET_FLUSH_S = 0.015
"""Silence after which held output is released (a prompt, `printf abc`); the loop waits with
this timeout only while a stream holds something."""
STREAMS = {1: "stdout", 2: "stderr"}
AgentEvent = AgentStarted | AgentOutput | AgentReply


class _Stream:
    def __init__(self, name: str, scrubber: Scrubber | None) -> None:
        self.name = name
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.scrubber = StreamScrubber(scrubber, whole_reads=True)

    def feed(self, data: bytes) -> str:
        return self.scrubber.feed(self.decoder.decode(data))

    def flush(self, final: bool) -> str:
        if not final:
            return self.scrubber.flush_open()
        return self.scrubber.feed(self.decoder.decode(b"", final=True)) + self.scrubber.flush()


async def relay(
    source: AsyncIterator[AgentEvent],
    scrubber: Scrubber | None,
    events: asyncio.Queue[ToolEvent],
    watch: StreamWatch | None = None,
) -> tuple[AgentReply | None, int]:
    """Forward started/output events to `events`; return the agent's reply (None if the
    stream ended without one) and how many credentials were redacted from the chunks.
    `watch`: the honeytoken search of the raw output (calls/tripwires.py)."""
    streams = {fd: _Stream(name, scrubber) for fd, name in STREAMS.items()}
    reply: AgentReply | None = None
    step: asyncio.Future[AgentEvent] = asyncio.ensure_future(anext(source))
    fresh = False
    """Output came since the last quiet spell's release."""
    try:
        while True:
            # a quiet spell releases what it can once; what is still held then waits for
            # more output or the end (no timer spinning while a partial token is held)
            holding = fresh and any(s.scrubber.holding for s in streams.values())
            done, _ = await asyncio.wait({step}, timeout=QUIET_FLUSH_S if holding else None)
            if not done:
                await _flush(streams, events, final=False)
                fresh = False
                continue
            try:
                event = step.result()
            except StopAsyncIteration:
                break
            step = asyncio.ensure_future(anext(source))
            if isinstance(event, AgentReply):
                reply = event
            elif isinstance(event, AgentStarted):
                await events.put(StartedEvent(event.pid))
            else:
                stream = streams[event.fd]
                if watch is not None:
                    watch.feed(event.data, event.fd)
                await _put(events, stream.name, stream.feed(event.data))
                fresh = True
        await _flush(streams, events, final=True)
    finally:
        step.cancel()
        with contextlib.suppress(BaseException):
            await step
        await close_source(source)
    return reply, sum(s.scrubber.redactions for s in streams.values())


async def _flush(
    streams: dict[int, _Stream], events: asyncio.Queue[ToolEvent], final: bool
) -> None:
    for stream in streams.values():
        if final or stream.scrubber.holding:
            await _put(events, stream.name, stream.flush(final))


async def _put(events: asyncio.Queue[ToolEvent], name: str, text: str) -> None:
    if text:
        await events.put(OutputEvent(name, text))


async def close_source(source: AsyncIterator[Any]) -> None:
    """Close an async iterator that is a generator (ending what it holds), quietly."""
    close = getattr(source, "aclose", None)
    if close is not None:
        with contextlib.suppress(BaseException):
            await close()
