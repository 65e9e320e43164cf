"""The supervisor's end of the agent's framed socket (stockade/agent/frames.py): unary Invoke
as a 4-byte length and a protobuf message each way, over unix-socket connections kept for
call after call, instead of a gRPC call (most of a warm call's CPU on both sides:
docs/benchmarks.md, the supervisor's CPU per call); InvokeStream (an agent of protocol 3
or later), a request with STREAM_FLAG in its length answered by event frames, the result last;
and from protocol 4 every other call as a typed frame (TYPED_FLAG, its first byte the call):
Hello and Inspect (`call`), Download and WatchFiles (`stream`), Upload (`upload`: its chunks,
then an empty frame, then the reply).

Nothing here is trusted more than on gRPC: a reply's length is checked before it is read
(over the limit: FrameTooLarge, the connection closed), the caller's timeout bounds the
whole call (FrameDeadline), a connection that ends mid-call is FrameLost, and the bytes go
to the same parsing and checks as a gRPC reply (agent_link.py, replies.py). A call that is
cancelled or fails closes its connection, which cancels it in the agent (its command is
killed); only a connection whose call ended well is used again (a stream: one whose caller
read it to its result, FramedStream.end). A stream's timeout bounds it whole, reads and the
time its caller spends between them: at the deadline its connection is closed. An agent
without the socket (an image older than it, or one that could not make it), or a path that is
not a socket in the run folder sealed to root (a symlink the agent made before the seal), is
FramesAbsent: its calls go through gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TypeVar

FRAMES_SUFFIX = ".frames"
"""As stockade/agent/frames.py (which this layer does not import)."""
HEADER_BYTES = 4
STREAM_FLAG = 1 << 31
"""As stockade/agent/frames.py: set in a request's length, an InvokeStream."""
TYPED_FLAG = 1 << 30
"""As stockade/agent/frames.py: set in a request's length, a typed call (its first byte)."""
HELLO, INSPECT, UPLOAD, DOWNLOAD, WATCH = 1, 2, 3, 4, 5
"""The typed calls, as stockade/agent/frames.py."""
MAX_IDLE = 4
"""Connections kept for later calls; more calls at once open more, closed after."""

_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
_T = TypeVar("_T")


class FramesAbsent(Exception):
    """No framed socket answers: use gRPC."""


class FrameDeadline(Exception):
    """The call did not end within its timeout."""


class FrameLost(Exception):
    """The connection ended or failed during the call."""


class FrameTooLarge(Exception):
    """The reply is longer than the limit."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"Received message larger than max ({size} vs. {limit})")


class FramedInvoke:
    def __init__(self, path: Path, max_reply_bytes: int) -> None:
        self.path = path
        self._max = max_reply_bytes
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()
        self._closed = False

    async def call(
        self, request: bytes, timeout: float, typed: int = 0, sealed: bool = True
    ) -> bytes:
        """The reply's bytes to `request`'s (an Invoke, or the `typed` call's), within
        `timeout` seconds. `sealed` False: the folder need not be root's yet (the greeting
        of an agent that just started, before layout.seal_run_dir; the socket must still be
        a socket)."""
        connection = await self._connection(sealed)
        reader, writer = connection
        self._busy.add(connection)
        ended = False
        try:
            async with asyncio.timeout(timeout):
                await _send(writer, *_framed(request, typed))
                reply = await _receive(reader, self._max)
            ended = True
            return reply
        except TimeoutError:
            raise FrameDeadline("Deadline Exceeded") from None
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            raise FrameLost(f"the agent's framed socket closed during the call: {exc}") from exc
        finally:
            self._done(connection, ended)

    async def stream(self, request: bytes, timeout: float | None, typed: int = 0) -> FramedStream:
        """Send `request` as an InvokeStream (or the `typed` call: Download, WatchFiles); its
        frames are read from what this returns. No timeout: until the caller closes it."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        connection = await self._connection()
        self._busy.add(connection)
        stream = FramedStream(self, connection, deadline, self._max)
        try:
            if typed:
                await stream.send(*_framed(request, typed))
            else:
                await stream.send(len(request) | STREAM_FLAG, request)
        except BaseException:
            stream.close()
            raise
        return stream

    async def upload(self, header: bytes, chunks: AsyncIterator[bytes], timeout: float) -> bytes:
        """An Upload: the `header` chunk, each of `chunks` (serialized UploadChunks), the empty
        frame that ends them; the reply's bytes, all within `timeout` seconds. A failure of
        `chunks` (the client's stream) closes the connection, which ends the upload in the
        agent without a file."""
        connection = await self._connection()
        reader, writer = connection
        self._busy.add(connection)
        ended = False
        try:
            async with asyncio.timeout(timeout):
                await _io(_send(writer, *_framed(header, UPLOAD)))
                # what `chunks` raises is its caller's, passed on as it is: not the agent's
                async for chunk in chunks:
                    await _io(_send(writer, len(chunk), chunk))
                await _io(_send(writer, 0, b""))
                reply = await _io(_receive(reader, self._max))
            ended = True
            return reply
        except TimeoutError:
            raise FrameDeadline("Deadline Exceeded") from None
        finally:
            self._done(connection, ended)

    def _done(self, connection: _Connection, ended: bool) -> None:
        """Keep a connection whose call ended well for the next; close any other."""
        self._busy.discard(connection)
        if ended and not self._closed and len(self._idle) < MAX_IDLE:
            self._idle.append(connection)
        else:
            connection[1].close()

    async def _connection(self, sealed: bool = True) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if _open(connection):
                return connection
            connection[1].close()  # the agent ended it meanwhile
        try:
            here, folder = os.lstat(self.path), os.lstat(self.path.parent)
        except OSError as exc:  # none there: an older agent
            raise FramesAbsent(str(exc)) from exc
        # as the gRPC socket (layout.seal_run_dir): a socket itself, not a link the agent made
        # to steer the supervisor elsewhere, in a folder only root can change any more
        if not stat.S_ISSOCK(here.st_mode) or (sealed and folder.st_uid != 0):
            raise FramesAbsent(f"{self.path} is not a socket in a folder sealed to root")
        try:
            return await asyncio.open_unix_connection(str(self.path))
        except OSError as exc:  # refused (nobody listens), or too long a path
            raise FramesAbsent(str(exc)) from exc

    def connected(self) -> bool:
        """Whether a connection is open, idle or serving a call (the agent answered on it,
        and has not closed it since): as a gRPC channel's READY, which calls in flight keep
        so too (a channel multiplexes them; here each takes a connection of its own)."""
        return any(map(_open, self._idle)) or any(map(_open, self._busy))

    def close(self) -> None:
        """Close every connection: calls on them end with FrameLost."""
        self._closed = True
        for _, writer in [*self._idle, *self._busy]:
            with contextlib.suppress(Exception):
                writer.close()
        self._idle.clear()


class FramedStream:
    """One InvokeStream's frames: `next` each, `end` once the caller read the result (the
    connection is then kept), `close` always (any other connection is closed, which cancels
    the call in the agent)."""

    def __init__(
        self, owner: FramedInvoke, connection: _Connection, deadline: float | None, limit: int
    ) -> None:
        self._owner = owner
        self._reader, self._writer = connection
        self._connection = connection
        self._deadline = deadline
        self._max = limit
        self._open = True
        loop = asyncio.get_running_loop()
        # a caller that stops reading (a client no longer following) is bound too
        self._timer = None if deadline is None else loop.call_at(deadline, self._writer.close)

    async def send(self, size: int, request: bytes) -> None:
        async with self._failures():
            await _send(self._writer, size, request)

    async def next(self) -> bytes:
        """The next frame's bytes."""
        async with self._failures():
            return await _receive(self._reader, self._max)

    def end(self) -> None:
        """The caller read the stream's result: the connection may serve another call."""
        if self._open:
            self._open = False
            if self._timer is not None:
                self._timer.cancel()
            self._owner._done(self._connection, not self._writer.is_closing())

    def close(self) -> None:
        """Close the connection unless the stream ended (`end`): the agent cancels the call."""
        if self._open:
            self._open = False
            if self._timer is not None:
                self._timer.cancel()
            self._owner._done(self._connection, False)

    def _past(self) -> bool:
        return self._deadline is not None and asyncio.get_running_loop().time() >= self._deadline

    @contextlib.asynccontextmanager
    async def _failures(self) -> AsyncIterator[None]:
        try:
            if self._past():
                raise TimeoutError
            async with asyncio.timeout_at(self._deadline):
                yield
        except TimeoutError:
            raise FrameDeadline("Deadline Exceeded") from None
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            if self._past():
                raise FrameDeadline("Deadline Exceeded") from None
            raise FrameLost(f"the agent's framed socket closed during the call: {exc}") from exc


def _open(connection: _Connection) -> bool:
    reader, writer = connection
    return not reader.at_eof() and not writer.is_closing()


async def _io(step: Awaitable[_T]) -> _T:
    """A step on the socket; its failure as FrameLost."""
    try:
        return await step
    except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
        raise FrameLost(f"the agent's framed socket closed during the call: {exc}") from exc


def _framed(request: bytes, typed: int) -> tuple[int, bytes]:
    """The header and body of `request`: as it is, or as the `typed` call's."""
    if not typed:
        return len(request), request
    return (len(request) + 1) | TYPED_FLAG, bytes([typed]) + request


async def _send(writer: asyncio.StreamWriter, header: int, body: bytes) -> None:
    """One frame: `header` (the length, maybe with STREAM_FLAG) and `body`."""
    writer.write(header.to_bytes(HEADER_BYTES, "big") + body)
    await writer.drain()


async def _receive(reader: asyncio.StreamReader, limit: int) -> bytes:
    """One frame's bytes; its length is checked against `limit` before they are read."""
    size = int.from_bytes(await reader.readexactly(HEADER_BYTES), "big")
    if size > limit:
        raise FrameTooLarge(size, limit)
    return await reader.readexactly(size)
