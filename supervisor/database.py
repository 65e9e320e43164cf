"""The supervisor's embedded SQLite database (STATE_DIR/stockade.db): the audit log and the
commands approved with allow-always. WAL mode; each user opens its own connection.

The audit indexes serve the filters of `stockade audit` and ListAudit, newest first: every
query names a tenant, so each index starts with it and ends with time (and, implicitly, the
rowid), and a query walks one index backwards from its newest entry and stops at its limit,
whatever the size of the log. audit_time serves retention by age
(supervisor/observe/retention.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    request_id TEXT NOT NULL,
    caller TEXT NOT NULL,
    sandbox_key TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments_json TEXT NOT NULL,
    policy_step TEXT NOT NULL,
    guard_rule TEXT NOT NULL,
    approval TEXT NOT NULL,
    approver TEXT NOT NULL,
    duration_ms INTEGER NOT NULL,
    exit_code INTEGER NOT NULL,
    output_bytes INTEGER NOT NULL,
    redactions INTEGER NOT NULL,
    error_code TEXT NOT NULL,
    is_error INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_time ON audit (time);
CREATE TABLE IF NOT EXISTS approved (
    tenant TEXT NOT NULL,
    command TEXT NOT NULL,
    approver TEXT NOT NULL,
    time REAL NOT NULL,
    PRIMARY KEY (tenant, command)
);
"""
AUDIT_INDEXES = """
CREATE INDEX IF NOT EXISTS audit_tenant_time ON audit (tenant, time);
CREATE INDEX IF NOT EXISTS audit_tenant_key_time ON audit (tenant, sandbox_key, time);
CREATE INDEX IF NOT EXISTS audit_tenant_tool_time ON audit (tenant, tool, time);
CREATE INDEX IF NOT EXISTS audit_tenant_agent_time ON audit (tenant, agent_id, time);
CREATE INDEX IF NOT EXISTS audit_tenant_errors ON audit (tenant, time) WHERE is_error = 1;
DROP INDEX IF EXISTS audit_key_time;
"""
"""Made after the migrations (tenant is a column added by one). audit_key_time, of older
versions, is dropped: no query can use it (each names a tenant), and each index costs every
insert."""
WAL_LIMIT_BYTES = 64 << 20
"""What the write-ahead log is cut back to after a checkpoint (by default it keeps the size
of its largest transaction)."""
_MIGRATIONS = (
    # tenants: audit records carry one; allow-always commands are per tenant
    ("audit", "tenant", "ALTER TABLE audit ADD COLUMN tenant TEXT NOT NULL DEFAULT ''"),
    # fronts: a call's record names the front it came in through (grpc, mcp)
    ("audit", "front", "ALTER TABLE audit ADD COLUMN front TEXT NOT NULL DEFAULT ''"),
    (
        "approved_commands",
        None,
        "INSERT OR IGNORE INTO approved SELECT '', command, approver, time "
        "FROM approved_commands; DROP TABLE approved_commands",
    ),
)


def connect(path: Path) -> sqlite3.Connection:
    """A connection with the schema in place; usable from the thread that opened it only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
    db.executescript(SCHEMA)
    _migrate(db)
    return db


def reader(path: Path) -> sqlite3.Connection:
    """A connection for queries, to a database connect() has set up (no schema work)."""
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    db.execute("PRAGMA query_only=ON")
    return db


def used_bytes(db: sqlite3.Connection) -> int:
    """The bytes of the database's pages in use. Pages freed by deletes stay in the file, on
    its free list, and new rows take them before the file grows: so this, not the file's
    size, is what retention holds under its cap, and the file stops growing at that cap."""
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    free = db.execute("PRAGMA freelist_count").fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    return int((pages - free) * size)


def _migrate(db: sqlite3.Connection) -> None:
    """Bring a database made by an older version up to SCHEMA (each step once)."""
    for table, column, script in _MIGRATIONS:
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if columns and (column is None or column not in columns):
            db.executescript(f"BEGIN; {script}; COMMIT;")
    db.executescript(AUDIT_INDEXES)
