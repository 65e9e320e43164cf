"""Audit log retention (by age and by size, with export), its config, its indexes and the
migration of a database an older version made. Real SQLite files; no engine."""

from __future__ import annotations

import json
import math
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor import database
from stockade.supervisor.app import retention
from stockade.supervisor.config import AuditConfig, load_config
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.observe.audit import (
    _COLUMNS,
    AuditLog,
    AuditQuery,
    AuditRecord,
    _row,
    query_sql,
)
from stockade.supervisor.observe.retention import Retention, Trimmer

NOW = 1_800_000_000.0
DAY = 86400.0


def rec(when: float, i: int, **kw: Any) -> AuditRecord:
    fields: dict[str, Any] = {
        "time": when, "request_id": f"r{i}", "caller": "c", "sandbox_key": f"k{i % 7}",
        "agent_id": "a", "provider": "p", "tool": "exec",
        "arguments_json": json.dumps({"command": f"make test-{i} " + "x" * 200}),
        "policy_step": "allowed", "is_error": i % 5 == 0,
    }  # fmt: skip
    return AuditRecord(**{**fields, **kw})


def fill(path: Path, times: list[float]) -> list[dict[str, Any]]:
    """Insert a record per time, through the store; the rows as stored, by id."""
    db = database.connect(path)
    insert = f"INSERT INTO audit ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
    with db:
        db.execute("BEGIN")
        db.executemany(insert, [_row(rec(t, i)) for i, t in enumerate(times)])
    rows = rows_of(db)
    db.close()
    return rows


def rows_of(db: sqlite3.Connection) -> list[dict[str, Any]]:
    cursor = db.execute(f"SELECT id, {', '.join(_COLUMNS)} FROM audit ORDER BY id")
    return [dict(zip(("id", *_COLUMNS), row, strict=True)) for row in cursor]


def stored(path: Path) -> list[dict[str, Any]]:
    db = sqlite3.connect(path)
    try:
        return rows_of(db)
    finally:
        db.close()


def exported(folder: Path) -> list[dict[str, Any]]:
    files = sorted(folder.glob("*.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def test_age_keeps_nothing_older_and_exports_exactly_what_it_removes(tmp_path: Path) -> None:
    db, out = tmp_path / "audit.db", tmp_path / "export"
    before = fill(db, [NOW - DAY * (10 - i / 100) for i in range(1000)])  # 10 days back to now
    keep = Retention(max_age_s=5 * DAY, max_bytes=0, export_dir=out, chunk_rows=64)
    log = AuditLog(db, keep, clock=lambda: NOW)
    assert log.trim()
    log.close()
    after = stored(db)
    assert after, "the records of the last five days stay"
    assert min(r["time"] for r in after) >= NOW - 5 * DAY
    removed = [r for r in before if r["time"] < NOW - 5 * DAY]
    assert sorted(exported(out), key=lambda r: r["id"]) == removed
    assert [r["id"] for r in after] == [r["id"] for r in before if r not in removed]
    assert [f.name for f in out.iterdir()] == ["audit-2027-01-15.jsonl"]  # the day of NOW, UTC


def test_size_holds_the_cap_and_the_file_stops_growing(tmp_path: Path) -> None:
    """After a pass, the pages in use are at or below the cap (no slack: a pass goes on while
    they exceed it); between passes the log grows by what is written meanwhile (the slack).
    The file stops growing: new records take the pages the trim freed, so over eight rounds
    that each write about the cap's worth of records, it grows for two rounds, then stays."""
    db, out, cap = tmp_path / "audit.db", tmp_path / "export", 1 << 20
    before = fill(db, [NOW - 3600 + i for i in range(2000)])
    log = AuditLog(db, Retention(max_age_s=0, max_bytes=cap, export_dir=out, chunk_rows=100))
    sizes = []
    for cycle in range(8):
        for i in range(3000):
            log.record(rec(NOW + cycle * 10_000 + i, i))
        assert log.trim()
        check = sqlite3.connect(db)
        assert database.used_bytes(check) <= cap, cycle
        check.close()
        sizes.append(db.stat().st_size)
    log.close()
    assert max(sizes[2:]) <= sizes[1] * 1.05, sizes
    assert sizes[-1] < 4 * cap, sizes  # 26,000 records written: some 9 MiB
    after, gone = stored(db), exported(out)
    assert all(r["id"] < after[0]["id"] for r in gone), "the oldest go first"
    gone_before = sorted((r for r in gone if r["id"] <= before[-1]["id"]), key=lambda r: r["id"])
    assert gone_before == before, "exported as they were stored"
    assert sorted(r["id"] for r in gone + after) == list(range(1, len(before) + 8 * 3000 + 1))


def test_records_keep_landing_while_a_large_trim_runs(tmp_path: Path) -> None:
    """A trim of 200,000 records goes one chunk per transaction, and the writer takes the
    queued records between two chunks: records written during the trim are there right after
    each flush, while old records are still being removed (order, not milliseconds)."""
    db = tmp_path / "audit.db"
    old = fill(db, [NOW - 40 * DAY + i for i in range(200_000)])
    last_old = old[-1]["id"]
    keep = Retention(max_age_s=30 * DAY, max_bytes=0, chunk_rows=1000)
    log = AuditLog(db, keep, clock=lambda: NOW)
    watch = sqlite3.connect(db)
    landed_mid_trim = 0
    for i in range(100_000):
        log.record(rec(NOW, i, request_id=f"new{i}"))
        log.flush()
        (newest,) = watch.execute(
            "SELECT request_id FROM audit ORDER BY id DESC LIMIT 1"
        ).fetchone()
        assert newest == f"new{i}", "a record written during the trim is in the log"
        (oldest,) = watch.execute("SELECT min(id) FROM audit").fetchone()
        if oldest > last_old:
            break
        landed_mid_trim += oldest > 1  # the trim has started and has not finished
    watch.close()
    log.close()
    assert landed_mid_trim >= 2, "records landed between chunks of the trim"
    assert log.trimmer is not None
    assert log.trimmer.removed == len(old)


def test_one_step_removes_one_chunk_at_most(tmp_path: Path) -> None:
    db_path = tmp_path / "audit.db"
    fill(db_path, [NOW - 9 * DAY + i for i in range(1000)])
    db = database.connect(db_path)
    trimmer = Trimmer(
        db, Retention(max_age_s=DAY, max_bytes=0, chunk_rows=300), _COLUMNS, lambda: NOW
    )
    assert [trimmer.step() for _ in range(5)] == [300, 300, 300, 100, 0]
    assert trimmer.wait_s() == pytest.approx(60, abs=1)  # the pass is over; the next is due later
    db.close()


def test_a_failed_export_deletes_nothing(tmp_path: Path) -> None:
    """Rows are exported before they are deleted: when the export cannot be written, they
    stay (the failure is logged; the next pass tries again)."""
    db, blocker = tmp_path / "audit.db", tmp_path / "not-a-dir"
    blocker.write_text("a file where the export directory should be")
    before = fill(db, [NOW - 9 * DAY + i for i in range(50)])
    log = AuditLog(db, Retention(max_age_s=DAY, max_bytes=0, export_dir=blocker), clock=lambda: NOW)
    assert log.trim()
    log.close()
    assert stored(db) == before


OLD_SCHEMA = """
CREATE TABLE audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, request_id TEXT NOT NULL,
    caller TEXT NOT NULL, sandbox_key TEXT NOT NULL, agent_id TEXT NOT NULL,
    provider TEXT NOT NULL, tool TEXT NOT NULL, arguments_json TEXT NOT NULL,
    policy_step TEXT NOT NULL, guard_rule TEXT NOT NULL, approval TEXT NOT NULL,
    approver TEXT NOT NULL, duration_ms INTEGER NOT NULL, exit_code INTEGER NOT NULL,
    output_bytes INTEGER NOT NULL, redactions INTEGER NOT NULL, error_code TEXT NOT NULL,
    is_error INTEGER NOT NULL
);
CREATE INDEX audit_key_time ON audit (sandbox_key, time);
CREATE INDEX audit_time ON audit (time);
CREATE TABLE approved_commands (command TEXT PRIMARY KEY, approver TEXT, time REAL);
"""


async def test_a_database_of_an_older_version_is_migrated_and_trimmed(tmp_path: Path) -> None:
    """A file made before tenants and retention (no tenant column, the old key index, not
    in WAL mode) opens, gets the new indexes, answers filtered queries and is trimmed."""
    path = tmp_path / "stockade.db"
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    later = ("tenant", "front", "context_json", "checkpoint", "prev_hash", "hash")
    columns = [c for c in _COLUMNS if c not in later]
    for i, when in enumerate([NOW - 40 * DAY, NOW - 35 * DAY, NOW - DAY, NOW - 60]):
        values = _row(rec(when, i, sandbox_key="k"))[: len(columns)]
        old.execute(
            f"INSERT INTO audit ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
            values,
        )
    old.commit()
    old.close()
    log = AuditLog(path, Retention(max_age_s=30 * DAY, max_bytes=0), clock=lambda: NOW)
    assert log.trim()
    found = await log.query(AuditQuery(sandbox_key="k"))
    log.close()
    assert [r.time for r in found] == [NOW - 60, NOW - DAY]
    db = sqlite3.connect(path)
    indexes = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    mode = db.execute("PRAGMA journal_mode").fetchone()[0]
    db.close()
    assert "audit_key_time" not in indexes
    assert {
        "audit_tenant_key_time", "audit_tenant_tool_time", "audit_tenant_errors",
        "audit_tenant_decided",
    } <= indexes  # fmt: skip
    assert mode == "wal"


PLANS = [
    (AuditQuery(), "audit_tenant_time"),
    (AuditQuery(tenant="acme", since=NOW - 3600), "audit_tenant_time"),
    (AuditQuery(sandbox_key="k"), "audit_tenant_key_time"),
    (AuditQuery(tool="exec"), "audit_tenant_tool_time"),
    (AuditQuery(agent_id="a"), "audit_tenant_agent_time"),
    (AuditQuery(errors_only=True), "audit_tenant_errors"),
    (
        AuditQuery(sandbox_key="k", tool="exec", errors_only=True, since=NOW),
        "audit_tenant_key_time",
    ),
    (AuditQuery(tool="exec", errors_only=True), "audit_tenant_errors"),
    (AuditQuery(decided_only=True), "audit_tenant_decided"),
    (AuditQuery(decided_only=True, errors_only=True, tool="exec"), "audit_tenant_decided"),
    (AuditQuery(tool="exec", agent_id="a"), "audit_tenant_agent_time"),
]


@pytest.mark.parametrize(
    ("query", "index"), PLANS, ids=[p[1] + str(i) for i, p in enumerate(PLANS)]
)
def test_every_filter_reads_an_index_in_order(
    tmp_path: Path, query: AuditQuery, index: str
) -> None:
    """No filter of `stockade audit` or ListAudit scans the table or sorts what it finds:
    each walks an index newest first and stops at its limit (with several filters, the
    index of the most selective)."""
    db = database.connect(tmp_path / "audit.db")
    sql, params = query_sql(query)
    plan = " | ".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    db.close()
    assert plan.startswith(f"SEARCH audit USING INDEX {index} (tenant=? AND "), plan
    assert "TEMP B-TREE" not in plan, plan
    assert "SCAN" not in plan, plan


def test_queries_answer_newest_first_by_time(tmp_path: Path) -> None:
    """A record written late for an early call (a long call) sorts by its time."""
    path = tmp_path / "audit.db"
    fill(path, [NOW, NOW - 10, NOW + 10])
    log = AuditLog(path)
    records = log._query(AuditQuery(sandbox_key="k0", limit=10)) + log._query(AuditQuery(limit=10))
    log.close()
    assert [r.time for r in records] == [NOW, NOW + 10, NOW, NOW - 10]


def test_retention_from_config() -> None:
    keep = retention(AuditConfig(max_age_days=2, max_size_mb=3, export_dir="/x", trim_interval_s=5))
    assert keep == Retention(
        max_age_s=2 * DAY, max_bytes=3 << 20, export_dir=Path("/x"), interval_s=5
    )
    assert retention(AuditConfig(max_age_days=0, max_size_mb=0)).active is False
    defaults = AuditConfig()
    assert (defaults.max_age_days, defaults.max_size_mb, defaults.export_dir) == (30, 1024, "")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("max_age_days", -1, "audit.max_age_days must be between 0 (no limit) and 36500"),
        ("max_age_days", math.nan, "audit.max_age_days must be between"),
        ("max_age_days", math.inf, "audit.max_age_days must be between"),
        ("max_age_days", 1e9, "audit.max_age_days must be between"),
        ("max_age_days", "30", "audit.max_age_days must be float, got str"),
        ("max_size_mb", -5, "audit.max_size_mb must be 0 (no limit) or between 1 and 16777216"),
        ("max_size_mb", 1 << 40, "audit.max_size_mb must be 0 (no limit) or between"),
        ("max_size_mb", 0.5, "audit.max_size_mb must be int, got float"),
        ("max_size_mb", True, "audit.max_size_mb must be int, got bool"),
        ("trim_interval_s", 0, "audit.trim_interval_s must be between 0.05 and 86400 s, got 0"),
        ("trim_interval_s", -1, "audit.trim_interval_s must be between"),
        ("trim_interval_s", math.inf, "audit.trim_interval_s must be between"),
        ("trim_interval_s", 1e7, "audit.trim_interval_s must be between"),
        ("export_dir", "exports", "audit.export_dir must be an absolute path, got 'exports'"),
        ("export_dir", "/var/\0x", "audit.export_dir must not contain a NUL character"),
        ("export_dir", 7, "audit.export_dir must be str, got int"),
        ("max_age", 30, "unknown key(s) in [audit]: max_age"),
    ],
)
def test_bad_retention_config_is_a_load_error(key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(overrides={f"audit.{key}": value})


def test_zero_turns_a_limit_off() -> None:
    cfg = load_config(overrides={"audit.max_age_days": 0, "audit.max_size_mb": 0})
    assert retention(cfg.audit).active is False
