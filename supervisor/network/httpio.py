"""Byte plumbing for the intercepting relay (intercept.py): a buffered reader over any async
read, the sandbox side's TLS (a server-side ssl.SSLObject over the proxy's plain stream: the
ClientHello was already read to check its server name, so it is fed in first), HTTP/1.1 heads
and chunked framing, and the two stream filters: one that finds signs in a body on its way
out (keeping an overlap so a sign cut across reads is found) and one that masks the real
secrets in a response on its way back (same length, so the framing holds)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

from stockade.supervisor.policy.encodings import Forms

READ = 256 * 1024
"""Bytes asked for per read: big reads keep the per-call cost of Python small against TLS."""
MAX_LINE = 8 * 1024
MAX_TRAILER = 64 * 1024
LINGER_S = 2.0
LINGER_BYTES = 64 << 20
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""Control characters a head may not carry (tab, CR and LF are checked by place)."""


class HeadTooLarge(Exception):
    pass


class Malformed(Exception):
    """The peer broke HTTP/1.1 framing; the message says how."""


class Buffered:
    """Reads through `read(n)`; what was read past a head or a line is kept for the next."""

    def __init__(self, read: Callable[[int], Awaitable[bytes]]) -> None:
        self._read = read
        self._buf = bytearray()

    async def head(self, limit: int) -> bytes | None:
        """A whole head (through the blank line); None at a clean end before any byte."""
        start = 0
        while True:
            at = self._buf.find(b"\r\n\r\n", start)
            if at + 4 > limit:
                raise HeadTooLarge
            if at >= 0:
                head = bytes(self._buf[: at + 4])
                del self._buf[: at + 4]
                return head
            if len(self._buf) > limit:
                raise HeadTooLarge
            start = max(len(self._buf) - 3, 0)
            data = await self._read(READ)
            if not data:
                if self._buf.strip():
                    raise Malformed("the connection ended inside a head")
                return None
            self._buf += data

    async def line(self) -> bytes:
        while True:
            at = self._buf.find(b"\r\n")
            if at >= 0:
                line = bytes(self._buf[:at])
                del self._buf[: at + 2]
                return line
            if len(self._buf) > MAX_LINE:
                raise Malformed("a chunk line is too long")
            data = await self._read(READ)
            if not data:
                raise Malformed("the connection ended inside a chunked body")
            self._buf += data

    async def some(self, n: int) -> bytes:
        """Up to n bytes (b"" at the end), from what is buffered first."""
        if self._buf:
            data = bytes(self._buf[:n])
            del self._buf[:n]
            return data
        return await self._read(n)

    async def exactly(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            data = await self.some(n - len(out))
            if not data:
                raise Malformed("the connection ended inside a body")
            out += data
        return bytes(out)


async def linger(source: Buffered) -> None:
    """Read and drop what the sandbox still sends of a refused request (up to LINGER_BYTES or
    LINGER_S), so its writes are not reset before it reads the refusal."""
    left = LINGER_BYTES
    with contextlib.suppress(Exception):
        async with asyncio.timeout(LINGER_S):
            while left > 0 and (data := await source.some(READ)):
                left -= len(data)


class TLSServer:
    """The sandbox's TLS connection, terminated here with a minted leaf."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        context: ssl.SSLContext,
        hello: bytes,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_side=True)
        self._in.write(hello)
        self._ended = False

    async def handshake(self) -> None:
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                await self._writer.drain()
                if not await self._feed():
                    raise ConnectionError("the sandbox closed during the TLS handshake") from None
        self._flush()
        await self._writer.drain()

    async def _feed(self) -> bool:
        data = await self._reader.read(READ)
        if not data:
            self._in.write_eof()
            self._ended = True
            return False
        self._in.write(data)
        return True

    async def read(self, n: int) -> bytes:
        """Up to n bytes of plaintext (several TLS records when they are there), b"" at the
        end (a close_notify, or a plain close: either ends the stream)."""
        out = bytearray()
        while len(out) < n:
            try:
                data = self._tls.read(n - len(out))
                if not data:
                    break  # the TLS stream's end
                out += data
            except ssl.SSLWantReadError:
                if out or self._ended:
                    break
                self._flush()
                await self._feed()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break
        return bytes(out)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            done = self._tls.write(view)
            view = view[done:]
        self._flush()

    async def drain(self) -> None:
        await self._writer.drain()

    def _flush(self) -> None:
        pending = self._out.read()
        if pending:
            self._writer.write(pending)

    def close(self) -> None:
        with contextlib.suppress(ssl.SSLError):
            self._tls.unwrap()
        self._flush()


def parse_head(head: bytes) -> tuple[list[str], list[tuple[str, str]]]:
    """The start line's three parts and the header fields; Malformed when they are not
    HTTP/1.1's (obsolete line folding, spaces before a colon, control characters)."""
    text = head.decode("latin-1")
    if CONTROL.search(text):
        raise Malformed("control characters in the head")
    lines = text.split("\r\n")
    start = lines[0].split(" ", 2)
    if len(start) != 3:
        raise Malformed("the start line is not three parts")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or not name.isascii():
            raise Malformed(f"malformed header line {line[:80]!r}")
        if line[0] in " \t" or "\r" in line or "\n" in line:
            raise Malformed(f"malformed header line {line[:80]!r}")
        headers.append((name, value.strip(" \t")))
    return start, headers


def field(headers: list[tuple[str, str]], name: str) -> list[str]:
    return [v for k, v in headers if k.lower() == name]


def tokens(headers: list[tuple[str, str]], name: str) -> set[str]:
    return {t.strip().lower() for v in field(headers, name) for t in v.split(",") if t.strip()}


def framing(headers: list[tuple[str, str]]) -> int | None:
    """The body's length from Content-Length, None for chunked; Malformed for anything else
    (both given, other transfer codings, differing or bad lengths: how requests are
    smuggled)."""
    codings = [t.strip().lower() for v in field(headers, "transfer-encoding") for t in v.split(",")]
    lengths = {v.strip() for v in field(headers, "content-length")}
    if codings:
        if codings != ["chunked"]:
            raise Malformed(f"transfer coding {', '.join(codings)[:80]!r} is not relayed")
        if lengths:
            raise Malformed("both Transfer-Encoding and Content-Length")
        return None
    if not lengths:
        return 0
    if len(lengths) > 1:
        raise Malformed("differing Content-Length values")
    (text,) = lengths
    if not text.isdigit() or len(text) > 18:
        raise Malformed(f"bad Content-Length {text[:20]!r}")
    return int(text)


async def chunk_size(source: Buffered, trailer: bytearray | None = None) -> int:
    """The next chunk's size (0: the last; its trailer fields are read and dropped, kept in
    `trailer` when given, at most MAX_HEAD bytes of them)."""
    line = await source.line()
    text = line.split(b";", 1)[0].strip()
    if not text or len(text) > 15 or text.strip(b"0123456789abcdefABCDEF"):
        raise Malformed(f"bad chunk size {line[:20]!r}")
    size = int(text, 16)
    if size == 0:
        while field_line := await source.line():
            if trailer is not None:
                if len(trailer) + len(field_line) > MAX_TRAILER:
                    raise Malformed("the trailer fields are too large")
                trailer += field_line + b"\r\n"
    return size


async def chunk_end(source: Buffered) -> None:
    if await source.exactly(2) != b"\r\n":
        raise Malformed("a chunk does not end with CRLF")


class Masker:
    """Puts asterisks over every form of the real secrets (policy/encodings.py: the literal,
    base64 at each alignment, hex, percent, JSON and HTML escapes...) in a stream, same
    length, holding back the last (longest form - 1) bytes until more come or the stream
    ends, so a form cut across reads or chunks is masked whole. The bytes held are kept as
    they came (with the spans already found over them), so a longer form that a shorter one
    begins is still found whole: the stream comes out as the whole body masked at once."""

    def __init__(self, forms: Forms | list[bytes]) -> None:
        self._forms = forms if isinstance(forms, Forms) else Forms(forms)
        self._keep = max(self._forms.longest, 1) - 1
        self._held = b""
        self._marks: set[tuple[int, int]] = set()
        """Spans found over the held bytes (offsets in them)."""

    def feed(self, data: bytes) -> bytes:
        if not self._forms.patterns:
            return data
        window = self._held + data if self._held else data
        marks = self._marks | {(start, end) for start, end, _ in self._forms.spans(window)}
        cut = len(window) - self._keep
        if cut <= 0:
            self._held, self._marks = window, marks
            return b""
        self._held = window[cut:]
        self._marks = {(max(s - cut, 0), e - cut) for s, e in marks if e > cut}
        return _starred(window[:cut], marks)

    def flush(self) -> bytes:
        held, marks = self._held, self._marks
        self._held, self._marks = b"", set()
        return _starred(held, marks)


def _starred(data: bytes, spans: set[tuple[int, int]]) -> bytes:
    if not spans:
        return data
    out = bytearray(data)
    for start, end in spans:
        if start < len(out):
            out[start:end] = b"*" * (min(end, len(out)) - start)
    return bytes(out)


class Watch:
    """Looks for signs in a stream on its way out: `check(window)` sees each read with the
    bytes held back before it, and only what is past the overlap goes on, so a sign cut
    across reads is seen whole before any of it leaves."""

    def __init__(self, overlap: int, check: Callable[[bytes], str | None]) -> None:
        self._overlap = max(overlap, 0)
        self._check = check
        self._held = b""

    def feed(self, data: bytes) -> tuple[bytes, str | None]:
        """What may go on now, and the sign found (then nothing may go on)."""
        window = self._held + data if self._held else data
        found = self._check(window)
        if found is not None:
            return b"", found
        cut = len(window) - self._overlap
        if cut <= 0:
            self._held = window
            return b"", None
        self._held = window[cut:]
        return window[:cut], None

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held

    def check(self, data: bytes) -> str | None:
        """The sign in data that is not part of the stream (a chunked body's trailer)."""
        return self._check(data) if data else None


class Signed(Exception):
    """A sign found in a request body on its way out: the reason, as the watch said it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def hold(body: Body, watch: Watch, limit: int) -> tuple[bytes, bool]:
    """The body's first `limit` bytes (about) checked through `watch` before any of it leaves,
    and whether that was all of it (then its trailer is checked too); Signed when a sign is
    found."""
    held = bytearray()
    while len(held) < limit:
        piece = await body.next()
        if piece is None:
            if (found := watch.check(bytes(body.trailer))) is not None:
                raise Signed(found)
            return bytes(held + watch.flush()), True
        passed, found = watch.feed(piece)
        if found is not None:
            raise Signed(found)
        held += passed
    return bytes(held), False


async def send_rest(body: Body, watch: Watch, chunked: bool, writer: asyncio.StreamWriter) -> None:
    """The rest of a body past what `hold` kept, checked through `watch` and written framed
    (the last chunk too); Signed when a sign is found: the body then stays incomplete."""
    while (piece := await body.next()) is not None:
        passed, found = watch.feed(piece)
        if found is not None:
            raise Signed(found)
        if passed:
            writer.write(framed(passed, chunked, False))
            await writer.drain()
    if (found := watch.check(bytes(body.trailer))) is not None:
        raise Signed(found)
    writer.write(framed(watch.flush(), chunked, True))
    await writer.drain()


class Body:
    """A request body's pieces (chunked decoded), b"" never: None at its end."""

    def __init__(self, source: Buffered, length: int | None, idle: float) -> None:
        self._source = source
        self._left = length
        self._chunk = 0
        self._idle = idle
        self._done = length == 0
        self.trailer = bytearray()
        """A chunked body's trailer fields, once it has ended (never sent on)."""

    async def next(self) -> bytes | None:
        if self._done:
            return None
        if self._left is not None:  # Content-Length
            data = await asyncio.wait_for(self._source.some(min(self._left, READ)), self._idle)
            if not data:
                raise Malformed("the request body ended early")
            self._left -= len(data)
            self._done = self._left == 0
            return data
        if self._chunk == 0:
            self._chunk = await asyncio.wait_for(chunk_size(self._source, self.trailer), self._idle)
            if self._chunk == 0:
                self._done = True
                return None
        data = await asyncio.wait_for(self._source.some(min(self._chunk, READ)), self._idle)
        if not data:
            raise Malformed("the request body ended inside a chunk")
        self._chunk -= len(data)
        if self._chunk == 0:
            await asyncio.wait_for(chunk_end(self._source), self._idle)
        return data


async def response_pieces(
    source: Buffered, length: int | None, idle: float
) -> AsyncIterator[bytes]:
    """A response body's bytes as they come (chunked decoded; `length` -1: until the peer
    closes), each read within `idle` seconds."""
    if length is None:
        while size := await asyncio.wait_for(chunk_size(source), idle):
            while size:
                data = await asyncio.wait_for(source.some(min(size, READ)), idle)
                if not data:
                    raise Malformed("the response ended inside a chunk")
                size -= len(data)
                yield data
            await asyncio.wait_for(chunk_end(source), idle)
        return
    left = length
    while left:
        data = await asyncio.wait_for(source.some(READ if left < 0 else min(left, READ)), idle)
        if not data:
            if left < 0:
                return
            raise Malformed("the response ended early")
        if left > 0:
            left -= len(data)
        yield data


def framed(data: bytes, chunked: bool, last: bool) -> bytes:
    if not chunked:
        return data
    out = b"%x\r\n%b\r\n" % (len(data), data) if data else b""
    return out + b"0\r\n\r\n" if last else out


def masked(data: bytes, forms: Forms) -> bytes:
    return forms.mask(data)
