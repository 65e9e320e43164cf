"""The intercepting egress proxy (network/intercept.py, the hook in proxy.py) driven for real:
the proxy on a loopback socket, the tests' own HTTPS upstream (tests/upstream.py), clients
that speak real TLS through CONNECT (asyncio streams, http.client, curl). Each attack is
attempted and what reached the upstream is read back from its records."""

from __future__ import annotations

import asyncio
import base64
import http.client
import shutil
import subprocess
from pathlib import Path

import pytest

from stockade.supervisor.network.brokered import Broker, Injected
from tests.unit.intercept_harness import (
    GH_PH,
    GH_REAL,
    OTHER_PH,
    REG_PH,
    REG_REAL,
    SECRETS,
    Harness,
    assert_refused,
    basic,
    get,
    once,
    read_response,
    tunnel,
)


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


def test_stream_filters_see_a_value_cut_at_every_position() -> None:
    from stockade.supervisor.network.httpio import Masker, Watch

    text = b"head " + GH_REAL.encode() + b" tail " + GH_REAL.encode()
    for cut in range(len(text) + 1):
        masker = Masker([GH_REAL.encode()])
        out = masker.feed(text[:cut]) + masker.feed(text[cut:]) + masker.flush()
        assert out == text.replace(GH_REAL.encode(), b"*" * len(GH_REAL))
    placeholder = GH_PH.encode()
    for k in range(1, len(placeholder)):
        watch = Watch(len(placeholder) - 1, lambda w: "found" if placeholder in w else None)
        sent, found = watch.feed(b"x" * 100 + placeholder[:k])
        assert found is None
        assert sent == b"x" * len(sent)  # no byte of the placeholder has left
        assert len(sent) == 100 + k - (len(placeholder) - 1)
        assert watch.feed(placeholder[k:]) == (b"", "found")


def test_injection_places() -> None:
    from stockade.supervisor.network.brokered import inject

    broker = Broker(SECRETS)
    assert inject(broker, "authorization", f"bearer {GH_PH}", "api.test") is not None
    assert inject(broker, "Authorization", f"Bearer {GH_PH}", "evil.test") is None
    assert inject(broker, "Authorization", f"Bearer {GH_PH} x", "api.test") is None
    assert inject(broker, "X-Api-Key", OTHER_PH, "a.other.test") is not None
    assert inject(broker, "X-Api-Key", OTHER_PH, "xother.test") is None
    assert inject(broker, "Authorization", "Basic !!notbase64", "api.test") is None


@pytest.mark.parametrize(("path", "pause"), [("/bye", False), ("/drop", True), ("/late", False)])
async def test_an_upstream_that_closes_a_kept_alive_connection_is_reopened(
    h: Harness, path: str, pause: bool
) -> None:
    reader, writer = await tunnel(h)
    for raw in (get(path), get("/echo", f"Authorization: Bearer {GH_PH}"), get(path), get("/")):
        writer.write(raw.replace(b"{port}", str(h.up.port).encode()))
        reply = await read_response(reader)
        assert reply.status == 200
        if pause:  # the upstream's close arrives before the next request (else: after)
            await asyncio.sleep(0.05)
    writer.close()
    assert h.up.connections == 3  # the sandbox kept one connection throughout
    assert [r.target for r in h.up.requests] == [path, "/echo", path, "/"]


async def test_a_post_the_upstream_left_unanswered_is_not_sent_twice(h: Harness) -> None:
    reader, writer = await tunnel(h)
    writer.write(get("/late").replace(b"{port}", str(h.up.port).encode()))
    assert (await read_response(reader)).status == 200
    writer.write(b"POST /echo HTTP/1.1\r\nHost: api.test\r\nContent-Length: 2\r\n\r\nhi")
    reply = await read_response(reader)
    writer.close()
    assert reply.status == 502
    assert b"sent no response" in reply.body
    assert [r.target for r in h.up.requests] == ["/late"]
    assert h.up.connections == 1
