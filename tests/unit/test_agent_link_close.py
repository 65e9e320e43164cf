"""A call on the agent link that close() cuts short (its sandbox destroyed or replaced while
the call ran, as housekeeping's max-age replacement does between a client's calls) ends with
an answer, never with a stray CancelledError: in a server handler that error would end the
handler as cancelled, and the client would wait for a status that never comes (a GetSandbox
whose health probe met a replacement hung so until its test's timeout). A cancellation of
the awaiting task itself still propagates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from stockade.agent.v1 import agent_pb2, agent_pb2_grpc
from stockade.supervisor.engines.addresses import UnixAddress
from stockade.supervisor.errors import SandboxBroken, SandboxLost
from stockade.supervisor.sandboxes.agent_link import AgentConnection


class SilentAgent(agent_pb2_grpc.AgentServiceServicer):
    """Takes every call and answers none of them while a test runs."""

    def __init__(self) -> None:
        self.calls = 0

    async def _wait(self) -> None:
        self.calls += 1
        await asyncio.sleep(60)

    async def Hello(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._wait()
        return agent_pb2.HelloResponse()

    async def Invoke(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._wait()
        return agent_pb2.InvokeResponse()

    async def Inspect(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._wait()
        return agent_pb2.InspectResponse()

    async def WatchFiles(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        yield agent_pb2.WatchEvent(started=agent_pb2.WatchStarted(path=request.path))
        await self._wait()


@pytest.fixture
async def silent(tmp_path: Path) -> AsyncIterator[tuple[SilentAgent, Path]]:
    sock = tmp_path / "agent.sock"
    server = grpc.aio.server()
    service = SilentAgent()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    try:
        yield service, sock
    finally:
        await server.stop(grace=None)


Call = Callable[[AgentConnection], Awaitable[object]]


async def _closed_midway(
    served: tuple[SilentAgent, Path], call: Call
) -> tuple[object | None, BaseException | None]:
    """Start the call, close the connection once the agent holds it; what the call gave."""
    service, sock = served
    agent = AgentConnection(UnixAddress(sock))
    task = asyncio.create_task(call(agent))
    before = service.calls
    for _ in range(500):
        if service.calls > before:
            break
        await asyncio.sleep(0.01)
    assert service.calls > before, "the call never reached the agent"
    await agent.close()
    try:
        return await asyncio.wait_for(task, 20), None
    except (asyncio.CancelledError, Exception) as exc:
        return None, exc


async def test_a_probe_cut_short_by_close_says_the_agent_does_not_answer(
    silent: tuple[SilentAgent, Path],
) -> None:
    result, error = await _closed_midway(silent, lambda a: a.answers(30))
    assert error is None, f"the probe raised {error!r}"
    assert result is False


async def test_a_handshake_cut_short_by_close_is_a_broken_sandbox(
    silent: tuple[SilentAgent, Path],
) -> None:
    _, error = await _closed_midway(silent, lambda a: a.wait_ready(30))
    assert isinstance(error, SandboxBroken), repr(error)
    assert "destroyed or replaced" in str(error)


async def _watch(agent: AgentConnection) -> list[object]:
    return [event async for event in agent.watch_files("w", False)]


@pytest.mark.parametrize("which", ["invoke", "inspect", "watch"])
async def test_a_call_cut_short_by_close_is_a_lost_sandbox(
    silent: tuple[SilentAgent, Path], which: str
) -> None:
    calls: dict[str, Call] = {
        "invoke": lambda a: a.invoke("exec", {"command": "true"}, 30, "rid"),
        "inspect": lambda a: a.inspect([], [], "", 30),
        "watch": _watch,
    }
    _, error = await _closed_midway(silent, calls[which])
    assert isinstance(error, SandboxLost), repr(error)


async def test_cancelling_the_caller_still_cancels_it(silent: tuple[SilentAgent, Path]) -> None:
    service, sock = silent
    agent = AgentConnection(UnixAddress(sock))
    try:
        task = asyncio.create_task(agent.answers(30))
        while service.calls == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await agent.close()


async def test_an_agent_without_watch_files_asks_for_a_rebuild(tmp_path: Path) -> None:
    sock = tmp_path / "old.sock"
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(agent_pb2_grpc.AgentServiceServicer(), server)
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    agent = AgentConnection(UnixAddress(sock))
    try:
        with pytest.raises(SandboxBroken, match="predates WatchFiles; rebuild the image"):
            await _watch(agent)
    finally:
        await agent.close()
        await server.stop(grace=None)
