"""The supervisor's embedded SQLite database (STATE_DIR/stockade.db): the audit log and the
commands approved with allow-always. WAL mode; each user opens its own connection.

The audit table is defined here once, for both dialects: its columns in order and its
indexes, rendered as SQLite's DDL here and as PostgreSQL's by the shared state
(state/pg_schema.py), so a column added here reaches both; and both add a column an existing
table lacks (each column added after the first version has a default for that). Imports
nothing of the supervisor."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

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
    # replay: what policy reads of a call's context beyond agent and provider (JSON; "" none)
    AuditColumn("context_json", "text", "''"),
    # undo: the checkpoint taken before the call (docs/undo.md); hashed only when set
    AuditColumn("checkpoint", "text", "''"),
    # the hash chain (observe/chain.py): the previous record's hash and this record's
    AuditColumn("prev_hash", "text", "''"),
    AuditColumn("hash", "text", "''"),
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


DECIDED: Final = ("allow-once", "allow-always", "deny", "timeout")
"""The `approval` of a call an approver decided, or that timed out waiting for one
(policy/approvals.py's DECISIONS, and the timeout): what the console's approvals page lists."""
DECIDED_SQL: Final = f"approval IN ({', '.join(repr(d) for d in DECIDED)})"
"""The filter of a decided call, as literals: a query with it uses the partial index
audit_tenant_decided (SQLite uses a partial index only for a WHERE that implies the index's)."""

AUDIT_INDEXES = (
    AuditIndex("audit_time", ("time",)),
    AuditIndex("audit_tenant_time", ("tenant", "time")),
    AuditIndex("audit_tenant_key_time", ("tenant", "sandbox_key", "time")),
    AuditIndex("audit_tenant_tool_time", ("tenant", "tool", "time")),
    AuditIndex("audit_tenant_agent_time", ("tenant", "agent_id", "time")),
    AuditIndex("audit_tenant_errors", ("tenant", "time"), "is_error = 1"),
    AuditIndex("audit_tenant_decided", ("tenant", "time"), DECIDED_SQL),
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


CHAIN_TABLES: dict[Dialect, str] = {
    dialect: f"""CREATE TABLE IF NOT EXISTS audit_chain (
    name TEXT PRIMARY KEY,
    last_id {COLUMN_TYPES["count"][dialect]},
    last_hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS audit_checkpoints (
    {AuditColumn("id", "id").ddl(dialect)},
    time {COLUMN_TYPES["time"][dialect]},
    kind TEXT NOT NULL,
    last_id {COLUMN_TYPES["count"][dialect]},
    last_hash TEXT NOT NULL,
    public_key TEXT NOT NULL,
    signature TEXT NOT NULL
);
"""
    for dialect in ("sqlite", "postgresql")
}
"""The hash chain's head (one row, name 'head': the last record's id and hash, kept when
retention removes that record; PostgreSQL's writers lock it FOR UPDATE, one batch at a time)
and its signed checkpoints: `head` at an interval and at shutdown, `anchor` for the last
record retention removed (observe/chain.py)."""


def create_audit_indexes() -> str:
    """Every index, IF NOT EXISTS (run once the table has every column)."""
    return "".join(index.ddl() + "\n" for index in AUDIT_INDEXES)


def add_audit_column(column: AuditColumn, dialect: Dialect) -> str:
    """The ALTER TABLE that adds `column` to an audit table made before it."""
    return f"ALTER TABLE audit ADD COLUMN {column.ddl(dialect)}"


SCHEMA = (
    create_audit_table("sqlite")
    + CHAIN_TABLES["sqlite"]
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
    if db.execute("SELECT 1 FROM audit_chain WHERE name = 'head'").fetchone() is None:
        _start_chain(db)
    if _columns(db, "approved_commands"):
        db.executescript(f"BEGIN; {_APPROVED_COMMANDS}; COMMIT;")
    db.executescript(SQLITE_INDEXES)


def _start_chain(db: sqlite3.Connection) -> None:
    """The chain's head, once: the records an older version wrote are chained first, in id
    order (a one-time cost at the upgrade: CHAIN_REHASH_RATE)."""
    with db:
        db.execute("BEGIN IMMEDIATE")
        if db.execute("SELECT 1 FROM audit_chain WHERE name = 'head'").fetchone() is None:
            chain_existing(db, "?")


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    """The columns of `table`; none when there is no such table."""
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


# The hash chain (docs/audit.md). Its rules are here, beside the table they cover, so that
# both stores and the migrations of both apply the same ones; signing and verifying are
# observe/chain.py's, and scripts/verify_audit.py restates these few lines for offline use.
CHAIN_FORMAT = "stockade-audit-1"
"""The first element of every record's canonical form: a later format names itself anew."""
GENESIS = "0" * 64
"""The previous hash of the first record of an installation."""
HASHED = tuple(c.name for c in AUDIT_COLUMNS if c.name not in ("prev_hash", "hash"))
"""The columns a record's hash covers, in this order: all but the two hashes (id first)."""
CHAIN_BASE = HASHED.index("context_json") + 1
"""The columns of the chain's first format. A column added after them (each with the default
'') enters a record's canonical form only when it, or one after it, is set: trailing unset
ones are left out, so records written before the column existed hash as they did, and a new
column needs no new format (docs/audit.md)."""
CHAIN_REHASH_RATE = "about 100,000 records a second"
"""What chaining an older version's records costs, once, at the upgrade."""
HEAD = "SELECT last_id, last_hash FROM audit_chain WHERE name = 'head'"


def head_of(db: Any) -> tuple[int, str]:
    """The id and hash new records follow (in the writer's transaction): the head's, with
    ids after any record inserted past it by other means (which verify then names)."""
    cur = db.cursor()
    head = cur.execute(HEAD).fetchone()
    top = cur.execute("SELECT max(id) FROM audit").fetchone()
    return max(int(head[0]), int(top[0] or 0)), str(head[1])


def canonical(values: Sequence[object]) -> bytes:
    """A record's canonical bytes: the UTF-8 of the compact JSON array [CHAIN_FORMAT, then
    its HASHED values in order, trailing unset later columns left out (CHAIN_BASE)], text
    as stored (non-ASCII as is, not escaped), `time` as the shortest decimal that reads back
    as the same double, is_error as 0 or 1."""
    values = list(values)
    while len(values) > CHAIN_BASE and values[-1] == "":
        values.pop()
    return json.dumps(
        [CHAIN_FORMAT, *values], ensure_ascii=False, separators=(",", ":"), allow_nan=False
    ).encode("utf-8", "surrogatepass")


def link_hash(prev_hash: str, values: Sequence[object]) -> str:
    """SHA-256 over the previous record's hash (32 bytes) and this record's canonical bytes,
    as 64 hex digits."""
    return hashlib.sha256(bytes.fromhex(prev_hash) + canonical(values)).hexdigest()


def link(
    rows: Iterable[Sequence[object]], head: tuple[int, str]
) -> tuple[list[tuple[object, ...]], tuple[int, str]]:
    """Rows in AUDIT_COLUMNS order without the id (their two hashes last, unset), given
    the ids after the head's and chained from its hash; the new head."""
    last_id, last_hash = head
    linked = []
    for row in rows:
        last_id += 1
        values = (last_id, *row[:-2])
        last_hash = link_hash(prev := last_hash, values)
        linked.append((*values, prev, last_hash))
    return linked, (last_id, last_hash)


def chain_existing(db: Any, mark: str, batch: int = 5000) -> None:
    """Chain the records a table already holds (an older version's), in id order, and set
    the head; in the caller's transaction. `db`: a DB-API connection (sqlite3 or psycopg)
    whose placeholder is `mark`."""
    cur = db.cursor()
    head, after = (0, GENESIS), 0
    select = f"SELECT {', '.join(HASHED)} FROM audit WHERE id > {mark} ORDER BY id LIMIT {mark}"
    update = f"UPDATE audit SET prev_hash = {mark}, hash = {mark} WHERE id = {mark}"
    while rows := cur.execute(select, (after, batch)).fetchall():
        linked = []
        for values in rows:
            prev, digest = head[1], link_hash(head[1], values)
            linked.append((prev, digest, values[0]))
            head = (int(values[0]), digest)
        cur.executemany(update, linked)
        after = head[0]
    if head[0] == 0:  # no records: ids go on from the highest ever given, where it is known
        head = (_highest_id(db), GENESIS)
    cur.execute(
        f"INSERT INTO audit_chain (name, last_id, last_hash) VALUES ('head', {mark}, {mark})",
        head,
    )


def _highest_id(db: Any) -> int:
    if not isinstance(db, sqlite3.Connection):
        return 0
    row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'audit'").fetchone()
    return int(row[0]) if row else 0
