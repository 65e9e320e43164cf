"""A handler that an inner call's stray CancelledError ends (an agent channel closed under
it: its task was never cancelled) answers its caller UNAVAILABLE with reason SANDBOX_LOST
through status.mapped; passed on, gRPC would send no status at all and a caller without a
deadline would wait forever. A caller that goes away still cancels the handler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from stockade.agent.v1 import agent_pb2
from stockade.supervisor.fronts.grpc.interceptor import REASON_KEY
from stockade.supervisor.fronts.grpc.status import STRAY, Context, mapped, mapped_stream
from stockade.supervisor.policy.scrub.scrubber import Scrubber

SERVICE = "test.Stray"


async def _stray_cancel() -> None:
    """What grpc.aio does to the task awaiting a call whose channel is closed."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.cancel()
    await future


class Servicer:
    scrubber: Scrubber | None = None

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    @mapped
    async def Unary(self, request: Any, context: Context) -> Any:
        await _stray_cancel()
        return agent_pb2.HelloResponse()

    @mapped_stream
    async def Stream(self, request: Any, context: Context) -> AsyncIterator[Any]:
        yield agent_pb2.HelloResponse(pid=1)
        await _stray_cancel()
        yield agent_pb2.HelloResponse(pid=2)

    @mapped
    async def Slow(self, request: Any, context: Context) -> Any:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return agent_pb2.HelloResponse()


@pytest.fixture
async def served() -> AsyncIterator[tuple[Servicer, grpc.aio.Channel]]:
    servicer = Servicer()
    codec = {
        "request_deserializer": agent_pb2.HelloRequest.FromString,
        "response_serializer": agent_pb2.HelloResponse.SerializeToString,
    }
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(servicer.Unary, **codec),
        "Slow": grpc.unary_unary_rpc_method_handler(servicer.Slow, **codec),
        "Stream": grpc.unary_stream_rpc_method_handler(servicer.Stream, **codec),
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield servicer, channel
    finally:
        await channel.close()
        await server.stop(grace=None)


def _method(channel: grpc.aio.Channel, name: str, stream: bool = False) -> Any:
    make = channel.unary_stream if stream else channel.unary_unary
    return make(
        f"/{SERVICE}/{name}",
        request_serializer=agent_pb2.HelloRequest.SerializeToString,
        response_deserializer=agent_pb2.HelloResponse.FromString,
    )


async def _reason(exc: grpc.aio.AioRpcError) -> str:
    return dict(exc.trailing_metadata() or ()).get(REASON_KEY, "")


async def test_a_unary_handler_ended_by_a_stray_cancellation_answers_unavailable(
    served: tuple[Servicer, grpc.aio.Channel],
) -> None:
    _, channel = served
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _method(channel, "Unary")(agent_pb2.HelloRequest(), timeout=20)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
    assert caught.value.details() == STRAY
    assert await _reason(caught.value) == "SANDBOX_LOST"


async def test_a_stream_ended_by_a_stray_cancellation_answers_unavailable(
    served: tuple[Servicer, grpc.aio.Channel],
) -> None:
    _, channel = served
    got: list[int] = []

    async def read() -> None:
        call = _method(channel, "Stream", stream=True)(agent_pb2.HelloRequest(), timeout=20)
        async for reply in call:
            got.append(reply.pid)

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await read()
    assert got == [1]
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
    assert await _reason(caught.value) == "SANDBOX_LOST"


async def test_a_caller_that_goes_away_still_cancels_the_handler(
    served: tuple[Servicer, grpc.aio.Channel],
) -> None:
    servicer, channel = served
    call = _method(channel, "Slow")(agent_pb2.HelloRequest(), timeout=30)
    await asyncio.sleep(0.2)
    call.cancel()
    await asyncio.wait_for(servicer.cancelled.wait(), 10)
