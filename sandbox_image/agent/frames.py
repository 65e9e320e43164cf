"""The agent's framed socket: every call of a supervisor on the same host, without gRPC.

An agent on a unix socket serves PATH + FRAMES_SUFFIX (from protocol 4 nothing at PATH: no
gRPC on a unix socket, so the agent never loads grpc). Each message is a 4-byte big-endian
length and that many bytes, one call at a time per connection, and a connection serves call
after call:

- a plain length: an `InvokeRequest`, answered by its `InvokeResponse`;
- with STREAM_FLAG (protocol 3): an InvokeStream, answered by `InvokeEvent` frames, the one
  with the result last;
- with TYPED_FLAG (protocol 4): a typed frame, whose first byte names the call (HELLO,
  INSPECT, UPLOAD, DOWNLOAD, WATCH) and whose rest is its request: Hello and Inspect are
  answered by one frame; Download and WatchFiles by frames until the one with the result;
  Upload's `UploadChunk` header is followed by plain frames of data chunks and an empty frame
  that ends them, then answered by its `InvokeResponse`.

An agent older than a flag reads it as a length over its limit and closes the connection
without running anything: the supervisor then greets it over gRPC (agent_link.py). What a
gRPC call costs both processes (HTTP/2 framing, the completion queue's threads and wake-ups)
is most of a warm call's CPU; this is one write and one read each way (docs/benchmarks.md,
the supervisor's CPU per call).

The supervisor closing the connection while a call runs cancels the call, as a cancelled
RPC does: its command is killed (for a stream, as when its caller stops following; for an
upload, the partial file is removed). A message over MAX_MESSAGE_BYTES, one that is not what
its place asks for, an unknown call, a typed frame to an agent without typed calls, Inspect
limits out of range, or bytes sent during a call close the connection. An upload refused
before its end (a bad path) reads and drops the rest of its chunks, then answers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from stockade.agent.v1 import agent_pb2

log = logging.getLogger("stockade.agent")
FRAMES_SUFFIX = ".frames"
"""The framed socket's path is the agent's socket path (--socket) with this added."""
HEADER_BYTES = 4
STREAM_FLAG = 1 << 31
"""Set in a request's length: an InvokeStream (the length is the rest of the bits)."""
TYPED_FLAG = 1 << 30
"""Set in a request's length: a typed frame, its first byte the call (the length is the rest
of the bits, that byte included)."""
HELLO, INSPECT, UPLOAD, DOWNLOAD, WATCH = 1, 2, 3, 4, 5
_REQUESTS: dict[int, Any] = {
    HELLO: agent_pb2.HelloRequest,
    INSPECT: agent_pb2.InspectRequest,
    UPLOAD: agent_pb2.UploadChunk,
    DOWNLOAD: agent_pb2.DownloadRequest,
    WATCH: agent_pb2.WatchFilesRequest,
}

Invoke = Callable[[Any], Awaitable[Any]]
"""An InvokeRequest to its InvokeResponse (the gRPC servicer's Invoke without its context)."""
InvokeStream = Callable[[Any], AsyncGenerator[Any, None]]
"""An InvokeRequest to its InvokeEvents (the servicer's InvokeStream without its context)."""


class Typed(Protocol):
    """The typed calls (service.AgentService)."""

    async def hello(self) -> Any: ...

    async def inspect(self, request: Any) -> Any: ...

    async def upload(self, request_iterator: AsyncIterator[Any]) -> Any: ...

    def download(self, request: Any) -> AsyncGenerator[Any, None]: ...

    def watch_files(self, request: Any) -> AsyncGenerator[Any, None]: ...


class _Broken(Exception):
    """The supervisor's end broke the protocol: the connection is closed."""


async def serve_frames(
    path: Path,
    invoke: Invoke,
    max_bytes: int,
    invoke_stream: InvokeStream | None = None,
    typed: Typed | None = None,
) -> asyncio.Server | None:
    """Listen on `path` (replacing what is there); None, logged, when it cannot be made.
    Without `invoke_stream` a stream's flag, without `typed` a typed frame's, closes the
    connection (as an agent of protocol 2, or 3, would). Like the socket of an agent of
    protocol 3 or older it belongs to the sandbox user (the agent's effective ids:
    identity.py), so code in the sandbox can call through it; it only runs tools as that
    user, which such code is already."""
    try:
        path.unlink(missing_ok=True)
        return await asyncio.start_unix_server(
            partial(_connection, invoke, invoke_stream, typed, max_bytes), path=str(path)
        )
    except OSError as exc:
        log.warning("no framed socket at %s: %s", path, exc)
        return None


async def _connection(
    invoke: Invoke,
    invoke_stream: InvokeStream | None,
    typed: Typed | None,
    max_bytes: int,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    try:
        while (asked := await _request(reader, max_bytes, invoke_stream, typed)) is not None:
            kind, request = asked
            if not await _serve(
                kind, request, invoke, invoke_stream, typed, reader, writer, max_bytes
            ):
                return
    except (asyncio.IncompleteReadError, ConnectionError, _Broken):
        return
    except asyncio.CancelledError:
        # only at the agent's end (asyncio.run cancels what is left): Python 3.11's stream
        # server logs a connection task that ends cancelled as an error
        return
    finally:
        writer.close()


async def _serve(
    kind: int | None,
    request: Any,
    invoke: Invoke,
    invoke_stream: InvokeStream | None,
    typed: Typed | None,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    max_bytes: int,
) -> bool:
    """Answer one call; False when the connection is to be closed (the supervisor went away
    first, or asked what cannot be answered)."""
    if kind == STREAM_FLAG:
        assert invoke_stream is not None
        return await _answer(_events(invoke_stream(request), writer), reader) is not None
    if kind is None:
        return await _reply(await _answer(invoke(request), reader), writer)
    assert typed is not None
    if kind == HELLO:
        return await _reply(await _answer(typed.hello(), reader), writer)
    if kind == INSPECT:
        try:
            return await _reply(await _answer(typed.inspect(request), reader), writer)
        except ValueError as exc:
            log.warning("framed socket: Inspect refused (%s): closed", exc)
            return False
    if kind == DOWNLOAD:
        return await _answer(_events(typed.download(request), writer), reader) is not None
    if kind == WATCH:
        return await _answer(_events(typed.watch_files(request), writer), reader) is not None
    if request.WhichOneof("part") != "header":
        log.warning("framed socket: an upload that does not start with its header: closed")
        return False
    chunks = _chunks(request, reader, max_bytes)
    reply = await typed.upload(chunks)
    async for _ in chunks:  # what a refused upload left unread, to its end
        pass
    return await _reply(reply, writer)


async def _chunks(
    first: Any, reader: asyncio.StreamReader, max_bytes: int
) -> AsyncGenerator[Any, None]:
    """An upload's header, then each data chunk until the empty frame that ends them; a
    connection that ends first raises IncompleteReadError into the upload (which removes its
    partial file)."""
    yield first
    while True:
        size = int.from_bytes(await reader.readexactly(HEADER_BYTES), "big")
        if size == 0:
            return
        if size > max_bytes:
            log.warning("framed socket: an upload chunk of %d bytes: closed", size)
            raise _Broken
        chunk = agent_pb2.UploadChunk()
        try:
            chunk.ParseFromString(await reader.readexactly(size))
        except DecodeError:
            raise _Broken from None
        if chunk.WhichOneof("part") != "data":
            log.warning("framed socket: an upload chunk that is not data: closed")
            raise _Broken
        yield chunk


async def _reply(reply: Any | None, writer: asyncio.StreamWriter) -> bool:
    if reply is None:
        return False
    body = reply.SerializeToString()
    writer.write(len(body).to_bytes(HEADER_BYTES, "big") + body)
    await writer.drain()
    return True


async def _request(
    reader: asyncio.StreamReader,
    max_bytes: int,
    invoke_stream: InvokeStream | None,
    typed: Typed | None,
) -> tuple[int | None, Any] | None:
    """The next request and its kind (None: Invoke, STREAM_FLAG, or a typed call); None at
    the end of the connection or for a wrong message."""
    try:
        header = await reader.readexactly(HEADER_BYTES)
    except asyncio.IncompleteReadError:
        return None
    size = int.from_bytes(header, "big")
    # a flag this agent does not take is left in the length, which is then over the limit
    flag = STREAM_FLAG if invoke_stream is not None and size & STREAM_FLAG else 0
    if not flag and typed is not None and size & TYPED_FLAG:
        flag = TYPED_FLAG
    size &= ~flag
    if size > max_bytes:
        log.warning("framed socket: a request of %d bytes (at most %d): closed", size, max_bytes)
        return None
    body = await reader.readexactly(size)
    kind: int | None = STREAM_FLAG if flag == STREAM_FLAG else None
    message: Any = agent_pb2.InvokeRequest
    if flag == TYPED_FLAG:
        kind = body[0] if body else 0
        message = _REQUESTS.get(kind)
        if message is None:
            log.warning("framed socket: an unknown typed call %d: closed", kind)
            return None
        body = body[1:]
    request = message()
    try:
        request.ParseFromString(body)
    except DecodeError:
        log.warning("framed socket: a request that is not a %s: closed", message.__name__)
        return None
    return kind, request


async def _events(events: AsyncGenerator[Any, None], writer: asyncio.StreamWriter) -> bool:
    """Write each event as a frame (a full socket holds the stream back, as gRPC's flow
    control would); cancelled, it closes the events, which cancels the tool."""
    async with contextlib.aclosing(events) as stream:
        async for event in stream:
            body = event.SerializeToString()
            writer.write(len(body).to_bytes(HEADER_BYTES, "big") + body)
            await writer.drain()
    return True


async def _answer(call: Awaitable[Any], reader: asyncio.StreamReader) -> Any | None:
    """The call's reply; None when the supervisor closed the connection (or sent anything)
    before it ended: the call is cancelled, its command killed."""
    task = asyncio.ensure_future(call)
    gone = asyncio.ensure_future(reader.read(1))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # what has not finished is cancelled: the call when the supervisor went away first
        # (or the agent stops), the read when the call ended first
        for pending in (task, gone):
            if not pending.done():
                pending.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    if not gone.cancelled() or task.cancelled():
        return None
    return task.result()
