"""`python -m bench.brokered [--n N] [--mb M]`: what brokering a credential at the egress
proxy costs, side by side in one run on loopback, no engine needed. The tests' own HTTPS
upstream (tests/upstream.py) and the intercepting proxy (network/proxy.py + intercept.py,
one brokered secret for the upstream's name) each run in a process of their own; this
process is the client.

- latency: GETs on one kept-alive HTTPS connection (http.client), direct to the upstream
  with the real token against through the proxy with the placeholder (injected there),
  interleaved in rounds; the extra per request is the difference of the medians.
- throughput: curl downloading M MB (default 200) direct and through the proxy, MB/s.
Targets (issue 19): <= 2 ms extra per request, >= 100 MB/s through the proxy."""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench.timing import progress, summarize

TARGET_EXTRA_MS = 2.0
TARGET_MB_S = 100.0
NAME = "api.test"
PLACEHOLDER = "stk_ph_" + "q" * 32
REAL = "ghp_bench0123456789abcdefghijABCDEFGHIJ"


def _spawn(args: list[str]) -> tuple[subprocess.Popen[str], int]:
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{root / 'src'}:{root}"}
    process = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, text=True, env=env, cwd=root
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.strip().isdigit():
        process.kill()
        raise RuntimeError(f"{args[1]} did not start")
    return process, int(line)


@contextmanager
def _running(args: list[str]) -> Iterator[int]:
    process, port = _spawn(args)
    try:
        yield port
    finally:
        process.terminate()
        process.wait(10)


def _serve_proxy(folder: str, upstream_port: int) -> None:
    """The proxy process: one sandbox's EgressProxy with one brokered secret for NAME."""
    from stockade.supervisor.config.allowlist import Allowlist
    from stockade.supervisor.network.brokered import Broker, BrokeredSecret, Injection
    from stockade.supervisor.network.intercept import upstream_context
    from stockade.supervisor.network.mint import Authority
    from stockade.supervisor.network.proxy import EgressProxy, ProxySettings

    async def main() -> None:
        secret = BrokeredSecret(
            "bench", REAL, PLACEHOLDER, (NAME,), Injection("header", template="Bearer {secret}")
        )
        settings = ProxySettings(
            frozenset({upstream_port}), {NAME: "127.0.0.1"}, False, 64, 10.0, 60.0
        )
        proxy = EgressProxy(
            "bench", Allowlist([NAME], [upstream_port]), settings, lambda d: None,
            broker=Broker((secret,)), authority=Authority.load_or_create(Path(folder) / "ca"),
            upstream_context=upstream_context(str(Path(folder) / "ca.pem")),
        )  # fmt: skip
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        sock.setblocking(False)
        await proxy.start(sock)
        print(sock.getsockname()[1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def _connection(
    port: int, context: ssl.SSLContext, proxy: int | None
) -> http.client.HTTPSConnection:
    if proxy is None:
        conn = http.client.HTTPSConnection(NAME, port, context=context)
        conn.sock = context.wrap_socket(
            socket.create_connection(("127.0.0.1", port)), server_hostname=NAME
        )
        return conn
    conn = http.client.HTTPSConnection("127.0.0.1", proxy, context=context)
    conn.set_tunnel(NAME, port)
    return conn


def _latency(port: int, proxy: int, folder: Path, n: int) -> dict[str, Any]:
    direct_ctx = ssl.create_default_context(cafile=str(folder / "ca.pem"))
    proxied_ctx = ssl.create_default_context(cafile=str(folder / "ca" / "ca.crt"))
    direct = _connection(port, direct_ctx, None)
    proxied = _connection(port, proxied_ctx, proxy)
    samples: dict[str, list[float]] = {"direct": [], "proxied": []}
    rounds = 10
    per = max(n // rounds, 1)
    for i in range(rounds + 1):
        for label, conn, token in (("direct", direct, REAL), ("proxied", proxied, PLACEHOLDER)):
            for _ in range(per):
                started = time.perf_counter()
                conn.request("GET", "/", headers={"Authorization": f"Bearer {token}"})
                response = conn.getresponse()
                if response.read() != b"hello\n":
                    raise RuntimeError(f"{label}: unexpected answer {response.status}")
                if i:  # the first round warms both (TLS, leaf, caches)
                    samples[label].append(time.perf_counter() - started)
    direct.close()
    proxied.close()
    out = {k: summarize(v) for k, v in samples.items()}
    out["extra_ms"] = round(out["proxied"]["median_ms"] - out["direct"]["median_ms"], 3)
    return out


def _download(port: int, folder: Path, proxy: int | None, size: int) -> float:
    args = ["curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download}"]
    if proxy is None:
        args += ["--cacert", str(folder / "ca.pem"), "--resolve", f"{NAME}:{port}:127.0.0.1"]
    else:
        args += ["--cacert", str(folder / "ca" / "ca.crt"), "--proxy", f"http://127.0.0.1:{proxy}"]
    args.append(f"https://{NAME}:{port}/bytes/{size}")
    result = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"curl failed: {result.stderr.strip()}")
    return float(result.stdout) / 1e6


def run_brokered_bench(n: int = 300, mb: int = 200) -> dict[str, Any]:
    """Both measurements; MB/s as the best of three downloads each way."""
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        port = stack.enter_context(_running(["-m", "tests.upstream", tmp]))
        proxy = stack.enter_context(
            _running(["-m", "bench.brokered", "--serve-proxy", tmp, str(port)])
        )
        results: dict[str, Any] = {"latency": _latency(port, proxy, folder, n)}
        size = mb * 1000 * 1000
        direct = max(_download(port, folder, None, size) for _ in range(3))
        proxied = max(_download(port, folder, proxy, size) for _ in range(3))
        results["download"] = {"mb": mb, "direct_mb_s": round(direct, 1),
                               "proxied_mb_s": round(proxied, 1)}  # fmt: skip
        return results


def section(results: dict[str, Any]) -> str:
    if "error" in results:
        return f"== brokered credentials: the proxy ==\n  failed: {results['error']}"
    lat, down = results["latency"], results["download"]
    lines = [
        "== brokered credentials: the proxy (loopback, HTTPS, kept-alive) ==",
        f"{'':<40}{'n':>6}{'median':>10}{'p95':>10}   ms",
    ]
    for label, key in (("GET direct to the upstream", "direct"),
                       ("GET through the proxy (injected)", "proxied")):  # fmt: skip
        r = lat[key]
        lines.append(f"{label:<40}{r['n']:>6}{r['median_ms']:>10.3f}{r['p95_ms']:>10.3f}")
    met = "met" if lat["extra_ms"] <= TARGET_EXTRA_MS else "NOT met"
    lines.append(f"  extra per request {lat['extra_ms']:.3f} ms   target <= 2 ms   {met}")
    met = "met" if down["proxied_mb_s"] >= TARGET_MB_S else "NOT met"
    lines.append(
        f"download {down['mb']} MB (curl): direct {down['direct_mb_s']:.0f} MB/s, through the "
        f"proxy {down['proxied_mb_s']:.0f} MB/s   target >= 100 MB/s   {met}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.brokered", description=__doc__)
    parser.add_argument("--n", type=int, default=300, help="requests each way (default 300)")
    parser.add_argument("--mb", type=int, default=200, help="download size in MB (default 200)")
    parser.add_argument("--serve-proxy", nargs=2, metavar=("DIR", "PORT"), help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.serve_proxy:
        _serve_proxy(ns.serve_proxy[0], int(ns.serve_proxy[1]))
        return 0
    if ns.n < 10 or ns.mb < 1:
        parser.error("--n must be at least 10 and --mb at least 1")
    progress("brokered credentials: latency and throughput through the intercepting proxy")
    print(section(run_brokered_bench(ns.n, ns.mb)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
