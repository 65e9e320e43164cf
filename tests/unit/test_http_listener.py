"""The hardened HTTP listener ([http], fronts/listener.py) and the back-off after failed
authentications (fronts/backoff.py), attacked with real sockets on 127.0.0.1 against the
real fronts' apps: the MCP endpoint, the E2B endpoint and the console, each on its own
uvicorn as `stockade serve` starts it. Against a real supervisor (1,000 idle and 200
slow-header connections on every port while an operator signs in and the E2B SDK creates a
sandbox): tests/integration/test_http_hostile.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor.app import build_policy
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.config import load_config
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.fronts.backoff import Backoff, client_address
from stockade.supervisor.fronts.console.context import ConsoleContext
from stockade.supervisor.fronts.console.server import ConsoleFront
from stockade.supervisor.fronts.e2b.records import Records
from stockade.supervisor.fronts.e2b.server import E2bFront
from stockade.supervisor.fronts.http import Uvicorn
from stockade.supervisor.fronts.listener import address_key
from tests.unit.fakes import (
    FakeBackend,
    e2b_context,
    fake_manager,
    mcp_front_in_process,
    tokens_file,
)

TOKEN = "good-token-0123456789abcdef"
FRONTS = ("mcp", "e2b", "console")
SMALL = {
    "http.max_request_line_bytes": 512,
    "http.max_head_bytes": 2048,
    "http.max_headers": 20,
}


@contextlib.asynccontextmanager
async def front(kind: str, tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[int, Uvicorn]]:
    """One real front with `settings` (dotted [http] keys), serving on a free loopback port
    with bearer tokens (TOKEN, tenant acme; the console's operator): its port and server."""
    tokens = str(tokens_file(tmp_path, f"{TOKEN} acme\n"))
    common = {
        "state_dir": str(tmp_path / "state"),
        "auth.enabled": True,
        "auth.tokens_file": tokens,
        **settings,
    }
    if kind == "mcp":
        async with mcp_front_in_process(tmp_path, **common) as (mcp, _endpoint):
            yield mcp.port, mcp._server
        return
    config = load_config(None, {f"{kind}.listen": "127.0.0.1:0", **common})
    authenticator = Authenticator(config.auth)
    running: Any
    if kind == "e2b":  # the listener's attacks end before a sandbox: a fake engine
        running = E2bFront(e2b_context(config, Records(None), authenticator))
    else:
        policy = build_policy(config)
        manager = fake_manager(config, FakeBackend())
        running = ConsoleFront(ConsoleContext(config, policy, authenticator, manager, None))
    await running.start()
    try:
        yield running.port, running._server
    finally:
        await running.stop(1)


def request(path: str = "/", method: str = "GET", headers: str = "", body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}"
    if body:
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


async def exchange(port: int, data: bytes, *, source: str = "127.0.0.1") -> bytes:
    """Send `data` on a new connection (from `source`) and read until the server closes it
    or one answer's head and body arrived."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(data)
            await writer.drain()
        return await answer(reader)
    finally:
        writer.close()


async def answer(reader: asyncio.StreamReader) -> bytes:
    """One answer (its head, and a body of Content-Length), or what came before EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial
    except ConnectionError:
        return b""
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


def status(reply: bytes) -> int:
    assert reply.startswith(b"HTTP/1.1 "), reply[:200]
    return int(reply[9:12])


async def closed(reader: asyncio.StreamReader) -> bool:
    """True once the server has closed the connection (EOF or a reset)."""
    try:
        return await reader.read(1) == b""
    except ConnectionError:
        return True


def ok(port: int) -> bytes:
    """A request every front answers without a sandbox: 404 from MCP and E2B (an unknown
    path; E2B's with its key), the console's sign-in page."""
    return request("/login", headers=f"X-API-KEY: {TOKEN}\r\n")


PENDING = request(
    "/login",
    "POST",
    "Origin: http://127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
    "Content-Length: 100\r\n",
)
"""A sign-in whose body never comes: a request in progress until its connection closes."""
NORMAL = {"mcp": 404, "e2b": 404, "console": 200}


async def normal(kind: str, port: int) -> None:
    assert status(await exchange(port, ok(port))) == NORMAL[kind]


# ---- the head ----


@pytest.mark.parametrize("kind", FRONTS)
async def test_a_huge_header_value_is_refused_at_the_limit(kind: str, tmp_path: Path) -> None:
    """A header value streamed without end (the attack sent 128 MiB): 431 once the head
    passes max_head_bytes, the connection closed; the parser was never fed past the limit."""
    async with front(kind, tmp_path, **SMALL) as (port, server):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
        replied = asyncio.create_task(answer(reader))
        sent = 0
        with contextlib.suppress(ConnectionError):
            while sent < 128 << 20 and not replied.done():
                writer.write(b"a" * (64 << 10))
                await writer.drain()
                sent += 64 << 10
        reply = await replied
        writer.close()
        assert status(reply) == 431
        assert b"the request head is longer than 2048 bytes" in reply
        assert server.listener.refused["head"] == 1
        await normal(kind, port)


@pytest.mark.parametrize("kind", FRONTS)
async def test_request_line_and_header_count_limits(kind: str, tmp_path: Path) -> None:
    async with front(kind, tmp_path, **SMALL) as (port, _server):
        reply = await exchange(port, request("/" + "a" * 600))
        assert status(reply) == 414
        assert b"request line exceeds 512 bytes" in reply
        many = "".join(f"X-H{i}: v\r\n" for i in range(25))
        reply = await exchange(port, request(headers=many))
        assert status(reply) == 431
        assert b"more than 20 header fields" in reply
        await normal(kind, port)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        (
            "Content-Length with Transfer-Encoding",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        ("a bare CR in a header", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: b\rX-B: c\r\n\r\n"),
        ("a bare LF ending a header", b"GET / HTTP/1.1\r\nHost: x\nX-A: b\r\n\r\n"),
        ("a NUL in a header value", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: b\x00c\r\n\r\n"),
        ("a NUL in the target", b"GET /a\x00b HTTP/1.1\r\nHost: x\r\n\r\n"),
        (
            "two Content-Lengths",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        ),
        ("an obsolete line folding", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: b\r\n c\r\n\r\n"),
    ],
)
@pytest.mark.parametrize("kind", FRONTS)
async def test_request_smuggling_is_refused(
    kind: str, name: str, data: bytes, tmp_path: Path
) -> None:
    async with front(kind, tmp_path) as (port, _server):
        reply = await exchange(port, data)
        assert status(reply) == 400, name
        assert b"invalid HTTP request" in reply


async def test_trailers_are_held_to_the_head_limit_and_never_reach_the_app(
    tmp_path: Path,
) -> None:
    """A chunked body's trailers: no more than max_head_bytes (else 431), and not added to
    the headers of a request its app already holds."""
    async with front("console", tmp_path, **SMALL) as (port, server):
        head = b"POST /login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        reply = await exchange(port, head + b"1\r\na\r\n0\r\nX-T: " + b"a" * 8192 + b"\r\n\r\n")
        assert status(reply) == 431
        assert b"trailers are longer than 2048 bytes" in reply
        assert server.listener.refused["head"] == 1


# ---- time ----


@pytest.mark.parametrize("kind", FRONTS)
async def test_a_slow_head_gets_408_and_a_silent_connection_is_closed(
    kind: str, tmp_path: Path
) -> None:
    async with front(kind, tmp_path, **{"http.header_timeout_s": 0.3}) as (port, server):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the end of the head
        reply = await answer(reader)
        assert status(reply) == 408
        assert b"did not arrive within 0.3 s" in reply
        assert await closed(reader)
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # nothing sent
        assert status(await answer(reader)) == 408
        writer.close()
        assert server.listener.refused["slow"] == 2


async def test_an_idle_kept_alive_connection_is_closed(tmp_path: Path) -> None:
    async with front("console", tmp_path, **{"http.idle_timeout_s": 0.3}) as (port, server):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request("/login"))
        assert status(await answer(reader)) == 200
        assert await closed(reader)  # no request within idle_timeout_s
        writer.close()
        assert server.listener.count == 0


async def test_keep_alive_ends_after_max_requests_per_connection(tmp_path: Path) -> None:
    async with front("console", tmp_path, **{"http.max_requests_per_connection": 2}) as (
        port,
        _server,
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request("/login"))
        first = await answer(reader)
        assert b"connection: close" not in first.lower()
        writer.write(request("/login"))
        second = await answer(reader)
        assert status(second) == 200
        assert b"connection: close" in second.lower()
        assert await closed(reader)
        writer.close()


# ---- connections and requests in progress ----


@pytest.mark.parametrize("kind", FRONTS)
async def test_idle_and_slow_connections_never_lock_a_new_client_out(
    kind: str, tmp_path: Path
) -> None:
    """Far more idle and half-sent connections than max_connections (and than
    max_active_requests, which counts none of them): each new connection takes the place of
    the longest waiting one, and a client still gets its answer."""
    limits = {"http.max_connections": 8, "http.max_active_requests": 2}
    async with front(kind, tmp_path, **limits) as (port, server):
        held = []
        for i in range(40):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if i % 2:
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            held.append((reader, writer))
        await normal(kind, port)
        assert server.listener.count <= 8
        assert server.listener.refused["yielded"] >= 32
        assert await closed(held[0][0])  # the oldest gave way
        for _reader, writer in held:
            writer.close()


async def test_one_address_is_held_to_its_own_cap(tmp_path: Path) -> None:
    """127.0.0.2 holds no more than max_connections_per_address: its own oldest waiting
    connection yields to its next one, and once each of them has a request in progress its
    next is refused (503) while 127.0.0.1 is still served."""
    limits = {"http.max_connections_per_address": 3, "http.max_active_requests": 100}
    async with front("console", tmp_path, **limits) as (port, server):
        conns = [await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
                 for _ in range(5)]  # fmt: skip
        assert await closed(conns[0][0])
        assert await closed(conns[1][0])
        assert len(server.listener.by_address["127.0.0.2"]) == 3
        for _reader, writer in conns[2:]:  # a request in progress: a body still to come
            writer.write(PENDING)
            await writer.drain()
        while server.listener.waiting:
            await asyncio.sleep(0.01)
        reply = await exchange(port, ok(port), source="127.0.0.2")
        assert status(reply) == 503
        assert b"too many connections from this address" in reply
        await normal("console", port)
        for _reader, writer in conns:
            writer.close()


async def test_requests_in_progress_are_capped_and_only_they(tmp_path: Path) -> None:
    limits = {"http.max_active_requests": 2}
    async with front("console", tmp_path, **limits) as (port, server):
        busy = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(PENDING)
            busy.append((reader, writer))
        while server.listener.active < 2:
            await asyncio.sleep(0.01)
        reply = await exchange(port, ok(port))
        assert status(reply) == 503
        assert b"retry-after: 1" in reply.lower()
        assert b"too many requests in progress" in reply
        for _reader, writer in busy:
            writer.close()
        while server.listener.active:
            await asyncio.sleep(0.01)
        await normal("console", port)


# ---- failed authentications ----


def test_the_back_off_doubles_and_is_forgotten() -> None:
    now = [1000.0]
    backoff = Backoff(free=2, max_s=10.0, clock=lambda: now[0])
    assert [backoff.failed("a") for _ in range(2)] == [0.0, 0.0]
    assert backoff.wait_s("a") == 0.0
    waits = [backoff.failed("a") for _ in range(6)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff.wait_s("a") == 10.0
    assert backoff.wait_s("b") == 0.0  # another address is not slowed
    now[0] += 9.5
    assert backoff.wait_s("a") == pytest.approx(0.5)
    now[0] += 20.0  # twice max_s with no failure: it starts over
    assert backoff.wait_s("a") == 0.0
    assert backoff.failed("a") == 0.0


def test_the_client_address_behind_a_trusted_proxy() -> None:
    def scope(peer: str, forwarded: str | None) -> dict[str, Any]:
        headers = [] if forwarded is None else [(b"x-forwarded-for", forwarded.encode())]
        return {"client": (peer, 1), "headers": headers}

    trusted = frozenset({"127.0.0.1"})
    assert client_address(scope("127.0.0.1", "1.2.3.4, 10.0.0.9"), trusted) == "10.0.0.9"
    assert client_address(scope("127.0.0.1", None), trusted) == "127.0.0.1"
    assert client_address(scope("10.1.1.1", "1.2.3.4"), trusted) == "10.1.1.1"  # not trusted
    assert client_address(scope("2001:db8::1", None), trusted) == "2001:db8::/64"
    assert address_key("::ffff:10.0.0.1") == "10.0.0.1"


BAD = "x" * len(TOKEN)
"""A wrong token as long as the right one (the requests' Content-Length holds for both)."""
WRONG = {
    "mcp": request("/mcp", "POST", f"Authorization: Bearer {BAD}\r\n", b"{}"),
    "e2b": request("/v2/sandboxes", headers=f"X-API-KEY: {BAD}\r\n"),
    "console": request(
        "/login",
        "POST",
        "Origin: http://127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n",
        b"token=" + BAD.encode(),
    ),
}
RIGHT = {kind: data.replace(BAD.encode(), TOKEN.encode()) for kind, data in WRONG.items()}


@pytest.mark.parametrize("kind", FRONTS)
async def test_failed_authentications_back_off_per_address(kind: str, tmp_path: Path) -> None:
    """Past auth_free_failures, an address presenting credentials is answered 429 with
    Retry-After, even with the right token (never checked meanwhile); another address is
    not slowed, and a request without credentials is answered as before."""
    settings = {"http.auth_free_failures": 2, "http.auth_backoff_max_s": 60.0}
    async with front(kind, tmp_path, **settings) as (port, _server):
        for _ in range(3):
            assert status(await exchange(port, WRONG[kind], source="127.0.0.3")) == 401
        for data in (WRONG[kind], RIGHT[kind]):
            reply = await exchange(port, data, source="127.0.0.3")
            assert status(reply) == 429
            assert b"retry-after: 1" in reply.lower()
            assert b"too many failed authentications from this address" in reply
        assert BAD.encode() not in reply
        assert status(await exchange(port, RIGHT[kind])) not in (401, 429)  # 127.0.0.1
        await normal(kind, port)


# ---- the settings ----


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("http.max_head_bytes", 10),
        ("http.max_request_line_bytes", 1 << 21),
        ("http.max_headers", 0),
        ("http.max_connections", 0),
        ("http.max_connections_per_address", 0),
        ("http.max_active_requests", 0),
        ("http.header_timeout_s", 0.0),
        ("http.idle_timeout_s", float("inf")),
        ("http.auth_backoff_max_s", -1.0),
        ("http.auth_free_failures", -1),
        ("http.trusted_proxies", ["proxy.example"]),
    ],
)
def test_settings_out_of_range_are_refused(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(None, {key: value})


def test_the_defaults_load() -> None:
    http = load_config(None, {}).http
    assert http.max_head_bytes == 32768
    assert http.max_active_requests < http.max_connections
