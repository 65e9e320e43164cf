"""Request bodies for the HTTP fronts, bounded before any work is done on them.

- Size: a declared Content-Length over the limit is refused before a byte is read, a body
  streamed past it as soon as it gets there; nothing is buffered beyond the limit.
- Content-Encoding: `gzip` (`x-gzip`, members in sequence) and `deflate` (zlib-wrapped, or raw
  as some clients send it) are decoded as they stream, never more than CHUNK bytes at a time,
  within the size limit and at most RATIO times the bytes received (past RATIO_SLACK): a
  bomb is refused after a few MiB of work. A truncated or invalid stream is refused (400),
  and so is data after its end; any other encoding (`br`, `zstd`, a list of several) is 415
  naming it. The E2B SDKs send gzip only, on `/files` uploads.
- JSON: an object nested deeper than MAX_DEPTH is refused (400), never a RecursionError.

Every refusal is a BodyRefused (an InvalidRequest, so a file transfer fed from a refused body
is cancelled, not committed) carrying its HTTP status. A front audits its refusals: its app
runs under BodyAudit, which leaves the front and the Refusals in the ASGI scope, and where a
BodyRefused is turned into an answer the front calls `tell` (one record per client address
and window with a count, observe/refusals.py; the path and status, never the body)."""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from starlette.requests import ClientDisconnect, HTTPConnection, Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from stockade.supervisor import errors
from stockade.supervisor.fronts.backoff import client_of
from stockade.supervisor.observe.refusals import Refusals

CHUNK = 1 << 20
"""The most bytes a decoder hands out at once."""
RATIO = 100
"""A compressed body may grow to at most this many times its size..."""
RATIO_SLACK = 4 << 20
"""...once past this many decoded bytes (small, repetitive bodies may compress better)."""
MAX_DEPTH = 64
"""The deepest nesting of arrays and objects a JSON body may have."""
ENCODINGS = ("gzip", "x-gzip", "deflate", "identity")


class BodyRefused(errors.InvalidRequest):
    """A request body refused: `status` is 400 (malformed), 413 (too large) or 415 (an
    encoding not taken)."""

    def __init__(self, status: int, message: str, why: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.why = why or message
        """The reason audited: the message, unless it quotes the body (a parser's error)."""


AUDIT = "stockade.body_audit"
"""The scope key where BodyAudit leaves (front, Refusals) for `tell`."""


class BodyAudit:
    """ASGI middleware of a front whose refused bodies are audited: puts the front's name and
    `refusals` in each HTTP request's scope (nothing when `refusals` is None)."""

    def __init__(self, app: ASGIApp, front: str, refusals: Refusals | None) -> None:
        self._app = app
        self._front = front
        self._refusals = refusals

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._refusals is not None:
            scope = {**scope, AUDIT: (self._front, self._refusals)}
        await self._app(scope, receive, send)


def tell(where: Scope | HTTPConnection, exc: BodyRefused) -> None:
    """Audit a refused body of the request (its scope, or a Request over it): the front, the
    client's address, the path and why; nothing when its front has no BodyAudit."""
    scope = where.scope if isinstance(where, HTTPConnection) else where
    found = scope.get(AUDIT)
    if found is None:
        return
    front, refusals = found
    refusals.body(front, client_of(scope), str(scope.get("path", "")), exc.status, exc.why)


def too_large(limit: int) -> BodyRefused:
    return BodyRefused(413, f"the request body exceeds {limit} bytes")


def declared_length(request: Request) -> int | None:
    raw = request.headers.get("content-length")
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 19:
        raise BodyRefused(400, "bad Content-Length")
    return int(raw)


class Decoder:
    """One request's Content-Encoding, decoded as it streams: `feed` each received chunk and
    take the pieces it yields, then `finish` (which refuses a stream that did not end).
    `limit`: the most decoded bytes (None: no cap but the ratio)."""

    def __init__(self, encoding: str, limit: int | None) -> None:
        name = encoding.strip().lower() or "identity"
        if name not in ENCODINGS:
            taken = ", ".join(ENCODINGS)
            raise BodyRefused(415, f"Content-Encoding {encoding[:64]!r} is not taken ({taken})")
        self.name = "gzip" if name == "x-gzip" else name
        self.limit = limit
        self.received = 0
        self.consumed = 0
        """Compressed bytes the decoder has taken so far (the ratio's base)."""
        self.decoded = 0
        self._z: Any = None
        self._head = b""
        """deflate: the first bytes, until they tell zlib from raw."""
        if self.name == "gzip":
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def feed(self, data: bytes) -> Iterator[bytes]:
        self.received += len(data)
        if self.name == "identity":
            self._grow(len(data))
            if data:
                yield data
            return
        if self._z is None:
            self._head += data
            if len(self._head) < 2:
                return
            data, self._head = self._head, b""
            wrapped = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._z = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        yield from self._inflate(data)

    def _inflate(self, data: bytes) -> Iterator[bytes]:
        while True:
            if self._z.eof:
                data = self._z.unused_data + data
                if not data:
                    return
                if self.name != "gzip":
                    raise BodyRefused(400, f"data after the end of the {self.name} stream")
                self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the next gzip member
            try:
                out = self._z.decompress(data, CHUNK)
            except zlib.error as exc:
                raise BodyRefused(400, f"the body is not valid {self.name}: {exc}") from None
            left = len(self._z.unconsumed_tail) + len(self._z.unused_data)
            self.consumed += len(data) - left
            self._grow(len(out))
            if out:
                yield out
            data = self._z.unconsumed_tail
            if not data and len(out) < CHUNK and not (self._z.eof and self._z.unused_data):
                return

    def _grow(self, n: int) -> None:
        self.decoded += n
        if self.limit is not None and self.decoded > self.limit:
            raise too_large(self.limit)
        if self.name != "identity" and self.decoded > max(RATIO_SLACK, RATIO * self.consumed):
            raise BodyRefused(
                413, f"the {self.name} body expands more than {RATIO}-fold: refused as a bomb"
            )

    def finish(self) -> None:
        if self.name == "identity":
            return
        if self._z is None or not self._z.eof:
            raise BodyRefused(400, f"the {self.name} stream is truncated")


async def body_stream(request: Request, limit: int | None) -> AsyncIterator[bytes]:
    """The request's body, decoded, in pieces of at most CHUNK bytes (as received when not
    encoded); BodyRefused past `limit` bytes received or decoded (None: no cap but the ratio
    of a compressed body), for an encoding not taken and for a stream that is cut short or
    invalid. Nothing is yielded before the Content-Length and the encoding are checked."""
    size = declared_length(request)
    if limit is not None and size is not None and size > limit:
        raise too_large(limit)
    decoder = Decoder(request.headers.get("content-encoding", ""), limit)
    chunks = aiter(request.stream())
    while True:
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            break
        except ClientDisconnect:
            raise BodyRefused(400, "the client went away before the body ended") from None
        if limit is not None and decoder.received + len(chunk) > limit:
            raise too_large(limit)
        for piece in decoder.feed(chunk):
            yield piece
    decoder.finish()


async def read_body(request: Request, limit: int) -> bytes:
    """The whole decoded body, at most `limit` bytes (BodyRefused otherwise)."""
    body = bytearray()
    async for piece in body_stream(request, limit):
        body.extend(piece)
    return bytes(body)


def loads(data: bytes | str) -> Any:
    """JSON (ValueError when it is not) nested at most MAX_DEPTH deep (BodyRefused 400)."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise _too_deep() from None
    if _depth_over(value, MAX_DEPTH):
        raise _too_deep()
    return value


def _too_deep() -> BodyRefused:
    return BodyRefused(400, f"the JSON is nested more than {MAX_DEPTH} levels deep")


def _depth_over(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest deeper than `limit` (iteratively: no recursion)."""
    level: list[Any] = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [
            v
            for item in level
            for v in (item.values() if isinstance(item, dict) else item)
            if isinstance(v, dict | list)
        ]
    return False


class PlainOnly:
    """ASGI middleware for a front whose clients send no Content-Encoding (MCP): a request
    with one other than identity is answered 415, as a JSON-RPC error naming it, before the
    app reads a byte of its body."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            encoding = dict(scope.get("headers", ())).get(b"content-encoding", b"identity")
            if encoding.strip().lower() not in (b"", b"identity"):
                name = encoding.decode("latin-1")[:64]
                message = f"Content-Encoding {name!r} is not taken: send the body as it is"
                error = {"code": -32600, "message": message}
                answer = JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, 415)
                tell(scope, BodyRefused(415, message))
                await answer(scope, receive, send)
                return
        await self._app(scope, receive, send)
