"""Timing loops and their summary (min, median, p95), all in milliseconds."""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

Result = dict[str, Any]
"""A measurement: summary figures in ms, or {"error": "..."} when it could not be made."""


def summarize(seconds: list[float]) -> Result:
    ms = sorted(s * 1000 for s in seconds)

    def rank(q: float) -> float:  # nearest rank
        return ms[max(math.ceil(q * len(ms)) - 1, 0)]

    return {
        "n": len(ms),
        "min_ms": round(ms[0], 3),
        "median_ms": round(statistics.median(ms), 3),
        "p95_ms": round(rank(0.95), 3),
        "p99_ms": round(rank(0.99), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


def time_calls(call: Callable[[], object], n: int, warmup: int) -> Result:
    """Call `call` warmup times untimed, then n times, each timed on its own."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return summarize(samples)


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def guarded(what: str, measure: Callable[[], Result]) -> Result:
    """Run one measurement; an exception becomes {"error": ...} so the others still run."""
    progress(what)
    started = time.monotonic()
    try:
        result = measure()
    except Exception as exc:
        progress(f"{what} failed: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}
    progress(f"  ({time.monotonic() - started:.1f} s)")
    return result
