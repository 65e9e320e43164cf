"""The E2B front's Connect protocol (fronts/e2b/connect.py): envelopes and the JSON codec,
through its unary, server-streaming and client-streaming endpoints.

An input: byte 0 picks the call kind (0: unary, 1: server stream, 2: client stream) and
the Content-Type (bit 2: the other kind's), byte 1 the size of the chunks the body arrives
in, the rest is the request body. The endpoint must answer (an error as a Connect error),
never raise: nothing is a clean refusal here, and an answer of 500 ("unknown"/"internal"
for a message the codec could not read) is a crash too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message

from fuzz import run
from stockade.supervisor.fronts.e2b import connect
from stockade.supervisor.fronts.e2b.connect import Json

INSTRUMENT = ("stockade", "starlette")
REFUSALS: tuple[type[BaseException], ...] = ()


async def _echo(request: Request, message: Json) -> Json:
    return {"fields": len(message)}


async def _replies(request: Request, message: Json) -> AsyncIterator[Json]:
    yield {"fields": len(message)}


async def _gather(request: Request, messages: AsyncIterator[Json]) -> Json:
    return {"messages": len([m async for m in messages])}


ENDPOINTS = (
    (connect.unary(_echo), connect.UNARY_TYPE),
    (connect.server_stream(_replies), connect.STREAM_TYPE),
    (connect.client_stream(_gather), connect.STREAM_TYPE),
)


def request_of(
    body: bytes, content_type: str, chunk: int, answered: asyncio.Event | None = None
) -> Request:
    """The request; once its body is read, its receive waits for `answered` (the response
    complete, as uvicorn's does) and then says the client went."""
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/fuzz",
        "headers": [(b"content-type", content_type.encode())],
        "query_string": b"",
    }
    parts = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]

    async def receive() -> dict[str, Any]:
        if not parts:
            if answered is not None:
                await answered.wait()
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": parts.pop(0), "more_body": bool(parts)}

    return Request(scope, receive)


async def _answer(data: bytes) -> tuple[int, bytes]:
    """The endpoint's answer, its response run as uvicorn runs it (an ASGI app)."""
    kind, chunk = (data[0], data[1]) if len(data) >= 2 else (0, 0)
    endpoint, media = ENDPOINTS[kind % 3]
    if kind & 4:
        media = connect.STREAM_TYPE if media == connect.UNARY_TYPE else connect.UNARY_TYPE
    answered = asyncio.Event()
    request = request_of(data[2:], media, 1 + chunk, answered)
    response: Response = await endpoint(request)
    status, body = 0, []

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        else:
            body.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                answered.set()

    await response(request.scope, request.receive, send)
    return status, b"".join(body)


def one(data: bytes) -> None:
    status, body = run(_answer(data))
    if status >= 500 or b'"code":"internal"' in body or b'"code":"unknown"' in body:
        raise AssertionError(f"the codec answered {status}: {body[:200]!r}")
