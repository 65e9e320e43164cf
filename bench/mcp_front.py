"""MCP against gRPC: what a warm `exec true` costs through each front of one supervisor.

One `stockade serve` serves both the gRPC API and `[mcp] listen` on 127.0.0.1, with
`[mcp] key` set so that both fronts run in the same warm sandbox. The gRPC side is the sync
client (as `make bench`'s warm figure); the MCP side the official `mcp` SDK's client over
streamable HTTP, one session held open for the whole run, as an agent would hold it; and, for
the share that is the server's and not the SDK client's, MCP without the SDK (bench.mcp_plain:
JSON-RPC over one kept-alive HTTP connection). After a warm-up on each, they take turns in
rounds (each round's order rotated by one: `rotation`), and each round reads the supervisor's
CPU time from /proc.

Reported per front: median and p90 over all calls, the supervisor's CPU per call (and the
client process's, for what each client itself costs); and MCP - gRPC in ms, pooled and per
pair of rounds (median with its ~95% interval, quartiles, range), against the issue's target:
an MCP call costs at most 1 ms more than the same gRPC call (median, warm), judged on the SDK
client; the plain client's difference is shown beside it.

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
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

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
FRONTS = ("grpc", "mcp", "mcp_plain")
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
) -> tuple[dict[str, list[Round]], dict[str, float]]:
    """Warm the fronts up, then the interleaved rounds: each front's rounds, and the client
    process's CPU seconds per front. The sync gRPC calls block this loop while they run;
    the MCP sessions' tasks only wait meanwhile."""
    measured: dict[str, list[Round]] = {front: [] for front in FRONTS}
    client_cpu = dict.fromkeys(FRONTS, 0.0)
    http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120))
    with Stockade(sup.target) as grpc_client:
        try:
            async with (
                http,
                Client(streamable_http_client(url, http_client=http)) as mcp,
                PlainMcp(url) as plain,
            ):
                await mcp.list_tools()  # what an agent does first
                sdk_call = partial(exec_true, mcp)
                plain_call = partial(plain_exec_true, plain)
                for _ in range(warmup):
                    stockade_runs.exec_true(grpc_client, KEY)
                    await sdk_call()
                    await plain_call()
                for _, front in rotation(rounds):
                    before = time.process_time()
                    if front == "grpc":
                        done = one_round(grpc_client, sup.pid, calls, KEY)
                    else:
                        call = sdk_call if front == "mcp" else plain_call
                        done = await mcp_round(call, sup.pid, calls)
                    client_cpu[front] += time.process_time() - before
                    measured[front].append(done)
        finally:
            stockade_runs.destroy(grpc_client, KEY)
    return measured, client_cpu


def differences(
    grpc: Sequence[Round], mcp: Sequence[Round], tick_hz: int, target_ms: float = TARGET_EXTRA_MS
) -> dict[str, Any]:
    """Both fronts' summaries, and per figure MCP - gRPC: pooled, and per pair of rounds
    (round r of each front); the target is judged on the pooled medians."""
    if len(grpc) != len(mcp) or not grpc:
        raise ValueError(f"rounds differ: grpc {len(grpc)}, mcp {len(mcp)}")
    summary = {"grpc": side_summary(grpc, tick_hz), "mcp": side_summary(mcp, tick_hz)}
    diffs = pairwise(grpc, mcp, summary["grpc"], summary["mcp"])
    extra = diffs["median_ms"]
    return {
        **summary,
        "mcp_minus_grpc": diffs,
        "target_ms": target_ms,
        "met": extra["pooled"] <= target_ms,
        "verdict": verdict(extra, target_ms),
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
        measured, client_cpu = asyncio.run(
            measure(sup, f"http://{listen}/mcp", rounds, calls, warmup)
        )
    result = differences(measured["grpc"], measured["mcp"], TICK)
    result["mcp_plain"] = side_summary(measured["mcp_plain"], TICK)
    result["mcp_plain_minus_grpc"] = pairwise(
        measured["grpc"], measured["mcp_plain"], result["grpc"], result["mcp_plain"]
    )
    for front in FRONTS:
        result[front]["client_cpu_us_per_call"] = round(
            client_cpu[front] / result[front]["calls"] * 1e6, 1
        )
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
    lines += _block(result, "mcp", "MCP through the mcp SDK's client")
    if "mcp_plain" in result:
        lines += _block(result, "mcp_plain", "MCP, plain HTTP client (no SDK)")
    extra = result["mcp_minus_grpc"]["median_ms"]["pooled"]
    lines.append(
        f"  {'MCP - gRPC, warm median':32}{extra:>9.2f} ms   "
        f"target <= {result['target_ms']:g} ms   {result['verdict']}"
    )
    return "\n".join(lines)


def _block(result: dict[str, Any], front: str, title: str) -> list[str]:
    """gRPC against one MCP client: the figures, the difference, the pairs' spread."""
    grpc, mcp = result["grpc"], result[front]
    lines = [f"{title:32}{'gRPC':>9}{'MCP':>9}{'MCP-gRPC':>10}   pairs: median [95% CI], q1..q3"]
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


def write(by_engine: dict[str, dict[str, Any]], path: Path = RESULTS) -> None:
    """Put each engine's figures under engines.<engine>.mcp, keeping the rest of the record."""
    record = read_results(path)
    engines = record.get("engines")
    engines = dict(engines) if isinstance(engines, dict) else {}
    for engine, result in by_engine.items():
        previous = engines.get(engine)
        engines[engine] = {**(previous if isinstance(previous, dict) else {}), "mcp": result}
    write_results({**record, "engines": engines}, path)
    progress(f'MCP figures written to {path} ("engines.<engine>.mcp")')


def run(engines: Sequence[str], n: int, rounds: int, warmup: int) -> int:
    """This measurement alone, on each engine: print, record; 1 if one failed."""
    by_engine: dict[str, dict[str, Any]] = {}
    for engine in engines:
        try:
            by_engine[engine] = measure_engine(engine, n, rounds, warmup)
        except Exception as exc:  # the other engine is still measured
            progress(f"{engine}: MCP measurement failed: {type(exc).__name__}: {exc}")
            by_engine[engine] = {"error": f"{type(exc).__name__}: {exc}"}
        print(section(engine, by_engine[engine]), end="\n\n", flush=True)
    write(by_engine)
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
