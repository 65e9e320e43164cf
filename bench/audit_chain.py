"""`python -m bench.audit_chain`: what the audit's hash chain and policy replay cost (no
engine). The chain: a record's link (its canonical bytes and SHA-256, database.link, on
the audit writer's thread) per record, for arguments of 200 B and 4 KiB, and a batch of
records written through the real AuditLog with and without it. Replay: a generated day of
calls (mostly exec, with repeated commands as agents repeat them) through a candidate
config (calls/replay.py), records per second. Targets of issue 31: ≤ 0.02 ms per call for
the chain, ≥ 20,000 calls/s for replay."""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.timing import Result, summarize
from stockade.supervisor import database
from stockade.supervisor.calls.replay import Replayer, replay
from stockade.supervisor.config import config_from_toml
from stockade.supervisor.observe.audit import AuditLog, AuditRecord, _row

CHAIN_TARGET_MS = 0.02
REPLAY_TARGET = 20_000
CANDIDATE = """
[[guard.rules]]
name = "no-push"
pattern = "git push"

[agents.intern]
approvals = "always"

[agents.intern.tools]
deny = ["write_file"]
"""
COMMANDS = [
    "ls -la", "make test", "git status", "git diff", "python3 -m pytest -q", "cat README.md",
    "git push origin main", "make deploy", "npm test", "grep -rn TODO src",
]  # fmt: skip


def record(i: int, arguments: str, when: float = 1_800_000_000.0) -> AuditRecord:
    return AuditRecord(
        time=when + i * 0.01, request_id=f"{i:032x}", caller="ipv4:127.0.0.1:50000",
        sandbox_key=f"k{i % 50}", agent_id="builder", provider="anthropic", tool="exec",
        arguments_json=arguments, policy_step="allowed", duration_ms=12, exit_code=0,
        output_bytes=400, tenant="acme", front="grpc",
    )  # fmt: skip


def chain_cost(n: int, size: int, batch: int = 100) -> Result:
    """database.link per record, measured over batches as the writer links them."""
    arguments = json.dumps({"command": "x" * max(size - 16, 0)})
    rows = [_row(record(i, arguments)) for i in range(batch)]
    head = (0, database.GENESIS)
    seconds = []
    for _ in range(max(n // batch, 1)):
        started = time.perf_counter()
        _, head = database.link(rows, head)
        seconds.append((time.perf_counter() - started) / batch)
    return summarize(seconds)


def written(n: int) -> dict[str, float]:
    """Seconds per record of n records written through the real AuditLog (SQLite), its
    batches chained; and the same rows inserted as before the chain (no ids, no hashes)."""
    arguments = json.dumps({"command": "make test"})
    records = [record(i, arguments) for i in range(n)]
    with tempfile.TemporaryDirectory() as folder:
        log = AuditLog(Path(folder) / "chained.db")
        started = time.perf_counter()
        for r in records:
            log.record(r)
        log.flush()
        chained = time.perf_counter() - started
        log.close()
        db = database.connect(Path(folder) / "plain.db")
        columns = [c for c in database.HASHED if c != "id"] + ["prev_hash", "hash"]
        insert = (
            f"INSERT INTO audit ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        )
        started = time.perf_counter()
        for at in range(0, n, 1000):
            with db:
                db.execute("BEGIN")
                db.executemany(insert, [_row(r) for r in records[at : at + 1000]])
        plain = time.perf_counter() - started
        db.close()
    return {"chained_ms": chained / n * 1000, "plain_ms": plain / n * 1000}


def day(count: int, seed: int = 31, distinct: bool = False) -> list[AuditRecord]:
    """A day of recorded calls: exec of repeated commands (`distinct`: every command a new
    one, so the guard parses each), file reads and writes."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        agent = rng.choice(["builder", "builder", "intern"])
        tool = rng.choice(["exec", "exec", "exec", "read_file", "write_file"])
        if tool == "exec":
            command = rng.choice(COMMANDS) + (f" --run {i}" if distinct else "")
            arguments = json.dumps({"command": command})
        elif tool == "read_file":
            arguments = json.dumps({"path": f"src/m{rng.randrange(500)}.py"})
        else:
            arguments = json.dumps({"path": f"src/m{rng.randrange(500)}.py", "content": "x\n"})
        base = record(i, arguments, 1_800_000_000.0 + i * 86400.0 / count)
        out.append(replace(base, id=i + 1, agent_id=agent, tool=tool))
    return out


def replay_rate(count: int, rounds: int = 3, distinct: bool = False) -> dict[str, Any]:
    records = day(count, distinct=distinct)
    candidate = config_from_toml(CANDIDATE)
    rates = []
    for _ in range(rounds):
        started = time.perf_counter()
        report = replay(records, Replayer(candidate))
        rates.append(count / (time.perf_counter() - started))
    return {
        "calls": count,
        "per_s": sorted(rates)[len(rates) // 2],
        "changed": report.replayed - report.unchanged,
    }


def run_chain_bench(n: int = 20_000, replayed: int = 100_000) -> dict[str, Any]:
    return {
        "link_200B": chain_cost(n, 200),
        "link_4KiB": chain_cost(n, 4096),
        "written": written(min(n, 20_000)),
        "replay": replay_rate(replayed),
        "replay_distinct": replay_rate(max(replayed // 10, 1), rounds=1, distinct=True),
    }


def section(measured: dict[str, Any]) -> str:
    """The printed section, or why it is missing (python -m bench guards each measurement)."""
    if "error" in measured:
        return f"== audit hash chain and policy replay ==\n  n/a: {measured['error']}"
    lines = [
        "== audit hash chain and policy replay (no engine) ==",
        f"{'':<40}{'n':>7}{'median':>10}{'p95':>10}   ms",
    ]
    for name, key in (
        ("chain link per record, 200 B args", "link_200B"),
        ("chain link per record, 4 KiB args", "link_4KiB"),
    ):
        r = measured[key]
        lines.append(f"{name:<40}{r['n']:>7}{r['median_ms']:>10.4f}{r['p95_ms']:>10.4f}")
    worst = measured["link_4KiB"]["median_ms"]
    lines.append(
        f"  chain per call {worst:.4f} ms   target <= {CHAIN_TARGET_MS} ms   "
        + _met(worst <= CHAIN_TARGET_MS)
    )
    w = measured["written"]
    lines.append(
        f"writer per record: {w['chained_ms']:.4f} ms chained (AuditLog), "
        f"{w['plain_ms']:.4f} ms as a plain insert"
    )
    r = measured["replay"]
    lines.append(
        f"replay of {r['calls']:,} recorded calls: {r['per_s']:,.0f} calls/s "
        f"({r['changed']:,} changed)   target >= {REPLAY_TARGET:,}/s   "
        + _met(r["per_s"] >= REPLAY_TARGET)
    )
    d = measured["replay_distinct"]
    lines.append(
        f"  the same with every command distinct (the guard parses each): {d['per_s']:,.0f} calls/s"
    )
    return "\n".join(lines)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> int:
    print(section(run_chain_bench()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
