"""Cold start with and without the warm pool: the first call for a new key (`exec true`)
until its result, on a supervisor without a pool, then on one with `warm_pool = 2`. Between
samples the pooled run waits for the pool to refill, so each sample measures taking a pooled
container; how many samples the pool actually served is reported (a sample it did not serve
is an ordinary cold start). Each pooled sample is paired with a warm call on a sandbox that
runs already, made after the same pause: on this VM any call that follows an idle pause costs
~2 ms more than one made back to back (the vCPUs' wake-up, measured in docs/benchmarks.md),
so the pool's own cost is the pooled call over that one; both ratios are printed.

Without a pool, each sample's time is broken down by stage from the supervisor's log (the
line containers.py's StageClock writes when a container is up): prepare (spec, mount),
create, start, agent ready; "first call" is the rest of the sample (the call's way through
the supervisor and the agent, the client's round trip, the sandbox's registration)."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.stockade_runs import destroy, exec_true
from bench.timing import Result, summarize
from stockade.client import Stockade

POOL_CONFIG = "[housekeeping]\nwarm_pool = 2\nsweep_interval_s = 0.5\n"
REFILL_S = 3.0
"""Pause between pooled samples: the pool refills in the background meanwhile."""
WARM_KEY = "bench-cold-warm"
"""The sandbox of the pooled samples' reference: a warm call after the same pause."""


UP_LINE = re.compile(r"container \S+ up in ([\d.]+) ms: (.*)$")
FIRST_CALL = "first call"


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def cold_starts(client: Stockade, n: int, *, pooled: bool, log: Path | None = None) -> Result:
    """n first calls on new keys; with the supervisor's `log` (no pool) their stages too.
    Pooled, each sample is followed by its references (pooled_references)."""
    samples, from_pool, stages = [], 0, []
    references: dict[str, list[float]] = {name: [] for name in REFERENCES}
    if pooled:
        for _ in range(3):  # made (from the pool) and warm
            exec_true(client, WARM_KEY)
    for i in range(n):
        key = f"bench-cold-{'pool' if pooled else 'plain'}-{i}"
        if pooled:
            time.sleep(REFILL_S)
        seen = log.stat().st_size if log is not None else 0
        try:
            samples.append(timed(partial(exec_true, client, key)))
            from_pool += "-pool-" in client.get_sandbox(key).container_name
        finally:
            destroy(client, key)
        if pooled:
            from_pool += pooled_references(client, f"{key}-next", references)
        if log is not None:
            stages.append(stages_of(log, seen, samples[-1] * 1000))
    result: dict[str, Any] = summarize(samples)
    if pooled:
        destroy(client, WARM_KEY)
        result["from_pool"] = from_pool
        result["n_pooled"] = 2 * n
        result |= {name: summarize(times) for name, times in references.items()}
    if stages:
        result["stages_median_ms"] = {
            stage: round(statistics.median(s[stage] for s in stages), 1) for stage in stages[0]
        }
    return result


REFERENCES = ("warm_after_pause", "warm_back_to_back", "pool_after_warm")


AWAKE_CALLS = 5
"""Warm calls made untimed before the back-to-back references: the second call after a pause
is still slower than a steady one (~3.5 against ~2.9 ms here)."""


def pooled_references(client: Stockade, key: str, into: dict[str, list[float]]) -> int:
    """After the same pause as a pooled sample: a warm call (both pay the idle machine's
    wake-up); then, once AWAKE_CALLS more have run, a warm call back to back and at once the
    first call of the new `key` (from the pool, back to back as that warm call). 1 when the
    pool served `key`."""
    time.sleep(REFILL_S)
    into["warm_after_pause"].append(timed(partial(exec_true, client, WARM_KEY)))
    for _ in range(AWAKE_CALLS):
        exec_true(client, WARM_KEY)
    into["warm_back_to_back"].append(timed(partial(exec_true, client, WARM_KEY)))
    try:
        into["pool_after_warm"].append(timed(partial(exec_true, client, key)))
        return int("-pool-" in client.get_sandbox(key).container_name)
    finally:
        destroy(client, key)


def stages_of(log: Path, offset: int, total_ms: float) -> dict[str, float]:
    """The stages of the one container started since `offset` in the supervisor's log, and
    the rest of the sample (`total_ms`) as the first call."""
    with log.open("rb") as f:
        f.seek(offset)
        found = [m for line in f.read().decode(errors="replace").splitlines()
                 if (m := UP_LINE.search(line))]  # fmt: skip
    if len(found) != 1:
        raise RuntimeError(f"{len(found)} container starts logged during one cold start, not 1")
    stages = {}
    for part in found[0][2].split(", "):
        stage, _, ms = part.rpartition(" ")
        stages[stage] = float(ms)
    stages[FIRST_CALL] = total_ms - float(found[0][1])
    return stages


def section(engine: str, plain: Result, pooled: Result) -> str:
    """The lines printed by `make bench`."""
    lines = [f"== {engine}: cold start, first call for a new key (ms) =="]
    for label, r in (("no pool", plain), ("warm pool (2)", pooled)):
        if "error" in r:
            lines.append(f"{label:16}n/a: {r['error']}")
            continue
        line = f"{label:16}median {r['median_ms']:8.1f}   p95 {r['p95_ms']:8.1f}   n {r['n']}"
        if "from_pool" in r:
            line += f"   ({r['from_pool']} of {r.get('n_pooled', r['n'])} served by the pool)"
        lines.append(line)
    return "\n".join(lines)


TODAY_MS = {"podman": 177.5, "docker": 282.1}
"""Issue 30's "today": the median cold start (no pool) of main before it (a26b36b), measured
on the 2-core VM of docs/benchmarks.md on 2026-11-29; the target is 60% of it."""
TARGET_OF_TODAY = 0.6
TARGET_POOL_OVER_WARM = 2.0


def stages_section(engine: str, results: dict[str, Any]) -> str:
    """The breakdown `make bench` prints: median ms per stage of a cold start (no pool), and
    issue 30's two cold-start targets with met or not."""
    lines = [f"== {engine}: cold start by stage, median ms (no pool) =="]
    for name, label in (("cold_start", "user namespace"), ("cold_start_no_userns", "none")):
        stages = results.get(name, {}).get("stages_median_ms")
        if stages is None:
            continue
        row = "   ".join(f"{stage} {ms:.1f}" for stage, ms in stages.items())
        lines.append(f"{label if engine == 'podman' else '':16}{row}")
    cold = results.get("cold_start", {}).get("median_ms")
    if cold is not None and engine in TODAY_MS:
        limit = TODAY_MS[engine] * TARGET_OF_TODAY
        lines.append(
            f"  cold start {cold:.1f} ms   target <= {limit:.0f} ms (60% of {TODAY_MS[engine]:.0f},"
            f" this VM before issue 30)   {_met(cold <= limit)}"
        )
    lines.extend(pool_lines(results))
    return "\n".join(lines)


def pool_lines(results: dict[str, Any]) -> list[str]:
    """Issue 30's pool target. As the issue words it: the first call of a new key from the
    pool (after a pause, while the pool refills) against the run's warm call (back to back).
    Then like for like, the pool's own cost: that call against a warm call after the same
    pause (both pay the idle machine's wake-up), and a first call made right after a warm
    call against a warm call back to back. Each line is judged on its own."""
    pool = results.get("cold_start_pool", {})
    pooled = pool.get("median_ms")
    if pooled is None:
        return []
    warm = results.get("stockade_warm", {}).get("median_ms")
    paused = pool.get("warm_after_pause", {}).get("median_ms")
    back = pool.get("warm_back_to_back", {}).get("median_ms")
    after_warm = pool.get("pool_after_warm", {}).get("median_ms")
    rows = []
    if warm or back:
        rows.append(("from the pool", pooled, warm or back, "back to back"))
    if paused:
        rows.append(
            (
                f"like for like, after the same {REFILL_S:g} s pause: from the pool",
                pooled,
                paused,
                "",
            )
        )
    if after_warm and back:
        rows.append(
            (
                "like for like, back to back: from the pool right after a warm call",
                after_warm,
                back,
                "",
            )
        )
    lines = []
    for label, first, ms, how in rows:
        over = first / ms
        lines.append(
            f"  {label} {first:.1f} ms = {over:.1f}x a warm call {how + ' ' if how else ''}"
            f"({ms:.2f} ms)   target <= {TARGET_POOL_OVER_WARM:g}x   "
            f"{_met(over <= TARGET_POOL_OVER_WARM)}"
        )
    return lines


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    """`python -m bench.coldstart [--engine E] [--quick]`: this scenario alone."""
    import argparse

    from bench.engines import ENGINES, bring_up
    from bench.served import served

    parser = argparse.ArgumentParser(prog="python -m bench.coldstart")
    parser.add_argument("--engine", choices=[*ENGINES, "both"], default="both")
    parser.add_argument("--quick", action="store_true", help="3 cold starts each, not 10")
    ns = parser.parse_args()
    n = 3 if ns.quick else 10
    for engine in ENGINES if ns.engine == "both" else (ns.engine,):
        bring_up(engine)
        with served(engine) as sup, Stockade(sup.target) as client:
            plain = cold_starts(client, n, pooled=False, log=sup.log)
        with served(engine, POOL_CONFIG) as sup, Stockade(sup.target) as client:
            pooled = cold_starts(client, n, pooled=True)
        print(section(engine, plain, pooled))
        print("\n".join(pool_lines({"cold_start_pool": pooled})))


if __name__ == "__main__":
    main()
