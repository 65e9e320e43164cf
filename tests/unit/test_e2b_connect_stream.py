"""The Connect server stream's response (fronts/e2b/connect.py _ServerStream) on the ASGI
messages themselves: the head goes with the first message, a `Last` message with the end of
the stream in one body message (what the handler yields after it is not sent), a client that
goes away cancels the handler at once, the deadline ends the stream, and no generator of a
request is left for the garbage collector to close (each one costs the loop a task)."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.types import Message

from stockade.supervisor.fronts.e2b import connect
from stockade.supervisor.fronts.e2b.connect import ConnectError, Json, Last
from tests.unit.test_e2b_connect import frames


class Exchange:
    """One request's ASGI side: its body, then (when `leave` is set) the client's going."""

    def __init__(self, body: bytes, headers: dict[str, str] | None = None) -> None:
        raw = {"content-type": connect.STREAM_TYPE, **(headers or {})}
        self.scope: dict[str, Any] = {
            "type": "http",
            "method": "POST",
            "path": "/p.P/Start",
            "headers": [(k.encode(), v.encode()) for k, v in raw.items()],
        }
        self.body = body
        self.leave = asyncio.Event()
        self.sent: list[Message] = []
        self.first_sent = asyncio.Event()

    async def receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None  # type: ignore[assignment]  # once
            return {"type": "http.request", "body": body, "more_body": False}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        self.first_sent.set()

    async def run(self, handler: connect.ServerStream) -> None:
        request = Request(self.scope, self.receive)
        response = await connect.server_stream(handler)(request)
        await response(self.scope, self.receive, self.send)

    def frames(self) -> list[tuple[int, Json]]:
        return frames(b"".join(m.get("body", b"") for m in self.sent[1:]))


def request_body(message: Json) -> bytes:
    return connect.envelope(message)


async def test_the_last_message_goes_with_the_end_of_the_stream() -> None:
    drained: list[str] = []

    async def handler(_request: Request, msg: Json) -> AsyncIterator[Json]:
        yield {"start": msg["n"]}
        yield Last(end=1)
        yield {"never": "sent"}  # a handler's bug: dropped
        drained.append("to its end")

    ex = Exchange(request_body({"n": 7}))
    await ex.run(handler)
    assert ex.sent[0]["type"] == "http.response.start"
    assert ex.sent[0]["headers"] == [(b"content-type", b"application/connect+json")]
    bodies = ex.sent[1:]
    assert [m["more_body"] for m in bodies] == [True, False]
    assert bodies[1]["body"] == connect.envelope({"end": 1}) + connect.end_stream()
    assert ex.frames() == [(0, {"start": 7}), (0, {"end": 1}), (2, {})]
    assert drained == ["to its end"]


async def test_the_head_waits_for_the_first_message() -> None:
    go = asyncio.Event()

    async def handler(_request: Request, _msg: Json) -> AsyncIterator[Json]:
        await go.wait()
        yield {"first": True}

    ex = Exchange(request_body({}))
    task = asyncio.ensure_future(ex.run(handler))
    for _ in range(20):
        await asyncio.sleep(0)
    assert ex.sent == []  # no head before there is something to send with it
    go.set()
    await task
    assert [m["type"] for m in ex.sent] == ["http.response.start"] + ["http.response.body"] * 2
    assert ex.frames() == [(0, {"first": True}), (2, {})]


async def test_a_client_that_goes_cancels_the_handler_at_once() -> None:
    ended: list[str] = []

    async def handler(_request: Request, _msg: Json) -> AsyncIterator[Json]:
        try:
            yield {"start": 1}
            await asyncio.Event().wait()  # a silent process
            yield {"never": 1}
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    ex = Exchange(request_body({}))
    task = asyncio.ensure_future(ex.run(handler))
    await ex.first_sent.wait()
    ex.leave.set()
    await task  # returns: the client's going is no error of the app
    assert ended == ["cancelled"]
    assert ex.frames() == [(0, {"start": 1})]
    assert not task.cancelled()


async def test_a_cancel_from_outside_still_cancels() -> None:
    async def handler(_request: Request, _msg: Json) -> AsyncIterator[Json]:
        yield {"start": 1}
        await asyncio.Event().wait()
        yield {}

    ex = Exchange(request_body({}))
    task = asyncio.ensure_future(ex.run(handler))
    await ex.first_sent.wait()
    task.cancel()  # the server shutting down
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()


async def test_the_deadline_and_errors_end_the_stream() -> None:
    async def slow(_request: Request, _msg: Json) -> AsyncIterator[Json]:
        yield {"start": 1}
        await asyncio.Event().wait()
        yield {}

    ex = Exchange(request_body({}), {"connect-timeout-ms": "20"})
    await ex.run(slow)
    assert ex.frames()[-1] == (2, {"error": {"code": "deadline_exceeded", "message": ANY}})
    assert ex.sent[-1]["more_body"] is False

    async def failing(_request: Request, _msg: Json) -> AsyncIterator[Json]:
        raise ConnectError("not_found", "no such process")
        yield {}

    ex = Exchange(request_body({}))
    await ex.run(failing)
    assert ex.frames() == [(2, {"error": {"code": "not_found", "message": "no such process"}})]


class _Any:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)


ANY: Any = _Any()


async def test_no_generator_is_left_to_the_garbage_collector() -> None:
    """Each request's generators (its body's stream, its envelopes, its messages) are
    closed by their owners: asyncio's finalizer hook, which would close them at a cost of a
    task and a wake-up each, is never called."""
    left: list[str] = []
    hooks = sys.get_asyncgen_hooks()

    def finalizer(agen: Any) -> None:
        left.append(agen.__qualname__)
        assert hooks.finalizer is not None
        hooks.finalizer(agen)

    async def handler(_request: Request, _msg: Json) -> AsyncIterator[Json]:
        yield {"start": 1}
        yield Last(end=1)

    async def total(_request: Request, msgs: AsyncIterator[Json]) -> Json:
        return {"n": len([m async for m in msgs])}

    sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=finalizer)
    try:
        for _ in range(3):
            await Exchange(request_body({})).run(handler)
            ex = Exchange(request_body({"v": 1}) + request_body({"v": 2}))
            request = Request(ex.scope, ex.receive)
            response = await connect.client_stream(total)(request)
            await response(ex.scope, ex.receive, ex.send)
            assert ex.frames() == [(0, {"n": 2}), (2, {})]
        gc.collect()
        await asyncio.sleep(0)
    finally:
        sys.set_asyncgen_hooks(*hooks)
    assert left == []
