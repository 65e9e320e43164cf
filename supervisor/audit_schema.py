"""The audit table, defined once: its columns (in order) and its indexes, and the DDL of each
dialect rendered from them. The SQLite database (database.py) and the PostgreSQL shared state
(state/pg_schema.py) both render their audit table from here, so a column added here reaches
both, and both add a column missing from an existing table (migrations: a column added after
the first version has a default). Imports nothing of the supervisor: it belongs to the
bottom layer (with errors, keys, models and text), below database.py.

The indexes serve the filters of `stockade audit` and ListAudit, newest first: every query
names a tenant, so each index starts with it and ends with time (and, implicitly, the row
id), and a query walks one index backwards from its newest entry and stops at its limit,
whatever the size of the log. audit_time serves retention by age
(supervisor/observe/retention.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Dialect = Literal["sqlite", "postgresql"]
Kind = Literal["id", "time", "text", "count", "flag"]

TYPES: dict[Kind, dict[Dialect, str]] = {
    "id": {"sqlite": "INTEGER PRIMARY KEY AUTOINCREMENT", "postgresql": "BIGSERIAL PRIMARY KEY"},
    "time": {"sqlite": "REAL NOT NULL", "postgresql": "DOUBLE PRECISION NOT NULL"},
    "text": {"sqlite": "TEXT NOT NULL", "postgresql": "TEXT NOT NULL"},
    "count": {"sqlite": "INTEGER NOT NULL", "postgresql": "BIGINT NOT NULL"},
    "flag": {"sqlite": "INTEGER NOT NULL", "postgresql": "INTEGER NOT NULL"},
}
"""Each kind of column in each dialect (count: a 64-bit integer; flag: 0 or 1)."""


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind
    default: str = ""
    """An SQL literal; set for every column added after the first version (an existing
    table gets it by ALTER TABLE ... ADD COLUMN, which a NOT NULL column needs a default
    for)."""

    def ddl(self, dialect: Dialect) -> str:
        default = f" DEFAULT {self.default}" if self.default else ""
        return f"{self.name} {TYPES[self.kind][dialect]}{default}"


COLUMNS = (
    Column("id", "id"),
    Column("time", "time"),
    Column("request_id", "text"),
    Column("caller", "text"),
    Column("sandbox_key", "text"),
    Column("agent_id", "text"),
    Column("provider", "text"),
    Column("tool", "text"),
    Column("arguments_json", "text"),
    Column("policy_step", "text"),
    Column("guard_rule", "text"),
    Column("approval", "text"),
    Column("approver", "text"),
    Column("duration_ms", "count"),
    Column("exit_code", "count"),
    Column("output_bytes", "count"),
    Column("redactions", "count"),
    Column("error_code", "text"),
    Column("is_error", "flag"),
    # tenants: audit records carry one
    Column("tenant", "text", "''"),
    # fronts: a call's record names the front it came in through (grpc, mcp)
    Column("front", "text", "''"),
)
"""The audit table's columns, in order (AuditRecord's fields in observe/audit.py, with id)."""


@dataclass(frozen=True)
class Index:
    name: str
    columns: tuple[str, ...]
    where: str = ""

    def ddl(self) -> str:
        where = f" WHERE {self.where}" if self.where else ""
        return (
            f"CREATE INDEX IF NOT EXISTS {self.name} ON audit ({', '.join(self.columns)}){where};"
        )


INDEXES = (
    Index("audit_time", ("time",)),
    Index("audit_tenant_time", ("tenant", "time")),
    Index("audit_tenant_key_time", ("tenant", "sandbox_key", "time")),
    Index("audit_tenant_tool_time", ("tenant", "tool", "time")),
    Index("audit_tenant_agent_time", ("tenant", "agent_id", "time")),
    Index("audit_tenant_errors", ("tenant", "time"), "is_error = 1"),
)
"""The same in both dialects (the same SQL too)."""


def create_table(dialect: Dialect) -> str:
    """CREATE TABLE IF NOT EXISTS audit, every column."""
    columns = ",\n".join(f"    {column.ddl(dialect)}" for column in COLUMNS)
    return f"CREATE TABLE IF NOT EXISTS audit (\n{columns}\n);\n"


def create_indexes() -> str:
    """Every index, IF NOT EXISTS (run once the table has every column)."""
    return "".join(index.ddl() + "\n" for index in INDEXES)


def add_column(column: Column, dialect: Dialect) -> str:
    """The ALTER TABLE that adds `column` to an audit table made before it."""
    return f"ALTER TABLE audit ADD COLUMN {column.ddl(dialect)}"
