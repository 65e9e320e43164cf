"""The PostgreSQL schema of the shared state, made idempotent: every statement may run
again (IF NOT EXISTS), and the whole migration runs in one transaction under an advisory
lock, so two supervisors starting at once do not race each other's CREATEs (PostgreSQL's
CREATE ... IF NOT EXISTS is not safe against a concurrent one).

A sandbox key is stored as its tenant and the caller's key, in two columns: the scoped key
(keys.scope) joins them with a NUL, which a PostgreSQL TEXT cannot hold."""

from __future__ import annotations

import psycopg

MIGRATION_LOCK = 0x53544B_4D494752  # "STK" "MIGR": one fixed advisory lock id for migrations
VERSION = 1
"""Bumped with each new step; a database of a newer version is refused (an older
supervisor would not know its tables)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS stockade_schema (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS audit (
    id BIGSERIAL PRIMARY KEY,
    time DOUBLE PRECISION NOT NULL,
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
    duration_ms BIGINT NOT NULL,
    exit_code BIGINT NOT NULL,
    output_bytes BIGINT NOT NULL,
    redactions BIGINT NOT NULL,
    error_code TEXT NOT NULL,
    is_error INTEGER NOT NULL,
    tenant TEXT NOT NULL DEFAULT '',
    front TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS audit_time ON audit (time);
CREATE INDEX IF NOT EXISTS audit_tenant_time ON audit (tenant, time);
CREATE INDEX IF NOT EXISTS audit_tenant_key_time ON audit (tenant, sandbox_key, time);
CREATE INDEX IF NOT EXISTS audit_tenant_tool_time ON audit (tenant, tool, time);
CREATE INDEX IF NOT EXISTS audit_tenant_agent_time ON audit (tenant, agent_id, time);
CREATE INDEX IF NOT EXISTS audit_tenant_errors ON audit (tenant, time) WHERE is_error = 1;
CREATE TABLE IF NOT EXISTS approved (
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
CREATE INDEX IF NOT EXISTS sandboxes_tenant ON sandboxes (tenant);
"""


class SchemaTooNew(RuntimeError):
    pass


def migrate(db: psycopg.Connection[tuple[object, ...]]) -> None:
    """Bring the database up to SCHEMA, once whoever else runs it too."""
    with db.transaction():
        db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        db.execute(SCHEMA)
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
