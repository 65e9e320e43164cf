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
CREATE TABLE IF NOT EXISTS approved_commands (
    command TEXT PRIMARY KEY,
    approver TEXT NOT NULL,
    time REAL NOT NULL
);
"""


def connect(path: Path) -> sqlite3.Connection:
    """A connection with the schema in place; usable from the thread that opened it only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(SCHEMA)
    return db
