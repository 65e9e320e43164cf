"""The arithmetic of `python -m bench --compare`: the interleaved order of the rounds, each
side's summary, and the old-versus-new ratios with their noise. Pure: no engine, no clock.

A round is one batch of warm `exec true` calls on one side (one supervisor). Each round
yields its call durations, the supervisor's utime+stime over the batch in clock ticks (from
/proc/PID/stat: every thread, those that ended too, but only 1/CLK_TCK fine) and the run time
of its threads over the batch in ns (/proc/PID/task/*/schedstat: fine-grained, but blind to a
thread that ended meanwhile). The headline CPU figure is the ticks over all rounds divided by
the calls; the per-round figures (from schedstat) give the noise.

Noise: the rounds of the two sides alternate (old, new, then new, old, ...), so whatever else
the machine does at a moment hits a pair of rounds alike. Each pair gives a ratio new/old. Their
spread (quartiles, min..max) shows how much one round can say; the median of the ratios has a
distribution-free ~95% confidence interval (the sign test's order statistics), and the verdict
is "within noise" when that interval holds 1.0; else "slower" or "faster", or "slower by < 2%"
("faster ...") when the median ratio is within MARGIN of 1: runs of one commit against itself
(A/A) showed such shifts, about 1% (docs/benchmarks.md). Under MIN_PAIRS rounds, no verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

SIDES = ("old", "new")
MIN_PAIRS = 6
"""Fewer pairs cannot exclude chance at 95%: all 5 of 5 on one side happen 1 time in 16."""
MARGIN = 0.02
"""A median pair ratio this close to 1 is no slowdown, whatever its interval: A/A runs (one
commit on both sides) moved by about 1%."""


@dataclass(frozen=True)
class Round:
    """One batch on one side."""

    seconds: tuple[float, ...]
    """Each call's duration."""
    cpu_ticks: int
    """The supervisor's utime+stime over the batch, in clock ticks."""
    thread_ns: int
    """The run time of the supervisor's threads over the batch, in ns."""


def schedule(rounds: int) -> list[tuple[int, str]]:
    """(round, side) in the order to run them: old first in even rounds, new first in odd
    ones, so neither side always runs right after the other."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    order: list[tuple[int, str]] = []
    for r in range(rounds):
        sides = SIDES if r % 2 == 0 else SIDES[::-1]
        order += [(r, side) for side in sides]
    return order


def batches(n: int, rounds: int) -> int:
    """Calls per round for n calls a side over `rounds` rounds (n must split evenly)."""
    if rounds < 1 or n < rounds or n % rounds:
        raise ValueError(f"--n ({n}) must be a multiple of --rounds ({rounds}), at least once")
    return n // rounds


def nearest_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    """Lower and upper quartile (inclusive method; one value is its own quartiles)."""
    if len(values) == 1:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def median_ci(values: Sequence[float]) -> tuple[float, float]:
    """~95% confidence interval of the median of `values`, whatever their distribution: the
    order statistics n/2 -+ 0.98 sqrt(n) (normal approximation of the sign test's binomial);
    min..max when there are too few values for more (which covers ~95% from MIN_PAIRS on)."""
    ordered = sorted(values)
    n = len(ordered)
    half_width = 0.98 * math.sqrt(n)
    low = max(round(n / 2 - half_width), 1)
    high = min(round(1 + n / 2 + half_width), n)
    return ordered[low - 1], ordered[high - 1]


def side_summary(rounds: Sequence[Round], tick_hz: int) -> dict[str, Any]:
    """A side's figures over all its rounds: wall ms and supervisor CPU µs per call."""
    samples = [s for r in rounds for s in r.seconds]
    if not samples:
        raise ValueError("no calls to summarize")
    medians = [statistics.median(r.seconds) * 1e3 for r in rounds]
    cpu_rounds = [r.thread_ns / 1e3 / len(r.seconds) for r in rounds]
    ticks = sum(r.cpu_ticks for r in rounds)
    return {
        "calls": len(samples),
        "median_ms": round(statistics.median(samples) * 1e3, 3),
        "p90_ms": round(nearest_rank(samples, 0.9) * 1e3, 3),
        "round_median_ms": [round(m, 3) for m in medians],
        "round_median_spread": _spread(medians),
        "cpu_us_per_call": round(ticks / tick_hz / len(samples) * 1e6, 1),
        "cpu_ticks": ticks,
        "thread_cpu_us_per_call": round(sum(r.thread_ns for r in rounds) / 1e3 / len(samples), 1),
        "round_thread_cpu_us": [round(c, 1) for c in cpu_rounds],
        "round_thread_cpu_spread": _spread(cpu_rounds),
    }


def _spread(values: Sequence[float]) -> float:
    """(max - min) / median of the per-round figures: how much one round can differ."""
    middle = statistics.median(values)
    return round((max(values) - min(values)) / middle, 3) if middle else 0.0


def compare(old: Sequence[Round], new: Sequence[Round], tick_hz: int) -> dict[str, Any]:
    """Both sides' summaries and, per figure, new/old with its per-pair quartiles."""
    if len(old) != len(new) or not old:
        raise ValueError(f"rounds differ: old {len(old)}, new {len(new)}")
    summary = {"old": side_summary(old, tick_hz), "new": side_summary(new, tick_hz)}
    per_round: dict[str, Callable[[Round], float]] = {
        "median_ms": lambda r: statistics.median(r.seconds),
        "p90_ms": lambda r: nearest_rank(r.seconds, 0.9),
        "cpu_us_per_call": lambda r: r.thread_ns / len(r.seconds),
    }
    ratios = {}
    for figure, of_round in per_round.items():
        pairs = [_ratio(of_round(n), of_round(o)) for o, n in zip(old, new, strict=True)]
        ratios[figure] = _ratio_entry(summary["new"][figure], summary["old"][figure], pairs)
    return {**summary, "ratios": ratios}


def _ratio(new: float, old: float) -> float:
    return new / old if old else math.inf


def _ratio_entry(new: float, old: float, pairs: list[float]) -> dict[str, Any]:
    q1, q3 = quartiles(pairs)
    low, high = median_ci(pairs)
    verdict = (
        _verdict(statistics.median(pairs), low, high)
        if len(pairs) >= MIN_PAIRS
        else f"n/a: < {MIN_PAIRS} rounds"
    )
    return {
        "new_over_old": round(_ratio(new, old), 3),
        "pairs_median": round(statistics.median(pairs), 3),
        "pairs_median_ci95": [round(low, 3), round(high, 3)],
        "pairs_q1": round(q1, 3),
        "pairs_q3": round(q3, 3),
        "pairs_min": round(min(pairs), 3),
        "pairs_max": round(max(pairs), 3),
        "verdict": verdict,
    }


def _verdict(median: float, low: float, high: float) -> str:
    if low <= 1 <= high:
        return "within noise"
    verdict = "slower" if low > 1 else "faster"
    return f"{verdict} by < {MARGIN:.0%}" if abs(median - 1) < MARGIN else verdict


ROWS = (
    ("median_ms", "warm exec true, median (ms)", ".2f"),
    ("p90_ms", "warm exec true, p90 (ms)", ".2f"),
    ("cpu_us_per_call", "supervisor CPU per call (µs)", ".0f"),
)


def table(engine: str, result: dict[str, Any]) -> str:
    """The printed comparison of one engine."""
    old, new = result["old"], result["new"]
    head = (
        f"== {engine}: {result['old_rev']} (old) vs {result['new_rev']} (new), "
        f"{len(old['round_median_ms'])} interleaved rounds of "
        f"{old['calls'] // len(old['round_median_ms'])} calls a side =="
    )
    lines = [
        head,
        f"{'':32}{'old':>9}{'new':>9}{'new/old':>9}   pairs: median [95% CI], q1..q3   verdict",
    ]
    for key, label, spec in ROWS:
        r = result["ratios"][key]
        low, high = r["pairs_median_ci95"]
        lines.append(
            f"{label:32}{old[key]:>9{spec}}{new[key]:>9{spec}}{r['new_over_old']:>9.3f}   "
            f"{r['pairs_median']:.3f} [{low:.3f}..{high:.3f}], "
            f"{r['pairs_q1']:.2f}..{r['pairs_q3']:.2f}   {r['verdict']}"
        )
    lines.append(
        f"{'spread of round medians':32}{old['round_median_spread']:>9.1%}"
        f"{new['round_median_spread']:>9.1%}   (max-min)/median, wall"
    )
    lines.append(
        f"{'spread of round CPU':32}{old['round_thread_cpu_spread']:>9.1%}"
        f"{new['round_thread_cpu_spread']:>9.1%}   (max-min)/median, thread run time"
    )
    return "\n".join(lines)
