"""The audit table, defined once (supervisor/database.py): SQLite's table (database.py)
and PostgreSQL's (state/pg_schema.py) have the same columns in the same order, with the same
indexes, and they are an audit record's fields. A real SQLite file; PostgreSQL's rendered DDL
(test_state_postgres.py checks a real server's table against the same list)."""

from __future__ import annotations

import dataclasses
import re
import sqlite3
from pathlib import Path

from stockade.supervisor import database
from stockade.supervisor.observe.audit import AuditRecord
from stockade.supervisor.state import pg_schema
from tests.unit.test_audit_retention import OLD_SCHEMA

NAMES = [column.name for column in database.AUDIT_COLUMNS]
OLDEST = OLD_SCHEMA[: OLD_SCHEMA.index(";") + 1]
"""The audit table of the first version (before tenants and fronts), without its indexes and
the old approvals table."""


def sqlite_columns(path: Path) -> list[tuple[str, str, bool, str | None]]:
    """(name, type, not null, default) of the audit table of a file connect() set up."""
    db = database.connect(path)
    rows = db.execute("PRAGMA table_info(audit)").fetchall()
    db.close()
    return [(row[1], row[2], bool(row[3]), row[4]) for row in rows]


def sqlite_indexes(path: Path) -> set[str]:
    """The audit table's indexes of a file connect() sets up."""
    database.connect(path).close()
    db = database.reader(path)
    rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'audit'")
    names = {row[0] for row in rows if not row[0].startswith("sqlite_")}
    db.close()
    return names


def postgres_columns() -> list[str]:
    """The columns of the audit table in pg_schema.SCHEMA, in order."""
    found = re.search(r"CREATE TABLE IF NOT EXISTS audit \((.*?)\n\);", pg_schema.SCHEMA, re.S)
    assert found
    return [line.split()[0] for line in found.group(1).strip().split(",\n")]


def postgres_indexes() -> set[str]:
    return set(re.findall(r"CREATE INDEX IF NOT EXISTS (\w+) ON audit ", pg_schema.INDEXES))


def test_both_dialects_have_the_same_audit_columns(tmp_path: Path) -> None:
    sqlite = [name for name, *_ in sqlite_columns(tmp_path / "stockade.db")]
    assert sqlite == NAMES
    assert postgres_columns() == NAMES


def test_both_dialects_have_the_same_audit_indexes(tmp_path: Path) -> None:
    names = {index.name for index in database.AUDIT_INDEXES}
    assert sqlite_indexes(tmp_path / "stockade.db") == names
    assert postgres_indexes() == names


def test_the_audit_columns_are_an_audit_records_fields() -> None:
    """In the order of the rows written and read (observe/audit.py COLUMNS), then its id."""
    fields = [field.name for field in dataclasses.fields(AuditRecord)]
    assert ["id", *(name for name in fields if name != "id")] == NAMES
    assert sorted(NAMES) == sorted(fields)


def test_a_first_version_file_gets_the_same_table_as_a_new_one(tmp_path: Path) -> None:
    """Every column the first version lacked is added, in order, as a new file has it."""
    old = sqlite3.connect(tmp_path / "old.db")
    old.executescript(OLDEST)
    old.close()
    assert sqlite_columns(tmp_path / "old.db") == sqlite_columns(tmp_path / "new.db")
    assert sqlite_indexes(tmp_path / "old.db") == sqlite_indexes(tmp_path / "new.db")


def test_every_column_an_older_table_lacks_has_a_default() -> None:
    """A NOT NULL column can only be added to a table with rows when it has a default."""
    first = re.findall(r"(\w+) (?:INTEGER|REAL|TEXT)", OLDEST)
    later = [column for column in database.AUDIT_COLUMNS if column.name not in first]
    assert [column.name for column in later] == [
        "tenant", "front", "context_json", "checkpoint", "prev_hash", "hash",
    ]  # fmt: skip
    assert all(column.default for column in later)
