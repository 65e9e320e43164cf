"""The supervisor's embedded SQLite database (STATE_DIR/stockade.db): the audit log and the
commands approved with allow-always. WAL mode; each user opens its own connection.

The audit table is defined here once, for both dialects: its columns in order and its
indexes, rendered as SQLite's DDL here and as PostgreSQL's by the shared state
(state/pg_schema.py), so a column added here reaches both; and both add a column an existing
table lacks (each column added after the first version has a default for that). Imports
nothing of the supervisor."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Dialect = Literal["sqlite", "postgresql"]
Kind = Literal["id", "time", "text", "count", "flag"]

COLUMN_TYPES: dict[Kind, dict[Dialect, str]] = {
    "id": {"sqlite": "INTEGER PRIMARY KEY AUTOINCREMENT", "postgresql": "BIGSERIAL PRIMARY KEY"},
    "time": {"sqlite": "REAL NOT NULL", "postgresql": "DOUBLE PRECISION NOT NULL"},
    "text": {"sqlite": "TEXT NOT NULL", "postgresql": "TEXT NOT NULL"},
    "count": {"sqlite": "INTEGER NOT NULL", "postgresql": "BIGINT NOT NULL"},
    "flag": {"sqlite": "INTEGER NOT NULL", "postgresql": "INTEGER NOT NULL"},
}
"""Each kind of column in each dialect (count: a 64-bit integer; flag: 0 or 1)."""


@dataclass(frozen=True)
class AuditColumn:
    name: str
    kind: Kind
    default: str = ""
    """An SQL literal; set for every column added after the first version (an existing
    table gets it by ALTER TABLE ... ADD COLUMN, which a NOT NULL column needs a default
    for)."""

    def ddl(self, dialect: Dialect) -> str:
        default = f" DEFAULT {self.default}" if self.default else ""
        return f"{self.name} {COLUMN_TYPES[self.kind][dialect]}{default}"


AUDIT_COLUMNS = (
    AuditColumn("id", "id"),
    AuditColumn("time", "time"),
    AuditColumn("request_id", "text"),
    AuditColumn("caller", "text"),
    AuditColumn("sandbox_key", "text"),
    AuditColumn("agent_id", "text"),
    AuditColumn("provider", "text"),
    AuditColumn("tool", "text"),
    AuditColumn("arguments_json", "text"),
    AuditColumn("policy_step", "text"),
    AuditColumn("guard_rule", "text"),
    AuditColumn("approval", "text"),
    AuditColumn("approver", "text"),
    AuditColumn("duration_ms", "count"),
    AuditColumn("exit_code", "count"),
    AuditColumn("output_bytes", "count"),
    AuditColumn("redactions", "count"),
    AuditColumn("error_code", "text"),
    AuditColumn("is_error", "flag"),
    # tenants: audit records carry one
    AuditColumn("tenant", "text", "''"),
    # fronts: a call's record names the front it came in through (grpc, mcp)
    AuditColumn("front", "text", "''"),
)
"""The audit table's columns, in order (AuditRecord's fields in observe/audit.py, with id)."""


@dataclass(frozen=True)
class AuditIndex:
    name: str
    columns: tuple[str, ...]
    where: str = ""

    def ddl(self) -> str:
        where = f" WHERE {self.where}" if self.where else ""
        return (
            f"CREATE INDEX IF NOT EXISTS {self.name} ON audit ({', '.join(self.columns)}){where};"
        )


AUDIT_INDEXES = (
    AuditIndex("audit_time", ("time",)),
    AuditIndex("audit_tenant_time", ("tenant", "time")),
    AuditIndex("audit_tenant_key_time", ("tenant", "sandbox_key", "time")),
    AuditIndex("audit_tenant_tool_time", ("tenant", "tool", "time")),
    AuditIndex("audit_tenant_agent_time", ("tenant", "agent_id", "time")),
    AuditIndex("audit_tenant_errors", ("tenant", "time"), "is_error = 1"),
)
"""The same in both dialects (the same SQL too). They serve the filters of `stockade audit`
and ListAudit, newest first: every query names a tenant, so each index starts with it and
ends with time (and, implicitly, the row id), and a query walks one index backwards from its
newest entry and stops at its limit, whatever the size of the log. audit_time serves
retention by age (supervisor/observe/retention.py)."""


def create_audit_table(dialect: Dialect) -> str:
    """CREATE TABLE IF NOT EXISTS audit, every column."""
    columns = ",\n".join(f"    {column.ddl(dialect)}" for column in AUDIT_COLUMNS)
    return f"CREATE TABLE IF NOT EXISTS audit (\n{columns}\n);\n"


def create_audit_indexes() -> str:
    """Every index, IF NOT EXISTS (run once the table has every column)."""
    return "".join(index.ddl() + "\n" for index in AUDIT_INDEXES)


def add_audit_column(column: AuditColumn, dialect: Dialect) -> str:
    """The ALTER TABLE that adds `column` to an audit table made before it."""
    return f"ALTER TABLE audit ADD COLUMN {column.ddl(dialect)}"


SCHEMA = (
    create_audit_table("sqlite")
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
SQLITE_INDEXES = create_audit_indexes() + "DROP INDEX IF EXISTS audit_key_time;\n"
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
    columns it lacks (AUDIT_COLUMNS, in order), the older table of allow-always
    commands, then the indexes."""
    have = _columns(db, "audit")
    for column in AUDIT_COLUMNS:
        if have and column.name not in have:
            db.executescript(f"BEGIN; {add_audit_column(column, 'sqlite')}; COMMIT;")
    if _columns(db, "approved_commands"):
        db.executescript(f"BEGIN; {_APPROVED_COMMANDS}; COMMIT;")
    db.executescript(SQLITE_INDEXES)


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    """The columns of `table`; none when there is no such table."""
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
