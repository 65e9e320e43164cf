"""The egress proxy: the only thing an `egress` sandbox can reach. One instance per sandbox,
served by the supervisor's event loop on a socket inside the sandbox's helper namespace.

It speaks HTTP proxy: CONNECT host:port (HTTPS; the TLS ClientHello must name the same host
in SNI, else the tunnel is closed before a byte reaches the upstream) and absolute-form
http:// requests (the Host header must name the URL's host; one request per connection).
It resolves names itself (the sandbox has no DNS), refuses IP addresses, ports and names
outside the allowlist, names that resolve to non-public addresses (unless pinned or
configured), and connections past the per-sandbox cap. Every decision is reported.

A CONNECT to a host some brokered secret may go to is not piped: intercept.py terminates its
TLS and relays its requests, putting real secrets where their placeholders are configured.
Everywhere the proxy can read (CONNECT targets, server names, plain http:// heads and
bodies) a placeholder of the sandbox's, or a sign the tripwire knows, refuses the request
(403) and sounds the alarm. A plain request's body is decoded from its framing (httpio.py,
as intercepted requests are) and searched with an overlap, its first HOLD bytes before the
upstream is dialled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from stockade.supervisor.config.allowlist import (
    MAX_NAME,
    Allowlist,
    AllowlistError,
    canonical_host,
    is_global,
    shown,
)
from stockade.supervisor.network import intercept, tls
from stockade.supervisor.network.brokered import (
    Broker,
    InjectionRecorder,
    find_placeholder,
    no_record,
)
from stockade.supervisor.network.httpio import (
    Body,
    Buffered,
    Malformed,
    Signed,
    Watch,
    field,
    framed,
    framing,
    hold,
    linger,
    parse_head,
    send_rest,
    tokens,
)
from stockade.supervisor.network.intercept import HOLD
from stockade.supervisor.network.mint import Authority
from stockade.supervisor.network.proxyhttp import (
    Refused,
    header_fields,
    reply,
    same_authority,
    split_authority,
)
from stockade.supervisor.observe.alarms import Alarm, AlarmSink, NoTripwire, Tripwire

log = logging.getLogger("stockade.egress")
MAX_HEAD = 64 * 1024
HEAD_TIMEOUT_S = 30.0
HELLO_TIMEOUT_S = 10.0
CHUNK = 64 * 1024
DROP_HEADERS = frozenset(
    {"proxy-connection", "proxy-authorization", "connection", "keep-alive", "te", "upgrade"}
)
"""Not passed on upstream (Host is written afresh from the URL)."""
REWRITTEN_HEADERS = DROP_HEADERS | {"host"}
BODY_FIELD = re.compile(rb"\r\n(?:content-length|transfer-encoding)[ \t]*:", re.IGNORECASE)
"""A head that announces a body (then a refusal waits for it before closing)."""
FRAMED_HEADERS = REWRITTEN_HEADERS | {"transfer-encoding", "content-length", "trailer", "expect"}
"""Not passed on with a plain request either: its body is framed afresh (trailers dropped),
and 100 Continue is answered here."""


@dataclass(frozen=True)
class ProxySettings:
    ports: frozenset[int]
    hosts: dict[str, str]
    """Pinned name -> address (canonical names)."""
    allow_private_addresses: bool
    max_connections: int
    connect_timeout_s: float
    idle_timeout_s: float


@dataclass(frozen=True)
class EgressDecision:
    sandbox_key: str
    method: str
    host: str
    port: int
    allowed: bool
    reason: str
    address: str = ""


Recorder = Callable[[EgressDecision], None]


def no_alarm(alarm: Alarm) -> None:
    """The default AlarmSink: nothing sounds."""


class EgressProxy:
    def __init__(
        self,
        key: str,
        allowlist: Allowlist,
        settings: ProxySettings,
        record: Recorder,
        *,
        broker: Broker | None = None,
        tripwire: Tripwire | None = None,
        alarm: AlarmSink = no_alarm,
        record_injection: InjectionRecorder = no_record,
        authority: Authority | None = None,
        upstream_context: ssl.SSLContext | None = None,
    ) -> None:
        """`broker`: the sandbox's brokered secrets (hosts they may go to are intercepted:
        then `authority`, the installation's CA, is needed); `upstream_context`: the TLS
        client side towards intercepted hosts (default: the host's trust store)."""
        self.key = key
        self.allowlist = allowlist
        self._settings = settings
        self._record = record
        self._broker = broker or Broker()
        self._tripwire: Tripwire = tripwire or NoTripwire()
        self._alarm = alarm
        self._record_injection = record_injection
        if self._broker.secrets and authority is None:
            raise ValueError("brokered secrets need the egress CA (authority) to intercept")
        self._authority = authority
        self._upstream_context = upstream_context
        self._open = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def open_connections(self) -> int:
        return self._open

    async def start(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_server(self._accept, sock=sock, limit=MAX_HEAD)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.serve_connection(reader, writer)

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One client connection of this sandbox, to its end (closed here): what this proxy's
        own socket serves, and what a listener shared by many sandboxes hands over once it
        knows whose a connection is (network/shared_proxy.py)."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        # asyncio sets TCP_NODELAY only on sockets made with proto IPPROTO_TCP, and the
        # listening socket made for us has proto 0: without it, a response written as head
        # and body waits ~40 ms for the sandbox's delayed ACK (Nagle)
        with contextlib.suppress(OSError, AttributeError):
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if self._open >= self._settings.max_connections:
                reason = f"connection cap ({self._settings.max_connections} open) reached"
                self._decide("", "", 0, False, reason)
                await reply(writer, 503, reason)
                return
            self._open += 1
            try:
                await self._serve(reader, writer)
            finally:
                self._open -= 1
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            await reply(writer, 431, "request head too large")
            return
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await reply(writer, 400, "not an HTTP/1 request")
            return
        method, target, version = parts
        try:
            self._check_signs(method, target, head)
            if method.upper() == "CONNECT":
                header_fields(lines[1:])
                await self._connect(target, reader, writer)
            else:
                await self._forward(method, target, version, head, reader, writer)
        except Refused as refused:
            await reply(writer, refused.status, refused.reason)
            if method.upper() != "CONNECT" and BODY_FIELD.search(head):
                await linger(Buffered(reader.read))  # the body: not reset before it is read

    def _check_signs(self, method: str, target: str, data: bytes | str, evidence: str = "") -> None:
        """Refused (403) when data carries a placeholder of this sandbox's (the alarm
        sounded) or a sign the tripwire knows (it sounds its own)."""
        raw = data.encode("utf-8", "replace") if isinstance(data, str) else data
        evidence = evidence or f"{method[:32]} {target[:300]}"
        secret = find_placeholder(self._broker, raw)
        if secret is not None:
            detail = (
                f"the placeholder of secret {secret.name!r} was in a proxy request "
                f"({evidence}) where the proxy cannot put the secret; refused"
            )
            self._alarm(Alarm(self.key, "placeholder", "egress", detail, evidence))
            reason = f"the placeholder of secret {secret.name!r} is not sent here"
            self._decide(method, target, 0, False, reason)
            raise Refused(403, reason)
        if self._tripwire.check(self.key, "egress", raw, evidence):
            reason = "refused by the egress proxy's policy"
            self._decide(method, target, 0, False, reason)
            raise Refused(403, reason)

    def _sign_in_body(self, method: str, name: str, data: bytes, evidence: str) -> str | None:
        """For a plain http:// request's body on its way: what _check_signs finds, recorded
        (the tunnel is then cut, the rest of the body never sent)."""
        try:
            self._check_signs(method, name, data, evidence)
        except Refused as refused:
            return refused.reason
        return None

    async def _connect(
        self, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        host, port = split_authority(target, default_port=None)
        name, address, why = await self._admit("CONNECT", host, port)
        if self._broker.intercepts(name):
            await self._intercept(name, port, address, why, reader, writer)
            return
        up_reader, up_writer = await self._open_upstream("CONNECT", name, port, address)
        try:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            try:
                hello = await asyncio.wait_for(tls.read_client_hello(reader), HELLO_TIMEOUT_S)
                sni = tls.server_name(hello)
            except tls.NotTLS as exc:
                self._decide("CONNECT", name, port, False, f"not TLS: {exc}", address)
                return
            except TimeoutError:
                reason = f"no TLS ClientHello within {HELLO_TIMEOUT_S:.0f} s"
                self._decide("CONNECT", name, port, False, reason, address)
                return
            if not self._server_name_matches(sni, name, port, address):
                return
            self._decide("CONNECT", name, port, True, why, address)
            up_writer.write(hello)
            await self._pipe(reader.read, writer, up_reader, up_writer)
        finally:
            up_writer.close()

    def _server_name_matches(self, sni: str | None, name: str, port: int, address: str) -> bool:
        if sni is None:
            self._decide("CONNECT", name, port, False, "no server name (SNI) in TLS", address)
            return False
        try:
            self._check_signs("CONNECT", f"{name}:{port} (TLS server name)", sni)
        except Refused:
            return False
        try:
            sni_name = canonical_host(sni)
        except AllowlistError:
            sni_name = sni
        if sni_name != name:
            reason = f"TLS server name {shown(sni)} does not match the CONNECT host"
            self._decide("CONNECT", name, port, False, reason, address)
            return False
        return True

    async def _intercept(
        self,
        name: str,
        port: int,
        address: str,
        why: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """A host with brokered secrets: TLS ends here and intercept.py relays requests."""
        assert self._authority is not None
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        try:
            hello = await asyncio.wait_for(tls.read_client_hello(reader), HELLO_TIMEOUT_S)
            sni = tls.server_name(hello)
        except (tls.NotTLS, TimeoutError) as exc:
            self._decide("CONNECT", name, port, False, f"not TLS: {exc or 'timed out'}", address)
            return
        if not self._server_name_matches(sni, name, port, address):
            return
        self._decide("CONNECT", name, port, True, f"{why}; intercepted (brokered)", address)
        if self._upstream_context is None:  # made once: it reads the host's trust store
            self._upstream_context = intercept.upstream_context()
        context = self._upstream_context
        job = intercept.Interception(
            key=self.key, name=name, port=port, address=address, broker=self._broker,
            tripwire=self._tripwire, alarm=self._alarm, record_injection=self._record_injection,
            authority=self._authority, upstream_context=context,
            connect_timeout_s=self._settings.connect_timeout_s,
            idle_timeout_s=self._settings.idle_timeout_s,
            decide=lambda method, allowed, reason: self._decide(
                method, name, port, allowed, reason, address
            ),
        )  # fmt: skip
        await intercept.serve(job, reader, writer, hello)

    async def _forward(
        self,
        method: str,
        target: str,
        version: str,
        head: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """A plain http:// request: its head checked (whole, before any of it leaves), its
        body decoded from its framing (Content-Length or chunked; none: no body, whatever the
        sandbox sends after it is searched and dropped) and checked whole up to HOLD bytes
        before the upstream is even dialled, past that behind an overlap (a sign then cuts the
        upstream's request short); one request per connection."""
        url = urlsplit(target)
        if url.scheme.lower() != "http" or not url.netloc:
            reason = "only absolute http:// requests and CONNECT are proxied"
            self._decide(method, "", 0, False, reason)
            raise Refused(400, reason)
        host, port = split_authority(url.netloc, default_port=80)
        headers, length = self._framing(method, host, port, head)
        given = field(headers, "host")
        if len(given) > 1 or (given and not same_authority(given[0], host, port)):
            reason = (
                f"Host header {shown(', '.join(given))} does not match the request's host "
                f"{shown(host)}"
            )
            self._decide(method, host, port, False, reason)
            raise Refused(400, reason)
        name, address, why = await self._admit(method, host, port)
        source = Buffered(reader.read)
        if "100-continue" in tokens(headers, "expect") and length != 0:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # held here: Expect is not sent on
            await writer.drain()
        body = Body(source, length, self._settings.idle_timeout_s)
        evidence = f"{method[:32]} {target[:300]} (body)"
        watch = Watch(self._overlap(), self._body_check(method, name, evidence))
        try:
            held, done = await hold(body, watch, HOLD)
        except Signed as signed:
            raise Refused(403, signed.reason) from None
        except Malformed as exc:
            self._decide(method, name, port, False, str(exc), address)
            raise Refused(400, str(exc)) from None
        up_reader, up_writer = await self._open_upstream(method, name, port, address)
        try:
            self._decide(method, name, port, True, why, address)
            path = url.path or "/"
            if url.query:
                path += "?" + url.query
            chunked = length is None
            kept = [(k, v) for k, v in headers if k.lower() not in FRAMED_HEADERS]
            kept.append(
                ("Transfer-Encoding", "chunked") if chunked else ("Content-Length", f"{length}")
            )
            out = [f"{method} {path} {version}", f"Host: {url.netloc}"]
            out += [f"{k}: {v}" for k, v in kept] + ["Connection: close", "", ""]
            up_writer.write("\r\n".join(out).encode("latin-1") + framed(held, chunked, done))
            if not done:
                try:
                    await send_rest(body, watch, chunked, up_writer)
                except (Signed, Malformed) as exc:
                    up_writer.transport.abort()  # the request stays incomplete there
                    raise Refused(403 if isinstance(exc, Signed) else 400, str(exc)) from None
            await up_writer.drain()
            evidence = f"{method[:32]} {target[:300]} (sent after the request's end)"
            after = Watch(self._overlap(), self._body_check(method, name, evidence))
            await self._pipe(source.some, writer, up_reader, up_writer, after, relay=False)
        finally:
            up_writer.close()

    def _framing(
        self, method: str, host: str, port: int, head: bytes
    ) -> tuple[list[tuple[str, str]], int | None]:
        """The head's header fields and the body's length (None: chunked); refused (400) as
        the intercepting relay refuses them: control bytes, a bare CR, folded lines, both
        Content-Length and Transfer-Encoding, codings other than chunked, chunked in
        HTTP/1.0."""
        try:
            (_method, _target, version), headers = parse_head(head)
            length = framing(headers)
            if length is None and version != "HTTP/1.1":
                raise Malformed(f"Transfer-Encoding in an {version[:20]} request")
        except Malformed as exc:
            self._decide(method, host, port, False, str(exc))
            raise Refused(400, str(exc)) from None
        return headers, length

    def _overlap(self) -> int:
        longest = max((len(s.placeholder) for s in self._broker.secrets), default=0)
        return max(longest, self._tripwire.longest, 1) - 1

    def _body_check(self, method: str, name: str, evidence: str) -> Callable[[bytes], str | None]:
        return lambda window: self._sign_in_body(method, name, window, evidence)

    async def _admit(self, method: str, host: str, port: int) -> tuple[str, str, str]:
        """The canonical name, the address to connect to and why it is allowed, or Refused
        (recorded)."""
        decision = self.allowlist.decide(host, port)
        if not decision.allowed:
            self._decide(method, host, port, False, decision.reason)
            raise Refused(403, decision.reason)
        name = decision.name
        pinned = self._settings.hosts.get(name)
        if pinned:
            return name, pinned, decision.reason
        try:
            found = await asyncio.get_running_loop().getaddrinfo(
                name, port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            reason = f"cannot resolve {name}: {exc}"
            self._decide(method, name, port, False, reason)
            raise Refused(502, reason) from exc
        addresses = [str(info[4][0]) for info in found]
        usable = [a for a in addresses if self._settings.allow_private_addresses or is_global(a)]
        if not usable:
            reason = f"{name} resolves only to non-public addresses ({', '.join(addresses)})"
            self._decide(method, name, port, False, reason)
            raise Refused(403, reason)
        return name, usable[0], decision.reason

    async def _open_upstream(
        self, method: str, name: str, port: int, address: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(address, port, limit=CHUNK),
                self._settings.connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            reason = f"cannot connect to {name}:{port} ({address}): {exc or 'timed out'}"
            self._decide(method, name, port, False, reason, address)
            raise Refused(502, reason) from exc

    async def _pipe(
        self,
        read: Callable[[int], Awaitable[bytes]],
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        watch: Watch | None = None,
        relay: bool = True,
    ) -> None:
        """Copy both ways until both sides are done or nothing moves for the idle timeout;
        what the sandbox sends (`read`) through `watch` when given (a sign found ends the
        tunnel), and not relayed when `relay` is False (after a plain request's end)."""
        last = [time.monotonic()]
        idle = self._settings.idle_timeout_s

        async def copy(
            read: Callable[[int], Awaitable[bytes]],
            dst: asyncio.StreamWriter | None,
            watch: Watch | None = None,
        ) -> None:
            while True:
                try:
                    data = await asyncio.wait_for(read(CHUNK), idle)
                except TimeoutError:
                    if time.monotonic() - last[0] < idle:
                        continue
                    raise
                if watch is not None and data:
                    data, found = watch.feed(data)
                    if found is not None:
                        raise ConnectionAbortedError(found)
                    if not data:
                        continue  # all held back as overlap, for now
                elif watch is not None and dst is not None:
                    dst.write(watch.flush())
                if not data:
                    if dst is not None and dst.can_write_eof():
                        dst.write_eof()
                    return
                last[0] = time.monotonic()
                if dst is not None:
                    dst.write(data)
                    await dst.drain()

        tasks = [
            asyncio.ensure_future(copy(read, up_writer if relay else None, watch)),
            asyncio.ensure_future(copy(up_reader.read, writer)),
        ]
        try:  # a reset or an idle timeout on either side ends the tunnel
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _decide(
        self, method: str, host: str, port: int, allowed: bool, reason: str, address: str = ""
    ) -> None:
        # what the sandbox sent is bounded before it reaches the log and the audit record
        host, method = host[: MAX_NAME + 1], method[:32]
        decision = EgressDecision(self.key, method, host, port, allowed, reason, address)
        log.info(
            "egress %s %s %s:%s %s",
            "allow" if allowed else "deny",
            method,
            host,
            port,
            reason,
        )
        self._record(decision)
