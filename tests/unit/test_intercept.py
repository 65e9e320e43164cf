"""The intercepting egress proxy (network/intercept.py, the hook in proxy.py) driven for real:
the proxy on a loopback socket, the tests' own HTTPS upstream (tests/upstream.py), clients
that speak real TLS through CONNECT (asyncio streams, http.client, curl). Each attack is
attempted and what reached the upstream is read back from its records."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio

from stockade.supervisor.network.allowlist import Allowlist
from stockade.supervisor.network.brokered import Broker, BrokeredSecret, Injected, Injection
from stockade.supervisor.network.intercept import upstream_context
from stockade.supervisor.network.mint import Authority
from stockade.supervisor.network.proxy import EgressDecision, EgressProxy, ProxySettings
from stockade.supervisor.observe.alarms import Alarm
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


async def make_harness(tmp_path: Path, trust_upstream: bool = True) -> Harness:
    up = await Upstream(tmp_path / "upstream").start()
    authority = Authority.load_or_create(tmp_path / "egress-ca")
    settings = ProxySettings(
        ports=frozenset({up.port}),
        hosts={n: "127.0.0.1" for n in ("api.test", "other.test", "localhost")},
        allow_private_addresses=False,
        max_connections=16,
        connect_timeout_s=5,
        idle_timeout_s=10,
    )
    h = Harness(up, None, 0, tmp_path / "egress-ca" / "ca.crt")  # type: ignore[arg-type]
    context = upstream_context(str(up.ca.ca_file) if trust_upstream else None)
    h.proxy = EgressProxy(
        "tenant/box", Allowlist(["api.test", "other.test", "localhost"], [up.port]), settings,
        h.decisions.append, broker=Broker(SECRETS), tripwire=h.decoys, alarm=h.alarms.append,
        record_injection=h.injected.append, authority=authority, upstream_context=context,
    )  # fmt: skip
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    h.port = sock.getsockname()[1]
    await h.proxy.start(sock)
    return h


@pytest_asyncio.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
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


async def test_header_injection_and_the_real_value_masked_on_the_way_back(h: Harness) -> None:
    reply = await once(h, get("/echo", f"Authorization: Bearer {GH_PH}", "Accept-Encoding: gzip"))
    assert reply.status == 200
    (seen,) = h.up.requests
    assert seen.header("authorization") == f"Bearer {GH_REAL}"
    assert seen.header("accept-encoding") == "identity"
    assert GH_REAL.encode() not in reply.head + reply.body  # echoed in both, masked in both
    assert b"Bearer " + b"*" * len(GH_REAL) in reply.body
    assert reply.head.count(b"*" * len(GH_REAL)) == 1
    assert h.injected == [Injected("tenant/box", "gh", "api.test", "GET", "/echo")]
    assert not h.alarms
    assert [d.reason for d in h.decisions if d.allowed] == [
        "allowed by api.test; intercepted (brokered)"
    ]


@pytest.mark.parametrize("user_is_token", [False, True])
async def test_basic_injection(h: Harness, user_is_token: bool) -> None:
    pair = (REG_PH, "x") if user_is_token else ("bot", REG_PH)
    reply = await once(h, get("/auth", basic(*pair)))
    assert reply.body == b"authorized\n"
    sent = base64.b64decode(h.up.requests[0].header("authorization").split()[1]).decode()
    assert sent == (f"{REG_REAL}:x" if user_is_token else f"bot:{REG_REAL}")
    assert [i.secret for i in h.injected] == ["reg"]


async def test_the_401_challenge_passes_untouched(h: Harness) -> None:
    reply = await once(h, get("/auth"))
    assert reply.status == 401
    assert b'WWW-Authenticate: Basic realm="test"' in reply.head


@pytest.mark.parametrize(
    ("raw", "host", "secret"),
    [
        (get(f"/echo?token={GH_PH}"), "api.test", "gh"),
        (get("/echo?token=%73tk_ph_" + "a" * 32), "api.test", "gh"),
        (get("/echo", f"X-Leak: {GH_PH}"), "api.test", "gh"),
        (get("/echo", f"X-Leak: {GH_PH.upper()}"), "api.test", "gh"),
        (get("/echo", f"Authorization: token {GH_PH}"), "api.test", "gh"),  # not the template
        (get("/echo", f"Authorization: Bearer {GH_PH}", host="other.test"), "other.test", "gh"),
        (get("/echo", f"X-Api-Key: {OTHER_PH}"), "api.test", "other"),  # a host it may not go to
        (get("/echo", "X-Auth: Basic " + base64.b64encode(f"u:{REG_PH}".encode()).decode()),
         "api.test", "reg"),
        (get("/echo", basic("bot", REG_PH + "x")), "api.test", "reg"),
        (f"POST /echo HTTP/1.1\r\nHost: api.test\r\nContent-Length: 50\r\n\r\n{GH_PH:<50}".encode(),
         "api.test", "gh"),
        (f"POST /echo HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"
         f"5\r\n{GH_PH[:5]}\r\n{len(GH_PH) - 5:x}\r\n{GH_PH[5:]}\r\n0\r\n\r\n".encode(),
         "api.test", "gh"),
    ],
)  # fmt: skip
async def test_a_misplaced_placeholder_is_refused_and_never_reaches_the_upstream(
    h: Harness, raw: bytes, host: str, secret: str
) -> None:
    reply = await once(h, raw, host)
    assert_refused(h, reply, secret)
    assert h.up.requests == []  # not a byte of that request
    assert any(not d.allowed and secret in d.reason for d in h.decisions)


async def test_a_placeholder_in_a_large_streamed_body_is_cut_before_it_leaves(
    h: Harness,
) -> None:
    size = 3 * 1024 * 1024
    at = 2 * 1024 * 1024 + 256 * 1024 - 10  # across a read boundary, past the held part
    body = bytearray(b"y" * size)
    body[at : at + len(GH_PH)] = GH_PH.encode()
    reader, writer = await tunnel(h)
    writer.write(
        f"POST /sink HTTP/1.1\r\nHost: api.test\r\nContent-Length: {size}\r\n\r\n".encode()
    )
    for start in range(0, size, 100_000):  # written in pieces that cut the placeholder
        writer.write(body[start : start + 100_000])
        await writer.drain()
    reply = await read_response(reader)
    writer.close()
    assert_refused(h, reply, "gh")
    await asyncio.sleep(0.2)
    (seen,) = h.up.requests  # the head went, the body was cut short of the placeholder
    assert seen.body_length < at + len(GH_PH)
    assert b"stk_ph" not in seen.body
    assert seen.body_length >= 1024 * 1024


async def test_keep_alive_serves_many_requests_on_one_connection_each_way(h: Harness) -> None:
    reader, writer = await tunnel(h)
    for i in range(5):
        writer.write(
            get(f"/echo?{i}", f"Authorization: Bearer {GH_PH}").replace(
                b"{port}", str(h.up.port).encode()
            )
        )
        reply = await read_response(reader)
        assert reply.status == 200
    writer.write(b"HEAD /bytes/1000 HTTP/1.1\r\nHost: api.test\r\n\r\n")
    head = await read_response(reader, "HEAD")
    assert b"Content-Length: 1000" in head.head
    writer.write(get("/chunked?parts=ab,cd").replace(b"{port}", str(h.up.port).encode()))
    assert (await read_response(reader)).body == b"abcd"
    writer.close()
    assert h.up.connections == 1
    assert len(h.up.requests) == 7
    assert len(h.injected) == 5
    assert len([d for d in h.decisions if d.allowed]) == 1


async def test_http_client_and_a_chunked_response_cut_across_the_real_value(h: Harness) -> None:
    parts = f"{GH_REAL[:7]},{GH_REAL[7:20]},{GH_REAL[20:]},tail"

    def fetch() -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection("127.0.0.1", h.port, context=h.client_context())
        conn.set_tunnel("api.test", h.up.port)
        conn.request("GET", f"/chunked?parts={parts}")
        response = conn.getresponse()
        out = (response.status, response.read())
        conn.close()
        return out

    status, body = await asyncio.to_thread(fetch)
    assert status == 200
    assert body == b"*" * len(GH_REAL) + b"tail"


async def test_until_close_response_is_masked_and_closes(h: Harness) -> None:
    h.up.body = b"before " + GH_REAL.encode() + b" after"
    reply = await once(h, get("/close"))
    assert reply.body == b"before " + b"*" * len(GH_REAL) + b" after"
    assert b"Connection: close" in reply.head


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
async def test_curl_streams_200_mb_down_and_50_mb_up_in_bounded_memory(
    h: Harness, tmp_path: Path
) -> None:
    base = ["curl", "-sS", "--proxy", f"http://127.0.0.1:{h.port}", "--cacert", str(h.ca_file)]
    url = f"https://api.test:{h.up.port}"
    peak = [0]

    async def sample() -> None:
        while True:
            peak[0] = max(peak[0], rss_kib())
            await asyncio.sleep(0.02)

    async def curl(*args: str) -> str:
        process = await asyncio.create_subprocess_exec(
            *base, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await process.communicate()
        assert process.returncode == 0, err
        return out.decode()

    await curl("-o", "/dev/null", f"{url}/bytes/1000000")  # warm: leaves, TLS, buffers
    before = rss_kib()
    sampler = asyncio.ensure_future(sample())
    size = 200 * 1000 * 1000
    got = await curl("-o", "/dev/null", "-w", "%{size_download}", f"{url}/bytes/{size}")
    upload = tmp_path / "upload"
    with upload.open("wb") as out:
        for _ in range(50):
            out.write(b"z" * 1_000_000)
    sent = await curl(
        "-o", "/dev/null", "-w", "%{size_upload}", "-H", f"Authorization: Bearer {GH_PH}",
        "--data-binary", f"@{upload}", f"{url}/sink",
    )  # fmt: skip
    sampler.cancel()
    assert int(got) == size
    assert int(float(sent)) == 50_000_000
    assert h.up.requests[-1].body_length == 50_000_000
    assert h.up.requests[-1].header("authorization") == f"Bearer {GH_REAL}"
    assert peak[0] - before < 8 * 1024, f"RSS grew by {peak[0] - before} KiB"


async def test_curl_injects_for_the_header_kind(h: Harness) -> None:
    if shutil.which("curl") is None:
        pytest.skip("needs curl")
    process = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--proxy", f"http://127.0.0.1:{h.port}", "--cacert", str(h.ca_file),
        "-H", f"Authorization: Bearer {GH_PH}", f"https://api.test:{h.up.port}/echo",
        stdout=subprocess.PIPE,
    )  # fmt: skip
    out, _ = await process.communicate()
    assert process.returncode == 0
    assert b"Bearer " + b"*" * len(GH_REAL) in out
    assert h.up.requests[0].header("authorization") == f"Bearer {GH_REAL}"


async def test_other_allowed_hosts_keep_the_plain_tunnel(h: Harness) -> None:
    reply = await once(h, get("/echo", host="localhost"), host="localhost")
    assert reply.status == 200  # the upstream's own certificate, not a minted one
    assert [d.reason for d in h.decisions] == ["allowed by localhost"]


async def test_100_continue(h: Harness) -> None:
    reader, writer = await tunnel(h)
    writer.write(
        b"POST /echo HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\n"
        b"Content-Length: 5\r\n\r\n"
    )
    assert (await read_response(reader)).status == 100
    writer.write(b"hello")
    reply = await read_response(reader)
    writer.close()
    assert reply.status == 200
    assert h.up.requests[0].body == b"hello"
    assert h.up.requests[0].header("expect") is None


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
