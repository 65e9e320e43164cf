"""The audit log in PostgreSQL: the same writer thread, batches and queries as the SQLite
one (observe/audit.py), on a connection of the shared pool, into one table every supervisor
writes; a query through any supervisor sees every supervisor's records (its own flushed
first; another's as of that one's last batch, BATCH_WINDOW_S behind at most).

Every supervisor's records are one hash chain (observe/chain.py): a batch locks the chain's
head (audit_chain, FOR UPDATE), so batches of several supervisors take their ids and hashes
one after another.

Retention by age applies (one chunk per step, a prefix of the chain under an advisory lock,
so two supervisors trimming at once export a record once and leave one anchor per chunk).
Retention by size does not: PostgreSQL does not hand freed pages back, and its operators
size a database with its own tools (a warning says so when audit.max_size_mb is set)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from psycopg_pool import ConnectionPool

from stockade.supervisor.database import HEAD, head_of, link
from stockade.supervisor.observe import chain
from stockade.supervisor.observe.audit import (
    CHAINED,
    HEAD_UPDATE,
    AuditLog,
    AuditQuery,
    Sealer,
    Writer,
    query_sql,
)
from stockade.supervisor.observe.retention import Retention, Trimmer, prefix_end

log = logging.getLogger("stockade.audit")
COLUMNS_READ = CHAINED[1:]
TRIM_LOCK = 0x53544B_5452494D  # "STK" "TRIM": one supervisor trims a chunk at a time


class PgAuditLog(AuditLog):
    def __init__(
        self,
        pool: ConnectionPool[Any],
        retention: Retention | None = None,
        clock: Callable[[], float] = time.time,
        sealing: chain.Sealing | None = None,
    ) -> None:
        self._pool = pool
        if retention is not None and retention.max_bytes:
            log.warning(
                "audit.max_size_mb does not apply to a PostgreSQL state (records are kept by "
                "age only, audit.max_age_days): size the database with PostgreSQL's tools"
            )
        super().__init__(Path("/nonexistent"), retention, clock, sealing)

    def _prepare(self) -> None:
        """The schema is the state's (pg_schema.migrate, at open)."""

    def _open_writer(self) -> tuple[Writer, Trimmer, Callable[[], None], Sealer]:
        placeholders = ", ".join(["%s"] * len(CHAINED))
        insert = f"INSERT INTO audit ({', '.join(CHAINED)}) VALUES ({placeholders})"

        def write(rows: list[tuple[object, ...]]) -> None:
            with self._pool.connection() as db, db.transaction(), db.cursor() as cur:
                cur.execute(HEAD + " FOR UPDATE")  # one batch at a time, whoever writes
                stored = [tuple(map(storable, row)) for row in rows]  # hashed as stored
                linked, new_head = link(stored, head_of(db))
                cur.executemany(insert, linked)
                cur.execute(HEAD_UPDATE, new_head)

        def seal(signer: chain.Signer) -> None:
            with self._pool.connection() as db, db.transaction():
                db.execute(HEAD + " FOR UPDATE")
                chain.seal_head(db, "%s", signer)

        trimmer = PgTrimmer(self._pool, self._retention, COLUMNS_READ, self._clock, self.signer)
        return write, trimmer, _nothing, seal

    @contextlib.contextmanager
    def _reader(self) -> Iterator[tuple[Any, str]]:
        with self._pool.connection() as db:
            yield db, "%s"

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
        signer: chain.Signer | None = None,
    ) -> None:
        super().__init__(None, retention, columns, clock, signer=signer)  # type: ignore[arg-type]
        self._pool = pool

    def _chunk(self) -> int:
        """A prefix of the chain older than the age limit, while no other supervisor trims
        (another's chunk under way: this pass ends, the other goes on)."""
        r = self._retention
        if r.max_age_s <= 0:
            return 0
        with self._pool.connection() as db, db.transaction():
            locked = db.execute("SELECT pg_try_advisory_xact_lock(%s)", (TRIM_LOCK,)).fetchone()
            if not (locked and locked[0]):
                return 0
            last = prefix_end(db, "%s", r.chunk_rows, self._clock() - r.max_age_s)
            return 0 if last is None else self._remove(db, "%s", last)


def storable(value: object) -> object:
    """A NUL (which a caller's text may hold) as U+FFFD: PostgreSQL's TEXT refuses it, and
    one such record would fail its whole batch."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


def _nothing() -> None:
    pass
