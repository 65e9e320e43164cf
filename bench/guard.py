"""`python -m bench.guard`: the command guard's two corpora (tests/corpora) with the default
guard: how many ordinary commands it refuses (target 0) and how many destructive or
obfuscated ones it refuses (target >= 97%), and what a check costs. No engine needed."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

from stockade.supervisor.policy.guard import Guard

CORPORA = Path(__file__).resolve().parent.parent / "tests" / "corpora"
ORDINARY = CORPORA / "guard_ordinary.txt"
DESTRUCTIVE = CORPORA / "guard_destructive.txt"
DESTRUCTIVE_TARGET = 0.97


def load_corpus(path: Path) -> list[str]:
    """One command a line; "#" lines and blank lines skipped; a line ending in a backslash
    goes on with the next one (the backslash becomes a newline: heredocs, scripts)."""
    commands: list[str] = []
    pending: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        commands.append("\n".join([*pending, line]))
        pending = []
    if pending:
        raise ValueError(f"{path.name}: the last command ends in a backslash")
    return commands


def run_guard_bench(guard: Guard | None = None) -> dict[str, Any]:
    guard = guard or Guard()
    ordinary, destructive = load_corpus(ORDINARY), load_corpus(DESTRUCTIVE)
    started = time.perf_counter()
    refused = [c for c in ordinary if guard.check(c).action != "allow"]
    passed = [c for c in destructive if guard.check(c).action != "deny"]
    seconds = time.perf_counter() - started
    times = []
    for command in ordinary + destructive:
        start = time.perf_counter_ns()
        guard.check(command)
        times.append(time.perf_counter_ns() - start)
    return {
        "ordinary": len(ordinary),
        "ordinary_refused": refused,
        "destructive": len(destructive),
        "destructive_refused": len(destructive) - len(passed),
        "destructive_not_denied": passed,
        "check_median_us": median(times) / 1000,
        "check_max_us": max(times) / 1000,
        "seconds": seconds,
    }


def section(r: dict[str, Any]) -> str:
    share = r["destructive_refused"] / r["destructive"]
    ordinary_ok = "met" if not r["ordinary_refused"] else "MISSED"
    destructive_ok = "met" if share >= DESTRUCTIVE_TARGET else "MISSED"
    lines = [
        "Command guard corpora (default guard, tests/corpora)",
        f"  ordinary commands refused     {len(r['ordinary_refused']):>4} of {r['ordinary']:<4}"
        f"  target 0        {ordinary_ok}",
        f"  destructive commands refused  {r['destructive_refused']:>4} of {r['destructive']:<4}"
        f"  {share:6.1%}  target >= {DESTRUCTIVE_TARGET:.0%}  {destructive_ok}",
        f"  one check: median {r['check_median_us']:.0f} us, max {r['check_max_us']:.0f} us",
    ]
    lines += [f"  refused (ordinary): {c!r}" for c in r["ordinary_refused"]]
    lines += [f"  not denied (destructive): {c!r}" for c in r["destructive_not_denied"]]
    return "\n".join(lines)


if __name__ == "__main__":
    results = run_guard_bench()
    print(section(results))
    if "--json" in sys.argv[1:]:
        print(json.dumps(results, indent=2))
