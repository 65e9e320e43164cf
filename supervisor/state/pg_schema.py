"""The PostgreSQL schema of the shared state, made idempotent: every statement may run
again (IF NOT EXISTS), and the whole migration runs in one transaction under an advisory
lock, so two supervisors starting at once do not race each other's CREATEs (PostgreSQL's
CREATE ... IF NOT EXISTS is not safe against a concurrent one).

A sandbox key is stored as its tenant and the caller's key, in two columns: the scoped key
(keys.scope) joins them with a NUL, which a PostgreSQL TEXT cannot hold.

The audit table is database.py's (AUDIT_COLUMNS, AUDIT_INDEXES), rendered for PostgreSQL:
the one definition the SQLite audit log renders too. A column added there is added here to a
table made before it (ALTER TABLE, in the migration's transaction)."""

from __future__ import annotations

import psycopg

from stockade.supervisor.database import (
    AUDIT_COLUMNS,
    CHAIN_TABLES,
    add_audit_column,
    chain_existing,
    create_audit_indexes,
    create_audit_table,
)

MIGRATION_LOCK = 0x53544B_4D494752  # "STK" "MIGR": one fixed advisory lock id for migrations
VERSION = 2
"""2: the audit's hash chain (its columns, audit_chain, audit_checkpoints). Bumped with each
new step; a database of a newer version is refused (an older
supervisor would not know its tables)."""

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS stockade_schema (version INTEGER NOT NULL);\n"
    + create_audit_table("postgresql")
    + CHAIN_TABLES["postgresql"]
    + """CREATE TABLE IF NOT EXISTS approved (
    tenant TEXT NOT NULL,
    command TEXT NOT NULL,
    approver TEXT NOT NULL,
    time DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, command)
);
CREATE TABLE IF NOT EXISTS supervisors (
    instance TEXT PRIMARY KEY,
    seen TIMESTAMPTZ NOT NULL
);
CREATE TABLE IF NOT EXISTS approval_requests (
    id TEXT PRIMARY KEY,
    instance TEXT NOT NULL,
    tenant TEXT NOT NULL,
    sandbox_key TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    command TEXT NOT NULL,
    reason TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    request_id TEXT NOT NULL,
    decision TEXT,
    approver TEXT
);
ALTER TABLE approval_requests ADD COLUMN IF NOT EXISTS diff TEXT NOT NULL DEFAULT '';
CREATE TABLE IF NOT EXISTS approvers (
    instance TEXT NOT NULL,
    tenant TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (instance, tenant)
);
CREATE TABLE IF NOT EXISTS sandboxes (
    instance TEXT NOT NULL,
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    memory_mb INTEGER NOT NULL,
    PRIMARY KEY (instance, tenant, key)
);
"""
)
"""Every table, the audit table rendered from database.py's definition (the same as the SQLite
audit log's)."""
INDEXES = (
    create_audit_indexes() + "CREATE INDEX IF NOT EXISTS sandboxes_tenant ON sandboxes (tenant);\n"
)
"""Made once every table has every column (an index may name a column a migration adds)."""
PRESENT_COLUMNS = (
    "SELECT column_name FROM information_schema.columns "
    "WHERE table_schema = current_schema() AND table_name = 'audit'"
)


class SchemaTooNew(RuntimeError):
    pass


def migrate(db: psycopg.Connection[tuple[object, ...]]) -> None:
    """Bring the database up to SCHEMA, the audit columns it lacks and INDEXES, once whoever
    else runs it too."""
    with db.transaction():
        db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        db.execute(SCHEMA)
        have = {str(row[0]) for row in db.execute(PRESENT_COLUMNS).fetchall()}
        for column in AUDIT_COLUMNS:
            if column.name not in have:  # a table made before the column was
                db.execute(add_audit_column(column, "postgresql"))
        db.execute(INDEXES)
        if db.execute("SELECT 1 FROM audit_chain WHERE name = 'head'").fetchone() is None:
            chain_existing(db, "%s")  # the records of version 1, chained once
        row = db.execute("SELECT max(version) FROM stockade_schema").fetchone()
        found = row[0] if row else None
        if found is None:
            db.execute("INSERT INTO stockade_schema VALUES (%s)", (VERSION,))
        elif int(str(found)) > VERSION:
            raise SchemaTooNew(
                f"the shared state's schema is version {found}, newer than this supervisor's "
                f"({VERSION}): upgrade this supervisor"
            )
        elif int(str(found)) < VERSION:
            db.execute("UPDATE stockade_schema SET version = %s", (VERSION,))
