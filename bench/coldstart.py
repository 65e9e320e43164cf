"""Cold start with and without the warm pool: the first call for a new key (`exec true`)
until its result, on a supervisor without a pool, then on one with `warm_pool = 2`. Between
samples the pooled run waits for the pool to refill, so each sample measures taking a pooled
container; how many samples the pool actually served is reported (a sample it did not serve
is an ordinary cold start)."""

from __future__ import annotations

import time
from typing import Any

from bench.stockade_runs import destroy, exec_true
from bench.timing import Result, summarize
from stockade.client import Stockade

POOL_CONFIG = "[housekeeping]\nwarm_pool = 2\nsweep_interval_s = 0.5\n"
REFILL_S = 3.0
"""Pause between pooled samples: the pool refills in the background meanwhile."""


def cold_starts(client: Stockade, n: int, *, pooled: bool) -> Result:
    samples, from_pool = [], 0
    for i in range(n):
        key = f"bench-cold-{'pool' if pooled else 'plain'}-{i}"
        if pooled:
            time.sleep(REFILL_S)
        started = time.perf_counter()
        try:
            exec_true(client, key)
            samples.append(time.perf_counter() - started)
            from_pool += "-pool-" in client.get_sandbox(key).container_name
        finally:
            destroy(client, key)
    result: dict[str, Any] = summarize(samples)
    if pooled:
        result["from_pool"] = from_pool
    return result


def section(engine: str, plain: Result, pooled: Result) -> str:
    """The lines printed by `make bench`."""
    lines = [f"== {engine}: cold start, first call for a new key (ms) =="]
    for label, r in (("no pool", plain), ("warm pool (2)", pooled)):
        if "error" in r:
            lines.append(f"{label:16}n/a: {r['error']}")
            continue
        line = f"{label:16}median {r['median_ms']:8.1f}   p95 {r['p95_ms']:8.1f}   n {r['n']}"
        if "from_pool" in r:
            line += f"   ({r['from_pool']} of {r['n']} served by the pool)"
        lines.append(line)
    return "\n".join(lines)


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
            plain = cold_starts(client, n, pooled=False)
        with served(engine, POOL_CONFIG) as sup, Stockade(sup.target) as client:
            pooled = cold_starts(client, n, pooled=True)
        print(section(engine, plain, pooled))


if __name__ == "__main__":
    main()
