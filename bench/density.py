"""Density (`python -m bench --density N`, off by default): N idle sandboxes on one
supervisor, then warm `exec true` calls on random ones (issue 30: 300 sandboxes per engine,
1,000 calls, p50 <= 3x the gRPC health round trip measured in the same run, no error), and the
host memory they take: PSS per sandbox (agent + init, and the engine's helper) over all of
them, and the host's MemAvailable before and after, divided by N."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import memory
from bench.stockade_runs import SETTLE_S, destroy, exec_true, health_floor
from bench.timing import summarize
from stockade.client import Stockade, StockadeError

CALLS = 1000
TARGET_RATIO = 3.0
WORKERS = 4
"""Sandboxes made (and removed) at once: the engine's pace, not the bench's."""


def mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def run_density(client: Stockade, target: str, sandboxes: int, calls: int) -> dict[str, Any]:
    keys = [f"bench-dense-{i:04}" for i in range(sandboxes)]
    before = mem_available_kib()
    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(lambda key: exec_true(client, key), keys))
        made_s = time.perf_counter() - started
        time.sleep(SETTLE_S)
        host_kib = before - mem_available_kib()
        procs = memory.processes()
        ids = [client.get_sandbox(key).container_id for key in keys]
        pss = memory.average([memory.container_memory(cid, procs) for cid in ids])
        del pss["per_sandbox"]
        samples, errors = warm_calls(client, keys, calls)
        health = health_floor(target, 100, 10)
    finally:
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(lambda key: destroy(client, key), keys))
    result: dict[str, Any] = summarize(samples) if samples else {}
    ratio = result["median_ms"] / health["median_ms"] if samples else None
    return {
        **result,
        "sandboxes": sandboxes,
        "calls": calls,
        "errors": errors,
        "made_s": round(made_s, 1),
        "health_median_ms": health["median_ms"],
        "p50_over_health": None if ratio is None else round(ratio, 2),
        "met": ratio is not None and ratio <= TARGET_RATIO and not errors,
        "host_mib_per_sandbox": round(host_kib / sandboxes / 1024, 2),
        "memory": pss,
    }


def warm_calls(client: Stockade, keys: list[str], calls: int) -> tuple[list[float], int]:
    """`calls` exec true on keys drawn at random (seeded: runs compare); the errors counted."""
    rng, samples, errors = random.Random(30), [], 0
    for _ in range(calls):
        key = rng.choice(keys)
        started = time.perf_counter()
        try:
            exec_true(client, key)
        except (RuntimeError, StockadeError):
            errors += 1
            continue
        samples.append(time.perf_counter() - started)
    return samples, errors


def section(engine: str, r: dict[str, Any]) -> str:
    """The lines `make bench --density N` prints."""
    head = f"== {engine}: density, idle sandboxes then warm exec true on random ones =="
    if "error" in r:
        return f"{head}\n  n/a: {r['error']}"
    m = r["memory"]
    verdict = "met" if r["met"] else "NOT met"
    lines = [
        head,
        f"{r['sandboxes']} sandboxes made in {r['made_s']} s; host memory per sandbox "
        f"{r['host_mib_per_sandbox']:.1f} MiB (MemAvailable), PSS {m['pss_mib']:.1f} MiB "
        f"(agent + init {m['pss_inside_mib']:.1f}, helper {m['pss_helper_mib']:.1f})",
    ]
    if "median_ms" in r:
        lines.append(
            f"{r['calls']} calls, {r['errors']} errors: p50 {r['median_ms']:.2f} ms, p99 "
            f"{r['p99_ms']:.2f} ms; p50 = {r['p50_over_health']:.1f}x the health round trip "
            f"({r['health_median_ms']:.2f} ms)   target <= {TARGET_RATIO:g}x, no error   {verdict}"
        )
    else:
        lines.append(f"{r['calls']} calls, {r['errors']} errors: none answered   NOT met")
    return "\n".join(lines)
