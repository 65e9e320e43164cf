"""InvokeStream over the agent's framed socket (stockade/agent/frames.py, the supervisor's
sandboxes/agent_frames.py FramedStream and AgentConnection.invoke_stream): the same events and
failures as over gRPC, the connection kept only after a stream read to its result, and every
way either end can misbehave refused: an oversized, truncated or malformed event, events out
of order or after the result, a timeout mid-stream, a caller that stops following (or stops
reading), close() mid-stream; and agents of protocol 2 (an older image adopted after a
restart), whose streams stay on gRPC and which never run a framed stream request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from stockade.agent.frames import FRAMES_SUFFIX, STREAM_FLAG, serve_frames
from stockade.agent.v1 import agent_pb2, agent_pb2_grpc
from stockade.supervisor.errors import AgentMisbehaved, SandboxBroken, SandboxLost
from stockade.supervisor.sandboxes.agent_frames import FrameDeadline, FrameTooLarge
from stockade.supervisor.sandboxes.agent_link import (
    PROTOCOL_VERSION,
    AgentCallFailed,
    AgentConnection,
    AgentOutput,
    AgentReply,
    AgentStarted,
)
from stockade.supervisor.sandboxes.replies import MAX_CHUNK_BYTES
from tests.unit.test_agent_frames import LIMIT, GrpcAgent, _frames, _raw, _request, _until


class StreamAgent:
    """The agent's side with a stand-in InvokeStream: Started, two outputs, the result; with
    `hang`, it waits for ever after the first output. Counts streams and cancellations."""

    def __init__(self) -> None:
        self.streams: list[Any] = []
        self.unary: list[Any] = []
        self.cancelled = 0
        self.hang = False
        self.started = asyncio.Event()

    async def invoke(self, request: Any) -> Any:
        self.unary.append(request)
        return agent_pb2.InvokeResponse(result_json='{"unary": true}')

    async def invoke_stream(self, request: Any) -> AsyncGenerator[Any, None]:
        self.streams.append(request)
        yield agent_pb2.InvokeEvent(started=agent_pb2.Started(pid=42))
        yield agent_pb2.InvokeEvent(output=agent_pb2.Output(fd=1, data=b"out"))
        self.started.set()
        if self.hang:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        yield agent_pb2.InvokeEvent(output=agent_pb2.Output(fd=2, data=b"err"))
        yield agent_pb2.InvokeEvent(
            result=agent_pb2.InvokeResponse(result_json=f'{{"tool": "{request.tool}"}}')
        )


@contextlib.asynccontextmanager
async def framed_agent(
    tmp_path: Path, streams: bool = True
) -> AsyncIterator[tuple[StreamAgent, Path]]:
    """The framed socket of an agent of protocol 3 (`streams`), or of protocol 2 (which
    serves only unary calls)."""
    stand_in = StreamAgent()
    sock = tmp_path / "agent.sock"
    server = await serve_frames(
        sock.with_name(sock.name + FRAMES_SUFFIX),
        stand_in.invoke,
        LIMIT,
        stand_in.invoke_stream if streams else None,
    )
    assert server is not None
    try:
        yield stand_in, sock
    finally:
        server.close()


class HelloAgent(GrpcAgent):
    """The gRPC side: Hello says `version`; InvokeStream (counted) answers a result."""

    def __init__(self, version: int) -> None:
        super().__init__()
        self.version = version
        self.streams = 0

    async def Hello(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return agent_pb2.HelloResponse(protocol_version=self.version)

    async def InvokeStream(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        self.streams += 1
        yield agent_pb2.InvokeEvent(result=agent_pb2.InvokeResponse(result_json='{"via": "grpc"}'))


SERVICES: dict[AgentConnection, HelloAgent] = {}


@contextlib.asynccontextmanager
async def linked(sock: Path, version: int = PROTOCOL_VERSION) -> AsyncIterator[AgentConnection]:
    """An AgentConnection greeted by a gRPC agent of `version` (in SERVICES)."""
    server = grpc.aio.server()
    service = HelloAgent(version)
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    link = AgentConnection(sock)
    try:
        await link.wait_ready(5)
        SERVICES[link] = service
        yield link
    finally:
        SERVICES.pop(link, None)
        await link.close()
        await server.stop(grace=None)


async def _all(link: AgentConnection, timeout: float = 5) -> list[Any]:
    return [e async for e in link.invoke_stream("exec", {"command": "x"}, timeout, "rid")]


# -- the happy path, reuse, old agents ------------------------------------------------------


async def test_a_stream_goes_framed_and_its_connection_serves_the_next_call(
    tmp_path: Path,
) -> None:
    async with framed_agent(tmp_path) as (stand_in, sock), linked(sock) as link:
        for _ in range(2):
            events = await _all(link)
            assert events == [
                AgentStarted(42),
                AgentOutput(1, b"out"),
                AgentOutput(2, b"err"),
                AgentReply("", "", {"tool": "exec"}),
            ]
        assert (await link.invoke("exec", {}, 5, "rid")).result == {"unary": True}
        assert link._frames is not None
        assert len(link._frames._idle) == 1, "one connection, kept"
        assert SERVICES[link].streams == 0
    assert [s.request_id for s in stand_in.streams] == ["rid", "rid"]
    assert len(stand_in.unary) == 1


async def test_an_agent_of_protocol_2_streams_over_grpc(tmp_path: Path) -> None:
    """An older image's agent adopted after a restart: it has the framed socket (unary
    calls), but its Hello says 2, so streams never reach it framed."""
    async with framed_agent(tmp_path, streams=False) as (stand_in, sock), linked(sock, 2) as link:
        events = await _all(link)
        assert events == [AgentReply("", "", {"via": "grpc"})]
        assert (await link.invoke("exec", {}, 5, "rid")).result == {"unary": True}
        assert SERVICES[link].streams == 1
    assert not stand_in.streams


@pytest.mark.parametrize("version", [1, PROTOCOL_VERSION + 1])
async def test_other_protocols_are_refused(tmp_path: Path, version: int) -> None:
    with pytest.raises(SandboxBroken, match="protocol"):
        async with linked(tmp_path / "agent.sock", version=version):
            pass


async def test_an_agent_of_protocol_2_runs_no_framed_stream_request(tmp_path: Path) -> None:
    """Were a stream request sent to an older agent anyway, its flag reads as a length over
    any limit: the connection is closed and nothing runs (so nothing could run twice)."""
    async with framed_agent(tmp_path, streams=False) as (stand_in, sock):
        reader, writer = await _raw(sock)
        request = _request()
        writer.write((len(request) | STREAM_FLAG).to_bytes(4, "big") + request)
        assert await reader.read() == b""
        writer.close()
    assert not stand_in.unary
    assert not stand_in.streams


async def test_an_agent_without_the_socket_streams_over_grpc(tmp_path: Path) -> None:
    async with linked(tmp_path / "agent.sock") as link:
        assert await _all(link) == [AgentReply("", "", {"via": "grpc"})]
        assert link._frames is None


# -- cancellation and deadlines -------------------------------------------------------------


async def test_a_caller_that_stops_following_cancels_the_stream_in_the_agent(
    tmp_path: Path,
) -> None:
    async with framed_agent(tmp_path) as (stand_in, sock), linked(sock) as link:
        stand_in.hang = True
        events: Any = link.invoke_stream("exec", {}, 30, "rid")  # an async generator
        assert await anext(events) == AgentStarted(42)
        await events.aclose()
        await _until(lambda: stand_in.cancelled == 1)
        assert link._frames is not None
        assert not link._frames._idle, "closed, not kept"
        stand_in.hang = False
        assert len(await _all(link)) == 4, "a new connection serves the next"


async def test_a_timeout_mid_stream_is_a_deadline_and_cancels_it(tmp_path: Path) -> None:
    async with framed_agent(tmp_path) as (stand_in, sock), linked(sock) as link:
        stand_in.hang = True
        with pytest.raises(AgentCallFailed) as failed:
            await _all(link, timeout=0.3)
        assert failed.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        await _until(lambda: stand_in.cancelled == 1)


async def test_a_caller_that_stops_reading_is_bound_by_the_deadline(tmp_path: Path) -> None:
    """Neither reading nor closing (a client that stopped following, its stream not yet
    collected): at the deadline the connection is closed, the call cancelled in the agent."""
    async with framed_agent(tmp_path) as (stand_in, sock):
        frames = _frames(sock)
        stand_in.hang = True
        stream = await frames.stream(_request(), 0.3)
        await _until(lambda: stand_in.cancelled == 1)
        with pytest.raises(FrameDeadline):
            await stream.next()
        stream.close()
        frames.close()


async def test_close_mid_stream_is_a_lost_sandbox(tmp_path: Path) -> None:
    async with framed_agent(tmp_path) as (stand_in, sock), linked(sock) as link:
        stand_in.hang = True
        task = asyncio.create_task(_all(link, timeout=30))
        await stand_in.started.wait()
        await link.close()
        with pytest.raises(SandboxLost):
            await task
        await _until(lambda: stand_in.cancelled == 1)


async def test_bytes_during_a_stream_cancel_it(tmp_path: Path) -> None:
    async with framed_agent(tmp_path) as (stand_in, sock):
        stand_in.hang = True
        reader, writer = await _raw(sock)
        request = _request()
        writer.write((len(request) | STREAM_FLAG).to_bytes(4, "big") + request)
        await stand_in.started.wait()
        writer.write(b"x")
        await reader.read()  # the events sent before, then the end
        assert reader.at_eof()
        await _until(lambda: stand_in.cancelled == 1)
        writer.close()


# -- the supervisor's end against a hostile framed stream -----------------------------------


def _frame(event: Any) -> bytes:
    body = bytes(event.SerializeToString())
    return len(body).to_bytes(4, "big") + body


STARTED = _frame(agent_pb2.InvokeEvent(started=agent_pb2.Started(pid=7)))
OUTPUT = _frame(agent_pb2.InvokeEvent(output=agent_pb2.Output(fd=1, data=b"x")))
RESULT = _frame(agent_pb2.InvokeEvent(result=agent_pb2.InvokeResponse(result_json="{}")))
BIG = b"x" * (MAX_CHUNK_BYTES + 1)


@contextlib.asynccontextmanager
async def hostile(tmp_path: Path, answer: bytes, close: bool = False) -> AsyncIterator[Path]:
    """A framed socket that reads one stream request, sends `answer`'s bytes, then waits for
    the supervisor to close (or closes itself: `close`)."""
    sock = tmp_path / "agent.sock"
    handlers: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            size = int.from_bytes(await reader.readexactly(4), "big")
            assert size & STREAM_FLAG
            await reader.readexactly(size & ~STREAM_FLAG)
            with contextlib.suppress(ConnectionError):
                writer.write(answer)
                await writer.drain()
                if not close:
                    await reader.read()
        finally:
            writer.close()

    server = await asyncio.start_unix_server(serve, str(sock.with_name(sock.name + FRAMES_SUFFIX)))
    try:
        yield sock
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


@pytest.mark.parametrize(
    ("answer", "close", "code"),
    [
        # an event whose length is over any limit, refused before it is read
        (STARTED + (0x7FFFFFFF).to_bytes(4, "big") + b"x" * 1000, False, "RESOURCE_EXHAUSTED"),
        (STARTED + (100).to_bytes(4, "big") + b"x" * 10, True, "UNAVAILABLE"),  # truncated
        (STARTED + OUTPUT, True, "UNAVAILABLE"),  # ended without a result
        (STARTED + OUTPUT, False, "DEADLINE_EXCEEDED"),  # silent mid-stream
    ],
)
async def test_stream_failures_are_those_of_a_grpc_call(
    tmp_path: Path, answer: bytes, close: bool, code: str
) -> None:
    async with hostile(tmp_path, answer, close) as sock, linked(sock) as link:
        with pytest.raises(AgentCallFailed) as failed:
            await _all(link, timeout=0.5)
        assert failed.value.code.name == code
        assert link._frames is not None
        assert not link._frames._idle


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (STARTED + (6).to_bytes(4, "big") + b"\x0a\xff\xff\xff\xff\x0f", "not a valid"),
        (STARTED + STARTED + RESULT, "Started twice"),
        (_frame(agent_pb2.InvokeEvent(started=agent_pb2.Started(pid=0))) + RESULT, "pid 0"),
        (_frame(agent_pb2.InvokeEvent(output=agent_pb2.Output(fd=3, data=b"x"))), "fd 3"),
        (
            _frame(
                agent_pb2.InvokeEvent(
                    output=agent_pb2.Output(fd=1, data=b"x" * (MAX_CHUNK_BYTES + 1))
                )
            ),
            "chunk",
        ),
        (_frame(agent_pb2.InvokeEvent()), "empty event"),
        (_frame(agent_pb2.InvokeEvent(result=agent_pb2.InvokeResponse())), "neither"),
    ],
)
async def test_a_hostile_stream_is_misbehaviour(tmp_path: Path, answer: bytes, match: str) -> None:
    async with hostile(tmp_path, answer) as sock, linked(sock) as link:
        with pytest.raises(AgentMisbehaved, match=match):
            await _all(link)
        assert link._frames is not None
        assert not link._frames._idle, "closed, not kept"


async def test_events_after_the_result_are_not_read(tmp_path: Path) -> None:
    async with hostile(tmp_path, STARTED + RESULT + OUTPUT + STARTED) as sock, linked(sock) as link:
        events = await _all(link)
        assert events == [AgentStarted(7), AgentReply("", "", {})]


async def test_an_oversized_event_is_refused_from_its_length(tmp_path: Path) -> None:
    async with hostile(tmp_path, (LIMIT + 1).to_bytes(4, "big") + b"x" * 10) as sock:
        frames = _frames(sock)
        stream = await frames.stream(_request(), 5)
        with pytest.raises(FrameTooLarge):
            await stream.next()
        stream.close()
        assert not frames._idle
        frames.close()
