"""Retention of the audit log: records older than a maximum age and, oldest first, those
past a maximum size go, optionally appended as JSON lines to a dated file first.

The Trimmer runs on the audit writer thread, between batches, one chunk (CHUNK_ROWS rows,
one transaction) at a time: the writer takes a batch of records between two chunks, so a
trim of millions of rows delays a record by one chunk at most, and calls, which only queue
their record, never wait for it. Nothing here imports grpc or knows about calls."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stockade.supervisor import database
from stockade.supervisor.observe import chain

log = logging.getLogger("stockade.audit")
CHUNK_ROWS = 2000
"""Rows deleted (and exported) per transaction."""
OLDEST = "SELECT id, time FROM audit ORDER BY id LIMIT {mark}"
"""The first records of the chain: retention removes a prefix of it, never a record from
its middle, so that what stays still links up (to the anchor signed for the last one gone).
By age: the oldest records up to the first one that is not too old (a record stamped a
little later than the one after it, by another supervisor's clock, holds those after it
back until it is old enough too)."""


@dataclass(frozen=True)
class Retention:
    max_age_s: float = 30 * 86400.0
    """Records older than this go; 0: no age limit."""
    max_bytes: int = 1024 << 20
    """The database's pages in use (database.used_bytes) are cut back to this; 0: no limit."""
    export_dir: Path | None = None
    """Where removed records are appended as JSON lines (audit-YYYY-MM-DD.jsonl, by the UTC
    day of the trim), written and fsynced before the delete; None: not kept."""
    interval_s: float = 60.0
    chunk_rows: int = CHUNK_ROWS

    @property
    def active(self) -> bool:
        return self.max_age_s > 0 or self.max_bytes > 0


class Trimmer:
    """One trim pass every interval_s, taken one chunk per step() (on the writer thread)."""

    def __init__(
        self,
        db: sqlite3.Connection,
        retention: Retention,
        columns: tuple[str, ...],
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        signer: chain.Signer | None = None,
    ) -> None:
        """signer: signs the anchor each chunk leaves (None: the anchor is unsigned, and
        verify cannot prove the records after it)."""
        self._db, self._retention, self._columns = db, retention, ("id", *columns)
        self._clock, self._monotonic = clock, monotonic
        self._signer = signer
        self._next = monotonic()
        """When the next pass starts (the first at once: a log may be over its limits)."""
        self._busy = False
        self._waiting: list[threading.Event] = []
        self.removed = 0
        """Records removed since start (by age and by size)."""

    def request(self, done: threading.Event) -> None:
        """Start a pass now (unless one is under way); `done` is set when one ends."""
        self._waiting.append(done)
        self._next = min(self._next, self._monotonic())

    def wait_s(self) -> float | None:
        """How long the writer may block for records before it must step(); None: forever."""
        if not self._retention.active:
            return None
        return 0.0 if self._busy else max(0.0, self._next - self._monotonic())

    def step(self) -> int:
        """Trim one chunk if a pass is due or under way; the number of records removed."""
        if self.wait_s() != 0.0:
            return 0
        self._busy = True
        try:
            removed = self._chunk()
        except Exception:  # a failed trim must not stop the writer; the next pass retries
            log.exception("audit: retention trim failed")
            removed = 0
        if removed == 0:  # the pass is over: the log is within its limits
            self._busy = False
            self._next = self._monotonic() + self._retention.interval_s
            for done in self._waiting:
                done.set()
            self._waiting.clear()
        self.removed += removed
        return removed

    def _chunk(self) -> int:
        """One transaction: the oldest records past the age limit, else the oldest ones while
        the pages in use exceed the size limit."""
        r = self._retention
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            last = None
            if r.max_age_s > 0:
                last = prefix_end(self._db, "?", r.chunk_rows, self._clock() - r.max_age_s)
            if last is None and r.max_bytes > 0 and database.used_bytes(self._db) > r.max_bytes:
                last = prefix_end(self._db, "?", r.chunk_rows)
            return 0 if last is None else self._remove(self._db, "?", last)

    def _remove(self, db: Any, mark: str, last: int) -> int:
        """Delete the records up to id `last`, exported first if asked, after the anchor
        that signs the last one's hash. Without export, one statement: the thread takes the
        interpreter lock back once, not once per row (under a busy event loop, each time
        costs it up to the 5 ms switch interval)."""
        chain.write_anchor(db, mark, self._signer, last)
        if self._retention.export_dir is None:
            cur = db.cursor().execute(f"DELETE FROM audit WHERE id <= {mark}", (last,))
            return max(int(cur.rowcount), 0)
        rows = (
            db.cursor()
            .execute(
                f"SELECT {', '.join(self._columns)} FROM audit WHERE id <= {mark} ORDER BY id",
                (last,),
            )
            .fetchall()
        )
        if rows:
            self._export(rows)
            db.cursor().execute(f"DELETE FROM audit WHERE id <= {mark}", (last,))
        return len(rows)

    def _export(self, rows: list[tuple[object, ...]]) -> None:
        """Append the rows as JSON lines and fsync, before the delete is committed: a crash
        between the two exports them again on the next pass (twice, never lost)."""
        if self._retention.export_dir is None:
            return
        day = datetime.fromtimestamp(self._clock(), UTC).strftime("%Y-%m-%d")
        path = self._retention.export_dir / f"audit-{day}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = "".join(
            json.dumps(dict(zip(self._columns, row, strict=True)), ensure_ascii=False) + "\n"
            for row in rows
        )
        with path.open("a", encoding="utf-8") as out:
            out.write(lines)
            out.flush()
            os.fsync(out.fileno())


def prefix_end(db: Any, mark: str, limit: int, older_than: float | None = None) -> int | None:
    """The id of the last record of the chain's first `limit` that goes: all of them, or
    (`older_than`) those up to the first one stamped at or after it. None: none goes."""
    rows = db.cursor().execute(OLDEST.format(mark=mark), (limit,)).fetchall()
    last = None
    for record_id, stamp in rows:
        if older_than is not None and stamp >= older_than:
            break
        last = int(record_id)
    return last
