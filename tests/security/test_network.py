"""Network modes, attacked from inside: an `egress` sandbox reaches exactly the allowlisted
names through the supervisor's proxy, and nothing else (no other name, no IP address, no
other port, no UDP, no DNS, no host address); the bandwidth and connection caps hold; every
decision is audited. The upstream servers are the test's own, on this machine's loopback
(the allowlist pins the test names to 127.0.0.1)."""

from __future__ import annotations

import http.server
import json
import ssl
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from stockade.client import Sandbox, Stockade, StockadeError, ToolResult
from stockade.supervisor.keys import sandbox_id
from tests.integration.harness import Supervisor, running_supervisor
from tests.upstream import QuietHandler

pytestmark = pytest.mark.timeout(300)
PROXY = "http://10.213.0.1:3128"
CAP_KBIT = 8000
CAP_BYTES_PER_S = CAP_KBIT * 1000 / 8
BLOB = 3 * 1024 * 1024


class _Handler(QuietHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.startswith("/blob"):
            self._send(b"x" * BLOB)
        else:
            self._send(f"hello from upstream {self.headers.get('Host', '')}".encode())

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        received = 0
        while received < length:
            received += len(self.rfile.read(min(65536, length - received)))
        self._send(str(received).encode())


@dataclass
class Upstream:
    http_port: int
    https_port: int
    ca_pem: str


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    ca = trustme.CA()
    cert = ca.issue_cert("upstream.test", "a.wild.test")
    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    secure = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert.configure_cert(context)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    for server in (plain, secure):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Upstream(plain.server_port, secure.server_port, ca.cert_pem.bytes().decode())
    finally:
        for server in (plain, secure):
            server.shutdown()
            server.server_close()


@pytest.fixture(scope="module")
def supervisor(engine: str, upstream: Upstream) -> Iterator[Supervisor]:
    config = textwrap.dedent(f"""
        [sandbox]
        network = "egress"
        [network]
        allow = ["upstream.test", "*.wild.test"]
        ports = [{upstream.http_port}, {upstream.https_port}]
        bandwidth_kbit = {CAP_KBIT}
        max_connections = 4
        [network.hosts]
        "upstream.test" = "127.0.0.1"
        "a.wild.test" = "127.0.0.1"
        "denied.test" = "127.0.0.1"
        """)
    with running_supervisor(engine, config) as sup:
        yield sup


@pytest.fixture
def box(client: Stockade, key: str, upstream: Upstream) -> Sandbox:
    sandbox = client.sandbox(key)
    sandbox.write_file("ca.pem", upstream.ca_pem)
    return sandbox


def run(box: Sandbox, command: str, timeout: int = 60) -> ToolResult:
    result = box.exec(command, timeout=timeout)
    assert result.exit_code is not None, f"{command!r}: {result.error_code} {result.for_llm}"
    return result


def python(box: Sandbox, program: str, timeout: int = 60) -> ToolResult:
    box.write_file("attempt.py", textwrap.dedent(program))
    return run(box, "python3 attempt.py", timeout)


def curl(box: Sandbox, args: str) -> tuple[str, str]:
    """(HTTP status, body) of a curl through the proxy."""
    options = f"-sS --max-time 20 -x {PROXY} --noproxy ''"
    result = run(box, f"curl {options} -w '\\n%{{http_code}}' {args}")
    body, _, status = result.stdout.rpartition("\n")
    return status, body


def test_allowed_names_are_reachable_over_http_and_https(box: Sandbox, upstream: Upstream) -> None:
    env = run(box, "env | grep -i _proxy= | sort").stdout
    assert f"HTTP_PROXY={PROXY}" in env
    assert f"https_proxy={PROXY}" in env
    plain = run(box, f"curl -sS --max-time 20 http://upstream.test:{upstream.http_port}/hi")
    assert plain.stdout == f"hello from upstream upstream.test:{upstream.http_port}"
    # HTTPS is tunnelled end to end: curl verifies the upstream's certificate itself
    secure = run(box, f"curl -sS --cacert ca.pem https://upstream.test:{upstream.https_port}/")
    assert secure.stdout == f"hello from upstream upstream.test:{upstream.https_port}"
    wildcard = run(box, f"curl -sS --cacert ca.pem https://a.wild.test:{upstream.https_port}/")
    assert wildcard.stdout.startswith("hello from upstream a.wild.test")
    by_python = python(
        box,
        f"""
        import urllib.request
        print(urllib.request.urlopen("http://upstream.test:{upstream.http_port}/").read().decode())
        """,
    )
    assert by_python.stdout.strip().startswith("hello from upstream"), by_python.for_llm


def test_other_names_addresses_and_ports_are_refused(box: Sandbox, upstream: Upstream) -> None:
    http_port, https_port = upstream.http_port, upstream.https_port
    refused = {
        f"http://denied.test:{http_port}/": "not on the allowlist",
        f"http://wild.test:{http_port}/": "not on the allowlist",  # *.wild.test: not the apex
        f"http://127.0.0.1:{http_port}/": "is an IP address",
        f"http://2130706433:{http_port}/": "is an IP address",
        f"http://[::1]:{http_port}/": "is an IP address",
        "http://upstream.test:22/": "port 22 is not allowed",
    }
    for url, reason in refused.items():
        status, body = curl(box, f"'{url}'")
        assert status == "403", (url, status, body)
        assert reason in body, (url, body)
    for target in (f"127.0.0.1:{https_port}", "upstream.test:22", f"denied.test:{https_port}"):
        status, body = curl(box, f"-p --cacert ca.pem 'https://{target}/'")
        assert status in ("000", "403"), (target, status, body)
    tunnel = run(box, f"curl -sS -p -x {PROXY} --noproxy '' https://denied.test:{https_port}/")
    assert tunnel.exit_code != 0, tunnel.for_llm
    assert "403" in tunnel.stderr, tunnel.for_llm


def test_no_way_around_the_proxy(box: Sandbox, upstream: Upstream) -> None:
    """Direct TCP and UDP to any address fail: the only route is the link to the proxy, and
    nothing but the proxy listens at its end. DNS does not resolve anything."""
    host_addresses = subprocess.run(
        ["hostname", "-I"], capture_output=True, text=True, check=True
    ).stdout.split()
    targets = [("10.213.0.1", upstream.http_port), ("10.213.0.1", 53), ("10.213.0.1", 22)]
    targets += [("127.0.0.1", upstream.http_port)]  # the sandbox's own loopback
    targets += [(a, upstream.http_port) for a in host_addresses if ":" not in a]
    result = python(
        box,
        f"""
        import socket
        for address, port in {targets!r}:
            try:
                socket.create_connection((address, port), timeout=3).close()
                print("TCP", address, port, "CONNECTED")
            except OSError as exc:
                print("TCP", address, port, "failed", exc)
        query = bytes.fromhex("abcd01000001000000000000")
        query += b"\\x08upstream\\x04test\\x00\\x00\\x01\\x00\\x01"
        for address in ["10.213.0.1"] + {[a for a in host_addresses if ":" not in a]!r}:
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.settimeout(2)
            try:
                udp.sendto(query, (address, 53))
                udp.recvfrom(512)
                print("UDP", address, "ANSWERED")
            except OSError as exc:
                print("UDP", address, "failed", exc)
        for name in ("upstream.test", "localhost.localdomain.test"):
            try:
                print("DNS", name, "RESOLVED", socket.getaddrinfo(name, 80))
            except OSError as exc:
                print("DNS", name, "failed", exc)
        """,
    )
    assert result.exit_code == 0, result.for_llm
    lines = result.stdout.splitlines()
    kinds = [line.split()[0] for line in lines]
    assert kinds.count("TCP") == len(targets), lines
    assert kinds.count("DNS") == 2, lines
    assert kinds.count("UDP") >= 2, lines
    for line in lines:
        assert " failed " in line, line


def test_tls_server_name_must_match_the_connect_host(
    supervisor: Supervisor, client: Stockade, box: Sandbox, key: str, upstream: Upstream
) -> None:
    result = python(
        box,
        f"""
        import socket, ssl
        def tunnel():
            s = socket.create_connection(("10.213.0.1", 3128), timeout=10)
            s.sendall(b"CONNECT upstream.test:{upstream.https_port} HTTP/1.1\\r\\n\\r\\n")
            head = b""
            while not head.endswith(b"\\r\\n\\r\\n"):
                head += s.recv(1)
            assert head.startswith(b"HTTP/1.1 200"), head
            return s
        context = ssl.create_default_context(cafile="ca.pem")
        context.check_hostname = False
        for name in ("upstream.test", "denied.test", None):
            try:
                with context.wrap_socket(tunnel(), server_hostname=name) as tls:
                    print(name, "HANDSHAKE", tls.version())
            except (OSError, ssl.SSLError) as exc:
                print(name, "failed", type(exc).__name__)
        s = tunnel()
        s.sendall(b"GET / HTTP/1.1\\r\\nHost: upstream.test\\r\\n\\r\\n")
        print("plain", "ANSWERED" if s.recv(100) else "failed closed")
        """,
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith("upstream.test HANDSHAKE"), result.for_llm
    assert lines[1].startswith("denied.test failed"), result.for_llm
    assert lines[2].startswith("None failed"), result.for_llm
    assert lines[3] == "plain failed closed", result.for_llm
    steps = [r.policy_step for r in client.list_audit(sandbox_key=key, tool="network")]
    assert any("'denied.test' does not match the CONNECT host" in s for s in steps), steps
    assert any("no server name (SNI)" in s for s in steps), steps
    assert any("not TLS" in s for s in steps), steps


def test_host_header_must_match_the_url(box: Sandbox, upstream: Upstream) -> None:
    result = python(
        box,
        f"""
        import socket
        s = socket.create_connection(("10.213.0.1", 3128), timeout=10)
        s.sendall(b"GET http://upstream.test:{upstream.http_port}/ HTTP/1.1\\r\\n"
                  b"Host: denied.test:{upstream.http_port}\\r\\n\\r\\n")
        print(s.recv(4096).decode())
        """,
    )
    assert result.stdout.startswith("HTTP/1.1 400"), result.for_llm
    assert "does not match" in result.stdout


def test_bandwidth_cap_holds_both_ways(box: Sandbox, upstream: Upstream) -> None:
    """The token bucket caps each direction at the configured rate. Only the upper bound is
    asserted (a busy machine can only make transfers slower); bench/ prints the ratio."""
    down = run(
        box,
        f"curl -sS -o /dev/null -w '%{{size_download}} %{{speed_download}}' "
        f"http://upstream.test:{upstream.http_port}/blob",
    )
    size, speed = down.stdout.split()
    assert int(size) == BLOB
    assert float(speed) <= CAP_BYTES_PER_S * 1.2, f"download at {float(speed):.0f} B/s"
    run(box, f"head -c {BLOB} /dev/zero > blob")
    up = run(
        box,
        "curl -sS -o /dev/null -w '%{size_upload} %{speed_upload}' --data-binary @blob "
        f"http://upstream.test:{upstream.http_port}/sink",
    )
    size, speed = up.stdout.split()
    assert int(size) == BLOB
    assert float(speed) <= CAP_BYTES_PER_S * 1.2, f"upload at {float(speed):.0f} B/s"


def test_connection_cap(box: Sandbox, upstream: Upstream) -> None:
    result = python(
        box,
        f"""
        import socket
        def connect():
            s = socket.create_connection(("10.213.0.1", 3128), timeout=10)
            s.sendall(b"CONNECT upstream.test:{upstream.https_port} HTTP/1.1\\r\\n\\r\\n")
            return s, s.recv(100).split(b"\\r\\n")[0].decode()
        held = [connect() for _ in range(4)]
        print([status for _, status in held])
        extra, status = connect()
        print(status)
        for s, _ in held:
            s.close()
        import time
        time.sleep(1)
        print(connect()[1])
        """,
    )
    lines = result.stdout.splitlines()
    assert lines[0] == str(["HTTP/1.1 200 Connection established"] * 4), result.for_llm
    assert lines[1] == "HTTP/1.1 503 Service Unavailable", result.for_llm
    assert lines[2] == "HTTP/1.1 200 Connection established", result.for_llm


def test_every_decision_is_audited(
    client: Stockade, box: Sandbox, key: str, upstream: Upstream
) -> None:
    curl(box, f"http://upstream.test:{upstream.http_port}/")
    curl(box, f"http://denied.test:{upstream.http_port}/")
    curl(box, f"http://127.0.0.1:{upstream.http_port}/")
    records = client.list_audit(sandbox_key=key, tool="network")
    seen = [(json.loads(r.arguments_json)["host"], r.is_error, r.caller) for r in records]
    assert ("upstream.test", False, "sandbox") in seen, seen
    assert ("denied.test", True, "sandbox") in seen, seen
    assert ("127.0.0.1", True, "sandbox") in seen, seen
    denied = [r for r in records if r.is_error]
    assert all(r.error_code == "PERMISSION_DENIED" for r in denied)


def test_ensure_sandbox_narrows_never_widens(
    client: Stockade, key: str, upstream: Upstream
) -> None:
    box = client.sandbox(key)
    box.write_file("keep.txt", "kept")
    info = box.ensure(allow=["a.wild.test"])
    assert (info.network_mode, info.network_allow) == ("egress", ("a.wild.test",))
    assert curl(box, f"http://a.wild.test:{upstream.http_port}/")[0] == "200"
    assert curl(box, f"http://upstream.test:{upstream.http_port}/")[0] == "403"
    for network, allow, code in [
        ("open", None, "PERMISSION_DENIED"),
        ("egress", ["evil.test"], "PERMISSION_DENIED"),
        ("egress", ["*.test"], "PERMISSION_DENIED"),
        ("egress", ["10.0.0.1"], "PERMISSION_DENIED"),
        ("bogus", None, "INVALID_ARGUMENT"),
        ("none", ["upstream.test"], "INVALID_ARGUMENT"),
        ("egress", ["a.wild.test"] * 10_000, "INVALID_ARGUMENT"),
        ("egress", ["a.wild.test\n"], "PERMISSION_DENIED"),
        ("egress", ["x" * 70_000 + ".wild.test"], "PERMISSION_DENIED"),
    ]:
        with pytest.raises(StockadeError) as raised:
            box.ensure(network=network, allow=allow)
        assert raised.value.code == code, (network, allow, raised.value)
    info = box.ensure(network="none")
    assert info.network_mode == "none"
    interfaces = run(box, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").stdout.split()
    assert interfaces == ["lo"]
    assert "kept" in box.read_file("keep.txt")


def test_link_survives_restart_and_goes_with_destroy(
    supervisor: Supervisor, key: str, upstream: Upstream
) -> None:
    namespace = Path(f"/var/run/netns/stockade-{supervisor.instance_id()[:8]}-{sandbox_id(key)}")
    url = f"http://upstream.test:{upstream.http_port}/"
    with supervisor.client() as c:
        assert curl(c.sandbox(key), url)[0] == "200"
    assert namespace.exists()
    supervisor.stop()
    supervisor.start()
    with supervisor.client() as c:
        box = c.sandbox(key)
        assert box.info().state == "RUNNING"
        assert curl(box, url)[0] == "200"
        box.destroy()
    assert not namespace.exists()


def test_sandbox_cannot_reconfigure_its_link(box: Sandbox) -> None:
    """No CAP_NET_ADMIN: the address, the link state and the routes stay as built (so the
    token bucket and the single route hold)."""
    result = python(
        box,
        """
        import fcntl, socket, struct
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        name = b"eth0".ljust(16, b"\\0")
        attempts = {
            "down": (0x8914, name + struct.pack("H", 0) + b"\\0" * 22),      # SIOCSIFFLAGS
            "address": (0x8916, name + struct.pack("HH4s", socket.AF_INET, 0,
                                                   socket.inet_aton("10.9.9.9")) + b"\\0" * 8),
            "mtu": (0x8922, name + struct.pack("i", 9000) + b"\\0" * 20),    # SIOCSIFMTU
        }
        for what, (request, arg) in attempts.items():
            try:
                fcntl.ioctl(s, request, arg)
                print(what, "ALLOWED")
            except OSError as exc:
                print(what, "denied", exc.errno)
        """,
    )
    assert result.stdout.split("\n")[:3] == ["down denied 1", "address denied 1", "mtu denied 1"]
    assert "eth0" in run(box, "cat /proc/net/route").stdout


@pytest.fixture
def open_supervisor(engine: str) -> Iterator[Supervisor]:
    with running_supervisor(engine, '[sandbox]\nnetwork = "open"\n') as sup:
        yield sup


def test_open_mode_is_the_bridge_with_a_warning(open_supervisor: Supervisor, key: str) -> None:
    """`open` only when configured: the engine's bridge (a default route), logged. No traffic
    is sent: reaching anything from it is the point of the mode, not a test."""
    with open_supervisor.client() as c:
        box = c.sandbox(key)
        assert box.ensure().network_mode == "open"
        routes = run(box, "cat /proc/net/route").stdout.splitlines()[1:]
        assert any(r.split()[1] == "00000000" for r in routes), routes  # a default route
        assert c.sandbox(key + "-n").ensure(network="none").network_mode == "none"
    assert f"sandbox {key!r} gets network mode open" in open_supervisor.log()
