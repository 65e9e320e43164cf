"""A quiet sandbox's `exec true` latency alone, then while another sandbox abuses its
resources; the ratio of the medians is what the abuse costs its neighbours (issue target:
within 2x). The abuses are those of tests/security/test_resource_abuse.py, each kept up (in a
loop) for the whole measurement, in a supervisor with small disk quotas."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any

from bench.stockade_runs import destroy, exec_true
from bench.timing import Result, time_calls
from stockade.client import Stockade, StockadeError

CONFIG = """
[sandbox]
workspace_size_mb = 64
tmp_size_mb = 16
max_file_size_mb = 8
"""
RAMP_S = 1.0
"""Time the abuse gets to build up before the quiet sandbox is measured."""
ROUND_TIMEOUT_S = 20.0

SCRIPTS = {
    "bomb.sh": ":(){ :|:& };:\n",
    "mem.sh": "while :; do python3 -c 'a = []\nwhile True: a.append(bytearray(10 << 20))'; done\n",
    "files.sh": (
        'while :; do python3 -c \'import os, shutil\nos.makedirs("m", exist_ok=True)\n'
        'try:\n    [open(f"m/{n}", "w").close() for n in range(10**6)]\nexcept OSError: pass\n'
        'shutil.rmtree("m")\'; done\n'
    ),
}
ABUSES = {
    "cpu spin": "while :; do :; done",
    "memory bomb (OOM kills, repeated)": "sh mem.sh",
    "fork bomb": "sh bomb.sh",
    "1000 background processes": "for i in $(seq 1000); do sleep 300 & done; wait",
    "workspace disk fill": "while :; do head -c 60M /dev/zero > fill; rm -f fill; done",
    "/tmp disk fill": "while :; do head -c 15M /dev/zero > /tmp/fill; rm -f /tmp/fill; done",
    "a million files": "sh files.sh",
    "output flood": "yes",
}


def neighbour_latency(
    client: Stockade, n: int, warmup: int, names: Sequence[str] = tuple(ABUSES)
) -> dict[str, Any]:
    """{"alone": Result, "abuses": {name: {"during": Result, "ratio": float, ...}}}, for the
    abuses `names` (all of ABUSES by default)."""
    quiet = "bench-quiet"
    try:
        alone = time_calls(lambda: exec_true(client, quiet), n, max(warmup, 1))
        abuses = {name: _during(client, quiet, ABUSES[name], alone, n) for name in names}
        return {"alone": alone, "abuses": abuses}
    finally:
        destroy(client, quiet)


def _during(client: Stockade, quiet: str, command: str, alone: Result, n: int) -> dict[str, Any]:
    abuser = "bench-abuser"
    box = client.sandbox(abuser)
    for name, text in SCRIPTS.items():
        box.write_file(name, text)
    stop = threading.Event()
    rounds: list[str] = []

    def abuse() -> None:
        while not stop.is_set():
            with contextlib.suppress(StockadeError):
                result = box.exec(command, timeout=ROUND_TIMEOUT_S)
                rounds.append(result.error_code or str(result.exit_code))

    worker = threading.Thread(target=abuse, daemon=True)
    worker.start()
    try:
        time.sleep(RAMP_S)
        during = time_calls(lambda: exec_true(client, quiet), n, 0)
    finally:
        stop.set()
        destroy(client, abuser)  # ends the call in flight
        worker.join(ROUND_TIMEOUT_S * 2)
    return {
        "during": during,
        "median_ratio": round(during["median_ms"] / alone["median_ms"], 2),
        "p95_ratio": round(during["p95_ms"] / alone["p95_ms"], 2),
        "abuse_rounds": rounds[:5],
    }


def section(engine: str, result: dict[str, Any]) -> str:
    """The table printed by `make bench`."""
    if "error" in result:
        return f"== {engine}: neighbour latency under abuse ==\n  n/a: {result['error']}"
    alone = result["alone"]
    lines = [
        f"== {engine}: a quiet sandbox's exec true while another abuses (target: within 2x) ==",
        f"{'':36}{'median':>10}{'p95':>10}{'x median':>10}{'x p95':>8}",
        f"{'alone':36}{alone['median_ms']:>10.2f}{alone['p95_ms']:>10.2f}",
    ]
    for name, r in result["abuses"].items():
        d = r["during"]
        verdict = "met" if r["median_ratio"] <= 2 else "MISSED"
        lines.append(
            f"{name:36}{d['median_ms']:>10.2f}{d['p95_ms']:>10.2f}"
            f"{r['median_ratio']:>10.2f}{r['p95_ratio']:>8.2f}  {verdict}"
        )
    return "\n".join(lines)


def main() -> None:
    """`python -m bench.abuse [--engine E] [--quick]`: this scenario alone."""
    import argparse

    from bench.engines import ENGINES, bring_up
    from bench.served import served

    parser = argparse.ArgumentParser(prog="python -m bench.abuse")
    parser.add_argument("--engine", choices=[*ENGINES, "both"], default="both")
    parser.add_argument("--quick", action="store_true", help="30 calls per figure, not 300")
    ns = parser.parse_args()
    n = 30 if ns.quick else 300
    for engine in ENGINES if ns.engine == "both" else (ns.engine,):
        bring_up(engine)
        with served(engine, CONFIG) as sup, Stockade(sup.target) as client:
            print(section(engine, neighbour_latency(client, n, min(max(n // 10, 5), 30))))


if __name__ == "__main__":
    main()
