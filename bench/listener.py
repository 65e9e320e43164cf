"""The hardened HTTP listener's cost (issue 26: "no more than 0.1 ms per call on the MCP and
E2B fronts"): plain uvicorn against the listener every HTTP front now serves through.

Two server processes, alike but for how they serve HTTP: "plain" is uvicorn's httptools
protocol with the settings the fronts had before the listener (`http="httptools"`, no proxy
headers, no access log; E2B's keep-alive of 75 s), "hardened" is `fronts.http.http_server`
(supervisor/fronts/listener.py's limits and fronts/backoff.py's back-off, the [http]
defaults). Each serves three apps on loopback:

- tiny: a small ASGI app answering `GET /` with 2 bytes (the listener's own share, most of
  the rest taken away);
- mcp: the real MCP endpoint (`fronts.mcp.server.build_app`, bearer tokens on), asked
  `tools/list` in an initialized session;
- e2b: the real E2B control plane and envd (`fronts.e2b.server.build_app`, API keys on),
  asked `GET /v2/sandboxes` (the tenant has none).

Neither request reaches a sandbox: the apps' SandboxManager is a real one, on a Podman
backend at a socket nothing listens at, which no request here calls. Every request presents
its credentials (a valid token), so the back-off's path runs on each one. No engine is
needed: this section is part of `make bench`'s host side.

This process is the client: per app and side, one kept-alive loopback connection (a new one
when an answer says `Connection: close`) over a plain socket, each request written whole and
its answer read to its end. After a warm-up on each, the sides take turns in interleaved
rounds (compare_stats.schedule: plain, hardened, then hardened, plain, ...; in each round the
three apps in turn), each round reading its server's CPU time from /proc. Reported per app:
each side's median, p90 and server CPU per request, and hardened - plain: pooled, and per
pair of rounds (the median with its ~95% interval), against the target: the hardened
listener adds at most 0.1 ms per request, in latency (median) and in server CPU.

Alone: `python -m bench --only listener [--listener-requests N] [--listener-rounds R]`, which
puts its figures under host.listener in bench/results.json and keeps the rest of the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from bench import RESULTS
from bench.compare import read_results, thread_ns, write_results
from bench.compare_stats import MIN_PAIRS, Round, schedule, side_summary
from bench.console_cost import tokens_file
from bench.cpu import TICK, cpu_ticks
from bench.mcp_front import pairwise
from bench.mcp_plain import PROTOCOL as MCP_PROTOCOL
from bench.timing import guarded, progress

TREE = Path(__file__).resolve().parents[1]
APPS = ("tiny", "mcp", "e2b")
TITLES = {
    "tiny": "a tiny ASGI app, GET / (2 bytes)",
    "mcp": "MCP endpoint, tools/list in a session",
    "e2b": "E2B control plane, GET /v2/sandboxes (none)",
}
SIDE_NAMES = {"old": "plain", "new": "hardened"}
"""compare_stats's sides: old is plain uvicorn, new the hardened listener."""
TARGET_MS = 0.1
"""Issue 26: the hardened listener costs at most this much more per request."""
REQUESTS, ROUNDS = 2000, 15
QUICK_REQUESTS = 300
NOWHERE = "unix:///nonexistent/stockade-bench-listener.sock"
"""The engine the apps' SandboxManager is given: no request of this bench reaches it."""


# the server side (a child process: `python -m bench.listener --serve SIDE ...`)


async def tiny_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


def _plain(app: Any, lifespan: Literal["on", "off"], **settings: Any) -> Any:
    """uvicorn as the fronts served before the hardened listener (git show
    06b6b29:supervisor/fronts/{mcp,e2b}/server.py)."""
    import uvicorn

    from stockade.supervisor.fronts.http import Uvicorn

    return Uvicorn(
        uvicorn.Config(
            app,
            lifespan=lifespan,
            log_config=None,
            access_log=False,
            http="httptools",
            proxy_headers=False,
            **settings,
        )
    )


async def serve_side(side: str, state_dir: Path, tokens: Path) -> None:
    """Serve the three apps the `side` way on free loopback ports; print the ports as one
    JSON line, then serve until stdin closes."""
    from stockade.supervisor.app import build_policy
    from stockade.supervisor.auth import Authenticator
    from stockade.supervisor.calls.pipeline import ToolPipeline
    from stockade.supervisor.config import load_config
    from stockade.supervisor.engines.backends.podman import PodmanBackend
    from stockade.supervisor.fronts.backoff import presents
    from stockade.supervisor.fronts.e2b import server as e2b
    from stockade.supervisor.fronts.e2b.context import E2bContext
    from stockade.supervisor.fronts.e2b.records import Records
    from stockade.supervisor.fronts.http import http_server, listening_socket, serve
    from stockade.supervisor.fronts.mcp import server as mcp
    from stockade.supervisor.sandboxes.manager import SandboxManager

    overrides = {
        "state_dir": str(state_dir),
        "auth.tokens_file": str(tokens),
        "mcp.listen": "127.0.0.1:0",
        "e2b.listen": "127.0.0.1:0",
    }
    config = load_config(None, overrides)
    policy = build_policy(config)
    authenticator = Authenticator(config.auth)
    manager = SandboxManager(config, PodmanBackend(NOWHERE), instance_id="benchlst", image="-")
    pipeline = ToolPipeline(config, manager, policy)
    endpoint = mcp.build_app(config, pipeline, policy, authenticator)
    records = await asyncio.to_thread(Records, config.state_dir)
    e2b_app, _control = e2b.build_app(
        E2bContext(config, pipeline, policy, authenticator, manager, records)
    )
    if side == "plain":
        servers = {
            "tiny": _plain(tiny_app, "off"),
            "mcp": _plain(endpoint.app, "on"),
            "e2b": _plain(e2b_app, "on", timeout_keep_alive=75),
        }
    else:
        bearer, keys = presents(b"authorization"), presents(b"x-api-key", e2b.TOKEN_HEADER)
        servers = {
            "tiny": http_server(tiny_app, config.http, "tiny", bearer, lifespan="off"),
            "mcp": http_server(endpoint.app, config.http, "mcp", bearer),
            "e2b": http_server(e2b_app, config.http, "e2b", keys),
        }
    ports, tasks = {}, []
    for app, server in servers.items():
        sock = listening_socket("127.0.0.1:0", "listen", app)
        ports[app] = sock.getsockname()[1]
        tasks.append(await serve(server, sock, app))
    print(json.dumps(ports), flush=True)
    await asyncio.to_thread(sys.stdin.read)
    for server in servers.values():
        server.config.timeout_graceful_shutdown = 1
        server.should_exit = True
    for task in tasks:
        with contextlib.suppress(Exception):
            await task
    if policy.audit is not None:
        policy.audit.close()


@dataclass
class Side:
    """A running server process: its pid and each app's port."""

    pid: int
    ports: dict[str, int]


@contextlib.contextmanager
def running(side: str, tokens: Path) -> Iterator[Side]:
    """The `side` server in a child process of its own (state in a temporary folder), this
    tree's code; stopped after."""
    paths = [str(TREE / "src"), str(TREE), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    with (
        tempfile.TemporaryDirectory(prefix="stkb-listener-", dir="/tmp") as state,
        subprocess.Popen(
            [sys.executable, "-m", "bench.listener", "--serve", side, state, str(tokens)],
            cwd=TREE,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as child,
    ):
        assert child.stdin is not None
        assert child.stdout is not None
        try:
            line = child.stdout.readline()
            if not line:
                raise RuntimeError(f"the {side} server ended before serving: {child.wait()}")
            yield Side(child.pid, json.loads(line))
        finally:
            with contextlib.suppress(OSError):
                child.stdin.close()
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


# the client side


class Connection:
    """One kept-alive HTTP/1.1 connection to 127.0.0.1:port: a request written whole, its
    answer (Content-Length or chunked) read to its end."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._sock: socket.socket | None = None
        self._buffer = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buffer = b""

    def ask(self, request: bytes, reconnect: bool = False) -> tuple[int, dict[str, str], bytes]:
        """Status, headers (lower-case names) and body of the answer to `request`;
        `reconnect`: on a new connection if the server had closed this one before answering
        (plain uvicorn closes a connection idle for 5 s)."""
        if self._sock is None:
            self._sock = socket.create_connection(("127.0.0.1", self._port), timeout=30)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._sock.sendall(request)
            head = self._until(b"\r\n\r\n")
        except ConnectionError:
            if not reconnect or self._buffer:
                raise
            self.close()
            return self.ask(request)
        status_line, *fields = head.decode("latin-1").split("\r\n")
        headers = {}
        for field in fields:
            name, _, value = field.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = self._exactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = self._chunks()
        else:
            raise RuntimeError(f"an answer with no length: {status_line}")
        if headers.get("connection", "").lower() == "close":
            self.close()
        return int(status_line.split()[1]), headers, body

    def _fill(self) -> None:
        assert self._sock is not None
        data = self._sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self._buffer += data

    def _until(self, mark: bytes) -> bytes:
        while (end := self._buffer.find(mark)) < 0:
            self._fill()
        found, self._buffer = self._buffer[:end], self._buffer[end + len(mark) :]
        return found

    def _exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._fill()
        found, self._buffer = self._buffer[:size], self._buffer[size:]
        return found

    def _chunks(self) -> bytes:
        body = b""
        while size := int(self._until(b"\r\n").split(b";")[0], 16):
            body += self._exactly(size)
            self._until(b"\r\n")
        self._until(b"\r\n")  # no trailers
        return body


def request(
    method: str, port: int, path: str, headers: Mapping[str, str], body: bytes = b""
) -> bytes:
    """A request's bytes to 127.0.0.1:port (a body's length always said on a POST)."""
    lines = [f"{method} {path} HTTP/1.1", f"host: 127.0.0.1:{port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body or method == "POST":
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Client:
    """What one side is asked: per app, a connection and the request it repeats."""

    def __init__(self, side: Side, token: str) -> None:
        self.connections = {app: Connection(port) for app, port in side.ports.items()}
        ports = side.ports
        bearer = {"authorization": f"Bearer {token}"}
        self.requests = {
            "tiny": request("GET", ports["tiny"], "/", bearer),
            "e2b": request("GET", ports["e2b"], "/v2/sandboxes", {"x-api-key": token}),
            "mcp": self._mcp_session(ports["mcp"], bearer),
        }

    def _mcp_session(self, port: int, bearer: dict[str, str]) -> bytes:
        """Initialize a session; the tools/list request of that session."""
        headers = {
            **bearer,
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
        }
        initialize = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": MCP_PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "stockade-bench", "version": "0"},
            },
        }
        conn = self.connections["mcp"]
        status, answer, body = conn.ask(
            request("POST", port, "/mcp", headers, json.dumps(initialize).encode())
        )
        if status != 200 or "mcp-session-id" not in answer:
            raise RuntimeError(f"MCP initialize: HTTP {status}: {body[:200]!r}")
        headers["mcp-session-id"] = answer["mcp-session-id"]
        headers["mcp-protocol-version"] = MCP_PROTOCOL
        done = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
        status, _, body = conn.ask(request("POST", port, "/mcp", headers, done))
        if status != 202:
            raise RuntimeError(f"MCP notifications/initialized: HTTP {status}: {body[:200]!r}")
        listing = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
        return request("POST", port, "/mcp", headers, listing)

    def check(self) -> None:
        """Each app's answer is what this bench means to measure."""
        for app in APPS:
            status, _, body = self.connections[app].ask(self.requests[app])
            expected = {"tiny": b"ok", "e2b": b"[]"}.get(app)
            if status != 200 or (expected is not None and body != expected):
                raise RuntimeError(f"{app}: HTTP {status}: {body[:200]!r}")
            if app == "mcp" and b'"tools"' not in body:
                raise RuntimeError(f"mcp: no tools/list result: {body[:200]!r}")

    def ask(self, app: str, reconnect: bool = False) -> None:
        status, _, body = self.connections[app].ask(self.requests[app], reconnect)
        if status != 200:
            raise RuntimeError(f"{app}: HTTP {status}: {body[:200]!r}")

    def close(self) -> None:
        for conn in self.connections.values():
            conn.close()


def one_round(client: Client, app: str, pid: int, requests: int) -> Round:
    """`requests` requests to `app`, each timed, with the server's CPU over them; after one
    untimed on the app's connection (anew if the server closed it while it sat idle)."""
    client.ask(app, reconnect=True)
    samples = []
    ticks, ns = cpu_ticks(pid)[0], thread_ns(pid)
    for _ in range(requests):
        started = time.perf_counter()
        client.ask(app)
        samples.append(time.perf_counter() - started)
    return Round(tuple(samples), cpu_ticks(pid)[0] - ticks, thread_ns(pid) - ns)


def what(requests: int, rounds: int) -> str:
    """The measurement's name in the bench's progress lines."""
    return (
        f"HTTP listener: plain against hardened, {rounds} interleaved rounds of {requests} "
        "requests a side and app"
    )


def measure(requests: int = REQUESTS, rounds: int = ROUNDS) -> dict[str, Any]:
    """Both servers at once, the interleaved rounds; the figures (compared)."""
    warmup = min(max(requests // 10, 20), 500)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    measured: dict[str, dict[str, list[Round]]] = {app: {"old": [], "new": []} for app in APPS}
    with (
        tokens_file() as (path, token),
        running("plain", path) as plain,
        running("hardened", path) as hardened,
    ):
        sides = {"old": plain, "new": hardened}
        clients = {name: Client(side, token) for name, side in sides.items()}
        try:
            for client in clients.values():
                client.check()
                for app in APPS:
                    for _ in range(warmup):
                        client.ask(app)
            for r, name in schedule(rounds):
                for i in range(len(APPS)):
                    app = APPS[(r + i) % len(APPS)]
                    done = one_round(clients[name], app, sides[name].pid, requests)
                    measured[app][name].append(done)
        finally:
            for client in clients.values():
                client.close()
    return {
        "started_at": started,
        "rounds": rounds,
        "requests_per_round": requests,
        "warmup": warmup,
        # the bench runs on a shared machine: how busy it was, 1/5/15-minute averages
        "load_average": {"before": load_before, "after": os.getloadavg()},
        **compared(measured, TICK),
    }


def compared(
    measured: Mapping[str, Mapping[str, Sequence[Round]]],
    tick_hz: int,
    target_ms: float = TARGET_MS,
) -> dict[str, Any]:
    """Per app, each side's summary and hardened - plain (mcp_front.pairwise), the latency
    (median) and the server CPU per request judged against `target_ms`; `met` when every
    app meets both."""
    apps: dict[str, Any] = {}
    for app, by_side in measured.items():
        old, new = side_summary(by_side["old"], tick_hz), side_summary(by_side["new"], tick_hz)
        added = pairwise(by_side["old"], by_side["new"], old, new)
        apps[app] = {
            "plain": old,
            "hardened": new,
            "added": added,
            "judged": {
                "latency": judge(added["median_ms"], target_ms),
                "cpu": judge(added["cpu_us_per_call"], target_ms * 1e3),
            },
        }
    met = all(j["met"] for a in apps.values() for j in a["judged"].values())
    return {"target_ms": target_ms, "apps": apps, "met": met}


def judge(added: Mapping[str, Any], target: float) -> dict[str, Any]:
    """Met or NOT met by the per-pair median of the added cost (`target` in its unit); when
    its ~95% interval reaches across the target, the rounds do not settle it: said so."""
    met = added["pairs_median"] <= target
    word = "met" if met else "NOT met"
    if added["pairs"] < MIN_PAIRS:
        return {"met": met, "verdict": f"{word} (< {MIN_PAIRS} rounds: no interval)"}
    low, high = added["pairs_median_ci95"]
    if low <= target < high:
        word += " (its interval reaches across)"
    return {"met": met, "verdict": word}


ROWS = (
    ("median_ms", "latency, median (µs)", 1e3),
    ("p90_ms", "latency, p90 (µs)", 1e3),
    ("cpu_us_per_call", "server CPU per request (µs)", 1.0),
)
JUDGED_ROWS = {"median_ms": "latency", "cpu_us_per_call": "cpu"}


def section(result: dict[str, Any]) -> str:
    """The table `make bench` prints (every figure in µs; the target 100 µs = 0.1 ms)."""
    head = "== HTTP listener: plain uvicorn (httptools) against the hardened listener"
    if "error" in result:
        return f"{head} ==\n  n/a: {result['error']}"
    target_us = result["target_ms"] * 1e3
    lines = [
        f"{head} with back-off, {result['rounds']} interleaved rounds of "
        f"{result['requests_per_round']} requests a side, one kept-alive loopback "
        "connection ==",
        f"  {'':30}{'plain':>9}{'hardened':>9}{'added':>8}   "
        f"pairs: median [95% CI]   target: added <= {target_us:g} µs",
    ]
    for app, title in TITLES.items():
        if app not in result["apps"]:
            continue
        a = result["apps"][app]
        lines.append(title)
        for key, label, scale in ROWS:
            d = a["added"][key]
            low, high = (v * scale for v in d["pairs_median_ci95"])
            row = (
                f"  {label:30}{a['plain'][key] * scale:>9.1f}{a['hardened'][key] * scale:>9.1f}"
                f"{d['pooled'] * scale:>8.1f}   {d['pairs_median'] * scale:.1f} "
                f"[{low:.1f}..{high:.1f}]"
            )
            if key in JUDGED_ROWS:
                row = f"{row:<84}{a['judged'][JUDGED_ROWS[key]]['verdict']}"
            lines.append(row)
    overall = "met" if result["met"] else "NOT met"
    lines.append(f"  the hardened listener adds <= {target_us:g} µs a request: {overall}")
    return "\n".join(lines)


def write(result: dict[str, Any], path: Path = RESULTS) -> None:
    """Put the figures under host.listener, keeping the rest of the record."""
    record = read_results(path)
    host = record.get("host")
    host = dict(host) if isinstance(host, dict) else {}
    write_results({**record, "host": {**host, "listener": result}}, path)
    progress(f'listener figures written to {path} ("host.listener")')


def run(requests: int, rounds: int) -> int:
    """`python -m bench --only listener`: measure, print, record; 1 if it failed."""
    result = guarded(what(requests, rounds), lambda: measure(requests, rounds))
    print(section(result), end="\n\n", flush=True)
    write(result)
    return 1 if "error" in result else 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 4 and args[0] == "--serve" and args[1] in ("plain", "hardened"):
        asyncio.run(serve_side(args[1], Path(args[2]), Path(args[3])))
        return 0
    print("python -m bench --only listener (this module serves its sides)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
