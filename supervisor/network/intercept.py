"""The intercepting relay: for a host some brokered secret may go to, the egress proxy hands
the sandbox's CONNECT tunnel here instead of piping it. TLS from the sandbox ends here (a leaf
minted by the installation's CA, which the sandbox trusts); a TLS connection of our own goes
to the real host (verified against the host's trust store, or the configured upstream CA);
HTTP/1.1 requests are relayed between them, kept alive, bodies streamed both ways.

Per request: a placeholder in its secret's configured place (the named header in the
template's shape, or HTTP basic auth) on a host the secret allows is replaced with the real
value, and the injection recorded (never the value). A placeholder anywhere else (the request
line, another header, the body, a host the secret may not go to) refuses the request with a
403 and sounds an alarm; the upstream sees none of it (bodies are checked whole up to HOLD
bytes before the request leaves, past that an overlap is held back and the upstream
connection cut). The tripwire (honeytokens) sees heads and bodies the same way. Real values
in responses are masked in every encoding policy/encodings.py knows (base64, hex, percent, JSON
and HTML escapes...; same length, so framing holds); Accept-Encoding is replaced with
identity so bodies come uncompressed and can be scanned, and one compressed all the same
(gzip, deflate, br) is decoded within policy/compression.py's limits, masked and passed on
plain (any other coding: a 502, never a body passed on unmasked). Upgrades are refused."""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from stockade.supervisor.config.allowlist import AllowlistError, canonical_host
from stockade.supervisor.network.brokered import (
    Broker,
    BrokeredSecret,
    Injected,
    InjectionRecorder,
    basic_decoded,
    find_placeholder,
    inject,
)
from stockade.supervisor.network.httpio import (
    READ,
    Body,
    Buffered,
    HeadTooLarge,
    Malformed,
    Masker,
    Signed,
    TLSServer,
    Watch,
    field,
    framed,
    framing,
    hold,
    linger,
    masked,
    parse_head,
    response_pieces,
    send_rest,
    tokens,
)
from stockade.supervisor.network.mint import Authority
from stockade.supervisor.observe.alarms import MAX_EVIDENCE, Alarm, AlarmSink, Tripwire
from stockade.supervisor.policy.compression import Inflater, Undecodable
from stockade.supervisor.policy.encodings import Forms

MAX_HEAD = 64 * 1024
HOLD = 1 << 20
"""Body bytes checked whole before a request goes upstream (a refused request then leaves
nothing there); a longer body is streamed behind an overlap."""
HANDSHAKE_TIMEOUT_S = 10.0
REQUEST_DROP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
     "upgrade", "accept-encoding", "expect", "transfer-encoding", "content-length"}
)  # fmt: skip
RESPONSE_DROP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade",
     "transfer-encoding"}
)  # fmt: skip
DECODED_DROP = RESPONSE_DROP | {"content-encoding", "content-length"}
"""Not passed on with a response decoded here (its framing is written afresh)."""
DECODED_HOLD = 8 << 20
"""Decoded bytes of a compressed response held before its head goes on: past the ratio's
slack (policy/compression.py RATIO_SLACK), so a bomb is a 502, not a cut response."""
DECODED_LIMIT = 1 << 30
"""The most bytes one compressed response may decode to."""
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
METHOD = re.compile(r"[A-Z][A-Z0-9_-]{0,31}")
STATUS = re.compile(r"HTTP/1\.[01] [1-5][0-9][0-9](?: .*)?")
PHRASES = {400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large", 501: "Not Implemented", 502: "Bad Gateway",
           505: "HTTP Version Not Supported"}  # fmt: skip
Decide = Callable[[str, bool, str], None]
"""Records an egress decision (method, allowed, reason) for this tunnel's host and port."""


@dataclass(frozen=True)
class Interception:
    key: str
    name: str
    """The canonical host name (the CONNECT target, the SNI)."""
    port: int
    address: str
    broker: Broker
    tripwire: Tripwire
    alarm: AlarmSink
    record_injection: InjectionRecorder
    authority: Authority
    upstream_context: ssl.SSLContext
    connect_timeout_s: float
    idle_timeout_s: float
    decide: Decide


class Refusal(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _Stale(Exception):
    """The upstream closed a kept-alive connection before answering."""


class _Closed(Exception):
    """The exchange cannot go on (a peer broke off mid-response): close the tunnel."""


def upstream_context(ca_file: str | None = None) -> ssl.SSLContext:
    """The proxy's TLS client side: the host's trust store, plus `ca_file` when given (the
    tests' own upstream CA); HTTP/1.1 only."""
    context = ssl.create_default_context()
    if ca_file:
        context.load_verify_locations(ca_file)
    context.set_alpn_protocols(["http/1.1"])
    return context


async def serve(
    job: Interception, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hello: bytes
) -> None:
    """Terminate the sandbox's TLS (its ClientHello already read) and relay its requests until
    either side closes or nothing moves for the idle timeout."""
    tls = TLSServer(reader, writer, job.authority.context_for(job.name), hello)
    try:
        await asyncio.wait_for(tls.handshake(), HANDSHAKE_TIMEOUT_S)
    except (ssl.SSLError, ConnectionError, TimeoutError) as exc:
        job.decide("CONNECT", False, f"TLS with the sandbox failed: {exc or 'timed out'}")
        return
    relay = _Relay(job, tls)
    try:
        await relay.run()
    except (_Closed, ssl.SSLError, Malformed, TimeoutError):
        pass
    finally:
        relay.close_upstream()
        with contextlib.suppress(Exception):
            tls.close()


class _Relay:
    def __init__(self, job: Interception, tls: TLSServer) -> None:
        self.job = job
        self.tls = tls
        self.client = Buffered(tls.read)
        self.up: tuple[Buffered, asyncio.StreamWriter, asyncio.StreamReader] | None = None
        self.forms = Forms([])
        longest = max((len(s.placeholder) for s in job.broker.secrets), default=0)
        self.overlap = max(longest, job.tripwire.longest, 1) - 1

    async def run(self) -> None:
        broker = self.job.broker
        if "forms" in vars(broker):  # compiled by an earlier connection
            self.forms = broker.forms
        else:  # compiled once a broker, in a worker thread
            self.forms = await asyncio.to_thread(lambda: broker.forms)
        while True:
            try:
                head = await asyncio.wait_for(self.client.head(MAX_HEAD), self.job.idle_timeout_s)
                if head is None:
                    return
                if not await self.exchange(head):
                    return
            except HeadTooLarge:
                await self.reply(431, "request head too large")
                return
            except Malformed as exc:
                await self.reply(400, str(exc))
                return
            except Refusal as refusal:
                await self.reply(refusal.status, refusal.reason)
                await linger(self.client)
                return

    async def exchange(self, head: bytes) -> bool:
        """Relay one request and its response; whether the sandbox's connection stays open."""
        (method, target, version), headers = parse_head(head)
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise Refusal(505, f"{version[:20]!r} is not HTTP/1.1")
        if not METHOD.fullmatch(method) or method == "CONNECT":
            raise self.refused(method[:32], 405, f"method {method[:32]!r} is not relayed")
        path = self.origin_form(method, target)
        self.check_host(method, headers)
        if field(headers, "upgrade") or "upgrade" in tokens(headers, "connection"):
            raise self.refused(method, 501, "protocol upgrades are not relayed to this host")
        length = framing(headers)
        out, injected = self.rewrite(method, path, headers)
        evidence = f"{method} https://{self.job.name}{path[:300]}"
        if self.job.tripwire.check(self.job.key, "egress", head, evidence):
            raise self.refused(method, 403, "refused by the egress proxy's policy")
        client_keep = version == "HTTP/1.1" and "close" not in tokens(headers, "connection")
        if "100-continue" in tokens(headers, "expect") and length != 0:
            self.tls.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = Body(self.client, length, self.job.idle_timeout_s)
        watch = Watch(self.overlap, lambda window: self.sign_in_body(window, evidence))
        try:
            held, done = await hold(body, watch, HOLD)
        except Signed as signed:
            raise self.refused(method, 403, signed.reason) from None
        chunked = length is None
        out.append(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(length)))
        lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in out), "", ""]
        first = "\r\n".join(lines).encode("latin-1") + framed(held, chunked, done)
        reused = self.up is not None
        await self.send_first(method, first)
        for secret in injected:
            self.job.record_injection(
                Injected(self.job.key, secret.name, self.job.name, method, path.split("?")[0])
            )
        if not done:
            await self.stream_rest(method, body, watch, chunked)
        try:
            return await self.respond(method, client_keep)
        except _Stale:
            # a kept-alive connection the upstream had closed: once more on a fresh one,
            # when the whole request is still here and sending it twice does no harm
            self.close_upstream()
            if not (reused and done and method in IDEMPOTENT):
                raise self.refused(method, 502, f"{self.job.name} sent no response") from None
            await self.send_first(method, first)
            return await self.respond(method, client_keep, stale_ok=False)

    def origin_form(self, method: str, target: str) -> str:
        if target.startswith("/") or (target == "*" and method == "OPTIONS"):
            path = target
        elif target.lower().startswith("https://"):
            authority, slash, rest = target[8:].partition("/")
            if not self.same_host(authority):
                raise self.refused(method, 400, "the request names another host than the tunnel")
            path = slash + rest or "/"
        else:
            raise self.refused(method, 400, "the request target is not a path")
        if not path.isascii() or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in path):
            raise self.refused(method, 400, "the request target has spaces or control bytes")
        found = find_placeholder(self.job.broker, path.encode()) or find_placeholder(
            self.job.broker, unquote_to_bytes(path)
        )
        if found is not None:
            raise self.misplaced(method, path, found, "the request's URL")
        return path

    def same_host(self, authority: str) -> bool:
        host, _, port = authority.rpartition(":") if ":" in authority else (authority, "", "")
        try:
            canonical = canonical_host(host)
        except AllowlistError:
            return False
        return canonical == self.job.name and (not port or port == str(self.job.port))

    def check_host(self, method: str, headers: list[tuple[str, str]]) -> None:
        given = field(headers, "host")
        if len(given) > 1 or (given and not self.same_host(given[0])):
            raise self.refused(method, 400, "the Host header names another host than the tunnel")

    def rewrite(
        self, method: str, path: str, headers: list[tuple[str, str]]
    ) -> tuple[list[tuple[str, str]], list[BrokeredSecret]]:
        """The headers to send upstream (placeholders replaced where configured, hop-by-hop
        fields dropped, Host kept or added, identity encoding asked for) and the secrets put
        in; a Refusal for a placeholder anywhere else."""
        out: list[tuple[str, str]] = []
        injected: list[BrokeredSecret] = []
        broker = self.job.broker
        for name, value in headers:
            replaced = inject(broker, name, value, self.job.name)
            if replaced is not None:
                out.append((name, replaced[0]))
                injected.append(replaced[1])
                continue
            found = find_placeholder(broker, f"{name}: {value}".encode("latin-1"))
            scheme, _, token = value.partition(" ")
            if found is None and scheme.lower() == "basic":
                decoded = basic_decoded(token)
                found = find_placeholder(broker, decoded.encode()) if decoded else None
            if found is not None:
                where = f"header {name[:64]}"
                if not found.allows(self.job.name):
                    where += f" (secret {found.name!r} may not go to this host)"
                raise self.misplaced(method, path, found, where)
            if name.lower() not in REQUEST_DROP:
                out.append((name, value))
        if not field(headers, "host"):
            out.insert(0, ("Host", self.job.name if self.job.port == 443 else
                           f"{self.job.name}:{self.job.port}"))  # fmt: skip
        out.append(("Accept-Encoding", "identity"))
        return out, injected

    def sign_in_body(self, window: bytes, evidence: str) -> str | None:
        found = find_placeholder(self.job.broker, window)
        if found is not None:
            self.sound(found, "the request's body", evidence)
            return f"the placeholder of secret {found.name!r} is not sent in a request's body"
        if self.job.tripwire.check(self.job.key, "egress", window, evidence):
            return "refused by the egress proxy's policy"
        return None

    def misplaced(self, method: str, path: str, secret: BrokeredSecret, where: str) -> Refusal:
        self.sound(secret, where, f"{method} https://{self.job.name}{path[:300]}")
        reason = (
            f"the placeholder of secret {secret.name!r} is only sent in its configured place "
            f"to its hosts, not in {where}"
        )
        return self.refused(method, 403, reason)

    def sound(self, secret: BrokeredSecret, where: str, evidence: str) -> None:
        detail = (
            f"the placeholder of secret {secret.name!r} was on its way to {self.job.name} "
            f"in {where}; refused"
        )
        self.job.alarm(
            Alarm(self.job.key, "placeholder", "egress", detail, evidence[:MAX_EVIDENCE])
        )

    def refused(self, method: str, status: int, reason: str) -> Refusal:
        self.job.decide(method, False, reason)
        return Refusal(status, reason)

    async def connect(self) -> tuple[Buffered, asyncio.StreamWriter, asyncio.StreamReader]:
        job = self.job
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(job.address, job.port, limit=READ), job.connect_timeout_s
            )
        except (OSError, TimeoutError) as exc:
            reason = f"cannot connect to {job.name}:{job.port}: {exc or 'timed out'}"
            raise self.refused("CONNECT", 502, reason) from exc
        try:  # TLS on the plain connection, so a failed handshake leaves no socket behind
            await asyncio.wait_for(
                writer.start_tls(job.upstream_context, server_hostname=job.name),
                job.connect_timeout_s,
            )
        except ssl.SSLCertVerificationError as exc:
            writer.transport.abort()
            reason = f"{job.name}'s certificate is not trusted: {exc.verify_message}"
            raise self.refused("CONNECT", 502, reason) from exc
        except (OSError, TimeoutError) as exc:
            writer.transport.abort()
            reason = f"TLS with {job.name}:{job.port} failed: {exc or 'timed out'}"
            raise self.refused("CONNECT", 502, reason) from exc
        self.up = (Buffered(reader.read), writer, reader)
        return self.up

    async def send_first(self, method: str, data: bytes) -> None:
        """The head and the held body, on the kept-alive connection unless the upstream
        has closed it."""
        if self.up is not None and (self.up[2].at_eof() or self.up[1].is_closing()):
            self.close_upstream()
        writer = (self.up or await self.connect())[1]
        try:
            writer.write(data)
            await writer.drain()
        except (ConnectionError, ssl.SSLError) as exc:
            self.close_upstream()
            raise self.refused(method, 502, f"{self.job.name} closed the connection") from exc

    async def stream_rest(self, method: str, body: Body, watch: Watch, chunked: bool) -> None:
        assert self.up is not None
        try:
            await send_rest(body, watch, chunked, self.up[1])
        except Signed as signed:
            self.close_upstream()  # the request stays incomplete there
            raise self.refused(method, 403, signed.reason) from None

    async def respond(self, method: str, client_keep: bool, stale_ok: bool = True) -> bool:
        assert self.up is not None
        up, idle = self.up[0], self.job.idle_timeout_s
        masker = Masker(self.forms)
        while True:
            try:
                try:
                    head = await asyncio.wait_for(up.head(MAX_HEAD), idle)
                except ConnectionError:
                    if stale_ok:
                        raise _Stale from None
                    raise
                if head is None and stale_ok:
                    raise _Stale
                if head is None:
                    raise Malformed("no response")
                (version, code, phrase), headers = parse_head(head)
                if not STATUS.fullmatch(f"{version} {code} {phrase}".rstrip()):
                    raise Malformed("not an HTTP/1.1 status line")
                status = int(code)
                length = framing(headers)
            except (Malformed, HeadTooLarge, TimeoutError, ConnectionError, ssl.SSLError) as exc:
                self.close_upstream()
                raise self.refused(method, 502, f"{self.job.name}: bad response ({exc})") from exc
            if status == 101:
                self.close_upstream()
                raise self.refused(method, 502, f"{self.job.name} switched protocols")
            if status >= 200:
                break
            self.tls.write(masked(head, self.forms))  # 100 Continue, 103 Early Hints
        if method == "HEAD" or status in (204, 304):
            length = 0
        elif length == 0 and not field(headers, "content-length"):
            length = -1  # until the upstream closes
        up_keep = version == "HTTP/1.1" and "close" not in tokens(headers, "connection")
        keep = client_keep and length != -1
        out = [f"{version} {code} {phrase}".rstrip()]
        coding = ", ".join(field(headers, "content-encoding")).strip()
        if length != 0 and coding.lower() not in ("", "identity") and self.forms.patterns:
            out += [f"{k}: {v}" for k, v in headers if k.lower() not in DECODED_DROP]
            keep = await self.respond_decoded(method, out, up, length, coding, client_keep)
        else:
            out += [f"{k}: {v}" for k, v in headers if k.lower() not in RESPONSE_DROP]
            if length is None:
                out.append("Transfer-Encoding: chunked")
            if not keep:
                out.append("Connection: close")
            self.tls.write(masked("\r\n".join([*out, "", ""]).encode("latin-1"), self.forms))
            try:
                await self.stream_response(up, length, masker)
            except (Malformed, TimeoutError, ConnectionError, ssl.SSLError) as exc:
                self.close_upstream()
                raise _Closed from exc
        if not up_keep or length == -1:
            self.close_upstream()
        return keep

    async def stream_response(self, up: Buffered, length: int | None, masker: Masker) -> None:
        tls, chunked = self.tls, length is None
        async for data in response_pieces(up, length, self.job.idle_timeout_s):
            if passed := masker.feed(data):
                tls.write(framed(passed, chunked, False))
                await tls.drain()
        tls.write(framed(masker.flush(), chunked, True))
        await tls.drain()

    async def respond_decoded(
        self,
        method: str,
        out: list[str],
        up: Buffered,
        length: int | None,
        coding: str,
        client_keep: bool,
    ) -> bool:
        """A compressed response, on a tunnel whose real values are masked: decoded within
        DECODED_LIMIT bytes and policy/compression.py's ratio, masked and sent on plain; the
        first DECODED_HOLD bytes decoded before the head goes (a body that ends within them
        goes with its Content-Length, and a bomb or a stream that is not what it says is a
        502 there); past them chunked, and cut without its last chunk at such a fault.
        Whether the sandbox's connection stays open."""
        name = self.job.name
        try:
            inflater = Inflater(coding, DECODED_LIMIT)
        except Undecodable:
            self.close_upstream()
            reason = (
                f"{name} sent its response with Content-Encoding {coding[:64]!r}, which the "
                "proxy cannot decode to mask the brokered secrets (gzip, deflate and br are)"
            )
            raise self.refused(method, 502, reason) from None
        masker = Masker(self.forms)
        pieces = aiter(response_pieces(up, length, self.job.idle_timeout_s))
        held = bytearray()
        done = False
        try:
            while len(held) < DECODED_HOLD:
                data = await anext(pieces, None)
                if data is None:
                    inflater.finish()
                    held += masker.flush()
                    done = True
                    break
                for plain in inflater.feed(data):
                    held += masker.feed(plain)
        except Undecodable as exc:
            self.close_upstream()
            raise self.refused(method, 502, f"{name}'s {coding[:64]} response: {exc}") from None
        except (Malformed, TimeoutError, ConnectionError, ssl.SSLError) as exc:
            self.close_upstream()
            raise self.refused(method, 502, f"{name}: bad response ({exc})") from exc
        out.append(f"Content-Length: {len(held)}" if done else "Transfer-Encoding: chunked")
        keep = client_keep and (done or length != -1)
        if not keep:
            out.append("Connection: close")
        head = masked("\r\n".join([*out, "", ""]).encode("latin-1"), self.forms)
        self.tls.write(head + framed(bytes(held), not done, False))
        await self.tls.drain()
        if done:
            return keep
        try:
            async for data in pieces:
                for plain in inflater.feed(data):
                    if passed := masker.feed(plain):
                        self.tls.write(framed(passed, True, False))
                        await self.tls.drain()
            inflater.finish()
        except Undecodable as exc:
            self.close_upstream()
            refusal = self.refused(method, 502, f"{name}'s {coding[:64]} response: {exc}")
            raise _Closed from refusal
        except (Malformed, TimeoutError, ConnectionError, ssl.SSLError) as exc:
            self.close_upstream()
            raise _Closed from exc
        self.tls.write(framed(masker.flush(), True, True))
        await self.tls.drain()
        return keep

    async def reply(self, status: int, reason: str) -> None:
        body = f"stockade egress proxy: {reason}\n".encode()
        head = (
            f"HTTP/1.1 {status} {PHRASES.get(status, 'Error')}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            self.tls.write(head.encode() + body)
            await self.tls.drain()

    def close_upstream(self) -> None:
        if self.up is not None:
            self.up[1].close()
            self.up = None
