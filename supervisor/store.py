"""The supervisor's embedded SQLite database (STATE_DIR/stockade.db): the audit log and the
commands approved with allow-always. WAL mode; each user opens its own connection."""

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
CREATE INDEX IF NOT EXISTS audit_key_time ON audit (sandbox_key, time);
CREATE INDEX IF NOT EXISTS audit_time ON audit (time);
CREATE TABLE IF NOT EXISTS approved (
    tenant TEXT NOT NULL,
    command TEXT NOT NULL,
    approver TEXT NOT NULL,
    time REAL NOT NULL,
    PRIMARY KEY (tenant, command)
);
"""
_MIGRATIONS = (
    # tenants: audit records carry one; allow-always commands are per tenant
    ("audit", "tenant", "ALTER TABLE audit ADD COLUMN tenant TEXT NOT NULL DEFAULT ''"),
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
    db.executescript(SCHEMA)
    _migrate(db)
    return db


def _migrate(db: sqlite3.Connection) -> None:
    """Bring a database made by an older version up to SCHEMA (each step once)."""
    for table, column, script in _MIGRATIONS:
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if columns and (column is None or column not in columns):
            db.executescript(f"BEGIN; {script}; COMMIT;")
    db.execute("CREATE INDEX IF NOT EXISTS audit_tenant_time ON audit (tenant, time)")
