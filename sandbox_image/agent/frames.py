"""The agent's framed socket: Invoke and InvokeStream without gRPC, for the supervisor on the
same host.

Beside its gRPC socket PATH, an agent on a unix socket serves PATH + FRAMES_SUFFIX, made
before the gRPC one (so a supervisor that got an answer to Hello finds it). Each message is
a 4-byte big-endian length and that many bytes: the supervisor sends an `InvokeRequest`, the
agent answers its `InvokeResponse`, one call at a time per connection, and a connection
serves call after call. A request whose length has STREAM_FLAG set is an InvokeStream (from
protocol 3, which Hello reports): the agent answers with `InvokeEvent` frames, the one with
the result last; an agent older than that reads the flag as a length over its limit and
closes the connection without running anything. What a unary gRPC call costs both processes
(HTTP/2 framing, the completion queue's threads and wake-ups) is most of a warm call's CPU;
this is one write and one read each way (docs/benchmarks.md, the supervisor's CPU per call).

The supervisor closing the connection while a call runs cancels the call, as a cancelled
RPC does: its command is killed (for a stream, as when its caller stops following). A message
over MAX_MESSAGE_BYTES, one that is not an `InvokeRequest`, or bytes sent during a call close
the connection. Everything else (Hello, files, watches, agents over TCP with mutual TLS) stays
on gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from stockade.agent.v1 import agent_pb2

log = logging.getLogger("stockade.agent")
FRAMES_SUFFIX = ".frames"
"""The framed socket's path is the gRPC socket's with this added."""
HEADER_BYTES = 4
STREAM_FLAG = 1 << 31
"""Set in a request's length: an InvokeStream (the length is the rest of the bits)."""

Invoke = Callable[[Any], Awaitable[Any]]
"""An InvokeRequest to its InvokeResponse (the gRPC servicer's Invoke without its context)."""
InvokeStream = Callable[[Any], AsyncGenerator[Any, None]]
"""An InvokeRequest to its InvokeEvents (the servicer's InvokeStream without its context)."""


async def serve_frames(
    path: Path, invoke: Invoke, max_bytes: int, invoke_stream: InvokeStream | None = None
) -> asyncio.Server | None:
    """Listen on `path` (replacing what is there); None, logged, when it cannot be made (the
    supervisor then uses gRPC for every call). Like the gRPC socket it belongs to the sandbox
    user (the agent's effective ids: identity.py), so code in the sandbox can call through
    either; each only runs tools as that user, which such code is already."""
    try:
        path.unlink(missing_ok=True)
        return await asyncio.start_unix_server(
            partial(_connection, invoke, invoke_stream, max_bytes), path=str(path)
        )
    except OSError as exc:
        log.warning("no framed socket at %s (calls go through gRPC): %s", path, exc)
        return None


async def _connection(
    invoke: Invoke,
    invoke_stream: InvokeStream | None,
    max_bytes: int,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    try:
        while (asked := await _request(reader, max_bytes, invoke_stream is not None)) is not None:
            request, stream = asked
            if stream:
                assert invoke_stream is not None
                if not await _answer(_events(invoke_stream(request), writer), reader):
                    return
                continue
            reply = await _answer(invoke(request), reader)
            if reply is None:
                return
            body = reply.SerializeToString()
            writer.write(len(body).to_bytes(HEADER_BYTES, "big") + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        return
    finally:
        writer.close()


async def _request(
    reader: asyncio.StreamReader, max_bytes: int, streams: bool
) -> tuple[Any, bool] | None:
    """The next request and whether it is a stream; None at the end of the connection or for
    a wrong message."""
    try:
        header = await reader.readexactly(HEADER_BYTES)
    except asyncio.IncompleteReadError:
        return None
    size = int.from_bytes(header, "big")
    stream = streams and bool(size & STREAM_FLAG)
    if stream:
        size &= ~STREAM_FLAG
    if size > max_bytes:
        log.warning("framed socket: a request of %d bytes (at most %d): closed", size, max_bytes)
        return None
    request = agent_pb2.InvokeRequest()
    try:
        request.ParseFromString(await reader.readexactly(size))
    except DecodeError:
        log.warning("framed socket: a request that is not an InvokeRequest: closed")
        return None
    return request, stream


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
