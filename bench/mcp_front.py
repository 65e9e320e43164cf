"""MCP against gRPC: what a warm `exec true` costs through each front of one supervisor.

One `stockade serve` serves both the gRPC API and `[mcp] listen` on 127.0.0.1, with
`[mcp] key` set so that all fronts run in the same warm sandbox. The gRPC side is the sync
client (as `make bench`'s warm figure); the MCP side the official `mcp` SDK's client over
streamable HTTP in both protocol modes, each held open for the whole run as an agent would
hold it: its default ("auto", which takes the sessionless 2026-07-28 that the endpoint's
`server/discover` offers: `mcp`) and a session (`mode="legacy"`, the initialize handshake:
`mcp_session`); and, for the share that is the server's and not the SDK client's, MCP
without the SDK (bench.mcp_plain: JSON-RPC in a session over one kept-alive HTTP connection:
`mcp_plain`). After a warm-up on each, they take turns in rounds (each round's order rotated
by one: `rotation`), and each round reads the supervisor's CPU time from /proc.

Reported per front: median and p90 over all calls, the supervisor's CPU per call (and the
client process's, for what each client itself costs); and front - gRPC in ms, pooled and per
pair of rounds (median with its ~95% interval, quartiles, range), against the issue's target:
an MCP call costs at most 1 ms more than the same gRPC call (median, warm), judged on the SDK
client in each of its modes (`JUDGED`); the plain client's difference is shown beside them.

Alone: `python -m bench.mcp_front [--engine E] [--n N] [--rounds R]` (or
`python -m bench --only mcp`), which puts its figures under engines.<engine>.mcp in
bench/results.json and keeps the rest of the record.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from bench import RESULTS, stockade_runs
from bench.compare import one_round, read_results, thread_ns, write_results
from bench.compare_stats import (
    MIN_PAIRS,
    Round,
    median_ci,
    nearest_rank,
    quartiles,
    side_summary,
)
from bench.cpu import TICK, cpu_ticks
from bench.engines import ENGINES, bring_up
from bench.mcp_plain import PlainMcp
from bench.served import Served, free_port, served
from bench.timing import progress
from stockade.client import Stockade

KEY = "bench-mcp"
FRONTS = ("grpc", "mcp", "mcp_session", "mcp_plain")
JUDGED = ("mcp", "mcp_session")
"""The fronts judged against the target: the SDK client in its default mode (sessionless,
2026-07-28) and in a session."""
TITLES = {
    "mcp": "MCP, SDK client, default mode",
    "mcp_session": "MCP, SDK client, a session",
    "mcp_plain": "MCP, plain client, a session",
}
MODES = {"mcp": "default mode", "mcp_session": "session"}
TARGET_EXTRA_MS = 1.0
"""Issue 15: an MCP call costs at most this much more than the same gRPC call (median)."""
DEFAULT_ROUNDS = 10


def config(listen: str) -> str:
    """The supervisor's extra config: the MCP endpoint, every MCP session on KEY."""
    return f'[mcp]\nlisten = "{listen}"\nkey = "{KEY}"\n'


def rotation(rounds: int, fronts: Sequence[str] = FRONTS) -> list[tuple[int, str]]:
    """(round, front) in the order to run them: round r starts with front r mod k and goes on
    in turn, so each front runs first, second, ... equally often (for two fronts: what
    compare_stats.schedule does)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    k = len(fronts)
    return [(r, fronts[(r + i) % k]) for r in range(rounds) for i in range(k)]


async def exec_true(client: Client) -> None:
    result = await client.call_tool("exec", {"command": "true"})
    data = result.structured_content or {}
    if result.is_error or data.get("exit_code") != 0:
        raise RuntimeError(f"MCP exec true failed: {result.content}")


async def plain_exec_true(client: PlainMcp) -> None:
    result = await client.call_tool("exec", {"command": "true"})
    if result.get("isError") or (result.get("structuredContent") or {}).get("exit_code") != 0:
        raise RuntimeError(f"MCP exec true failed: {result.get('content')}")


async def mcp_round(call: Callable[[], Awaitable[None]], pid: int, calls: int) -> Round:
    """`calls` warm `exec true` through an MCP session, like compare.one_round."""
    samples = []
    ticks, ns = cpu_ticks(pid)[0], thread_ns(pid)
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return Round(tuple(samples), cpu_ticks(pid)[0] - ticks, thread_ns(pid) - ns)


async def measure(
    sup: Served, url: str, rounds: int, calls: int, warmup: int
) -> tuple[dict[str, list[Round]], dict[str, float], dict[str, str]]:
    """Warm the fronts up, then the interleaved rounds: each front's rounds, the client
    process's CPU seconds per front, and the protocol version each MCP client speaks. The
    sync gRPC calls block this loop while they run; the MCP clients' tasks only wait
    meanwhile."""
    measured: dict[str, list[Round]] = {front: [] for front in FRONTS}
    client_cpu = dict.fromkeys(FRONTS, 0.0)
    timeout = httpx2.Timeout(30, read=120)
    http, session_http = httpx2.AsyncClient(timeout=timeout), httpx2.AsyncClient(timeout=timeout)
    with Stockade(sup.target) as grpc_client:
        try:
            async with (
                http,
                session_http,
                Client(streamable_http_client(url, http_client=http)) as sdk,
                Client(
                    streamable_http_client(url, http_client=session_http), mode="legacy"
                ) as session,
                PlainMcp(url) as plain,
            ):
                protocols = {
                    "mcp": sdk.protocol_version,
                    "mcp_session": session.protocol_version,
                    "mcp_plain": plain.protocol_version,
                }
                if session.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
                    raise RuntimeError(f"mode legacy speaks {session.protocol_version}")
                await sdk.list_tools()  # what an agent does first
                await session.list_tools()
                mcp_calls: dict[str, Callable[[], Awaitable[None]]] = {
                    "mcp": partial(exec_true, sdk),
                    "mcp_session": partial(exec_true, session),
                    "mcp_plain": partial(plain_exec_true, plain),
                }
                for _ in range(warmup):
                    stockade_runs.exec_true(grpc_client, KEY)
                    for call in mcp_calls.values():
                        await call()
                for _, front in rotation(rounds):
                    before = time.process_time()
                    if front == "grpc":
                        done = one_round(grpc_client, sup.pid, calls, KEY)
                    else:
                        done = await mcp_round(mcp_calls[front], sup.pid, calls)
                    client_cpu[front] += time.process_time() - before
                    measured[front].append(done)
        finally:
            stockade_runs.destroy(grpc_client, KEY)
    return measured, client_cpu, protocols


def compared(
    measured: Mapping[str, Sequence[Round]], tick_hz: int, target_ms: float = TARGET_EXTRA_MS
) -> dict[str, Any]:
    """Each front's summary; per MCP front and figure, front - gRPC: pooled, and per pair of
    rounds (round r of each front); the target judged on the pooled medians of each front in
    JUDGED (`judged`), `met` when all of them meet it."""
    grpc = measured["grpc"]
    if not grpc:
        raise ValueError("rounds differ: grpc has none")
    result: dict[str, Any] = {"grpc": side_summary(grpc, tick_hz)}
    judged: dict[str, dict[str, Any]] = {}
    for front in FRONTS[1:]:
        rounds = measured[front]
        if len(rounds) != len(grpc):
            raise ValueError(f"rounds differ: grpc {len(grpc)}, {front} {len(rounds)}")
        result[front] = side_summary(rounds, tick_hz)
        diffs = pairwise(grpc, rounds, result["grpc"], result[front])
        result[f"{front}_minus_grpc"] = diffs
        if front in JUDGED:
            extra = diffs["median_ms"]
            judged[front] = {
                "met": extra["pooled"] <= target_ms,
                "verdict": verdict(extra, target_ms),
            }
    return {
        **result,
        "target_ms": target_ms,
        "judged": judged,
        "met": all(j["met"] for j in judged.values()),
        "verdict": "; ".join(f"{MODES[f]}: {j['verdict']}" for f, j in judged.items()),
    }


PER_ROUND: dict[str, Callable[[Round], float]] = {
    "median_ms": lambda r: statistics.median(r.seconds) * 1e3,
    "p90_ms": lambda r: nearest_rank(r.seconds, 0.9) * 1e3,
    "cpu_us_per_call": lambda r: r.thread_ns / 1e3 / len(r.seconds),
}


def pairwise(
    base: Sequence[Round],
    other: Sequence[Round],
    base_sum: dict[str, Any],
    other_sum: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """Per figure, other - base: pooled (of the summaries) and per pair of rounds."""
    if len(base) != len(other) or not base:
        raise ValueError(f"rounds differ: {len(base)} and {len(other)}")
    diffs = {}
    for figure, of_round in PER_ROUND.items():
        pairs = [of_round(o) - of_round(b) for b, o in zip(base, other, strict=True)]
        diffs[figure] = _difference(other_sum[figure] - base_sum[figure], pairs)
    return diffs


def _difference(pooled: float, pairs: list[float]) -> dict[str, Any]:
    q1, q3 = quartiles(pairs)
    low, high = median_ci(pairs)
    return {
        "pooled": round(pooled, 3),
        "pairs_median": round(statistics.median(pairs), 3),
        "pairs_median_ci95": [round(low, 3), round(high, 3)],
        "pairs_q1": round(q1, 3),
        "pairs_q3": round(q3, 3),
        "pairs_min": round(min(pairs), 3),
        "pairs_max": round(max(pairs), 3),
        "pairs": len(pairs),
    }


def verdict(extra: dict[str, Any], target_ms: float) -> str:
    """Met or MISSED by the pooled median difference; when the per-pair interval reaches
    across the target, it says so (the rounds do not settle it)."""
    met = extra["pooled"] <= target_ms
    word = "met" if met else "MISSED"
    if extra["pairs"] < MIN_PAIRS:
        return f"{word} (< {MIN_PAIRS} rounds: no interval)"
    low, high = extra["pairs_median_ci95"]
    if low <= target_ms < high:
        return f"{word} (the rounds' interval {low:.2f}..{high:.2f} ms reaches across)"
    return word


def measure_engine(engine: str, n: int, rounds: int, warmup: int) -> dict[str, Any]:
    """Bring the engine up, serve both fronts, measure; the figures of one engine."""
    bring_up(engine)
    calls = max(n // rounds, 1)
    listen = f"127.0.0.1:{free_port()}"
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    progress(f"{engine}: MCP against gRPC, {rounds} rounds of {calls} warm calls a front")
    with served(engine, config(listen)) as sup:
        measured, client_cpu, protocols = asyncio.run(
            measure(sup, f"http://{listen}/mcp", rounds, calls, warmup)
        )
    result = compared(measured, TICK)
    for front, protocol in protocols.items():
        result[front]["protocol"] = protocol
    return run_record(result, client_cpu, started, load_before, rounds, calls, warmup)


def run_record(
    result: dict[str, Any],
    client_cpu: Mapping[str, float],
    started: str,
    load_before: tuple[float, float, float],
    rounds: int,
    calls: int,
    warmup: int,
) -> dict[str, Any]:
    """One engine's figures of a front against gRPC, as bench/results.json keeps them: the
    client's CPU per call added to each front's summary."""
    for front, seconds in client_cpu.items():
        result[front]["client_cpu_us_per_call"] = round(seconds / result[front]["calls"] * 1e6, 1)
    return {
        "started_at": started,
        "rounds": rounds,
        "calls_per_round": calls,
        "warmup": warmup,
        # the bench runs on a shared machine: how busy it was, 1/5/15-minute averages
        "load_average": {"before": load_before, "after": os.getloadavg()},
        **result,
    }


ROWS = (
    ("median_ms", "warm exec true, median (ms)", ".2f"),
    ("p90_ms", "warm exec true, p90 (ms)", ".2f"),
    ("cpu_us_per_call", "supervisor CPU per call (µs)", ".0f"),
)


def section(engine: str, result: dict[str, Any]) -> str:
    """The table `make bench` prints for one engine."""
    head = f"== {engine}: MCP against gRPC, warm exec true, one supervisor and sandbox =="
    if "error" in result:
        return f"{head}\n  n/a: {result['error']}"
    lines = [
        f"== {engine}: MCP against gRPC, warm exec true, one supervisor and sandbox, "
        f"{result['rounds']} interleaved rounds of {result['calls_per_round']} calls a front ==",
    ]
    for front, title in TITLES.items():
        if front in result:
            lines += _block(result, front, title)
    for front, judged in result["judged"].items():
        extra = result[f"{front}_minus_grpc"]["median_ms"]["pooled"]
        label = f"MCP - gRPC, {MODES[front]}"
        lines.append(
            f"  {label:32}{extra:>9.2f} ms   "
            f"target <= {result['target_ms']:g} ms   {judged['verdict']}"
        )
    return "\n".join(lines)


def _block(result: dict[str, Any], front: str, title: str) -> list[str]:
    """gRPC against one MCP client: the figures, the difference, the pairs' spread."""
    grpc, mcp = result["grpc"], result[front]
    protocol = f" ({mcp['protocol']})" if "protocol" in mcp else ""
    lines = [
        title + protocol,
        f"  {'':30}{'gRPC':>9}{'MCP':>9}{'MCP-gRPC':>10}   pairs: median [95% CI], q1..q3",
    ]
    for key, label, spec in ROWS:
        d = result[f"{front}_minus_grpc"][key]
        low, high = d["pairs_median_ci95"]
        lines.append(
            f"  {label:30}{grpc[key]:>9{spec}}{mcp[key]:>9{spec}}{d['pooled']:>10{spec}}   "
            f"{d['pairs_median']:{spec}} [{low:{spec}}..{high:{spec}}], "
            f"{d['pairs_q1']:{spec}}..{d['pairs_q3']:{spec}}"
        )
    lines.append(
        f"  {'client CPU per call (µs)':30}{grpc['client_cpu_us_per_call']:>9.0f}"
        f"{mcp['client_cpu_us_per_call']:>9.0f}   (this process)"
    )
    lines.append(
        f"  {'spread of round medians':30}{grpc['round_median_spread']:>9.1%}"
        f"{mcp['round_median_spread']:>9.1%}   (max-min)/median"
    )
    return lines


def write(by_engine: dict[str, dict[str, Any]], path: Path = RESULTS, part: str = "mcp") -> None:
    """Put each engine's figures under engines.<engine>.<part>, keeping the rest of the
    record."""
    record = read_results(path)
    engines = record.get("engines")
    engines = dict(engines) if isinstance(engines, dict) else {}
    for engine, result in by_engine.items():
        previous = engines.get(engine)
        engines[engine] = {**(previous if isinstance(previous, dict) else {}), part: result}
    write_results({**record, "engines": engines}, path)
    progress(f'{part} figures written to {path} ("engines.<engine>.{part}")')


def run(engines: Sequence[str], n: int, rounds: int, warmup: int) -> int:
    """This measurement alone, on each engine: print, record; 1 if one failed."""
    return run_alone(engines, partial(measure_engine, n=n, rounds=rounds, warmup=warmup), section)


def run_alone(
    engines: Sequence[str],
    measure_one: Callable[[str], dict[str, Any]],
    section_of: Callable[[str, dict[str, Any]], str],
    part: str = "mcp",
) -> int:
    """One front's measurement alone, on each engine: print, record under `part`; 1 if one
    failed."""
    by_engine: dict[str, dict[str, Any]] = {}
    for engine in engines:
        try:
            by_engine[engine] = measure_one(engine)
        except Exception as exc:  # the other engine is still measured
            progress(f"{engine}: {part} measurement failed: {type(exc).__name__}: {exc}")
            by_engine[engine] = {"error": f"{type(exc).__name__}: {exc}"}
        print(section_of(engine, by_engine[engine]), end="\n\n", flush=True)
    write(by_engine, part=part)
    return 1 if any("error" in r for r in by_engine.values()) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mcp_front", description=__doc__)
    parser.add_argument("--engine", choices=[*ENGINES, "both"], default="both")
    parser.add_argument("--n", type=int, default=300, help="warm calls a front (default 300)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="(default 10)")
    ns = parser.parse_args(argv)
    if ns.n < 1 or ns.rounds < 1:
        parser.error("--n and --rounds must be at least 1")
    engines = ENGINES if ns.engine == "both" else (ns.engine,)
    return run(engines, ns.n, ns.rounds, min(max(ns.n // 10, 5), 30))


if __name__ == "__main__":
    sys.exit(main())
