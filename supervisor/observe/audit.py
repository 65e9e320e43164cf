"""The audit log: one record per call and decision, in the embedded SQLite database.

Writes go through a queue to one writer thread, so a call never waits on the disk; a query
first waits until everything queued before it is written. The writer gathers what arrives in
BATCH_WINDOW_S after a first record and writes it as one transaction: one wake-up of that
thread per window instead of one per call, since each takes the interpreter lock from the
event loop's thread while calls are being served.

Retention (supervisor/observe/retention.py) trims on the same thread, one chunk between two batches,
so records keep landing while millions of old ones go; it keeps the log under its age and
size limits, never blocking a call."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stockade.supervisor import database
from stockade.supervisor.keys import split
from stockade.supervisor.observe import chain
from stockade.supervisor.observe.retention import Retention, Trimmer
from stockade.supervisor.text import wire_text

log = logging.getLogger("stockade.audit")
MAX_LIMIT = 10_000
BATCH_WINDOW_S = 0.05
"""How long the writer waits after a record for more before writing (a flush, a query or
close cuts it short). Records of that window are lost if the supervisor is killed."""
MAX_BATCH = 1000


@dataclass(frozen=True)
class AuditRecord:
    time: float
    request_id: str
    caller: str
    sandbox_key: str
    agent_id: str
    provider: str
    tool: str
    arguments_json: str
    policy_step: str
    guard_rule: str = ""
    approval: str = ""
    approver: str = ""
    duration_ms: int = 0
    exit_code: int = -1
    output_bytes: int = 0
    redactions: int = 0
    error_code: str = ""
    is_error: bool = False
    tenant: str = ""
    """The caller's tenant ("" with auth off); sandbox_key is the key as that caller wrote it."""
    front: str = ""
    """The front a tool call came in through: "grpc", "mcp" or "mcp-stdio" (the stdio bridge,
    a gRPC caller that names itself); "" for records that are no
    caller's call (egress decisions, housekeeping) and for records older than the field."""
    context_json: str = ""
    """What tool policy reads of the caller's context beyond agent_id and provider (channel,
    chat_id, peer_kind, subagent_depth: a JSON object of those set), for policy replay; ""
    when none is set."""
    checkpoint: str = ""
    """The checkpoint taken of the sandbox's workspace before the call (docs/undo.md), or ""."""
    prev_hash: str = ""
    """The previous record's hash (database.link), set by the writer."""
    hash: str = ""
    """This record's hash over its other columns and prev_hash, set by the writer."""
    id: int = 0


@dataclass(frozen=True)
class AuditQuery:
    tenant: str = ""
    """Only this tenant's records (always applied: "" is the records of no tenant)."""
    sandbox_key: str = ""
    tool: str = ""
    agent_id: str = ""
    since: float = 0.0
    limit: int = 100
    errors_only: bool = False
    decided_only: bool = False
    """Only calls an approver decided, or that timed out waiting for one (database.DECIDED):
    read through their own partial index, however many other calls came after them."""
    record_id: int = 0
    """Only the record of this id (its primary key: one row read, however long the log);
    0: any."""


_COLUMNS = tuple(f.name for f in dataclasses.fields(AuditRecord) if f.name != "id")
COLUMNS = _COLUMNS
"""The columns of a record, in the order of the rows written and read (but the id)."""
CHAINED = ("id", *COLUMNS)
SUMMARY_COLUMNS = (
    "time", "tool", "is_error", "error_code", "policy_step", "guard_rule", "approval",
    "duration_ms", "redactions",
)  # fmt: skip
"""What AuditLog.summaries reads of each record: enough to count and classify a call."""
"""The columns a batch inserts: the writer gives the ids, after the chain's head."""
HEAD_UPDATE = "UPDATE audit_chain SET last_id = %s, last_hash = %s WHERE name = 'head'"
Writer = Callable[[list[tuple[object, ...]]], None]
Sealer = Callable[[chain.Signer], None]
"""Signs the chain's head into the store (observe/chain.py seal_head, in a transaction)."""


class _Flush:
    def __init__(self) -> None:
        self.done = threading.Event()


class _Trim(_Flush):
    """Done once a retention pass has left the log within its limits."""


class AuditLog:
    def __init__(
        self,
        path: Path,
        retention: Retention | None = None,
        clock: Callable[[], float] = time.time,
        sealing: chain.Sealing | None = None,
    ) -> None:
        """retention: None keeps every record. clock: the time retention's ages count from.
        sealing: how the chain is signed (None: chained, not signed)."""
        self._path = path
        self._retention = retention or Retention(max_age_s=0, max_bytes=0)
        self._clock = clock
        self._sealing = sealing
        self._sealed_at = time.monotonic()
        self.trimmer: Trimmer | None = None
        """The writer thread's, once it runs (its `removed` counts what retention took)."""
        self._prepare()
        self._queue: queue.SimpleQueue[AuditRecord | _Flush | None] = queue.SimpleQueue()
        self._urgent = threading.Event()
        """Set by flush() and close(): write what is queued now, without waiting."""
        self._markers = 0
        """Flush and stop markers queued and not yet taken: while any is, nothing waits."""
        self._markers_lock = threading.Lock()
        self._writer = threading.Thread(target=self._write_loop, name="audit-writer", daemon=True)
        self._writer.start()

    def record(self, rec: AuditRecord) -> None:
        """Queue a record; never blocks on the disk. The writer thread turns it into a row
        (_row), off the path of the call being answered."""
        self._queue.put(rec)

    def _prepare(self) -> None:
        """The schema in place before the first record (the database of another kind of
        store: a subclass's, supervisor/state/pg_audit.py)."""
        database.connect(self._path).close()

    @property
    def signer(self) -> chain.Signer | None:
        return self._sealing.signer if self._sealing else None

    def _open_writer(self) -> tuple[Writer, Trimmer, Callable[[], None], Sealer]:
        """On the writer thread: what writes a batch (one transaction: ids and hashes
        from the chain's head on), the trimmer, what closes the writer's connection, and
        what signs the head."""
        db = database.connect(self._path)
        insert = (
            f"INSERT INTO audit ({', '.join(CHAINED)}) VALUES ({', '.join('?' * len(CHAINED))})"
        )

        def write(rows: list[tuple[object, ...]]) -> None:
            with db:
                db.execute("BEGIN IMMEDIATE")
                linked, (last_id, last_hash) = database.link(rows, database.head_of(db))
                db.executemany(insert, linked)
                db.execute(HEAD_UPDATE.replace("%s", "?"), (last_id, last_hash))

        def seal(signer: chain.Signer) -> None:
            with db:
                db.execute("BEGIN IMMEDIATE")
                chain.seal_head(db, "?", signer)

        trimmer = Trimmer(db, self._retention, _COLUMNS, self._clock, signer=self.signer)
        return write, trimmer, db.close, seal

    def _seal(self, seal: Sealer, now: bool = False) -> None:
        """A head checkpoint when one is due (or `now`, at close)."""
        sealing = self._sealing
        if sealing is None:
            return
        if not now and time.monotonic() - self._sealed_at < sealing.interval_s:
            return
        self._sealed_at = time.monotonic()
        try:
            seal(sealing.signer)
        except Exception:  # the writer must outlive a failed checkpoint; the next one retries
            log.exception("audit: the chain's head could not be signed")

    def _wait_s(self, trimmer: Trimmer) -> float | None:
        """How long the writer may wait for records: until retention's next step or the
        next head checkpoint, whichever comes first (None: for ever)."""
        wait = trimmer.wait_s()
        if self._sealing is None:
            return wait
        due = max(0.0, self._sealing.interval_s - (time.monotonic() - self._sealed_at))
        return due if wait is None else min(wait, due)

    def _write_loop(self) -> None:
        write, trimmer, close, seal = self._open_writer()
        self.trimmer = trimmer
        while True:
            batch, flushes, stop = self._drain(self._wait_s(trimmer))
            if batch:
                try:
                    write([_row(r) for r in batch])
                except Exception:  # the writer must outlive a bad batch: it is the only one
                    log.exception("audit: %d records could not be written", len(batch))
            for flush in flushes:
                if isinstance(flush, _Trim):
                    trimmer.request(flush.done)
                else:
                    flush.done.set()
            if stop:
                self._seal(seal, now=True)
                close()
                return
            self._seal(seal)
            trimmer.step()

    def _drain(self, wait_s: float | None) -> tuple[list[AuditRecord], list[_Flush], bool]:
        """The next batch: blocks for a first item up to wait_s (None: for ever); after a
        record, gathers more for up to BATCH_WINDOW_S (less when flush() or close() asks)."""
        try:
            items = [self._queue.get(timeout=wait_s) if wait_s != 0 else self._queue.get_nowait()]
        except queue.Empty:
            return [], [], False
        trimming = wait_s == 0  # the thread has work: no window to gather records in
        if isinstance(items[0], AuditRecord) and self._queue.qsize() < MAX_BATCH and not trimming:
            with self._markers_lock:
                urgent = self._markers > 0
            if not urgent:
                self._urgent.wait(BATCH_WINDOW_S)
        self._urgent.clear()
        while not self._queue.empty() and len(items) < MAX_BATCH:
            items.append(self._queue.get())
        records = [i for i in items if isinstance(i, AuditRecord)]
        flushes = [i for i in items if isinstance(i, _Flush)]
        stop = None in items
        with self._markers_lock:
            self._markers -= len(flushes) + stop
        return records, flushes, stop

    def _put_marker(self, marker: _Flush | None) -> None:
        with self._markers_lock:
            self._markers += 1
        self._queue.put(marker)
        self._urgent.set()

    def flush(self, timeout: float = 30.0) -> None:
        marker = _Flush()
        self._put_marker(marker)
        marker.done.wait(timeout)

    def trim(self, timeout: float = 300.0) -> bool:
        """Run a retention pass now (after what is queued) and wait until it ends: with the
        log within its limits, or at a chunk that failed (logged; its rows stay). False if
        that took longer than timeout."""
        if not self._retention.active:
            return True
        marker = _Trim()
        self._put_marker(marker)
        return marker.done.wait(timeout)

    async def query(self, q: AuditQuery) -> list[AuditRecord]:
        return await asyncio.to_thread(self._query, q)

    def _query(self, q: AuditQuery) -> list[AuditRecord]:
        self.flush()
        return [_from_row(row) for row in self._rows(q)]

    def _rows(self, q: AuditQuery) -> list[tuple[object, ...]]:
        sql, params = query_sql(q)
        db = database.reader(self._path)
        try:
            return db.execute(sql, params).fetchall()
        finally:
            db.close()

    def summaries(self, after: int, since: float, limit: int) -> list[tuple[Any, ...]]:
        """(id, *SUMMARY_COLUMNS) of at most `limit` records with an id above `after`, in id
        order, for the console's trends (fronts/console/trends.py), which fold each record
        once. `after` 0: from the first record at or after `since` (audit_time finds it),
        then forward along the primary key, whatever the size of the log. Blocking; no
        flush (the trends may be a batch window late)."""
        with self._reader() as (db, mark):
            if after <= 0:
                indexed = " INDEXED BY audit_time" if mark == "?" else ""  # SQLite's own
                first = db.execute(
                    f"SELECT id FROM audit{indexed} WHERE time >= {mark} ORDER BY time LIMIT 1",
                    (since,),
                ).fetchone()
                if first is None:
                    return []
                after = int(first[0]) - 1
            sql = (
                f"SELECT id, {', '.join(SUMMARY_COLUMNS)} FROM audit "
                f"WHERE id > {mark} AND time >= {mark} ORDER BY id LIMIT {mark}"
            )
            return list(db.execute(sql, (after, since, limit)).fetchall())

    @contextlib.contextmanager
    def scan(self, q: ScanQuery) -> Iterator[Iterator[AuditRecord]]:
        """The records in id order (oldest first), read as they are iterated, for replay;
        blocking: use it in a thread, from start to end. Waits for what is queued first."""
        self.flush()
        with self._reader() as (db, mark):
            yield scan_records(db, mark, q)

    @contextlib.contextmanager
    def _reader(self) -> Iterator[tuple[Any, str]]:
        """A read-only connection to the store and its placeholder."""
        db = database.reader(self._path)
        try:
            yield db, "?"
        finally:
            db.close()

    def close(self) -> None:
        self._put_marker(None)
        self._writer.join(30)


@dataclass(frozen=True)
class ScanQuery:
    """Records for replay, in id order: since a time, of one tenant or all, of one key."""

    since: float = 0.0
    tenant: str | None = None
    """None: every tenant's records."""
    sandbox_key: str = ""
    limit: int = 0
    """At most this many, the oldest first (0: all)."""


def scan_records(db: Any, mark: str, q: ScanQuery, chunk: int = 5000) -> Iterator[AuditRecord]:
    """The records a ScanQuery selects, read `chunk` at a time in id order, through a DB-API
    connection of either store."""
    where, params = [f"id > {mark}", f"time >= {mark}"], list[object]([q.since])
    if q.tenant is not None:
        where.append(f"tenant = {mark}")
        params.append(q.tenant)
    if q.sandbox_key:
        where.append(f"sandbox_key = {mark}")
        params.append(q.sandbox_key)
    sql = (
        f"SELECT id, {', '.join(_COLUMNS)} FROM audit WHERE {' AND '.join(where)} "
        f"ORDER BY id LIMIT {mark}"
    )
    after, left = 0, q.limit or -1
    cur = db.cursor()
    while left:
        size = chunk if left < 0 else min(chunk, left)
        rows = cur.execute(sql, (after, *params, size)).fetchall()
        for row in rows:
            yield _from_row(row)
        if len(rows) < size:
            return
        after, left = int(rows[-1][0]), left - len(rows) if left > 0 else left


INDEX_ORDER = (
    ("sandbox_key", "audit_tenant_key_time"),
    ("decided_only", "audit_tenant_decided"),
    ("errors_only", "audit_tenant_errors"),
    ("agent_id", "audit_tenant_agent_time"),
    ("tool", "audit_tenant_tool_time"),
)
"""The index a query with several filters reads, most selective filter first (a key names
one sandbox; decided calls, then failed ones, are few; agents, then tools, are few and each
has many records).
SQLite, left to choose, read the tool's index for `--key --tool --errors`: 31 ms instead of
6 on a log of 1,000,000 records; ANALYZE did not change its mind."""


def query_sql(q: AuditQuery, postgres: bool = False) -> tuple[str, tuple[object, ...]]:
    """The SELECT of a query, newest first. Ordered by time (then id) so that the index of
    the query's filter (database.AUDIT_INDEXES) gives the rows in order: no sort, and a read
    that stops at the limit, however many records match. `postgres`: PostgreSQL's
    placeholders, and its planner picks the index (there is no INDEXED BY)."""
    mark = "%s" if postgres else "?"
    where, params = [f"tenant = {mark}", f"time >= {mark}"], [q.tenant, q.since]
    for column in ("sandbox_key", "tool", "agent_id"):
        if getattr(q, column):
            where.append(f"{column} = {mark}")
            params.append(getattr(q, column))
    if q.errors_only:
        where.append("is_error = 1")  # a literal, so the partial index audit_tenant_errors fits
    if q.decided_only:
        where.append(database.DECIDED_SQL)  # literals too: audit_tenant_decided fits
    index = next((name for field, name in INDEX_ORDER if getattr(q, field)), "audit_tenant_time")
    if q.record_id:
        where.append(f"id = {mark}")
        params.append(q.record_id)
    params.append(min(q.limit or 100, MAX_LIMIT))
    indexed = "" if postgres or q.record_id else f" INDEXED BY {index}"
    sql = (
        f"SELECT id, {', '.join(_COLUMNS)} FROM audit{indexed} "
        f"WHERE {' AND '.join(where)} ORDER BY time DESC, id DESC LIMIT {mark}"
    )
    return sql, tuple(params)


MAX_FIELD_CHARS = 1024
"""Longest text kept of a field other than the arguments (capped by the pipeline): callers
make up tool names, agent ids and the like, and a refused call is audited too."""


def _row(rec: AuditRecord) -> tuple[object, ...]:
    """The record's columns in order. A scoped key (keys.scope) is stored as its tenant and
    the caller's key; text is cut to MAX_FIELD_CHARS (but the arguments, capped by the
    pipeline) and made storable (a lone surrogate from a caller's arguments or a file name
    that is not UTF-8 becomes U+FFFD, instead of failing the batch). Every field is a scalar:
    no dataclasses.asdict, which deep-copies and takes 15x as long, on the writer thread that
    shares the GIL."""
    values = {column: getattr(rec, column) for column in _COLUMNS}
    tenant, key = split(rec.sandbox_key)
    if tenant:
        values.update(tenant=tenant, sandbox_key=key)
    return tuple(_column(name, value) for name, value in values.items())


def _column(name: str, value: object) -> object:
    if name == "is_error":
        return int(bool(value))
    if not isinstance(value, str):
        return value
    return wire_text(value if name == "arguments_json" else value[:MAX_FIELD_CHARS])


def _from_row(row: tuple[object, ...]) -> AuditRecord:
    values = dict(zip(_COLUMNS, row[1:], strict=True))
    values["is_error"] = bool(values["is_error"])
    return AuditRecord(id=int(row[0]), **values)  # type: ignore[arg-type, call-overload]
