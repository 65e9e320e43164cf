"""Approvals shared through PostgreSQL: allow-always in one table every supervisor reads,
and the pending requests on a board (approval_requests) that every supervisor lists, so an
approver connected to any supervisor sees and decides any request of its tenant.

The supervisor that asked keeps waiting on its own future (policy/approvals.py); the board
only carries the request out and the decision back. News travel by NOTIFY on one channel
(postgres.py listens); the heartbeat resyncs everything the notifications carry (a lost
connection, a notification missed), so nothing depends on every notification arriving."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from stockade.supervisor.errors import StateUnavailable
from stockade.supervisor.keys import scope, split
from stockade.supervisor.policy.approvals import AllowAlways, BoardListener, Pending
from stockade.supervisor.state.pg_audit import storable

log = logging.getLogger("stockade")
CHANNEL = "stockade_state"
MAX_NOTE = 1024
"""Longest text carried in a notification (an approver's name); NOTIFY takes 8000 bytes."""
CLOSED_KEPT, CLOSED_KEPT_S = 1000, 60.0
"""How many closed ids are remembered past a minute (a resync reads within seconds)."""
FRESH = "now() - interval '15 seconds'"
"""A supervisor not seen since is gone: its requests, approvers and sandboxes do not count."""


@contextlib.contextmanager
def answering(where: str) -> Iterator[None]:
    """A database that fails a caller's request is StateUnavailable, naming `where` (host
    and database) and psycopg's first line (which names host and port, no password)."""
    try:
        yield
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StateUnavailable(f"the shared state ({where}) did not answer: {first}") from exc


def notify(db: Any, kind: str, instance: str, **fields: str) -> None:
    """Queue a notification, sent when the caller's transaction commits."""
    note = {"k": kind, "i": instance, **{k: v[:MAX_NOTE] for k, v in fields.items()}}
    db.execute("SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps(note)))


class PgAllowAlways(AllowAlways):
    """AllowAlways on the shared table: a command approved through one supervisor passes on
    every one (its cache follows the others' additions by notification and heartbeat)."""

    def __init__(self, pool: ConnectionPool[Any], instance: str, where: str = "") -> None:
        self._pool, self._instance, self._where = pool, instance, where  # no SQLite
        self._commands: set[tuple[str, str]] = set()
        self.reload()

    def reload(self) -> None:
        with self._pool.connection() as db:
            rows = db.execute("SELECT tenant, command FROM approved").fetchall()
        self._commands = {(str(row[0]), str(row[1])) for row in rows}

    def add(self, command: str, approver: str, tenant: str = "") -> None:
        with answering(self._where), self._pool.connection() as db, db.transaction():
            db.execute(
                "INSERT INTO approved VALUES (%s, %s, %s, %s) ON CONFLICT (tenant, command) "
                "DO UPDATE SET approver = excluded.approver, time = excluded.time",
                (tenant, storable(command), storable(approver), time.time()),
            )
            notify(db, "always", self._instance)
        self._commands.add((tenant, command))

    def close(self) -> None:
        pass


def _pending(row: tuple[Any, ...]) -> Pending:
    return Pending(
        id=row[0], sandbox_key=scope(row[9], row[1]), agent_id=row[2], tool=row[3], command=row[4],
        reason=row[5], created_at=datetime.fromtimestamp(row[6], UTC),
        expires_at=datetime.fromtimestamp(row[7], UTC), request_id=row[8], diff=row[10],
    )  # fmt: skip


PENDING_COLUMNS = (
    "id, sandbox_key, agent_id, tool, command, reason, created_at, expires_at, request_id, tenant, "
    "diff"
)
"""A file change's diff (calls/previews.py, at most 64 KiB) travels with its request, so an
approver connected to another supervisor sees it too."""


class PgBoard:
    """The ApprovalBoard on PostgreSQL. Writes go through one worker thread, in order (a
    request's close never overtakes its post); reads of others' news run on the listener
    and heartbeat threads and reach the manager on the event loop."""

    def __init__(self, pool: ConnectionPool[Any], instance: str, where: str = "") -> None:
        self._pool, self._instance, self._where = pool, instance, where
        self._listener: BoardListener | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._known: dict[str, float] = {}
        """Other supervisors' pending request ids the manager has been told of, with when
        (time.monotonic); on the loop only, as `_closed`."""
        self._closed: dict[str, float] = {}
        """Others' requests closed lately: a resync that read one before it closed must not
        bring it back."""
        self._writes: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._work, name="state-writes", daemon=True)
        self._worker.start()

    # this supervisor's side

    def attach(self, listener: BoardListener) -> None:
        self._listener, self._loop = listener, asyncio.get_running_loop()

    def post(self, request: Pending) -> None:
        tenant, key = split(request.sandbox_key)
        row = (
            request.id, self._instance, tenant, key, request.agent_id,
            request.tool, request.command, request.reason, request.created_at.timestamp(),
            request.expires_at.timestamp(), request.request_id, request.diff,
        )  # fmt: skip
        values = tuple(storable(v) for v in row)

        def write() -> None:
            with self._pool.connection() as db, db.transaction():
                db.execute(
                    "INSERT INTO approval_requests (id, instance, tenant, sandbox_key, "
                    "agent_id, tool, command, reason, created_at, expires_at, request_id, diff) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (id) DO NOTHING",
                    values,
                )
                notify(db, "pending", self._instance, id=request.id)

        self._writes.put(write)

    def closed(self, request_id: str, outcome: str, approver: str) -> None:
        def write() -> None:
            with self._pool.connection() as db, db.transaction():
                db.execute("DELETE FROM approval_requests WHERE id = %s", (request_id,))
                notify(
                    db, "closed", self._instance, id=request_id, outcome=outcome,
                    approver=approver,
                )  # fmt: skip

        self._writes.put(write)

    def set_approvers(self, tenant: str, count: int) -> None:
        def write() -> None:
            with self._pool.connection() as db, db.transaction():
                if count:
                    db.execute(
                        "INSERT INTO approvers VALUES (%s, %s, %s) ON CONFLICT (instance, tenant)"
                        " DO UPDATE SET count = excluded.count",
                        (self._instance, tenant, count),
                    )
                else:
                    db.execute(
                        "DELETE FROM approvers WHERE instance = %s AND tenant = %s",
                        (self._instance, tenant),
                    )
                notify(db, "approvers", self._instance)

        self._writes.put(write)

    async def decide(self, request_id: str, tenant: str, decision: str, approver: str) -> bool:
        def write() -> bool:
            with answering(self._where), self._pool.connection() as db, db.transaction():
                found = db.execute(
                    "UPDATE approval_requests SET decision = %s, approver = %s "
                    "WHERE id = %s AND tenant = %s AND decision IS NULL AND instance <> %s "
                    f"AND instance IN (SELECT instance FROM supervisors WHERE seen > {FRESH}) "
                    "RETURNING instance",
                    (decision, approver, request_id, tenant, self._instance),
                ).fetchone()
                if found is not None:
                    notify(
                        db, "decided", self._instance, id=request_id, to=str(found[0]),
                        decision=decision, approver=approver,
                    )  # fmt: skip
                return found is not None

        return await asyncio.to_thread(write)

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every write queued so far is done (tests, close)."""
        done = threading.Event()
        self._writes.put(done.set)
        done.wait(timeout)

    def close(self) -> None:
        self.flush()
        self._writes.put(None)
        self._worker.join(10)

    def _work(self) -> None:
        while (write := self._writes.get()) is not None:
            try:
                write()
            except Exception:  # one failed write must not stop the others
                log.exception("shared state: an approvals write failed")

    # the others' side: called on the listener's or the heartbeat's thread

    def heard(self, note: dict[str, str]) -> None:
        """A notification from another supervisor."""
        kind = note.get("k")
        if kind == "pending":
            with self._pool.connection() as db:
                row = db.execute(
                    f"SELECT {PENDING_COLUMNS} FROM approval_requests "
                    "WHERE id = %s AND decision IS NULL",
                    (note.get("id", ""),),
                ).fetchone()
            if row is not None:
                self._call(self._remote_pending, _pending(row))
        elif kind == "closed":
            outcome, approver = note.get("outcome", ""), note.get("approver", "")
            self._call(self._remote_closed, note.get("id", ""), outcome, approver)
        elif kind == "decided" and note.get("to") == self._instance:
            listener = self._listener
            if listener is not None:
                decision, approver = note.get("decision", ""), note.get("approver", "")
                self._call(listener.remote_decided, note.get("id", ""), decision, approver)
        elif kind == "approvers":
            self.resync_approvers()

    def resync(self) -> None:
        """Everything the notifications carry, read again: others' pending requests, the
        approvers connected to others, decisions of this supervisor's requests."""
        read_at = time.monotonic()
        with self._pool.connection() as db:
            rows = db.execute(
                f"SELECT {', '.join('r.' + c for c in PENDING_COLUMNS.split(', '))} "
                "FROM approval_requests r JOIN supervisors s ON s.instance = r.instance "
                f"WHERE r.instance <> %s AND r.decision IS NULL AND s.seen > {FRESH}",
                (self._instance,),
            ).fetchall()
            decided = db.execute(
                "SELECT id, decision, approver FROM approval_requests "
                "WHERE instance = %s AND decision IS NOT NULL",
                (self._instance,),
            ).fetchall()
        self._call(self._replace_pending, [_pending(row) for row in rows], read_at)
        listener = self._listener
        if listener is not None:
            for request_id, decision, approver in decided:
                self._call(listener.remote_decided, request_id, decision, approver or "")
        self.resync_approvers()

    def resync_approvers(self) -> None:
        with self._pool.connection() as db:
            rows = db.execute(
                "SELECT a.tenant, sum(a.count) FROM approvers a "
                "JOIN supervisors s ON s.instance = a.instance "
                f"WHERE a.instance <> %s AND s.seen > {FRESH} GROUP BY a.tenant",
                (self._instance,),
            ).fetchall()
        counts = {str(tenant): int(count) for tenant, count in rows}
        listener = self._listener
        if listener is not None:
            self._call(listener.remote_approvers, counts)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    # on the event loop

    def _remote_pending(self, request: Pending) -> None:
        if self._listener is None or request.id in self._known or request.id in self._closed:
            return
        self._known[request.id] = time.monotonic()
        self._listener.remote_pending(request)

    def _remote_closed(self, request_id: str, outcome: str, approver: str) -> None:
        now = time.monotonic()
        self._closed[request_id] = now
        if len(self._closed) > CLOSED_KEPT:
            self._closed = {i: t for i, t in self._closed.items() if now - t < CLOSED_KEPT_S}
        if self._listener is not None and self._known.pop(request_id, None) is not None:
            self._listener.remote_closed(request_id, outcome, approver)

    def _replace_pending(self, requests: list[Pending], read_at: float) -> None:
        """A resync's picture, read at `read_at`: requests it lacks that were known before
        then are over (their close was missed); news since then stands."""
        current = {r.id for r in requests}
        for gone in [i for i, t in self._known.items() if i not in current and t < read_at]:
            self._remote_closed(gone, "withdrawn", "")
        for request in requests:
            self._remote_pending(request)
