"""Plain http:// requests through the egress proxy (network/proxy.py over network/httpio.py,
the framing code the intercepting relay uses): the body is decoded from its framing before
it is searched, so a placeholder or a decoy cut across chunks (of two sizes, each in a write
of its own), in a trailer, or sent after a request's end (an HTTP/1.0 "close-delimited"
body) is found whole; one in a body no larger than HOLD is a 403 before the upstream is even
dialled, one past HOLD cuts the upstream's request short. Clean bodies arrive whole, framed
afresh; smuggling-shaped heads are refused as on the intercepted path."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from stockade.supervisor.network.intercept import HOLD
from stockade.supervisor.policy.honeytokens import Honeytokens
from tests.unit.intercept_harness import DECOY, GH_PH, Harness, make_harness, read_response
from tests.upstream import Upstream

CHUNK_SIZES = [1, 7]


@pytest_asyncio.fixture
async def p(tmp_path: Path) -> AsyncIterator[Harness]:
    """The proxy of intercept_harness (three brokered secrets, the tests' decoy) in front of
    a plain HTTP upstream."""
    h = await make_harness(tmp_path, up=Upstream(tmp_path / "plain", tls=False))
    yield h
    await h.proxy.close()
    await h.up.close()


def head(h: Harness, *fields: str, method: str = "POST", version: str = "HTTP/1.1") -> bytes:
    lines = [f"{method} http://api.test:{h.up.port}/sink {version}", *fields, "", ""]
    return "\r\n".join(lines).encode()


def chunks(body: bytes, size: int, trailer: bytes = b"") -> list[bytes]:
    """body as chunks of `size` bytes (each framed), the last chunk and `trailer`."""
    out = [b"%x\r\n%b\r\n" % (len(body[i : i + size]), body[i : i + size])
           for i in range(0, len(body), size)]  # fmt: skip
    return [*out, b"0\r\n" + trailer + b"\r\n"]


async def send(h: Harness, parts: list[bytes], half_close: bool = False) -> bytes:
    """Each part in a write of its own (drained, so the proxy reads them apart), then the
    answer: its head and body as its Content-Length says (the proxy may wait for the rest of
    a refused request before it closes), or what came until the proxy closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0)
        if half_close:
            writer.write_eof()
        try:
            reply = await read_response(reader)
        except asyncio.IncompleteReadError as cut:
            return cut.partial
        return reply.head + reply.body
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def assert_refused_before_upstream(h: Harness, reply: bytes, reason: bytes) -> None:
    assert reply.startswith(b"HTTP/1.1 403"), reply[:200]
    assert reason in reply
    assert h.up.connections == 0  # not even dialled
    assert not h.injected


@pytest.mark.parametrize("size", CHUNK_SIZES)
async def test_a_placeholder_split_across_chunks_is_refused_before_the_upstream(
    p: Harness, size: int
) -> None:
    body = b"token=" + GH_PH.encode() + b"&more"
    parts = [head(p, "Transfer-Encoding: chunked"), *chunks(body, size)]
    reply = await send(p, parts)
    assert_refused_before_upstream(p, reply, b"secret 'gh'")
    assert [(a.kind, a.where) for a in p.alarms] == [("placeholder", "egress")]
    assert [d.allowed for d in p.decisions] == [False]


@pytest.mark.parametrize("size", CHUNK_SIZES)
async def test_a_decoy_split_across_chunks_trips_the_wire_before_the_upstream(
    p: Harness, size: int
) -> None:
    body = b"aws_secret_access_key=" + DECOY.encode()
    reply = await send(p, [head(p, "Transfer-Encoding: chunked"), *chunks(body, size)])
    assert_refused_before_upstream(p, reply, b"policy")
    assert p.decoys.hits == [("tenant/box", "egress")]


async def test_a_placeholder_split_across_writes_of_a_sized_body(p: Harness) -> None:
    body = b"a" * 100_000 + GH_PH.encode()
    cut = 100_010
    parts = [head(p, f"Content-Length: {len(body)}") + body[:cut], body[cut:]]
    reply = await send(p, parts)
    assert_refused_before_upstream(p, reply, b"secret 'gh'")


@pytest.mark.parametrize(
    "fields",
    [[f"X-Leak: {GH_PH}"], [f"Authorization: Bearer {GH_PH}"]],
)
async def test_a_placeholder_in_the_head_is_refused_before_the_upstream(
    p: Harness, fields: list[str]
) -> None:
    reply = await send(p, [head(p, *fields, "Transfer-Encoding: chunked"), *chunks(b"clean", 2)])
    assert_refused_before_upstream(p, reply, b"secret 'gh'")


async def test_a_placeholder_in_a_trailer_is_refused(p: Harness) -> None:
    trailer = f"X-Trailer: {GH_PH}\r\n".encode()
    parts = [head(p, "Transfer-Encoding: chunked", "Trailer: X-Trailer")]
    reply = await send(p, [*parts, *chunks(b"clean body", 4, trailer)])
    assert_refused_before_upstream(p, reply, b"secret 'gh'")


async def test_a_sign_past_the_whole_body_limit_cuts_the_request_short(p: Harness) -> None:
    body = b"x" * (HOLD + 300_000) + GH_PH.encode()
    parts = [head(p, "Transfer-Encoding: chunked"), *chunks(body[:HOLD], 64 << 10)][:-1]
    parts += chunks(body[HOLD:], 5000)
    reply = await send(p, parts)
    assert reply.startswith(b"HTTP/1.1 403") or reply == b""  # the upstream may answer first
    assert [a.kind for a in p.alarms] == ["placeholder"]
    for _ in range(100):  # the upstream's read of the cut request ends on its own
        if p.up.requests and p.up.requests[0].body_sha256:
            break
        await asyncio.sleep(0.05)
    (got,) = p.up.requests
    assert got.body_length < len(body)
    assert b"stk_ph_" not in got.body


@pytest.mark.parametrize("size", CHUNK_SIZES)
async def test_a_clean_chunked_body_arrives_whole_framed_afresh(p: Harness, size: int) -> None:
    body = bytes(range(256)) * 40
    sent = [part.replace(b"\r\n", b";ext=1\r\n", 1) for part in chunks(body, size, b"X-T: 1\r\n")]
    reply = await send(p, [head(p, "Transfer-Encoding: chunked", "Trailer: X-T"), *sent])
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    (got,) = p.up.requests
    assert got.body == body
    assert got.header("transfer-encoding") == "chunked"
    assert got.header("trailer") is None
    assert not p.alarms


async def test_a_sized_body_past_the_limit_streams_whole(p: Harness) -> None:
    body = b"y" * (HOLD * 2 + 12345)
    reply = await send(p, [head(p, f"Content-Length: {len(body)}"), body])
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    (got,) = p.up.requests
    assert got.body_length == len(body)
    assert got.header("content-length") == str(len(body))


@pytest.mark.parametrize("sign", [GH_PH.encode(), DECOY.encode()])
async def test_an_http_1_0_close_delimited_body_is_searched_and_never_relayed(
    p: Harness, sign: bytes
) -> None:
    """HTTP/1.0 with no Content-Length: no body (RFC 9112 6.3). What the sandbox sends after
    the head is read, searched with the same overlap, and never sent on."""
    leak = b"k=" + sign
    parts = [head(p, version="HTTP/1.0"), leak[:9], leak[9:]]
    reply = await send(p, parts, half_close=True)
    assert reply.startswith(b"HTTP/1.1 200") or reply == b""  # as the two ends race
    for _ in range(100):
        if p.alarms or p.decoys.hits:
            break
        await asyncio.sleep(0.05)
    assert len(p.alarms) + len(p.decoys.hits) == 1
    for got in p.up.requests:
        assert got.body == b""
        assert sign not in got.head


async def test_an_http_1_0_request_without_a_body_still_works(p: Harness) -> None:
    reply = await send(p, [head(p, method="GET", version="HTTP/1.0")], half_close=True)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    assert reply.endswith(b"hello\n")
    assert p.up.requests[0].body_length == 0


async def test_100_continue_is_answered_here_and_the_body_checked(p: Harness) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
    try:
        writer.write(head(p, "Content-Length: 5", "Expect: 100-continue"))
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert p.up.connections == 0
        writer.write(b"hello")
        reply = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    assert reply.startswith(b"HTTP/1.1 200")
    (got,) = p.up.requests
    assert (got.body, got.header("expect")) == (b"hello", None)


@pytest.mark.parametrize(
    ("fields", "body", "reason"),
    [
        (["Transfer-Encoding: chunked", "Content-Length: 3"], b"abc", b"both"),
        (["Content-Length: 3", "Content-Length: 4"], b"abcd", b"differing"),
        (["Transfer-Encoding: gzip, chunked"], b"", b"not relayed"),
        (["Content-Length: -1"], b"", b"bad Content-Length"),
        (["X-A: b\x00c"], b"", b"control"),
        (["X-A: b\rX-B: c"], b"", b"malformed header"),
        ([" X-Folded: c"], b"", b"malformed header"),
        (["Transfer-Encoding: chunked"], b"zz\r\n", b"chunk size"),
    ],
)
async def test_smuggling_shapes_are_refused(
    p: Harness, fields: list[str], body: bytes, reason: bytes
) -> None:
    reply = await send(p, [head(p, *fields) + body])
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert reason in reply
    assert p.up.connections == 0


async def test_chunked_in_http_1_0_is_refused(p: Harness) -> None:
    reply = await send(p, [head(p, "Transfer-Encoding: chunked", version="HTTP/1.0")])
    assert reply.startswith(b"HTTP/1.1 400")
    assert b"HTTP/1.0" in reply
    assert p.up.connections == 0


async def test_an_encoded_decoy_split_across_chunks_is_caught(tmp_path: Path) -> None:
    """With the real tripwire: a decoy base64-encoded in a chunked body, cut in 3-byte
    chunks."""
    wire = Honeytokens(bytes(range(32)), lambda alarm: None)
    decoy = wire.decoys("tenant/box").aws_secret
    await wire.settle()
    h = await make_harness(tmp_path, tripwire=wire, up=Upstream(tmp_path / "plain", tls=False))
    try:
        body = b"blob=" + base64.b64encode(b"key=" + decoy.encode())
        reply = await send(h, [head(h, "Transfer-Encoding: chunked"), *chunks(body, 3)])
        assert_refused_before_upstream(h, reply, b"policy")
    finally:
        await h.proxy.close()
        await h.up.close()
