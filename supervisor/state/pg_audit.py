"""The audit log in PostgreSQL: the same writer thread, batches and queries as the SQLite
one (observe/audit.py), on a connection of the shared pool, into one table every supervisor
writes; a query through any supervisor sees every supervisor's records (its own flushed
first; another's as of that one's last batch, BATCH_WINDOW_S behind at most).

Retention by age applies (one chunk per step, FOR UPDATE SKIP LOCKED so two supervisors
trimming at once export a record once). Retention by size does not: PostgreSQL does not hand
freed pages back, and its operators size a database with its own tools (a warning says so
when audit.max_size_mb is set)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from psycopg_pool import ConnectionPool

from stockade.supervisor.observe.audit import COLUMNS, AuditLog, AuditQuery, Writer, query_sql
from stockade.supervisor.observe.retention import Retention, Trimmer

log = logging.getLogger("stockade.audit")
BY_AGE = "SELECT id FROM audit WHERE time < %s ORDER BY time, id LIMIT %s FOR UPDATE SKIP LOCKED"


class PgAuditLog(AuditLog):
    def __init__(
        self,
        pool: ConnectionPool[Any],
        retention: Retention | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._pool = pool
        if retention is not None and retention.max_bytes:
            log.warning(
                "audit.max_size_mb does not apply to a PostgreSQL state (records are kept by "
                "age only, audit.max_age_days): size the database with PostgreSQL's tools"
            )
        super().__init__(Path("/nonexistent"), retention, clock)

    def _prepare(self) -> None:
        """The schema is the state's (pg_schema.migrate, at open)."""

    def _open_writer(self) -> tuple[Writer, Trimmer, Callable[[], None]]:
        placeholders = ", ".join(["%s"] * len(COLUMNS))
        insert = f"INSERT INTO audit ({', '.join(COLUMNS)}) VALUES ({placeholders})"

        def write(rows: list[tuple[object, ...]]) -> None:
            with self._pool.connection() as db, db.cursor() as cur:
                cur.executemany(insert, [tuple(map(storable, row)) for row in rows])

        return write, PgTrimmer(self._pool, self._retention, COLUMNS, self._clock), _nothing

    def _rows(self, q: AuditQuery) -> list[tuple[object, ...]]:
        sql, params = query_sql(q, postgres=True)
        with self._pool.connection() as db:
            return list(db.execute(sql, params).fetchall())


class PgTrimmer(Trimmer):
    """Retention by age, in chunks, each one transaction of the pool's."""

    def __init__(
        self,
        pool: ConnectionPool[Any],
        retention: Retention,
        columns: tuple[str, ...],
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(None, retention, columns, clock)  # type: ignore[arg-type]
        self._pool = pool

    def _chunk(self) -> int:
        r = self._retention
        if r.max_age_s <= 0:
            return 0
        params = (self._clock() - r.max_age_s, r.chunk_rows)
        with self._pool.connection() as db, db.transaction():
            if r.export_dir is None:
                cur = db.execute(f"DELETE FROM audit WHERE id IN ({BY_AGE})", params)
                return max(int(cur.rowcount), 0)
            rows = db.execute(
                f"SELECT {', '.join(self._columns)} FROM audit WHERE id IN ({BY_AGE}) ORDER BY id",
                params,
            ).fetchall()
            if rows:
                self._export(rows)
                db.execute("DELETE FROM audit WHERE id = ANY(%s)", ([row[0] for row in rows],))
            return len(rows)


def storable(value: object) -> object:
    """A NUL (which a caller's text may hold) as U+FFFD: PostgreSQL's TEXT refuses it, and
    one such record would fail its whole batch."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


def _nothing() -> None:
    pass
