"""`python -m bench.audit [--records N]`: what the audit log's size costs. A call's host-side
cost (bench/pipeline.py, whose audit record goes to the log) and `stockade audit` queries with
filters (AuditLog.query and the reply's conversion, what ListAudit runs), each side by side on
an empty log and on one of N records (1,000,000 by default), bulk-inserted through the store
as a busy single-tenant appliance would have written them over a week."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.pipeline import call_cost
from bench.timing import Result, progress, summarize
from stockade.supervisor import database
from stockade.supervisor.config import AuditConfig
from stockade.supervisor.fronts.grpc.convert import audit_to_pb
from stockade.supervisor.observe.audit import _COLUMNS, AuditLog, AuditQuery, AuditRecord, _row

RECORDS = 1_000_000
SPAN_S = 7 * 86400.0
"""The filled log's records are spread over the last week (inside the default max age)."""
TOOLS = (
    ("exec", 60), ("read_file", 15), ("write_file", 8), ("edit_file", 5), ("glob", 5),
    ("grep", 4), ("network", 2), ("housekeeping", 1),
)  # fmt: skip
QUERIES: dict[str, AuditQuery] = {
    "newest 50": AuditQuery(limit=50),
    "--key k42": AuditQuery(sandbox_key="k42", limit=50),
    "--tool write_file": AuditQuery(tool="write_file", limit=50),
    "--agent agent-7": AuditQuery(agent_id="agent-7", limit=50),
    "--errors": AuditQuery(errors_only=True, limit=50),
    "--since 1h": AuditQuery(since=time.time() - 3600, limit=50),
    "--key k42 --tool grep --errors": AuditQuery(
        sandbox_key="k42", tool="grep", errors_only=True, limit=50
    ),
    "--key rare (10 old records)": AuditQuery(sandbox_key="rare", limit=50),
    "--limit 10000": AuditQuery(limit=10_000),
}


def fill(path: Path, count: int, seed: int = 7) -> float:
    """Insert `count` records of realistic shape; returns the seconds it took."""
    started = time.perf_counter()
    rng = random.Random(seed)
    tools = rng.choices([t for t, _ in TOOLS], [w for _, w in TOOLS], k=count)
    now = time.time()
    db = database.connect(path)
    insert = f"INSERT INTO audit ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
    with db:
        db.execute("BEGIN")
        for start in range(0, count, 50_000):
            rows = [
                _row(_record(rng, i, tools[i], now - SPAN_S * (1 - i / count)))
                for i in range(start, min(start + 50_000, count))
            ]
            db.executemany(insert, rows)
    db.close()
    return time.perf_counter() - started


def _record(rng: random.Random, i: int, tool: str, when: float) -> AuditRecord:
    error = rng.random() < 0.05
    key = "rare" if i < 10 else f"k{rng.randrange(200)}"
    command = f"cd src && pytest -q tests/unit/test_{rng.randrange(400)}.py -k 'not slow'"
    args = {"command": command} if tool == "exec" else {"path": f"src/mod_{i % 977}.py"}
    return AuditRecord(
        time=when, request_id=f"{i:016x}", caller="token:ci", sandbox_key=key,
        agent_id=f"agent-{rng.randrange(20)}", provider="anthropic", tool=tool,
        arguments_json=json.dumps(args), policy_step="allowed", duration_ms=rng.randrange(900),
        exit_code=1 if error else 0, output_bytes=rng.randrange(1 << 16),
        error_code="EXIT_NONZERO" if error else "", is_error=error,
    )  # fmt: skip


def time_queries(path: Path, n: int) -> dict[str, Result]:
    """Each query n times (after one warm-up), through AuditLog.query and the conversion
    ListAudit makes of its reply, in one event loop."""
    log = AuditLog(path)

    async def run(q: AuditQuery) -> Result:
        samples = []
        for _ in range(n + 1):
            started = time.perf_counter()
            [audit_to_pb(r) for r in await log.query(q)]
            samples.append(time.perf_counter() - started)
        return summarize(samples[1:])

    async def run_all() -> dict[str, Result]:
        return {name: await run(q) for name, q in QUERIES.items()}

    try:
        return asyncio.run(run_all())
    finally:
        log.close()


def run_audit_bench(records: int = RECORDS, calls: int = 2000, queries: int = 30) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="stk-bench-audit-") as tmp:
        empty, full = Path(tmp, "empty"), Path(tmp, "full")
        empty.mkdir()
        full.mkdir()
        progress(f"audit: filling a log with {records:,} records")
        fill_s = fill(full / "stockade.db", records)
        size_mb = (full / "stockade.db").stat().st_size / (1 << 20)
        progress(f"audit: filled in {fill_s:.0f} s ({size_mb:.0f} MiB); timing queries, calls")
        found = {
            "query_empty": time_queries(empty / "stockade.db", queries),
            "query_full": time_queries(full / "stockade.db", queries),
        }  # before the calls, which add records to both logs
        costs = call_cost({"empty": empty, "full": full}, calls)
        trimming = Path(tmp, "trimming")
        trimming.mkdir()
        shutil.copyfile(full / "stockade.db", trimming / "stockade.db")
        progress("audit: timing calls while retention trims the full log to half its size")
        cap = AuditConfig(max_size_mb=max(int(size_mb / 2), 1), export_dir=f"{tmp}/export")
        during = call_cost({"trimming": trimming}, calls, audit=cap)["trimming"]
        return {
            "records": records,
            "fill_s": round(fill_s, 1),
            "file_mb": round(size_mb, 1),
            "call_empty": costs["empty"],
            "call_full": costs["full"],
            "call_trimming": during,
            **found,
        }


def section(r: dict[str, Any]) -> str:
    full = f"{r['records']:,} records"
    head = f"{'':<34}{'empty log':>14}{full:>20}{'ratio':>8}"
    lines = [
        f"== audit log size ({r['records']:,} records, {r['file_mb']} MiB, "
        f"filled in {r['fill_s']} s) ==",
        f"{head}   median ms (p95)",
        _pair("call through the pipeline", r["call_empty"], r["call_full"]),
        _pair("  while a trim exports + removes", r["call_empty"], r["call_trimming"]),
        f"  (the trim removed {r['call_trimming']['trimmed']:,} records during those calls;"
        " measured after the two above, not beside them)",
    ]
    for name in QUERIES:
        lines.append(_pair(f"stockade audit {name}", r["query_empty"][name], r["query_full"][name]))
    worst = max(q["median_ms"] for name, q in r["query_full"].items() if "limit" not in name)
    ratio = r["call_full"]["median_ms"] / r["call_empty"]["median_ms"]
    lines.append(
        f"  call cost with the full log {ratio:.2f}x the empty one's   target: same within noise"
    )
    lines.append(
        f"  slowest filtered query (limit 50) {worst:.2f} ms   target <= 100 ms   "
        f"{'met' if worst <= 100 else 'NOT met'}"
    )
    return "\n".join(lines)


def printed(r: dict[str, Any]) -> str:
    """The section, or why it is missing (python -m bench guards each measurement)."""
    return f"== audit log size ==\n  n/a: {r['error']}" if "error" in r else section(r)


def _pair(label: str, a: Result, b: Result) -> str:
    ratio = b["median_ms"] / a["median_ms"] if a["median_ms"] else float("nan")
    cells = [f"{x['median_ms']:.3f} ({x['p95_ms']:.2f})" for x in (a, b)]
    return f"{label[:34]:<34}{cells[0]:>14}{cells[1]:>20}{ratio:>8.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.audit", description=__doc__)
    parser.add_argument("--records", type=int, default=RECORDS)
    ns = parser.parse_args(argv)
    if ns.records < 1:
        parser.error("--records must be at least 1")
    print(section(run_audit_bench(ns.records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
