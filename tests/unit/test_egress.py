"""The egress allowlist, the ClientHello reader and the proxy itself (on loopback sockets:
a real asyncio upstream, a real client; no engine needed)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import trustme

from stockade.supervisor.config import load_config
from stockade.supervisor.config.allowlist import Allowlist, AllowlistError, is_global
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.network import tls
from stockade.supervisor.network.proxy import EgressDecision, EgressProxy, ProxySettings
from tests.unit.fakes import listening_socket


@pytest.mark.parametrize(
    ("host", "port", "allowed", "reason"),
    [
        ("example.com", 443, True, "allowed by example.com"),
        ("EXAMPLE.com.", 80, True, "allowed by example.com"),
        ("www.example.com", 443, False, "not on the allowlist"),
        ("a.b.wild.org", 443, True, "allowed by *.wild.org"),
        ("wild.org", 443, False, "not on the allowlist"),
        ("evilwild.org", 443, False, "not on the allowlist"),
        ("wild.org.evil.com", 443, False, "not on the allowlist"),
        ("example.com", 22, False, "port 22 is not allowed"),
        ("127.0.0.1", 80, False, "is an IP address"),
        ("127.1", 80, False, "is an IP address"),
        ("2130706433", 80, False, "is an IP address"),
        ("0x7f.1", 80, False, "is an IP address"),
        ("[::1]", 443, False, "is an IP address"),
        ("::ffff:127.0.0.1", 443, False, "is an IP address"),
        ("exa mple.com", 80, False, "not a valid host name"),
        ("example.com\r\nX: y", 80, False, "not a valid host name"),
        ("", 80, False, "empty host name"),
        ("a" * 300 + ".com", 80, False, "not a valid host name"),
        ("bücher.wild.org", 443, True, "allowed by *.wild.org"),
    ],
)
def test_allowlist_decisions(host: str, port: int, allowed: bool, reason: str) -> None:
    decision = Allowlist(["example.com", "*.wild.org"], [80, 443]).decide(host, port)
    assert decision.allowed is allowed
    assert reason in decision.reason


@pytest.mark.parametrize("pattern", ["*", "*.com.*", "a.*.com", "10.0.0.1", "", "*."])
def test_bad_patterns_are_config_errors(pattern: str) -> None:
    with pytest.raises(ConfigError, match=r"network\.allow"):
        load_config(overrides={"network.allow": [pattern]})


def test_network_config_checks() -> None:
    with pytest.raises(ConfigError, match="not an IP address"):
        load_config(overrides={"network.hosts": {"a.test": "nowhere"}})
    with pytest.raises(ConfigError, match="out of range"):
        load_config(overrides={"network.ports": [0]})
    with pytest.raises(ConfigError, match=r"sandbox\.network must be one of"):
        load_config(overrides={"sandbox.network": "host"})
    with pytest.raises(ConfigError, match="subnet"):
        load_config(overrides={"network.subnet": "10.0.0.0/31"})


def test_narrowing_never_widens() -> None:
    configured = Allowlist(["x.com", "*.wild.test"], [443])
    narrowed = configured.narrowed(["*.a.wild.test", "b.wild.test", "X.com."])
    assert narrowed.patterns == ("*.a.wild.test", "b.wild.test", "x.com")
    for wider in ["*.test", "wild.test", "y.com", "*.x.com"]:
        with pytest.raises(AllowlistError, match="not within"):
            configured.narrowed([wider])


@pytest.mark.parametrize(
    ("address", "public"),
    [("93.184.216.34", True), ("127.0.0.1", False), ("10.1.2.3", False), ("169.254.1.1", False),
     ("::1", False), ("::ffff:10.0.0.1", False), ("fd00::1", False), ("224.0.0.1", False),
     ("2606:2800:220:1::1", True), ("0.0.0.0", False), ("100.64.0.1", False)],
)  # fmt: skip
def test_is_global(address: str, public: bool) -> None:
    assert is_global(address) is public


def client_hello(server_name: str | None) -> bytes:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    outgoing = ssl.MemoryBIO()
    tls_object = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls_object.do_handshake()
    return outgoing.read()


async def read_hello(data: bytes) -> bytes:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return await tls.read_client_hello(reader)


async def test_server_name_from_a_real_client_hello() -> None:
    hello = client_hello("Upstream.Test")
    assert tls.server_name(await read_hello(hello + b"trailing")) == "Upstream.Test"
    assert tls.server_name(await read_hello(client_hello(None))) is None
    # split over two records, as a client may send it
    body = hello[5:]
    split = b"\x16\x03\x01" + (100).to_bytes(2, "big") + body[:100]
    split += b"\x16\x03\x01" + (len(body) - 100).to_bytes(2, "big") + body[100:]
    assert tls.server_name(await read_hello(split)) == "Upstream.Test"


@pytest.mark.parametrize(
    "data",
    [b"GET / HTTP/1.1\r\n\r\n", b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00",
     b"\x16\x03\x01\xff\xff" + b"\x01" * 10, b"\x16\x03\x01\x00\x04\x01\x00\x00\xff"],
)  # fmt: skip
async def test_hostile_hellos_are_refused(data: bytes) -> None:
    with pytest.raises((tls.NotTLS, asyncio.IncompleteReadError)):
        tls.server_name(await read_hello(data))


async def test_extensions_overrunning_the_hello_are_not_tls() -> None:
    hello = bytearray(client_hello("a.test"))
    at = 5 + 4 + 2 + 32  # record header, handshake header, version, random
    at += 1 + hello[at]
    at += 2 + int.from_bytes(hello[at : at + 2], "big")
    at += 1 + hello[at]
    hello[at : at + 2] = b"\xff\xff"  # the extensions' length
    with pytest.raises(tls.NotTLS, match="overrun"):
        tls.server_name(bytes(hello))


class Harness:
    def __init__(self) -> None:
        self.decisions: list[EgressDecision] = []
        self.proxy: EgressProxy | None = None
        self.port = 0
        self.upstream_port = 0


@pytest_asyncio.fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness()

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read(65536)
        writer.write(b"UPSTREAM GOT " + data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    h.upstream_port = server.sockets[0].getsockname()[1]
    settings = ProxySettings(
        ports=frozenset({h.upstream_port}),
        hosts={"up.test": "127.0.0.1"},
        allow_private_addresses=False,
        max_connections=2,
        connect_timeout_s=5,
        idle_timeout_s=5,
    )
    allowlist = Allowlist(["up.test", "localhost"], [h.upstream_port])
    h.proxy = EgressProxy("k", allowlist, settings, h.decisions.append)
    sock = listening_socket()
    h.port = sock.getsockname()[1]
    await h.proxy.start(sock)
    yield h
    await h.proxy.close()
    server.close()
    await server.wait_closed()


async def exchange(h: Harness, data: bytes, then: bytes = b"") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
    writer.write(data)
    if then:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(then)
    await writer.drain()
    reply = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return reply


async def test_absolute_form_request_is_forwarded_with_one_host(harness: Harness) -> None:
    port = harness.upstream_port
    reply = await exchange(
        harness,
        f"GET http://up.test:{port}/p?q=1 HTTP/1.1\r\nHost: up.test:{port}\r\n"
        "Proxy-Authorization: secret\r\nX-Keep: 1\r\n\r\n".encode(),
    )
    assert reply.startswith(f"UPSTREAM GOT GET /p?q=1 HTTP/1.1\r\nHost: up.test:{port}".encode())
    assert b"X-Keep: 1" in reply
    assert b"Connection: close" in reply
    assert b"secret" not in reply
    assert [d.allowed for d in harness.decisions] == [True]


@pytest.mark.parametrize(
    ("request_head", "status", "reason"),
    [
        (b"GET http://other.test:{port}/ HTTP/1.1\r\n\r\n", b"403", b"not on the allowlist"),
        (b"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n", b"403", b"IP address"),
        (b"GET http://up.test:1/ HTTP/1.1\r\n\r\n", b"403", b"port 1 is not allowed"),
        (b"GET / HTTP/1.1\r\nHost: up.test\r\n\r\n", b"400", b"only absolute http://"),
        (b"GET https://up.test:{port}/ HTTP/1.1\r\n\r\n", b"400", b"only absolute http://"),
        (b"GET http://up.test:{port}/ HTTP/1.1\r\nHost: evil.test\r\n\r\n", b"400",
         b"does not match"),
        (b"GET http://up.test:{port}/ HTTP/1.1\r\nHost: up.test:{port}\r\n"
         b"Host: evil.test\r\n\r\n", b"400", b"does not match"),
        (b"GET http://user:pw@up.test:{port}/ HTTP/1.1\r\n\r\n", b"400", b"credentials"),
        (b"CONNECT up.test HTTP/1.1\r\n\r\n", b"400", b"needs host:port"),
        (b"CONNECT up.test:99999 HTTP/1.1\r\n\r\n", b"400", b"bad port"),
        (b"CONNECT localhost:{port} HTTP/1.1\r\n\r\n", b"403", b"non-public"),
        (b"HELLO\r\n\r\n", b"400", b"not an HTTP/1 request"),
        (b"GET http://up.test:{port}/ HTTP/1.1\r\nbroken header\r\n\r\n", b"400", b"malformed"),
        (b"GET http://up.test:{port}/ HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", b"431",
         b"too large"),
    ],
)  # fmt: skip
async def test_refusals(
    harness: Harness, request_head: bytes, status: bytes, reason: bytes
) -> None:
    head = request_head.replace(b"{port}", str(harness.upstream_port).encode())
    reply = await exchange(harness, head)
    assert reply.startswith(b"HTTP/1.1 " + status), reply[:200]
    assert reason in reply
    assert b"UPSTREAM" not in reply
    assert all(not d.allowed for d in harness.decisions)


async def test_connect_checks_the_tls_server_name(harness: Harness) -> None:
    port = harness.upstream_port
    connect = f"CONNECT up.test:{port} HTTP/1.1\r\n\r\n".encode()
    good = await exchange(harness, connect, client_hello("up.test"))
    assert good.startswith(b"UPSTREAM GOT \x16\x03")  # after "200 Connection established"
    for bad in (client_hello("evil.test"), client_hello(None), b"GET / HTTP/1.1\r\n\r\n"):
        assert await exchange(harness, connect, bad) == b""  # closed, nothing forwarded
    reasons = [d.reason for d in harness.decisions]
    assert [d.allowed for d in harness.decisions] == [True, False, False, False]
    assert "does not match" in reasons[1]
    assert "no server name" in reasons[2]
    assert "not TLS" in reasons[3]


async def test_connection_cap(harness: Harness) -> None:
    held = [await asyncio.open_connection("127.0.0.1", harness.port) for _ in range(2)]
    await asyncio.sleep(0.1)
    reply = await exchange(harness, b"")
    assert reply.startswith(b"HTTP/1.1 503")
    assert b"connection cap" in reply
    for _, writer in held:
        writer.close()


async def test_tls_upstream_through_the_tunnel(tmp_path: object) -> None:
    """A real TLS handshake passes the tunnel untouched (the proxy reads but forwards the
    ClientHello), so the client verifies the upstream's own certificate."""
    ca = trustme.CA()
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("up.test").configure_cert(server_context)

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    settings = ProxySettings(frozenset({port}), {"up.test": "127.0.0.1"}, False, 4, 5, 5)
    proxy = EgressProxy("k", Allowlist(["up.test"], [port]), settings, lambda d: None)
    sock = listening_socket()
    await proxy.start(sock)
    try:
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        writer.write(f"CONNECT up.test:{port} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        client_context = ssl.create_default_context()
        ca.configure_trust(client_context)
        await writer.start_tls(client_context, server_hostname="up.test")
        writer.write(b"ping\n")
        assert await asyncio.wait_for(reader.readline(), 10) == b"ping\n"
        writer.close()
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


async def test_huge_names_are_bounded_in_replies_and_records(harness: Harness) -> None:
    port = harness.upstream_port
    name = "a" * 60000 + ".test"
    reply = await exchange(harness, f"GET http://{name}:{port}/ HTTP/1.1\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 403")
    assert len(reply) < 1000
    mismatch = f"GET http://up.test:{port}/ HTTP/1.1\r\nHost: {name}\r\n\r\n".encode()
    assert (await exchange(harness, mismatch)).startswith(b"HTTP/1.1 400")
    assert len(harness.decisions) == 2
    for decision in harness.decisions:
        assert not decision.allowed
        assert len(decision.host) <= 254
        assert len(decision.reason) < 400
