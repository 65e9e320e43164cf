"""The Connect protocol (JSON codec only) for Starlette, as the E2B SDKs speak it.

Unary: a JSON body in, `application/json` out; an error is a non-200 status with
`{"code": "<lowercase connect code>", "message": ...}`. Server-streaming and
client-streaming: `application/connect+json` envelopes (1 flag byte, 4-byte big-endian
length, JSON), every response stream ending with an end-of-stream envelope (flag 0x02)
that carries the error, if any, over HTTP 200. Connect-Timeout-Ms bounds the handler.

Every message is held to `limit` bytes (the configured request size): a unary body by its
Content-Length before it is read, an envelope by its declared length before its payload is;
past it, `resource_exhausted` as envd answers. JSON nested too deep is `invalid_argument`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from stockade.supervisor.fronts import bodies

T = TypeVar("T")
KEEPALIVE_S = 50.0
"""The longest silence on a stream (the SDKs ask for 50 s; undici drops a body silent 300 s)."""
UNARY_TYPE = "application/json"
STREAM_TYPE = "application/connect+json"
END_STREAM = 0x02
COMPRESSED = 0x01
LIMIT = 16 << 20
"""The default largest message (the supervisor passes its max_request_bytes)."""

HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}

Json = dict[str, Any]
Unary = Callable[[Request, Json], Awaitable[Json]]
ServerStream = Callable[[Request, Json], AsyncIterator[Json]]
ClientStream = Callable[[Request, AsyncIterator[Json]], Awaitable[Json]]


class ConnectError(Exception):
    def __init__(self, code: str, message: str) -> None:
        if code not in HTTP_STATUS:
            raise ValueError(f"not a Connect code: {code}")
        super().__init__(message)
        self.code = code
        self.message = message

    def to_json(self) -> Json:
        return {"code": self.code, "message": self.message}


def envelope(message: Json, flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_stream(error: ConnectError | None = None) -> bytes:
    return envelope({"error": error.to_json()} if error else {}, END_STREAM)


async def read_envelopes(
    chunks: AsyncIterator[bytes], limit: int = LIMIT
) -> AsyncGenerator[tuple[int, bytes]]:
    """(flags, payload) of each envelope in a byte stream, however it is chunked; one that
    declares more than `limit` bytes is refused before its payload is read."""
    buf = bytearray()
    async for chunk in chunks:
        buf.extend(chunk)
        while len(buf) >= 5:
            flags, size = struct.unpack(">BI", buf[:5])
            if size > limit:
                message = f"the message declares {size} bytes: more than {limit}"
                raise ConnectError("resource_exhausted", message)
            if len(buf) < 5 + size:
                break
            yield flags, bytes(buf[5 : 5 + size])
            del buf[: 5 + size]
    if buf:
        raise ConnectError("invalid_argument", "truncated envelope")


def _decode(request: Request, data: bytes) -> Json:
    try:
        value = bodies.loads(data or b"{}")
    except bodies.BodyRefused as exc:
        bodies.tell(request, exc)
        raise ConnectError("invalid_argument", exc.message) from None
    except ValueError as exc:
        raise ConnectError("invalid_argument", f"the message is not JSON: {exc}") from None
    except RecursionError:
        raise ConnectError("invalid_argument", "the message nests too deeply") from None
    if not isinstance(value, dict):
        raise ConnectError("invalid_argument", "the message is not a JSON object")
    return value


def timeout_of(request: Request) -> float | None:
    raw = request.headers.get("connect-timeout-ms")
    if not raw:
        return None
    if not raw.isdigit() or len(raw) > 10:
        raise ConnectError("invalid_argument", "bad Connect-Timeout-Ms")
    return int(raw) / 1000


def _media(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def unary_error(exc: ConnectError) -> Response:
    return JSONResponse(exc.to_json(), status_code=HTTP_STATUS[exc.code])


def refused(exc: bodies.BodyRefused) -> ConnectError:
    """A refused body as envd's Connect server answers it."""
    return ConnectError(
        "resource_exhausted" if exc.status == 413 else "invalid_argument", exc.message
    )


def unary(handler: Unary, limit: int = LIMIT) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            if _media(request) != UNARY_TYPE:
                raise ConnectError("invalid_argument", f"unary calls take {UNARY_TYPE}")
            if request.headers.get("content-encoding", "identity") != "identity":
                raise _unimplemented(request, "compressed requests are not supported")
            try:
                message = _decode(request, await bodies.read_body(request, limit))
            except bodies.BodyRefused as exc:
                bodies.tell(request, exc)
                raise refused(exc) from None
            result = await asyncio.wait_for(handler(request, message), timeout_of(request))
        except ConnectError as exc:
            return unary_error(exc)
        except TimeoutError:
            return unary_error(ConnectError("deadline_exceeded", "the deadline passed"))
        return JSONResponse(result, media_type=UNARY_TYPE)

    return endpoint


async def _messages(request: Request, limit: int) -> AsyncGenerator[Json]:
    """The request's messages. The generators it holds are closed here, and its caller closes
    it (contextlib.aclosing): one left to the garbage collector costs a task and a wake-up of
    the event loop to close it (asyncio's finalizer hook)."""
    if _media(request) != STREAM_TYPE:
        raise ConnectError("invalid_argument", f"streaming calls take {STREAM_TYPE}")
    async with (
        contextlib.aclosing(request.stream()) as chunks,
        contextlib.aclosing(read_envelopes(chunks, limit)) as envelopes,
    ):
        while True:
            try:
                found = await anext(envelopes, None)
            except ConnectError as exc:  # a message too large or cut short: a refused body
                status = 413 if exc.code == "resource_exhausted" else 400
                bodies.tell(request, bodies.BodyRefused(status, exc.message))
                raise
            if found is None:
                return
            flags, payload = found
            if flags & COMPRESSED:
                raise _unimplemented(request, "compressed messages are not supported")
            if flags & END_STREAM:
                return
            yield _decode(request, payload)


def _unimplemented(request: Request, message: str) -> ConnectError:
    """A compressed request or message (no E2B SDK sends one), audited as a refused body."""
    bodies.tell(request, bodies.BodyRefused(415, message))
    return ConnectError("unimplemented", message)


def _stream_response(body: AsyncIterator[bytes]) -> Response:
    response = StreamingResponse(body, media_type=STREAM_TYPE)
    response.headers["content-type"] = STREAM_TYPE  # exactly: no charset (Python's check)
    return response


class Last(dict[str, Any]):
    """A server stream's last message (a process's end event): it goes out with the end of
    the stream in one write; what the handler does after it (its own end) is not waited for."""


class _ServerStream(Response):
    """A server stream's response: what Starlette's StreamingResponse does (the head, each
    message as it comes, the end; the handler cancelled at once when the client goes), at a
    lower cost per call: the head goes with the first message and a `Last` message with the
    end of the stream and the chunked body's terminator (one write each, with listener.py's
    cork), and one task watches for the client's disconnect instead of a task group."""

    def __init__(self, messages: AsyncIterator[Json], deadline: float | None) -> None:
        self._messages = messages
        self._deadline = deadline
        self._send: Send | None = None
        self._started = self._ended = False
        self.status_code = 200
        self.background = None
        self.raw_headers = [(b"content-type", STREAM_TYPE.encode())]  # exactly: no charset

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = False

        def left(watch: asyncio.Future[None]) -> None:
            nonlocal gone
            if not (self._ended or gone or watch.cancelled() or watch.exception()):
                gone = True
                task.cancel()  # the client went away: the handler ends at once

        watch = asyncio.ensure_future(_disconnect(receive))
        watch.add_done_callback(left)
        self._send = send
        try:
            await self._pump()
        except asyncio.CancelledError:
            if not gone or task.uncancel() > 0:
                raise
        finally:
            self._ended = True
            watch.cancel()
            await _close(self._messages)

    async def _pump(self) -> None:
        try:
            async with asyncio.timeout(self._deadline):
                async for out in self._messages:
                    if self._ended:
                        continue  # after the last message: only the handler's own end
                    last = isinstance(out, Last)
                    data = envelope(out) + end_stream() if last else envelope(out)
                    await self._write(data, more=not last)
        except ConnectError as exc:
            await self._write(end_stream(exc), more=False)
            return
        except TimeoutError:
            error = ConnectError("deadline_exceeded", "the deadline passed")
            await self._write(end_stream(error), more=False)
            return
        await self._write(end_stream(), more=False)

    async def _write(self, data: bytes, *, more: bool) -> None:
        if self._ended:
            return
        assert self._send is not None
        if not self._started:
            self._started = True
            start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
            await self._send(start)
        self._ended = not more
        await self._send({"type": "http.response.body", "body": data, "more_body": more})


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _close(messages: AsyncIterator[Json]) -> None:
    close = getattr(messages, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()


def server_stream(
    handler: ServerStream, limit: int = LIMIT
) -> Callable[[Request], Awaitable[Response]]:
    """The request message is read before the response starts (a disconnect watch would
    race a body still read)."""

    async def endpoint(request: Request) -> Response:
        try:
            deadline = timeout_of(request)
            async with contextlib.aclosing(_messages(request, limit)) as messages:
                first = await anext(messages, None)
            if first is None:
                raise ConnectError("invalid_argument", "a server stream takes one message")
        except ConnectError as exc:
            return _stream_response(_only(end_stream(exc)))
        return _ServerStream(handler(request, first), deadline)

    return endpoint


async def _only(data: bytes) -> AsyncIterator[bytes]:
    yield data


def client_stream(
    handler: ClientStream, limit: int = LIMIT
) -> Callable[[Request], Awaitable[Response]]:
    """The handler consumes the request stream before the response starts (see above)."""

    async def endpoint(request: Request) -> Response:
        try:
            async with asyncio.timeout(timeout_of(request)):
                async with contextlib.aclosing(_messages(request, limit)) as messages:
                    result = await handler(request, messages)
        except ConnectError as exc:
            return _stream_response(_only(end_stream(exc)))
        except TimeoutError:
            error = ConnectError("deadline_exceeded", "the deadline passed")
            return _stream_response(_only(end_stream(error)))
        return _stream_response(_only(envelope(result) + end_stream()))

    return endpoint


def keepalive_interval(request: Request) -> float:
    """Seconds of silence after which a stream sends a keepalive: the client's
    Keepalive-Ping-Interval, 1 to KEEPALIVE_S."""
    raw = request.headers.get("keepalive-ping-interval", "")
    wanted = int(raw) if raw.isdigit() and len(raw) < 6 else KEEPALIVE_S
    return float(min(max(wanted, 1), KEEPALIVE_S))


async def with_keepalive(
    events: AsyncIterator[T],
    every_s: float | None,
    gone: asyncio.Event | None = None,
    gone_error: ConnectError | None = None,
) -> AsyncGenerator[T | None, None]:
    """The events, with None whenever `every_s` passes without one (None: no keepalives);
    with `gone`, `gone_error` is raised once it is set before the stream ends, in the same
    wait (one task an event). The source is not closed here: its owner does that."""
    ended = asyncio.ensure_future(gone.wait()) if gone is not None else None
    step: asyncio.Future[T] | None = None
    try:
        while True:
            if step is None:
                step = asyncio.ensure_future(anext(events))
            waiting: set[asyncio.Future[Any]] = {step} if ended is None else {step, ended}
            await asyncio.wait(waiting, timeout=every_s, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                if ended is None or not ended.done():
                    yield None
                    continue
                raise gone_error or ConnectError("unavailable", "the stream's source went")
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            step = None
            yield item
    finally:
        if ended is not None:
            ended.cancel()
        if step is not None and not step.done():
            step.cancel()
            with contextlib.suppress(BaseException):
                await step
