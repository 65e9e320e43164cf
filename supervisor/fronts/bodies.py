"""Request bodies for the HTTP fronts, bounded before any work is done on them.

- Size: a declared Content-Length over the limit is refused before a byte is read, a body
  streamed past it as soon as it gets there; nothing is buffered beyond the limit.
- Content-Encoding: `gzip` (`x-gzip`, members in sequence) and `deflate` (zlib-wrapped, or raw
  as some clients send it) are decoded as they stream (policy/compression.py, shared with the
  egress proxy), never more than CHUNK bytes at a time, within the size limit and at most
  RATIO times the bytes received (past RATIO_SLACK): a bomb is refused after a few MiB of
  work. A truncated or invalid stream is refused (400), and so is data after its end; any
  other encoding (`br`, `zstd`, a list of several) is 415 naming it. The E2B SDKs send gzip
  only, on `/files` uploads.
- JSON: an object nested deeper than MAX_DEPTH is refused (400), never a RecursionError.

Every refusal is a BodyRefused (an InvalidRequest, so a file transfer fed from a refused body
is cancelled, not committed) carrying its HTTP status. A front audits its refusals: its app
runs under BodyAudit, which leaves the front and the Refusals in the ASGI scope, and where a
BodyRefused is turned into an answer the front calls `tell` (one record per client address
and window with a count, observe/refusals.py; the path and status, never the body)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from starlette.requests import ClientDisconnect, HTTPConnection, Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from stockade.supervisor import errors
from stockade.supervisor.fronts.backoff import client_of
from stockade.supervisor.observe.refusals import Refusals
from stockade.supervisor.policy.compression import (
    CHUNK,
    RATIO,
    RATIO_SLACK,
    Inflater,
    Undecodable,
)

__all__ = [
    "AUDIT", "CHUNK", "ENCODINGS", "MAX_DEPTH", "RATIO", "RATIO_SLACK", "BodyAudit",
    "BodyRefused", "Decoder", "PlainOnly", "body_stream", "declared_length", "loads",
    "read_body", "tell", "too_large",
]  # fmt: skip
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
    """One request's Content-Encoding, decoded as it streams (policy/compression.py's
    Inflater, its refusals as a front answers them): `feed` each received chunk and take the
    pieces it yields, then `finish` (which refuses a stream that did not end). `limit`: the
    most decoded bytes (None: no cap but the ratio)."""

    def __init__(self, encoding: str, limit: int | None) -> None:
        try:
            self._inflater = Inflater(encoding, limit, ENCODINGS)
        except Undecodable:
            taken = ", ".join(ENCODINGS)
            raise BodyRefused(
                415, f"Content-Encoding {encoding[:64]!r} is not taken ({taken})"
            ) from None
        self.name = self._inflater.name
        self.limit = limit

    @property
    def received(self) -> int:
        return self._inflater.received

    @property
    def decoded(self) -> int:
        return self._inflater.decoded

    def feed(self, data: bytes) -> Iterator[bytes]:
        try:
            yield from self._inflater.feed(data)
        except Undecodable as exc:
            raise self._refused(exc) from None

    def finish(self) -> None:
        try:
            self._inflater.finish()
        except Undecodable as exc:
            raise self._refused(exc) from None

    def _refused(self, exc: Undecodable) -> BodyRefused:
        if exc.why == "too large" and self.limit is not None:
            return too_large(self.limit)
        return BodyRefused(413 if exc.why == "bomb" else 400, exc.message)


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
