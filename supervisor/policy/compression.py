"""Content codings decoded as they stream, within a size and a ratio: what a front does with a
compressed request body (fronts/bodies.py) and the egress proxy with a compressed response it
must mask (network/intercept.py). Pure code over bytes: each user turns `Undecodable` into its
own answer (a 400, 413 or 415 for a front; a 502 for the proxy).

- `gzip` (`x-gzip`, members in sequence), `deflate` (zlib-wrapped, or raw as some peers send
  it) and `br` are decoded never more than about CHUNK bytes at a time;
- at most `limit` decoded bytes, and at most RATIO times the compressed bytes taken (past
  RATIO_SLACK): a bomb is refused after a few MiB of work;
- a truncated or invalid stream, data after its end, and any coding not in `taken` (`zstd`,
  `compress`, a list of several) are refused, saying which.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Iterator
from typing import Any, Literal

import brotli

__all__ = ["CHUNK", "CODINGS", "RATIO", "RATIO_SLACK", "Inflater", "Undecodable"]

CHUNK = 1 << 20
"""The most bytes a decoder hands out at once (brotli's may overshoot it by a buffer)."""
RATIO = 100
"""A compressed stream may grow to at most this many times its size..."""
RATIO_SLACK = 4 << 20
"""...once past this many decoded bytes (small, repetitive bodies may compress better)."""
CODINGS = ("gzip", "x-gzip", "deflate", "br", "identity")

Why = Literal["unknown", "invalid", "truncated", "too large", "bomb"]


class Undecodable(Exception):
    """A stream refused: `why` says how (for the caller's status), the message says it in
    words that name the coding but never quote the data."""

    def __init__(self, why: Why, message: str) -> None:
        super().__init__(message)
        self.why = why
        self.message = message


class Inflater:
    """One stream's Content-Encoding, decoded as it comes: `feed` each piece received and take
    the pieces it yields, then `finish` (which refuses a stream that did not end). `limit`: the
    most decoded bytes (None: no cap but the ratio); `taken`: the codings accepted."""

    def __init__(self, encoding: str, limit: int | None, taken: Collection[str] = CODINGS) -> None:
        name = encoding.strip().lower() or "identity"
        if name not in taken:
            raise Undecodable("unknown", f"Content-Encoding {encoding[:64]!r} is not decoded")
        self.name = "gzip" if name == "x-gzip" else name
        self.limit = limit
        self.received = 0
        self.consumed = 0
        """Compressed bytes the decoder has taken so far (the ratio's base)."""
        self.decoded = 0
        self._z: Any = None
        self._br: brotli.Decompressor | None = None
        self._head = b""
        """deflate: the first bytes, until they tell zlib from raw."""
        if self.name == "gzip":
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif self.name == "br":
            self._br = brotli.Decompressor()

    def feed(self, data: bytes) -> Iterator[bytes]:
        self.received += len(data)
        if self.name == "identity":
            self._grow(len(data))
            if data:
                yield data
            return
        if self._br is not None:
            yield from self._unbrotli(data)
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
                    raise Undecodable("invalid", f"data after the end of the {self.name} stream")
                self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the next gzip member
            try:
                out = self._z.decompress(data, CHUNK)
            except zlib.error as exc:
                raise Undecodable("invalid", f"the body is not valid {self.name}: {exc}") from None
            left = len(self._z.unconsumed_tail) + len(self._z.unused_data)
            self.consumed += len(data) - left
            self._grow(len(out))
            if out:
                yield out
            data = self._z.unconsumed_tail
            if not data and len(out) < CHUNK and not (self._z.eof and self._z.unused_data):
                return

    def _unbrotli(self, data: bytes) -> Iterator[bytes]:
        assert self._br is not None
        if not data:
            return
        if self._br.is_finished():
            raise Undecodable("invalid", "data after the end of the br stream")
        self.consumed += len(data)  # brotli keeps what it has not used: all of it is taken
        while True:
            try:
                out = self._br.process(data, output_buffer_limit=CHUNK)
            except brotli.error as exc:
                raise Undecodable("invalid", f"the body is not valid br: {exc}") from None
            data = b""
            self._grow(len(out))
            if out:
                yield out
            if self._br.can_accept_more_data():
                return

    def _grow(self, n: int) -> None:
        self.decoded += n
        if self.limit is not None and self.decoded > self.limit:
            raise Undecodable("too large", f"the body exceeds {self.limit} bytes")
        if self.name != "identity" and self.decoded > max(RATIO_SLACK, RATIO * self.consumed):
            raise Undecodable(
                "bomb", f"the {self.name} body expands more than {RATIO}-fold: refused as a bomb"
            )

    def finish(self) -> None:
        if self.name == "identity":
            return
        ended = self._br.is_finished() if self._br is not None else (self._z and self._z.eof)
        if not ended:
            raise Undecodable("truncated", f"the {self.name} stream is truncated")
