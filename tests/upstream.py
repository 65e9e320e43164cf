"""The tests' own HTTPS upstream: a small HTTP/1.1 server (asyncio + ssl) on 127.0.0.1 with a
certificate from a test CA made here, recording every request it receives (head and body), so
a test can show what reached "the real host" and what did not.

Answers by path (query strings are ignored except where said):
- `/bytes/N`: N bytes of b"x" with Content-Length, streamed in 256 KiB writes (never held whole).
- `/chunked`: a chunked body, the parts given by `?parts=a,b,c` (default "hello, ,world").
- `/echo`: the request's head as the body, and its Authorization header again in the response
  header X-Echo-Authorization (a test can show a real secret is masked in both).
- `/auth`: 401 with `WWW-Authenticate: Basic realm="test"` when the request has no
  Authorization, else 200 "authorized".
- `/close`: a body sent until the connection closes (no Content-Length, no chunking).
- `/bye`, `/drop`: "bye\\n", then the connection closed, saying so (Connection: close) or not;
  `/late`: the same 0.2 s later, a request sent meanwhile left unanswered.
- anything else: `Upstream.body` (default b"hello\\n") with Content-Length.
Request bodies (Content-Length or chunked) are read whole and kept up to `RECORD_LIMIT` bytes
(their length and SHA-256 always). `Expect: 100-continue` gets its 100 first. Keep-alive as
HTTP/1.1 says. Run alone (`python -m tests.upstream DIR`) it writes DIR/ca.pem and prints its
port: the bench uses it so in a process of its own."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gzip
import hashlib
import http.server
import ipaddress
import os
import ssl
import sys
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NAMES = ("api.test", "other.test", "localhost")
RECORD_LIMIT = 1 << 20
WRITE = 256 * 1024
MAX_HEAD = 256 * 1024


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A base for the tests' http.server upstreams: `_send` answers 200 with `body`; nothing
    is logged."""

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Recorded:
    method: str
    target: str
    headers: list[tuple[str, str]]
    head: bytes
    body: bytes = b""
    body_length: int = 0
    body_sha256: str = ""

    def header(self, name: str) -> str | None:
        found = [v for k, v in self.headers if k.lower() == name.lower()]
        return found[0] if found else None


@dataclass
class TestCA:
    """A CA of the tests' own and one server certificate it signed for NAMES and 127.0.0.1."""

    directory: Path
    ca_file: Path = field(init=False)
    cert_file: Path = field(init=False)
    key_file: Path = field(init=False)

    def __post_init__(self) -> None:
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stockade tests upstream CA")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = [x509.DNSName(n) for n in NAMES]
        names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAMES[0])]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca_file = self.directory / "ca.pem"
        self.cert_file = self.directory / "server.pem"
        self.key_file = self.directory / "server.key"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
        self.key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_file, self.key_file)
        context.set_alpn_protocols(["http/1.1"])
        return context

    def client_context(self) -> ssl.SSLContext:
        """What a client of the upstream (or the proxy, for its upstream side) trusts."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.set_alpn_protocols(["http/1.1"])
        return context


def _usage(sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not sign, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=sign, crl_sign=sign,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


class Upstream:
    """Start with `await up.start()` (or `async with Upstream(dir) as up`); `up.port`,
    `up.ca.ca_file`, `up.requests` (every request received, in order)."""

    def __init__(self, directory: Path | None = None, tls: bool = True) -> None:
        self._tmp = None if directory else tempfile.TemporaryDirectory()
        self.ca = TestCA(directory or Path(self._tmp.name))  # type: ignore[union-attr]
        self.tls = tls
        self.requests: list[Recorded] = []
        self.connections = 0
        self.body = b"hello\n"
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> Upstream:
        context = self.ca.server_context() if self.tls else None
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", 0, ssl=context, limit=MAX_HEAD
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
        if self._tmp is not None:
            self._tmp.cleanup()

    async def __aenter__(self) -> Upstream:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except ssl.SSLError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _request_head(self, reader: asyncio.StreamReader) -> tuple[Recorded, str] | None:
        """The next request's head, recorded (its body not read yet), and its HTTP version;
        None when the connection ends first."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        headers = []
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers.append((name, value.strip()))
        got = Recorded(method, target, headers, head)
        self.requests.append(got)
        return got, version

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        request = await self._request_head(reader)
        if request is None:
            return False
        got, version = request
        method, target, head = got.method, got.target, got.head
        if (got.header("expect") or "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await self._read_body(reader, got)
        keep = version == "HTTP/1.1" and (got.header("connection") or "").lower() != "close"
        path = target.split("?", 1)[0]
        query = target.split("?", 1)[1] if "?" in target else ""
        extra: list[tuple[str, str]] = []
        status = "200 OK"
        if path.startswith("/bytes/"):
            await self._bytes(writer, int(path[7:]), keep, head_only=method == "HEAD")
            return keep
        if path == "/chunked":
            parts = query[6:].split(",") if query.startswith("parts=") else ["hello", " ", "world"]
            out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            for part in parts:
                data = part.encode()
                out += b"%x\r\n%s\r\n" % (len(data), data)
            writer.write(out + b"0\r\n\r\n")
            await writer.drain()
            return keep
        if path in ("/bye", "/drop", "/late"):  # closes after answering: saying so, or not
            close = "Connection: close\r\n" if path == "/bye" else ""
            writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n{close}\r\nbye\n".encode())
            await writer.drain()
            if path == "/late":  # a while later, leaving a request sent meanwhile unanswered
                await asyncio.sleep(0.2)
            return False
        if path == "/close":
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + self.body)
            await writer.drain()
            return False
        if path == "/echo":
            body = head
            extra.append(("X-Echo-Authorization", got.header("authorization") or "-"))
        elif path == "/auth" and got.header("authorization") is None:
            status, body = "401 Unauthorized", b"who are you?\n"
            extra.append(("WWW-Authenticate", 'Basic realm="test"'))
        elif path == "/auth":
            body = b"authorized\n"
        else:
            body = self.body
        lines_out = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}"]
        lines_out += [f"{k}: {v}" for k, v in extra]
        if not keep:
            lines_out.append("Connection: close")
        head_out = ("\r\n".join(lines_out) + "\r\n\r\n").encode("latin-1")
        writer.write(head_out if method == "HEAD" else head_out + body)
        await writer.drain()
        return keep

    async def _read_body(self, reader: asyncio.StreamReader, got: Recorded) -> None:
        digest = hashlib.sha256()
        kept = bytearray()

        def take(data: bytes) -> None:
            digest.update(data)
            got.body_length += len(data)
            if len(kept) < RECORD_LIMIT:
                kept.extend(data[: RECORD_LIMIT - len(kept)])

        try:
            await self._read_chunks_or_length(reader, got, take)
        finally:  # a body cut short is kept as far as it came
            got.body = bytes(kept)
            got.body_sha256 = digest.hexdigest()

    async def _read_chunks_or_length(
        self, reader: asyncio.StreamReader, got: Recorded, take: Callable[[bytes], None]
    ) -> None:
        if "chunked" in (got.header("transfer-encoding") or "").lower():
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass
                    break
                while size:
                    data = await reader.read(min(size, WRITE))
                    if not data:
                        raise ConnectionError("body cut short")
                    take(data)
                    size -= len(data)
                await reader.readexactly(2)
        else:
            left = int(got.header("content-length") or "0")
            while left:
                data = await reader.read(min(left, WRITE))
                if not data:
                    raise ConnectionError("body cut short")
                take(data)
                left -= len(data)

    async def _bytes(
        self, writer: asyncio.StreamWriter, n: int, keep: bool, head_only: bool
    ) -> None:
        close = "" if keep else "Connection: close\r\n"
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n{close}\r\n".encode())
        if head_only:
            await writer.drain()
            return
        block = b"x" * WRITE
        while n:
            part = block if n >= WRITE else block[:n]
            writer.write(part)
            n -= len(part)
            await writer.drain()


PREFIXES = [b"", b"x", b"xy"]


def reflections(value: bytes) -> list[bytes]:
    """What ReflectingUpstream sends back: each encoding of each alignment of value (each
    base64 alignment), a line each."""
    from tests.unit.encoders import ENCODINGS

    return [ENCODINGS[name](p + value) for name in sorted(ENCODINGS) for p in PREFIXES]


def compressed(data: bytes, coding: str) -> bytes:
    """data in a Content-Encoding (an unknown one: as it is, only named so)."""
    import brotli

    if coding in ("gzip", "x-gzip"):
        return gzip.compress(data, 6)
    if coding == "deflate":
        return zlib.compress(data)
    if coding == "br":
        return bytes(brotli.compress(data, quality=5))
    return data


class ReflectingUpstream(Upstream):
    """`/reflect`: the Authorization header received, reflected in every encoding (a line
    each, `reflections`). Query words: `chunked` sends it chunked (uncompressed: each line cut
    in two chunks inside its middle; compressed: in 5-byte chunks); `close` until the
    connection closes; `coding=NAME` compressed so and named in Content-Encoding; `repeat=N`
    the lines N times, each time after a line of noise (`#` and random hex); `cut=N` the
    (compressed) body cut N bytes short, its Content-Length saying so. `/bomb?coding=NAME`:
    64 MiB of zeros, compressed."""

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        request = await self._request_head(reader)
        if request is None:
            return False
        got, _version = request
        await self._read_body(reader, got)
        path, _, query = got.target.partition("?")
        words = dict(w.partition("=")[::2] for w in query.split("&") if w)
        coding = words.get("coding", "")
        if path == "/bomb":
            lines = [bytes(64 << 20)]
        else:
            lines = reflections((got.header("authorization") or "-").encode())
            if "repeat" in words:  # after a line of noise each time: not over 10-fold
                once, lines = lines, []
                for _ in range(int(words["repeat"])):
                    lines += [b"#" + os.urandom(384).hex().encode(), *once]
        body = compressed(b"\n".join(lines) + b"\n", coding)
        body = body[: len(body) - int(words.get("cut", "0"))]
        head = b"HTTP/1.1 200 OK\r\n"
        if coding:
            head += b"Content-Encoding: %s\r\n" % coding.encode()
        if "close" in words:
            writer.write(head + b"Connection: close\r\n\r\n" + body)
            await writer.drain()
            return False
        if "chunked" in words:
            out = head + b"Transfer-Encoding: chunked\r\n\r\n"
            parts = [body[i : i + 5] for i in range(0, len(body), 5)] if coding else [
                half for line in lines
                for half in (line[: len(line) // 2], line[len(line) // 2 :] + b"\n")
            ]  # fmt: skip
            out += b"".join(b"%x\r\n%b\r\n" % (len(part), part) for part in parts if part)
            writer.write(out + b"0\r\n\r\n")
        else:
            writer.write(head + b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        await writer.drain()
        return True


async def _main(directory: str) -> None:
    upstream = await Upstream(Path(directory)).start()
    print(upstream.port, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(sys.argv[1]))
