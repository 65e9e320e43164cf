"""The supervisor's embedded SQLite database (STATE_DIR/stockade.db): the audit log and the
commands approved with allow-always. WAL mode; each user opens its own connection.

The audit table's columns and indexes are audit_schema.py's (one definition for this and
the PostgreSQL shared state); this module renders them for SQLite and migrates older files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from stockade.supervisor import audit_schema

SCHEMA = (
    audit_schema.create_table("sqlite")
    + """
CREATE TABLE IF NOT EXISTS approved (
    tenant TEXT NOT NULL,
    command TEXT NOT NULL,
    approver TEXT NOT NULL,
    time REAL NOT NULL,
    PRIMARY KEY (tenant, command)
);
"""
)
AUDIT_INDEXES = audit_schema.create_indexes() + "DROP INDEX IF EXISTS audit_key_time;\n"
"""Made after the migrations (tenant is a column added by one). audit_key_time, of older
versions, is dropped: no query can use it (each names a tenant), and each index costs every
insert."""
WAL_LIMIT_BYTES = 64 << 20
"""What the write-ahead log is cut back to after a checkpoint (by default it keeps the size
of its largest transaction)."""
_APPROVED_COMMANDS = (
    "INSERT OR IGNORE INTO approved SELECT '', command, approver, time "
    "FROM approved_commands; DROP TABLE approved_commands"
)
"""allow-always commands are per tenant: the older table (no tenant) moves into `approved`."""


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
    """Bring a database made by an older version up to SCHEMA (each step once): the audit
    columns it lacks (audit_schema.COLUMNS, in order), the older table of allow-always
    commands, then the indexes."""
    have = _columns(db, "audit")
    for column in audit_schema.COLUMNS:
        if have and column.name not in have:
            db.executescript(f"BEGIN; {audit_schema.add_column(column, 'sqlite')}; COMMIT;")
    if _columns(db, "approved_commands"):
        db.executescript(f"BEGIN; {_APPROVED_COMMANDS}; COMMIT;")
    db.executescript(AUDIT_INDEXES)


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    """The columns of `table`; none when there is no such table."""
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
