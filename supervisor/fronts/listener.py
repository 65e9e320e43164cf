"""The hardened HTTP/1.1 listener every HTTP front serves through ([http] in the config,
docs/security.md#the-http-listener): uvicorn's httptools protocol (llhttp, a C parser, which
refuses request smuggling: Content-Length with Transfer-Encoding, a bare CR or LF, a NUL in
the head) with the limits uvicorn lacks, all enforced before a request reaches an app:

- a head's bytes are counted as they arrive and fed to the parser no further than
  max_head_bytes (so a huge header value is refused at the limit, never joined in memory);
  the request line, the count of header fields and a chunked body's trailers likewise;
- a head must arrive within header_timeout_s of its first byte (or of the connection's
  start), a kept-alive connection is closed after idle_timeout_s, and after
  max_requests_per_connection its answer says `Connection: close`;
- connections per client address and per front are capped, and a new connection past a cap
  takes the place of the one that has waited longest with no request in progress (idle, or
  still sending its head), so idle or slow clients never lock a new one out; only when every
  connection has a request in progress is the new one answered 503;
- requests in progress (a head received, the answer not finished) are capped per front; an
  idle connection does not count.

Each refusal is an HTTP answer naming the limit, and the connection is closed.

What an answer writes in one turn of the event loop goes out in one write (`Corked`): uvicorn
writes a response's head and its body apart, a system call and a TCP segment each, which cost
the supervisor about as much CPU as the rest of a small answer's HTTP handling."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from stockade.supervisor.config import HttpConfig

BUSY_RETRY_S = 1
CORK_BYTES = 64 << 10
"""Bytes held for the end of the event loop's turn at most: past them, written at once (so a
fast producer meets the transport's flow control as without the cork)."""
LINGER_S = 2.0
"""How long a refused connection's input is still read (and dropped) before it closes."""


def address_key(host: str) -> str:
    """The client address connections are counted by: the address, an IPv6 one's /64."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is None:
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(getattr(address, "ipv4_mapped", None) or address)


class Listener:
    """What one front's connections share: the counts the caps apply to, the connections
    that may yield to a new one (oldest first), and how many of each refusal there were."""

    def __init__(self, limits: HttpConfig) -> None:
        self.limits = limits
        self.active = 0
        self.count = 0
        self.by_address: dict[str, set[GuardedProtocol]] = {}
        self.waiting: dict[GuardedProtocol, float] = {}
        """Connections with no request in progress, by when they began to wait (in order)."""
        self.refused: dict[str, int] = {}
        self._trusted = frozenset(address_key(a) for a in limits.trusted_proxies)

    def protocol(self) -> type[GuardedProtocol]:
        """The protocol class uvicorn makes each connection with, bound to this listener."""
        return type("Guarded", (GuardedProtocol,), {"listener": self})

    def admit(self, conn: GuardedProtocol) -> str | None:
        """Count a new connection (making room by closing a waiting one), or the reason it
        is refused."""
        group = self.by_address.setdefault(conn.address, set())
        if len(group) >= self.limits.max_connections_per_address and (
            conn.address not in self._trusted
        ):
            victim = min(group & self.waiting.keys(), key=self.waiting.__getitem__, default=None)
            if victim is None:
                return "too many connections from this address, each with a request in progress"
            victim.yield_place()
        if self.count >= self.limits.max_connections:
            victim = next(iter(self.waiting), None)
            if victim is None:
                return "the server is at its connection limit, each with a request in progress"
            victim.yield_place()
        group.add(conn)
        self.count += 1
        return None

    def leave(self, conn: GuardedProtocol) -> None:
        group = self.by_address.get(conn.address)
        if group is not None:
            group.discard(conn)
            if not group:
                del self.by_address[conn.address]
        self.waiting.pop(conn, None)
        self.count -= 1

    def wait(self, conn: GuardedProtocol) -> None:
        self.waiting.pop(conn, None)
        self.waiting[conn] = time.monotonic()

    def busy(self, conn: GuardedProtocol) -> None:
        self.waiting.pop(conn, None)

    def note(self, what: str) -> None:
        self.refused[what] = self.refused.get(what, 0) + 1


async def _busy(scope: Any, receive: Any, send: Any) -> None:
    """The answer past max_active_requests."""
    body = b"the server has too many requests in progress: try again shortly\n"
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(BUSY_RETRY_S).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Corked(asyncio.Transport):
    """A transport whose writes of one turn of the event loop go out as one: the first write
    of a turn schedules the flush (loop.call_soon: before the loop next waits for anything);
    closing, a half close or CORK_BYTES held flush at once, an abort drops what is held."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))
        self._size += len(data)
        if self._size >= CORK_BYTES:
            self.flush()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held.clear()
            self._size = 0
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held.clear()
        self._size = 0
        self._transport.abort()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol held to its Listener's limits."""

    listener: ClassVar[Listener]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        limits = self.listener.limits
        self.limit_concurrency = None  # uvicorn's counts idle connections: the Listener's
        self.timeout_keep_alive = limits.idle_timeout_s  # type: ignore[assignment]  # a float
        self.address = ""
        self._counted = False
        self._head_open = True  # waiting for (the rest of) a request head
        self._trailer_open = False  # a chunked body's last chunk: trailers may follow
        self._head_bytes = 0
        self._fields = 0
        self._requests = 0
        self._refusal: tuple[int, str] | None = None
        self._dropping = False  # refused: what the client still sends is dropped
        self._head_timer: asyncio.TimerHandle | None = None

    # the connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = Corked(transport, self.loop)  # what each request's cycle writes to
        self.address = address_key(self.client[0]) if self.client else ""
        refusal = self.listener.admit(self)
        if refusal is not None:
            self._refuse(503, refusal, "connections")
            return
        self._counted = True
        self.listener.wait(self)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        self._uncount()
        super().connection_lost(exc)

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self.listener.leave(self)

    def yield_place(self) -> None:
        """Close this waiting connection for a new one."""
        self.listener.note("yielded")
        self._uncount()
        self._disarm_head_timer()
        self._unset_keepalive_if_required()
        self.transport.close()

    def _refuse(self, status: int, message: str, what: str) -> None:
        """Answer `status` with `message` and close the connection: our side at once, then,
        after LINGER_S of reading and dropping what the client still sends (so that a reset
        does not destroy the answer before the client reads it), the whole."""
        self.listener.note(what)
        self._disarm_head_timer()
        self._unset_keepalive_if_required()
        self._dropping = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # its app, if it runs, answers no more
            self.cycle.message_event.set()
        body = message.encode() + b"\n"
        head = b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n" % len(body)
        self.transport.write(STATUS_LINE[status] + head + b"connection: close\r\n\r\n" + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    # the head's timer

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            timeout = self.listener.limits.header_timeout_s
            self._head_timer = self.loop.call_later(timeout, self._head_too_slow)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if not self._dropping and not self.transport.is_closing():
            seconds = self.listener.limits.header_timeout_s
            self._refuse(408, f"the request head did not arrive within {seconds:g} s", "slow")

    # bytes in

    def data_received(self, data: bytes) -> None:
        """Feed the parser, a head (or trailers) no further than max_head_bytes."""
        self._unset_keepalive_if_required()
        if self._dropping:
            return
        limit = self.listener.limits.max_head_bytes
        while data and not self._dropping and not self.transport.is_closing():
            piece = data
            if self._head_open or self._trailer_open:
                room = limit - self._head_bytes
                if room <= 0:
                    what = "request head is" if self._head_open else "chunked body's trailers are"
                    self._refuse(431, f"the {what} longer than {limit} bytes", "head")
                    return
                piece = data[:room]
                self._head_bytes += len(piece)
            data = data[len(piece) :]
            if not self._feed(piece):
                return

    def _feed(self, piece: bytes) -> bool:
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        except httptools.HttpParserError as exc:
            if self._refusal is not None:
                self._refuse(*self._refusal, "head")
            else:
                self._refuse(400, f"invalid HTTP request: {exc}", "invalid")
            return False
        return True

    # the parser's callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_open = True
        self._trailer_open = False
        self._fields = 0
        self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        limit = self.listener.limits.max_request_line_bytes
        if len(self.url) + len(url) > limit:
            self._refusal = (414, f"the request line exceeds {limit} bytes")
            raise ValueError(self._refusal[1])
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        limit = self.listener.limits.max_headers
        if self._fields > limit:
            self._refusal = (431, f"more than {limit} header fields")
            raise ValueError(self._refusal[1])
        if self._head_open:  # trailers are not added to a request its app already holds
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_open = False
        self._head_bytes = 0
        self._fields = 0
        self._disarm_head_timer()
        self.listener.busy(self)
        self._requests += 1
        super().on_headers_complete()
        if self._requests >= self.listener.limits.max_requests_per_connection:
            self.cycle.keep_alive = False

    def on_chunk_header(self) -> None:
        self._trailer_open = True  # until this chunk's data begins

    def on_body(self, body: bytes) -> None:
        self._trailer_open = False
        self._head_bytes = 0
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._head_open = True
        self._trailer_open = False
        self._head_bytes = 0
        self._fields = 0
        super().on_message_complete()

    # requests in progress

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """uvicorn's, counting the request in progress until its task ends (a request past
        max_active_requests is answered 503 instead)."""
        listener = self.listener
        if listener.active >= listener.limits.max_active_requests:
            listener.note("busy")
            app = _busy
        task = self.loop.create_task(cycle.run_asgi(app))
        listener.active += 1
        task.add_done_callback(self._finished)
        self.tasks.add(task)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.listener.active -= 1

    def on_response_complete(self) -> None:
        waiting = not self.pipeline  # else the next pipelined request starts now
        super().on_response_complete()
        if waiting and self._counted and not self.transport.is_closing():
            self.listener.wait(self)
