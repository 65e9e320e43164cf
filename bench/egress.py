"""Egress mode: what the bandwidth cap lets through, measured against the cap, and what the
proxy adds to a small request. The upstream is an HTTP server of the bench's own on
loopback; the allowlist pins a test name to it."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.served import served
from bench.timing import summarize
from stockade.client import Sandbox, Stockade

CAP_KBIT = 16000
SIZE = 8 * 1024 * 1024


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # /blob/N: N bytes; anything else: 2
        _, blob, size = self.path.partition("/blob/")
        body = b"x" * (int(size) if blob else 2)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        left = int(self.headers.get("Content-Length", "0"))
        while left:
            left -= len(self.rfile.read(min(left, 1 << 16)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def upstream() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


def egress(engine: str, n: int, size: int = SIZE) -> dict[str, Any]:
    """Download and upload rates of `size` bytes through a capped link (and their ratio to
    the cap), and the latency of a small GET through the proxy, measured inside the sandbox
    by curl."""
    with upstream() as port:
        config = (
            f'[sandbox]\nnetwork = "egress"\n[network]\nallow = ["upstream.test"]\n'
            f"ports = [{port}]\nbandwidth_kbit = {CAP_KBIT}\n"
            f'[network.hosts]\n"upstream.test" = "127.0.0.1"\n'
        )
        with served(engine, config) as sup, Stockade(sup.target) as client:
            box = client.sandbox("bench-egress")
            url = f"http://upstream.test:{port}"
            down = _curl(box, f"-o /dev/null -w '%{{speed_download}}' {url}/blob/{size}")
            box.exec(f"head -c {size} /dev/zero > /tmp/blob")
            up = _curl(box, f"-o /dev/null -w '%{{speed_upload}}' --data-binary @/tmp/blob {url}/")
            small = _small_gets(box, url, n)
    cap = CAP_KBIT * 1000 / 8
    return {
        "cap_kbit": CAP_KBIT,
        "bytes": size,
        "download_bytes_per_s": down,
        "upload_bytes_per_s": up,
        "download_over_cap": down / cap,
        "upload_over_cap": up / cap,
        "small_get": small,
    }


def _curl(box: Sandbox, args: str) -> float:
    result = box.exec(f"curl -sS --max-time 120 {args}", timeout=180)
    if result.exit_code != 0:
        raise RuntimeError(f"curl failed: {result.for_llm}")
    return float(result.stdout)


def _small_gets(box: Sandbox, url: str, n: int) -> dict[str, Any]:
    """n small GETs through the proxy in one sandbox process, each timed by curl itself
    (connect to the proxy, CONNECT-less HTTP forward, upstream answer)."""
    count = max(n // 10, 10)
    timed = f"curl -sS -o /dev/null -w '%{{time_total}}\\n' {url}/"
    script = f"for i in $(seq {count}); do {timed}; done"
    result = box.exec(script, timeout=300)
    if result.exit_code != 0:
        raise RuntimeError(f"curl loop failed: {result.for_llm}")
    return summarize([float(line) for line in result.stdout.split()])
