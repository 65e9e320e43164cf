"""E2B against gRPC: what a warm `commands.run("true")` through the unmodified e2b SDK costs,
beside a warm gRPC `exec "/bin/bash -l -c true"` (the same login shell the SDK asks for), on
one supervisor.

One `stockade serve` serves the gRPC API and `[e2b] listen` on 127.0.0.1. The E2B side is
the e2b Python SDK's sync `Sandbox` (one sandbox, created once, held for the whole run as
an agent would hold it); the gRPC side the sync client on a sandbox of its own. After a
warm-up on each they take turns in rounds (each round's order rotated by one), and each
round reads the supervisor's CPU time from /proc. Both run `bash -l -c true` (a login shell
reads its profile: ~1.6 ms that no front can save); the gRPC side as one `exec` call, the E2B
side as a `process start` that follows its process over E2B's Connect stream.

Reported: median and p90 of each, the supervisor's and this process's CPU per call, E2B -
gRPC pooled and per pair of rounds, and the issue's target (issue 28, replacing issue 17's
absolute 3 ms, which the login shell alone makes unreachable): the E2B front adds at most
1 ms, judged on the median over pairs of rounds of E2B's median minus gRPC's.

Alone: `python -m bench --only e2b [--engine E] [--n N] [--rounds R]`, which puts its figures
under engines.<engine>.e2b in bench/results.json and keeps the rest of the record.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

from e2b import Sandbox

from bench import stockade_runs
from bench.compare import thread_ns
from bench.compare_stats import Round, nearest_rank, side_summary
from bench.cpu import TICK, cpu_ticks
from bench.engines import bring_up
from bench.mcp_front import pairwise, rotation, run_alone, run_record
from bench.served import Served, free_port, served
from bench.timing import progress
from stockade.client import Stockade

KEY = "bench-e2b-grpc"
FRONTS = ("grpc", "e2b")
GRPC_COMMAND = "/bin/bash -l -c true"
"""What the gRPC side runs: the command line the SDK's commands.run("true") runs."""
TARGET_MS = 1.0
"""Issue 28: what the E2B front adds to the same command, median of the pairs, warm."""
DEFAULT_ROUNDS = 10


def config(listen: str) -> str:
    return f'[e2b]\nlisten = "{listen}"\n'


def grpc_bash_true(client: Stockade) -> None:
    result = client.sandbox(KEY).exec(GRPC_COMMAND)
    if result.is_error or result.exit_code != 0:
        raise RuntimeError(f"gRPC exec {GRPC_COMMAND!r} failed: {result.for_llm}")


def grpc_round(client: Stockade, pid: int, calls: int) -> Round:
    """`calls` warm gRPC `exec "/bin/bash -l -c true"`, like compare.one_round."""
    samples = []
    ticks, ns = cpu_ticks(pid)[0], thread_ns(pid)
    for _ in range(calls):
        started = time.perf_counter()
        grpc_bash_true(client)
        samples.append(time.perf_counter() - started)
    return Round(tuple(samples), cpu_ticks(pid)[0] - ticks, thread_ns(pid) - ns)


def e2b_round(sbx: Sandbox, pid: int, calls: int) -> Round:
    """`calls` warm commands.run("true"), like compare.one_round."""
    samples = []
    ticks, ns = cpu_ticks(pid)[0], thread_ns(pid)
    for _ in range(calls):
        started = time.perf_counter()
        result = sbx.commands.run("true")
        samples.append(time.perf_counter() - started)
        if result.exit_code != 0:
            raise RuntimeError(f"E2B commands.run('true') failed: {result}")
    return Round(tuple(samples), cpu_ticks(pid)[0] - ticks, thread_ns(pid) - ns)


def measure(
    sup: Served, url: str, rounds: int, calls: int, warmup: int
) -> tuple[dict[str, list[Round]], dict[str, float]]:
    measured: dict[str, list[Round]] = {front: [] for front in FRONTS}
    client_cpu = dict.fromkeys(FRONTS, 0.0)
    sbx = Sandbox.create(api_url=url, sandbox_url=url, api_key="bench", timeout=3600)
    try:
        with Stockade(sup.target) as grpc_client:
            try:
                runs: dict[str, Callable[[], Round]] = {
                    "grpc": lambda: grpc_round(grpc_client, sup.pid, calls),
                    "e2b": lambda: e2b_round(sbx, sup.pid, calls),
                }
                for _ in range(warmup):
                    grpc_bash_true(grpc_client)
                    sbx.commands.run("true")
                for _, front in rotation(rounds, FRONTS):
                    before = time.process_time()
                    measured[front].append(runs[front]())
                    client_cpu[front] += time.process_time() - before
            finally:
                stockade_runs.destroy(grpc_client, KEY)
    finally:
        sbx.kill()
    return measured, client_cpu


def compared(measured: Mapping[str, Sequence[Round]], tick_hz: int) -> dict[str, Any]:
    grpc, e2b = measured["grpc"], measured["e2b"]
    result: dict[str, Any] = {
        "grpc": side_summary(grpc, tick_hz),
        "e2b": side_summary(e2b, tick_hz),
    }
    result["e2b_minus_grpc"] = pairwise(grpc, e2b, result["grpc"], result["e2b"])
    added = result["e2b_minus_grpc"]["median_ms"]["pairs_median"]
    per_pair = [
        statistics.median(o.seconds) * 1e3 - statistics.median(b.seconds) * 1e3
        for b, o in zip(grpc, e2b, strict=True)
    ]
    result["target_ms"] = TARGET_MS
    result["added_ms"] = added
    result["met"] = added <= TARGET_MS
    result["rounds_met"] = sum(d <= TARGET_MS for d in per_pair)
    result["e2b"]["p99_ms"] = round(
        nearest_rank([s for r in e2b for s in r.seconds], 0.99) * 1e3, 3
    )
    return result


def measure_engine(engine: str, n: int, rounds: int, warmup: int) -> dict[str, Any]:
    bring_up(engine)
    calls = max(n // rounds, 1)
    listen = f"127.0.0.1:{free_port()}"
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    progress(f"{engine}: E2B against gRPC, {rounds} rounds of {calls} warm calls a front")
    with served(engine, config(listen)) as sup:
        measured, client_cpu = measure(sup, f"http://{listen}", rounds, calls, warmup)
    result = compared(measured, TICK)
    return run_record(result, client_cpu, started, load_before, rounds, calls, warmup)


ROWS = (
    ("median_ms", "warm call, median (ms)", ".2f"),
    ("p90_ms", "warm call, p90 (ms)", ".2f"),
    ("cpu_us_per_call", "supervisor CPU per call (µs)", ".0f"),
)


def section(engine: str, result: dict[str, Any]) -> str:
    """The table `make bench` prints for one engine."""
    head = f"== {engine}: E2B commands.run('true') against gRPC exec {GRPC_COMMAND!r}"
    if "error" in result:
        return f"{head} ==\n  n/a: {result['error']}"
    lines = [
        f"{head}, one supervisor, {result['rounds']} interleaved rounds of "
        f"{result['calls_per_round']} calls a front ==",
        f"  {'':30}{'gRPC':>9}{'E2B':>9}{'E2B-gRPC':>10}   pairs: median [95% CI]",
    ]
    grpc, e2b = result["grpc"], result["e2b"]
    for key, label, spec in ROWS:
        d = result["e2b_minus_grpc"][key]
        low, high = d["pairs_median_ci95"]
        lines.append(
            f"  {label:30}{grpc[key]:>9{spec}}{e2b[key]:>9{spec}}{d['pooled']:>10{spec}}   "
            f"{d['pairs_median']:{spec}} [{low:{spec}}..{high:{spec}}]"
        )
    lines.append(
        f"  {'client CPU per call (µs)':30}{grpc['client_cpu_us_per_call']:>9.0f}"
        f"{e2b['client_cpu_us_per_call']:>9.0f}   (this process: the SDK's own share)"
    )
    word = "met" if result["met"] else "not met"
    lines.append(
        f"  E2B front adds {result['added_ms']:.2f} ms (median of the pairs; E2B median "
        f"{e2b['median_ms']:.2f} ms, gRPC {grpc['median_ms']:.2f} ms)"
    )
    lines.append(
        f"  E2B front adds <= {result['target_ms']:g} ms: {word} "
        f"({result['rounds_met']} of {result['rounds']} pairs of rounds within it)"
    )
    return "\n".join(lines)


def run(engines: Sequence[str], n: int, rounds: int, warmup: int) -> int:
    """`python -m bench --only e2b`: measure, print, record under engines.<engine>.e2b."""
    measure_one = partial(measure_engine, n=n, rounds=rounds, warmup=warmup)
    return run_alone(engines, measure_one, section, "e2b")
