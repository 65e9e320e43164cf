"""Shared by test_intercept*.py: the intercepting proxy on a loopback socket with three
brokered secrets and a tripwire of the tests' own, the tests' HTTPS upstream, and clients
that speak real TLS through CONNECT."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from stockade.supervisor.config.allowlist import Allowlist
from stockade.supervisor.network.brokered import Broker, BrokeredSecret, Injected, Injection
from stockade.supervisor.network.intercept import upstream_context
from stockade.supervisor.network.mint import Authority
from stockade.supervisor.network.proxy import EgressDecision, EgressProxy, ProxySettings
from stockade.supervisor.observe.alarms import Alarm, Tripwire
from tests.unit.fakes import listening_socket
from tests.upstream import Upstream

GH_PH = "stk_ph_" + "a" * 32
REG_PH = "stk_ph_" + "b" * 32
OTHER_PH = "stk_ph_" + "c" * 32
GH_REAL = "ghp_REALrealREAL0123456789abcdefABCDEF"
REG_REAL = "reg-REAL-password-9876"
OTHER_REAL = "other-REAL-key-5555"
DECOY = "AKIAQWERTYUIOPASDFGH"
SECRETS = (
    BrokeredSecret("gh", GH_REAL, GH_PH, ("api.test",),
                   Injection("header", template="Bearer {secret}")),
    BrokeredSecret("reg", REG_REAL, REG_PH, ("api.test",), Injection("basic", username="bot")),
    BrokeredSecret("other", OTHER_REAL, OTHER_PH, ("*.other.test", "other.test"),
                   Injection("header", header="X-Api-Key")),
)  # fmt: skip


class Decoys:
    """A tripwire of the tests' own: one planted sign."""

    longest = len(DECOY)

    def __init__(self) -> None:
        self.hits: list[tuple[str, str]] = []

    def check(self, sandbox_key: str, where: str, data: bytes | str, evidence: str = "") -> bool:
        raw = data.encode() if isinstance(data, str) else data
        if DECOY.encode() in raw:
            self.hits.append((sandbox_key, where))
            return True
        return False


@dataclass
class Harness:
    up: Upstream
    proxy: EgressProxy
    port: int
    ca_file: Path
    decisions: list[EgressDecision] = field(default_factory=list)
    alarms: list[Alarm] = field(default_factory=list)
    injected: list[Injected] = field(default_factory=list)
    decoys: Decoys = field(default_factory=Decoys)

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_verify_locations(str(self.up.ca.ca_file))  # the plain tunnel's host
        return context


async def make_harness(
    tmp_path: Path,
    trust_upstream: bool = True,
    tripwire: Tripwire | None = None,
    up: Upstream | None = None,
) -> Harness:
    """`tripwire`: the proxy's (the tests' own Decoys when None); `up`: the upstream, not yet
    started (an HTTPS Upstream when None)."""
    up = await (up or Upstream(tmp_path / "upstream")).start()
    authority = Authority.load_or_create(tmp_path / "egress-ca")
    settings = ProxySettings(
        ports=frozenset({up.port}),
        hosts={n: "127.0.0.1" for n in ("api.test", "other.test", "localhost")},
        allow_private_addresses=False,
        max_connections=16,
        connect_timeout_s=5,
        idle_timeout_s=10,
    )
    decisions: list[EgressDecision] = []
    alarms: list[Alarm] = []
    injected: list[Injected] = []
    decoys = Decoys()
    context = upstream_context(str(up.ca.ca_file) if trust_upstream else None)
    proxy = EgressProxy(
        "tenant/box", Allowlist(["api.test", "other.test", "localhost"], [up.port]), settings,
        decisions.append, broker=Broker(SECRETS), tripwire=tripwire or decoys, alarm=alarms.append,
        record_injection=injected.append, authority=authority, upstream_context=context,
    )  # fmt: skip
    sock = listening_socket()
    ca_file = tmp_path / "egress-ca" / "ca.crt"
    h = Harness(up, proxy, sock.getsockname()[1], ca_file, decisions, alarms, injected, decoys)
    await h.proxy.start(sock)
    return h


async def started(tmp_path: Path) -> AsyncIterator[Harness]:
    """For each test module's fixture `h`."""
    harness = await make_harness(tmp_path)
    yield harness
    await harness.proxy.close()
    await harness.up.close()


async def tunnel(
    h: Harness, host: str = "api.test", context: ssl.SSLContext | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
    writer.write(f"CONNECT {host}:{h.up.port} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    try:
        await writer.start_tls(context or h.client_context(), server_hostname=host)
    except BaseException:
        writer.transport.abort()
        raise
    return reader, writer


@dataclass
class Response:
    status: int
    head: bytes
    body: bytes


async def read_response(reader: asyncio.StreamReader, method: str = "GET") -> Response:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status = int(head.split(b" ")[1])
    fields = {
        k.strip().lower(): v.strip()
        for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:] if line)
    }
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return Response(status, head, b"")
    if fields.get(b"transfer-encoding") == b"chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readuntil(b"\r\n")
        return Response(status, head, body)
    if b"content-length" in fields:
        return Response(status, head, await reader.readexactly(int(fields[b"content-length"])))
    return Response(status, head, await asyncio.wait_for(reader.read(), 10))


async def once(h: Harness, raw: bytes, host: str = "api.test") -> Response:
    reader, writer = await tunnel(h, host)
    writer.write(raw.replace(b"{port}", str(h.up.port).encode()))
    await writer.drain()
    try:
        return await read_response(reader)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 2)


def get(path: str, *headers: str, host: str = "api.test") -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{{port}}", *headers, "", ""]
    return "\r\n".join(lines).encode()


def basic(user: str, password: str) -> str:
    return "Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def assert_refused(h: Harness, reply: Response, secret: str) -> None:
    assert reply.status == 403, reply.head
    assert f"secret {secret!r}".encode() in reply.body
    assert [(a.kind, a.where) for a in h.alarms] == [("placeholder", "egress")]
    assert secret in h.alarms[0].detail
    assert not h.injected
