"""The HTTP listener ([http], fronts/listener.py) against a real `stockade serve` with the
MCP, E2B and console fronts on: 1,000 idle and 200 slow-header connections held to each
HTTP port (from ten loopback addresses, so that every one of them is really held, under
the per-address cap) do not stop an operator signing in to the console with the browser's
form post, nor the E2B SDK creating a sandbox; gRPC health stays SERVING, and the
supervisor's memory comes back within 50 MB once the connections close."""

from __future__ import annotations

import http.client
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from e2b import Sandbox
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.hostile import IDLE, SLOW, enough_open_files, held_connections
from stockade.supervisor.fronts.console.sessions import COOKIE
from tests.integration.e2b_kit import E2bServed, serving_e2b
from tests.integration.harness import free_tcp_address

MB = 1 << 20


@pytest.fixture(scope="module")
def fronts(
    engine: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[E2bServed, dict[str, str]]]:
    """The supervisor with all three HTTP fronts (acme is the console's operator): it and
    the fronts' addresses by name."""
    addresses = {"mcp": free_tcp_address(), "console": free_tcp_address()}
    extra = (
        f'[mcp]\nlisten = "{addresses["mcp"]}"\n'
        f'[console]\nlisten = "{addresses["console"]}"\noperators = ["acme"]\n'
    )
    with serving_e2b(engine, tmp_path_factory.mktemp("hostile"), extra) as served:
        addresses["e2b"] = served.url.removeprefix("http://")
        yield served, addresses


@pytest.fixture(autouse=True, scope="module")
def _enough_open_files() -> None:
    """This process holds 3,600 sockets at once: its soft limit raised to the hard one."""
    enough_open_files(3 * (IDLE + SLOW) + 500)


def sign_in(address: str, token: str) -> http.client.HTTPResponse:
    """The console's sign-in form posted as the browser posts it."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = urllib.parse.urlencode({"token": token})
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "Origin": f"http://{address}",
    }
    conn.request("POST", "/login", body, headers)
    answer = conn.getresponse()
    answer.read()
    conn.close()
    return answer


def healthy(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=30
        )
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def open_files_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open files limit")


def settled_rss(served: E2bServed, ceiling: int) -> int:
    """The supervisor's RSS once at most `ceiling` (or as it is after 60 s)."""
    deadline = time.monotonic() + 60
    rss = served.sup.rss_bytes()
    while rss > ceiling and time.monotonic() < deadline:
        time.sleep(0.5)
        rss = served.sup.rss_bytes()
    return rss


def test_idle_and_slow_connections_never_lock_out_sign_in_or_the_sdk(
    fronts: tuple[E2bServed, dict[str, str]],
) -> None:
    served, addresses = fronts
    assert served.sup.process is not None
    assert open_files_limit(served.sup.process.pid) >= 3 * (IDLE + SLOW) + 500
    Sandbox.create(**served.opts()).kill()  # warm: the image, the SDK's pools
    assert sign_in(addresses["console"], served.token).status == 303
    start = served.sup.rss_bytes()
    for _round in range(2):
        with held_connections(addresses) as held:
            assert len(held) == 3 * (IDLE + SLOW)
            answer = sign_in(addresses["console"], served.token)
            assert answer.status == 303
            assert COOKIE in (answer.getheader("set-cookie") or "")
            sandbox = Sandbox.create(**served.opts())
            try:
                assert sandbox.commands.run("echo held").stdout == "held\n"
            finally:
                sandbox.kill()
            assert healthy(served.sup.target)
        rss = settled_rss(served, start + 50 * MB)
        assert rss <= start + 50 * MB, f"RSS {rss / MB:.0f} MB after, {start / MB:.0f} MB before"
    assert healthy(served.sup.target)
