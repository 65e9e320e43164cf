"""The hostile clients of issue 26, as plain functions that the integration tests attack a
real `stockade serve` with (tests/integration/test_http_hostile.py, test_e2b_bodies.py) and
that bench/front_abuse.py keeps up in a loop while another tenant is timed: connections held
idle or with half a head, a header value without end, a gzip bomb, an oversized Connect
envelope, and the envd client and upload they go through."""

from __future__ import annotations

import contextlib
import resource
import socket
import struct
import zlib
from collections.abc import Iterator

import httpx
from e2b import Sandbox

IDLE, SLOW = 1000, 200
"""Connections held to each HTTP port: sending nothing, and sending half a head."""
SOURCES = [f"127.0.0.{i}" for i in range(2, 12)]
"""Loopback addresses the held connections come from, so that every one of them is really
held, under `http.max_connections_per_address`."""
MiB = 1 << 20
HUGE_HEADER = 128 * MiB
"""The header value the attack sent unauthenticated (before the listener: 25 s of CPU)."""
DEEP_JSON = b"[" * 100_000 + b"]" * 100_000


def enough_open_files(needed: int) -> None:
    """This process's soft limit of open files raised to its hard one; refused below
    `needed`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < needed:
        raise RuntimeError(f"this process may open fewer than {needed} files")


@contextlib.contextmanager
def held_connections(
    addresses: dict[str, str], idle: int = IDLE, slow: int = SLOW
) -> Iterator[list[socket.socket]]:
    """`idle` connections that send nothing and `slow` ones that send half a head, to every
    port ("host:port"), spread over SOURCES; all closed after."""
    held: list[socket.socket] = []
    try:
        for address in addresses.values():
            host, port = address.rsplit(":", 1)
            for i in range(idle + slow):
                sock = socket.create_connection(
                    (host, int(port)), timeout=10, source_address=(SOURCES[i % len(SOURCES)], 0)
                )
                held.append(sock)
                if i >= idle:
                    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        yield held
    finally:
        for sock in held:
            sock.close()


def huge_header(address: str, most: int = HUGE_HEADER) -> int:
    """One unauthenticated request whose header value goes on for up to `most` bytes, sent
    until the server answers: its status (0 if it closed without one)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
        chunk, sent = b"a" * (64 << 10), 0
        with contextlib.suppress(ConnectionError):
            while sent < most:
                sock.sendall(chunk)
                sent += len(chunk)
        with contextlib.suppress(ConnectionError):
            reply = sock.recv(64)
            if reply.startswith(b"HTTP/1.1 "):
                return int(reply[9:12])
    return 0


def bomb() -> bytes:
    """270 MiB of zeros as gzip (~270 KB)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return b"".join(z.compress(bytes(MiB)) for _ in range(270)) + z.flush()


def start_envelope(size: int = 60_000_000) -> bytes:
    """A Connect envelope of an envd process Start whose argument is `size` bytes (the one
    accepted before the limit was 60 MB; gRPC's cap is 16 MiB)."""
    payload = b'{"process":{"cmd":"/bin/true","args":["' + b"x" * size + b'"]}}'
    return struct.pack(">BI", 0, len(payload)) + payload


CONNECT_JSON = {"content-type": "application/connect+json", "connect-protocol-version": "1"}


def envd_client(url: str, box: Sandbox) -> httpx.Client:
    """A raw HTTP client of `box`'s envd on the E2B front at `url`, as the SDK calls it."""
    headers = {"E2b-Sandbox-Id": box.sandbox_id, "X-Access-Token": str(box._envd_access_token)}
    return httpx.Client(base_url=url, headers=headers, timeout=120)


def upload(client: httpx.Client, path: str, body: bytes, encoding: str) -> httpx.Response:
    """`body` posted raw to envd's /files as `path`, with that Content-Encoding."""
    headers = {"content-type": "application/octet-stream", "content-encoding": encoding}
    return client.post("/files", params={"path": path}, content=body, headers=headers)
