"""Unary Invoke over the agent's framed socket (stockade/agent/frames.py, the supervisor's
sandboxes/agent_frames.py and AgentConnection.invoke): the same replies and failures as over
gRPC, connections kept for later calls, and every way the other end can misbehave refused:
an oversized length, bytes that are no message, silence, a connection cut mid-reply, bytes
sent during a call, a cancelled or timed-out call (cancelled in the agent too), close() during
a call, and an agent without the socket (gRPC instead)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from stockade.agent.frames import FRAMES_SUFFIX, serve_frames
from stockade.agent.v1 import agent_pb2, agent_pb2_grpc
from stockade.supervisor.errors import AgentMisbehaved, SandboxLost
from stockade.supervisor.sandboxes import agent_frames
from stockade.supervisor.sandboxes.agent_frames import (
    STREAM_FLAG,
    TYPED_FLAG,
    FrameDeadline,
    FramedInvoke,
    FrameLost,
    FramesAbsent,
    FrameTooLarge,
)
from stockade.supervisor.sandboxes.agent_link import AgentCallFailed, AgentConnection

LIMIT = 1 << 20


class Agent:
    """The agent's side with a stand-in for its tools: answers `reply`, or waits for ever when
    `hang`; counts calls and their cancellations."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.cancelled = 0
        self.hang = False
        self.started = asyncio.Event()

    async def invoke(self, request: Any) -> Any:
        self.calls.append(request)
        self.started.set()
        if self.hang:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return agent_pb2.InvokeResponse(result_json=f'{{"tool": "{request.tool}"}}')


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[tuple[Agent, Path]]:
    """The agent's framed socket beside a gRPC socket path (agent.sock) where nothing
    listens: a call that went through gRPC would fail."""
    stand_in = Agent()
    sock = tmp_path / "agent.sock"
    server = await serve_frames(sock.with_name(sock.name + FRAMES_SUFFIX), stand_in.invoke, LIMIT)
    assert server is not None
    try:
        yield stand_in, sock
    finally:
        server.close()


def _request(tool: str = "exec") -> bytes:
    return agent_pb2.InvokeRequest(tool=tool, arguments_json="{}").SerializeToString()


def _frames(sock: Path, limit: int = LIMIT) -> FramedInvoke:
    return FramedInvoke(sock.with_name(sock.name + FRAMES_SUFFIX), limit)


async def test_a_call_round_trips_and_its_connection_serves_the_next(
    agent: tuple[Agent, Path],
) -> None:
    stand_in, sock = agent
    frames = _frames(sock)
    try:
        for tool in ("exec", "read_file", "exec"):
            reply = agent_pb2.InvokeResponse()
            reply.ParseFromString(await frames.call(_request(tool), 5))
            assert reply.result_json == f'{{"tool": "{tool}"}}'
        assert [c.tool for c in stand_in.calls] == ["exec", "read_file", "exec"]
        assert len(frames._idle) == 1, "one connection, kept"
    finally:
        frames.close()


async def test_calls_at_once_get_connections_of_their_own(agent: tuple[Agent, Path]) -> None:
    stand_in, sock = agent
    frames = _frames(sock)
    try:
        replies = await asyncio.gather(*(frames.call(_request(), 5) for _ in range(10)))
        assert len(replies) == len(stand_in.calls) == 10
        assert len(frames._idle) == agent_frames.MAX_IDLE
    finally:
        frames.close()


async def test_a_timed_out_call_is_cancelled_in_the_agent(agent: tuple[Agent, Path]) -> None:
    stand_in, sock = agent
    stand_in.hang = True
    frames = _frames(sock)
    with pytest.raises(FrameDeadline):
        await frames.call(_request(), 0.2)
    await _until(lambda: stand_in.cancelled == 1)
    assert not frames._idle, "a connection whose call failed is not used again"


async def test_a_cancelled_caller_cancels_the_call_in_the_agent(
    agent: tuple[Agent, Path],
) -> None:
    stand_in, sock = agent
    stand_in.hang = True
    frames = _frames(sock)
    task = asyncio.create_task(frames.call(_request(), 30))
    await stand_in.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _until(lambda: stand_in.cancelled == 1)


async def test_close_ends_a_call_in_flight(agent: tuple[Agent, Path]) -> None:
    stand_in, sock = agent
    stand_in.hang = True
    frames = _frames(sock)
    task = asyncio.create_task(frames.call(_request(), 30))
    await stand_in.started.wait()
    frames.close()
    with pytest.raises(FrameLost):
        await task
    await _until(lambda: stand_in.cancelled == 1)


async def test_a_connection_serving_a_call_counts_as_connected(agent: tuple[Agent, Path]) -> None:
    """As a gRPC channel is READY while calls are in flight on it: a link whose every
    connection is busy still reaches its agent (health.py asks no engine then)."""
    stand_in, sock = agent
    stand_in.hang = True
    frames = _frames(sock)
    assert not frames.connected()
    task = asyncio.create_task(frames.call(_request(), 30))
    await stand_in.started.wait()
    assert not frames._idle
    assert frames.connected()
    frames.close()
    with pytest.raises(FrameLost):
        await task
    assert not frames.connected()


async def test_no_socket_is_absent(tmp_path: Path) -> None:
    with pytest.raises(FramesAbsent):
        await _frames(tmp_path / "agent.sock").call(_request(), 5)


# -- the agent's end against a wrong supervisor ---------------------------------------------


async def _raw(sock: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(str(sock.with_name(sock.name + FRAMES_SUFFIX)))


@pytest.mark.parametrize(
    "sent",
    [
        (LIMIT + 1).to_bytes(4, "big"),  # longer than the agent takes
        (0xFFFFFFFF).to_bytes(4, "big"),
        (6).to_bytes(4, "big") + b"\x0a\xff\xff\xff\xff\x0f",  # not an InvokeRequest
        b"\x00\x00",  # a header cut short
    ],
)
async def test_the_agent_closes_on_a_wrong_request(agent: tuple[Agent, Path], sent: bytes) -> None:
    stand_in, sock = agent
    reader, writer = await _raw(sock)
    writer.write(sent)
    if len(sent) < 4:
        writer.write_eof()
    assert await reader.read() == b"", "closed, nothing answered"
    assert not stand_in.calls
    writer.close()


async def test_bytes_during_a_call_cancel_it(agent: tuple[Agent, Path]) -> None:
    stand_in, sock = agent
    stand_in.hang = True
    reader, writer = await _raw(sock)
    request = _request()
    writer.write(len(request).to_bytes(4, "big") + request)
    await stand_in.started.wait()
    writer.write(b"x")
    assert await reader.read() == b""
    await _until(lambda: stand_in.cancelled == 1)
    writer.close()


# -- the supervisor's end against a hostile agent -------------------------------------------


Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def hostile(tmp_path: Path, answer: Answer) -> AsyncIterator[Path]:
    """A framed socket that reads one request (of any kind: test_agent_frames_typed.py uses
    it too) and answers with `answer`."""
    sock = tmp_path / "agent.sock"
    handlers: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            size = int.from_bytes(await reader.readexactly(4), "big")
            await reader.readexactly(size & ~(STREAM_FLAG | TYPED_FLAG))  # of any kind
            with contextlib.suppress(ConnectionError):
                await answer(reader, writer)
                await writer.drain()
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


async def _oversized(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write((0x7FFFFFFF).to_bytes(4, "big") + b"x" * 1000)  # over any limit
    await reader.read()  # until the supervisor closes


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()


async def _cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write((100).to_bytes(4, "big") + b"x" * 10)
    writer.close()


async def test_an_oversized_reply_is_refused_from_its_length(tmp_path: Path) -> None:
    async with hostile(tmp_path, _oversized) as sock:
        frames = _frames(sock)
        with pytest.raises(FrameTooLarge):
            await frames.call(_request(), 5)
        assert not frames._idle


async def test_a_silent_agent_runs_into_the_deadline(tmp_path: Path) -> None:
    async with hostile(tmp_path, _silent) as sock:
        with pytest.raises(FrameDeadline):
            await _frames(sock).call(_request(), 0.2)


async def test_a_reply_cut_short_is_a_lost_connection(tmp_path: Path) -> None:
    async with hostile(tmp_path, _cut) as sock:
        with pytest.raises(FrameLost):
            await _frames(sock).call(_request(), 5)


# -- AgentConnection: the framed path and its fallback, failures as over gRPC ----------------


class GrpcAgent(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self) -> None:
        self.invokes = 0

    async def Invoke(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.invokes += 1
        return agent_pb2.InvokeResponse(result_json='{"via": "grpc"}')


@contextlib.asynccontextmanager
async def grpc_agent(sock: Path) -> AsyncIterator[GrpcAgent]:
    server = grpc.aio.server()
    service = GrpcAgent()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    try:
        yield service
    finally:
        await server.stop(grace=None)


async def test_invoke_goes_through_the_framed_socket(agent: tuple[Agent, Path]) -> None:
    stand_in, sock = agent
    async with grpc_agent(sock) as over_grpc:
        link = AgentConnection(sock)
        try:
            reply = await link.invoke("exec", {"command": "true"}, 5, "rid")
        finally:
            await link.close()
    assert reply.result == {"tool": "exec"}
    assert stand_in.calls[0].request_id == "rid"
    assert stand_in.calls[0].arguments_json == '{"command": "true"}'
    assert over_grpc.invokes == 0


async def test_an_agent_without_the_socket_is_called_over_grpc(tmp_path: Path) -> None:
    sock = tmp_path / "agent.sock"
    async with grpc_agent(sock) as over_grpc:
        link = AgentConnection(sock)
        try:
            for _ in range(2):
                reply = await link.invoke("exec", {}, 5, "rid")
                assert reply.result == {"via": "grpc"}
        finally:
            await link.close()
    assert over_grpc.invokes == 2


async def _not_a_message(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write((6).to_bytes(4, "big") + b"\x0a\xff\xff\xff\xff\x0f")


async def test_a_reply_that_is_no_message_is_misbehaviour(tmp_path: Path) -> None:
    async with hostile(tmp_path, _not_a_message) as sock:
        link = AgentConnection(sock)
        try:
            with pytest.raises(AgentMisbehaved, match="not a valid"):
                await link.invoke("exec", {}, 5, "rid")
        finally:
            await link.close()


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        (_oversized, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (_silent, grpc.StatusCode.DEADLINE_EXCEEDED),
        (_cut, grpc.StatusCode.UNAVAILABLE),
    ],
)
async def test_failures_are_those_of_a_grpc_call(
    tmp_path: Path, answer: Answer, code: grpc.StatusCode
) -> None:
    async with hostile(tmp_path, answer) as sock:
        link = AgentConnection(sock)
        try:
            with pytest.raises(AgentCallFailed) as failed:
                await link.invoke("exec", {}, 0.5, "rid")
        finally:
            await link.close()
    assert failed.value.code == code


async def test_close_during_a_framed_call_is_a_lost_sandbox(agent: tuple[Agent, Path]) -> None:
    stand_in, sock = agent
    stand_in.hang = True
    link = AgentConnection(sock)
    task = asyncio.create_task(link.invoke("exec", {}, 30, "rid"))
    await stand_in.started.wait()
    await link.close()
    with pytest.raises(SandboxLost):
        await task


async def _until(done: Callable[[], bool]) -> None:
    for _ in range(500):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within 5 s")


async def test_a_link_in_place_of_the_socket_is_not_followed(
    agent: tuple[Agent, Path], tmp_path: Path
) -> None:
    """A hostile agent's symlink at the framed path (made before the run folder was sealed)
    to a socket elsewhere on the host: not followed; the call goes through gRPC."""
    stand_in, real = agent
    folder = tmp_path / "run"
    folder.mkdir()
    sock = folder / "agent.sock"
    (folder / f"agent.sock{FRAMES_SUFFIX}").symlink_to(real.with_name(real.name + FRAMES_SUFFIX))
    with pytest.raises(FramesAbsent):
        await _frames(sock).call(_request(), 5)
    async with grpc_agent(sock) as over_grpc:
        link = AgentConnection(sock)
        try:
            assert (await link.invoke("exec", {}, 5, "rid")).result == {"via": "grpc"}
        finally:
            await link.close()
    assert over_grpc.invokes == 1
    assert not stand_in.calls


async def test_a_socket_in_a_folder_not_sealed_to_root_is_not_used(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    sock = folder / "agent.sock"
    server = await serve_frames(sock.with_name(sock.name + FRAMES_SUFFIX), Agent().invoke, LIMIT)
    assert server is not None
    try:
        os.chown(folder, 65533, 65533)  # the agent's own, as before the seal
        with pytest.raises(FramesAbsent, match="sealed"):
            await _frames(sock).call(_request(), 5)
    finally:
        server.close()


async def test_a_kept_framed_connection_is_ready_as_a_connected_channel(
    agent: tuple[Agent, Path],
) -> None:
    """The lease's fast path asks is_ready(): calls that all go framed must not make it
    false when gRPC lets its unused channel go idle."""
    _, sock = agent
    link = AgentConnection(sock)  # no gRPC server: its channel never becomes READY
    try:
        assert not link.is_ready()
        await link.invoke("exec", {}, 5, "rid")
        assert link.is_ready()
    finally:
        await link.close()
    assert not link.is_ready()
