"""The overview's trends: calls, refusals by reason, failures, alarms, redactions and the
latency's p50/p95 over the last hour, day or week, from the audit log.

A page read must stay fast on a log of millions of records, and the console must add
nothing to a call: so no query aggregates the log when a page asks, and nothing is counted
per call. Each record is read once, after it is written: AuditLog.summaries reads the
records past the last one folded (along the primary key), and each is added to its
5-minute bucket (counts, and a histogram of durations for the quantiles). The buckets of
the last 7 days stay in memory (2,016 of them, a few hundred bytes each); a window sums
its buckets. A page folds at most FOLD_ROWS new records itself; more (the first read of a
large log, after a start) are folded by one background thread, FOLD_CHUNK at a time, and
until it has caught up the figures say they are partial."""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stockade.supervisor.observe.audit import AuditLog, AuditRecord

BUCKET_S = 300
KEEP_S = 7 * 86400
WINDOWS: dict[str, tuple[int, int]] = {
    "1h": (3600, 300),
    "24h": (86400, 1800),
    "7d": (KEEP_S, 7200),
}
"""A window's length and the width of one point of its chart, in seconds."""
LATENCY_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000)
"""The upper bounds of the durations' histogram (and one bin above the last): p50 and p95
are read from it, linear within a bin."""
FOLD_ROWS = 5000
"""The most records a page read folds itself; past that the background thread folds."""
FOLD_CHUNK = 20_000
NOT_CALLS = ("network", "housekeeping")
"""Records that are no tool call (egress decisions, housekeeping; console.* neither); the
alarms' records (tool `alarm`) are counted apart, never as calls or refusals."""


@dataclass
class Bucket:
    calls: int = 0
    refused: int = 0
    failed: int = 0
    alarms: int = 0
    redactions: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    latency: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_MS) + 1))

    def add(self, other: Bucket) -> None:
        self.calls += other.calls
        self.refused += other.refused
        self.failed += other.failed
        self.alarms += other.alarms
        self.redactions += other.redactions
        for reason, n in other.reasons.items():
            self.reasons[reason] = self.reasons.get(reason, 0) + n
        self.latency = [a + b for a, b in zip(self.latency, other.latency, strict=True)]


def quantile(bins: list[int], q: float) -> float | None:
    """The q-quantile in ms of a histogram over LATENCY_MS (linear within a bin; the bin
    above the last bound reads as that bound)."""
    total = sum(bins)
    if not total:
        return None
    wanted, seen, low = q * total, 0, 0.0
    for i, n in enumerate(bins):
        if n and seen + n >= wanted:
            if i == len(LATENCY_MS):
                return float(LATENCY_MS[-1])
            return round(low + (LATENCY_MS[i] - low) * (wanted - seen) / n, 2)
        seen += n
        low = float(LATENCY_MS[i]) if i < len(LATENCY_MS) else low
    return float(LATENCY_MS[-1])


Classify = Callable[[AuditRecord], tuple[str, str]]
"""A record's (decision, reason): the audit page's decision_of (given by overview.py, so
that this module imports no page)."""


def reason_of(row: tuple[Any, ...], decision_of: Classify) -> tuple[str, str]:
    """(decision, reason) of a failed record's summary row, as the audit page says it, the
    approver left out (a reason is a kind, not a person)."""
    _id, at, tool, _err, code, step, rule, approval, _ms, _red = row
    record = AuditRecord(
        time=at, request_id="", caller="", sandbox_key="", agent_id="", provider="",
        tool=tool, arguments_json="", policy_step=step, guard_rule=rule, approval=approval,
        error_code=code, is_error=True,
    )  # fmt: skip
    decision, reason = decision_of(record)
    return decision, reason.split(" by ", 1)[0]


class Trends:
    def __init__(
        self, audit: AuditLog, classify: Classify, clock: Callable[[], float] = time.time
    ) -> None:
        self._audit = audit
        self._classify = classify
        self._clock = clock
        self._buckets: dict[int, Bucket] = {}
        self._after = 0
        """The last record folded (its id)."""
        self._lock = threading.Lock()
        self._catching_up: threading.Thread | None = None
        self._stopped = False
        self.folded = 0
        """Records folded since the start."""

    def _fold(self, limit: int) -> int:
        """Fold at most `limit` new records (holding the lock); how many were read."""
        now = self._clock()
        rows = self._audit.summaries(self._after, now - KEEP_S, limit)
        for row in rows:
            self._add(row)
        if rows:
            self._after = int(rows[-1][0])
            self.folded += len(rows)
        oldest = int((now - KEEP_S) // BUCKET_S) * BUCKET_S
        for start in [s for s in self._buckets if s < oldest]:
            del self._buckets[start]
        return len(rows)

    def _add(self, row: tuple[Any, ...]) -> None:
        _id, at, tool, is_error, _code, _step, _rule, _approval, ms, redactions = row
        if tool in NOT_CALLS or tool.startswith("console."):
            return
        start = int(at // BUCKET_S) * BUCKET_S
        bucket = self._buckets.get(start)
        if bucket is None:
            bucket = self._buckets[start] = Bucket()
        if tool == "alarm":
            bucket.alarms += 1
            return
        bucket.calls += 1
        bucket.redactions += redactions or 0
        bucket.latency[bisect.bisect_left(LATENCY_MS, ms or 0)] += 1
        if is_error:
            decision, reason = reason_of(row, self._classify)
            if decision == "refused":
                bucket.refused += 1
                bucket.reasons[reason] = bucket.reasons.get(reason, 0) + 1
            else:
                bucket.failed += 1

    def refresh(self) -> bool:
        """Fold what is new (blocking: from a thread); True when the figures hold every
        record of the last 7 days, False while the background thread still reads."""
        if self._catching_up is not None and self._catching_up.is_alive():
            return False
        self._audit.flush()  # what was queued before the page asked, as a query does
        with self._lock:
            if self._fold(FOLD_ROWS) < FOLD_ROWS:
                return True
        self.catch_up()
        return False

    def catch_up(self) -> None:
        """Fold everything new in a background thread (at a start, or far behind)."""
        if self._catching_up is not None and self._catching_up.is_alive():
            return

        def run() -> None:
            while not self._stopped:
                with self._lock:
                    if self._fold(FOLD_CHUNK) < FOLD_CHUNK:
                        return

        self._catching_up = threading.Thread(target=run, name="console-trends", daemon=True)
        self._catching_up.start()

    def stop(self) -> None:
        self._stopped = True
        if self._catching_up is not None:
            self._catching_up.join(10)

    def window(self, name: str, complete: bool = True) -> dict[str, Any]:
        """The window's totals and its chart's points, oldest first."""
        length, step = WINDOWS[name]
        now = self._clock()
        first = int((now - length) // step + 1) * step
        points = [Bucket() for _ in range(length // step)]
        with self._lock:
            for start, bucket in self._buckets.items():
                slot = (start - first) // step
                if 0 <= slot < len(points):
                    points[slot].add(bucket)
        total = Bucket()
        for point in points:
            total.add(point)
        return {
            "window": name,
            "since": first,
            "step_s": step,
            "complete": complete,
            "calls": total.calls,
            "refused": total.refused,
            "failed": total.failed,
            "alarms": total.alarms,
            "redactions": total.redactions,
            "refusals": dict(sorted(total.reasons.items(), key=lambda kv: -kv[1])),
            "p50_ms": quantile(total.latency, 0.5),
            "p95_ms": quantile(total.latency, 0.95),
            "points": [
                {
                    "t": first + i * step,
                    "calls": p.calls,
                    "refused": p.refused,
                    "p50_ms": quantile(p.latency, 0.5),
                    "p95_ms": quantile(p.latency, 0.95),
                }
                for i, p in enumerate(points)
            ],
        }
