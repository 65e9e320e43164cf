"""The state shared by the supervisors of one installation, in PostgreSQL (`[state] url`).

One psycopg pool for the state's work (audit batches, approvals, counts), a second for the
per-key advisory locks (each held on its own connection across a key's create, so a create
never waits behind the audit for a connection), and one connection that LISTENs for the
others' news. A heartbeat (every BEAT_S) marks this supervisor alive, publishes its
sandboxes (the tenants' counts) and resyncs the approvals board: a supervisor not seen for
15 s is gone, and its rows stop counting.

The URL may hold a password: logs and errors name the host and database only."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from stockade.supervisor.config import TenantConfig
from stockade.supervisor.errors import ConfigError, QuotaExceeded
from stockade.supervisor.keys import split
from stockade.supervisor.observe.audit import AuditLog
from stockade.supervisor.observe.chain import Sealing
from stockade.supervisor.observe.retention import Retention
from stockade.supervisor.policy.approvals import AllowAlways
from stockade.supervisor.state.base import redacted_url
from stockade.supervisor.state.pg_approvals import FRESH, PgAllowAlways, PgBoard, answering
from stockade.supervisor.state.pg_audit import PgAuditLog
from stockade.supervisor.state.pg_schema import SchemaTooNew, migrate

log = logging.getLogger("stockade")
BEAT_S = 2.0
CONNECT_TIMEOUT_S = 10.0
POOL_WAIT_S = 10.0
"""How long a request waits for a connection of a pool (all busy, or the database gone)
before it fails as StateUnavailable."""
CONNECTION = {"autocommit": True, "connect_timeout": int(CONNECT_TIMEOUT_S)}
LOCK_POLL_S = (0.02, 0.5)
"""A key lock held elsewhere is tried again after 20 ms, doubling up to 500 ms: waiting
holds no connection, and a cancelled wait leaves nothing behind."""


def advisory_key(namespace: str, value: str) -> int:
    """A signed 64-bit advisory lock id for a name (blake2b of it)."""
    digest = hashlib.blake2b(f"stockade:{namespace}\0{value}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PostgresState:
    def __init__(
        self, url: str, instance: str, pool: ConnectionPool[Any], locks: ConnectionPool[Any]
    ) -> None:
        self._url, self.instance = url, instance
        self.description = f"postgresql {redacted_url(url)}"
        self._pool, self._locks = pool, locks
        self._always: PgAllowAlways | None = None
        where = redacted_url(url)
        self._board = PgBoard(pool, instance, where)
        self._ledger = PgLedger(pool, instance, where)
        self._local: dict[str, asyncio.Lock] = {}
        self._held: Callable[[], Mapping[str, int]] | None = None
        self._beat: asyncio.Task[None] | None = None
        self._stop = threading.Event()
        self._listening: threading.Thread | None = None

    @classmethod
    def open(cls, url: str, instance: str) -> PostgresState:
        """Connect and migrate; a database that cannot be reached is a ConfigError naming
        its host and database (never the password)."""
        where = redacted_url(url)
        pools = []
        try:
            # one plain connection first: its error says why (a pool retries and times out)
            psycopg.connect(url, connect_timeout=int(CONNECT_TIMEOUT_S)).close()
            for name, size in (("stockade-state", 8), ("stockade-locks", 32)):
                pool: ConnectionPool[Any] = ConnectionPool(
                    url, min_size=1, max_size=size, kwargs=CONNECTION, name=name, open=False,
                    timeout=POOL_WAIT_S,
                )  # fmt: skip
                pools.append(pool)
                pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
            with pools[0].connection() as db:
                migrate(db)
        except SchemaTooNew as exc:
            _close(pools)
            raise ConfigError(f"state.url ({where}): {exc}") from exc
        except (psycopg.Error, TimeoutError, OSError) as exc:
            _close(pools)
            raise ConfigError(
                f"cannot use the shared state at {where} (state.url): {_reason(exc)}"
            ) from exc
        log.info("shared state: %s", where)
        return cls(url, instance, pools[0], pools[1])

    def audit_log(
        self, retention: Retention | None = None, sealing: Sealing | None = None
    ) -> AuditLog:
        return PgAuditLog(self._pool, retention, sealing=sealing)

    def allow_always(self) -> AllowAlways:
        if self._always is None:
            self._always = PgAllowAlways(self._pool, self.instance, redacted_url(self._url))
        return self._always

    @property
    def board(self) -> PgBoard:
        return self._board

    @property
    def ledger(self) -> PgLedger:
        return self._ledger

    def follow(self, held: Callable[[], Mapping[str, int]]) -> None:
        """What this supervisor holds (key -> memory MiB), read at each heartbeat."""
        self._held = held

    @contextlib.asynccontextmanager
    async def lock(self, key: str) -> AsyncIterator[None]:
        """The key's lock across all supervisors: pg_advisory_lock on a hash of the
        tenant-scoped key, on a connection of its own, held for the block."""
        async with self._local.setdefault(key, asyncio.Lock()):
            taking = asyncio.ensure_future(asyncio.to_thread(self._locks.getconn))
            try:
                with answering(redacted_url(self._url)):
                    db = await asyncio.shield(taking)
            except asyncio.CancelledError:  # the connection, once taken, goes back
                taking.add_done_callback(self._give_back)
                raise
            try:
                with answering(redacted_url(self._url)):
                    await _advisory(db, advisory_key("key", key))
                try:
                    yield
                finally:
                    with contextlib.suppress(psycopg.Error):  # a lost connection lost it too
                        await asyncio.to_thread(
                            db.execute,
                            "SELECT pg_advisory_unlock(%s)",
                            (advisory_key("key", key),),
                        )
            finally:
                self._locks.putconn(db)

    def _give_back(self, taking: asyncio.Future[Any]) -> None:
        if not taking.cancelled() and taking.exception() is None:
            self._locks.putconn(taking.result())

    async def replicas(self) -> frozenset[str]:
        """The supervisors whose heartbeat is fresh (seen within 15 s), this one included."""
        with answering(redacted_url(self._url)):
            return await asyncio.to_thread(self._fresh)

    def _fresh(self) -> frozenset[str]:
        with self._pool.connection() as db:
            rows = db.execute(f"SELECT instance FROM supervisors WHERE seen > {FRESH}").fetchall()
        return frozenset({str(row[0]) for row in rows} | {self.instance})

    async def start(self) -> None:
        """Mark this supervisor alive (its leftovers of a previous run gone), then the
        heartbeat and the listener."""
        await asyncio.to_thread(self._hello)
        await asyncio.to_thread(self._board.resync)
        self._listening = threading.Thread(target=self._listen, name="state-listen", daemon=True)
        self._listening.start()
        self._beat = asyncio.create_task(self._heartbeat())

    async def close(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.cancel()
            await asyncio.gather(self._beat, return_exceptions=True)
        await asyncio.to_thread(self._board.close)
        if self._listening is not None:
            await asyncio.to_thread(self._listening.join, 5)
        with contextlib.suppress(psycopg.Error):
            await asyncio.to_thread(self._goodbye)
        await asyncio.to_thread(_close, [self._pool, self._locks])

    def _hello(self) -> None:
        with self._pool.connection() as db, db.transaction():
            db.execute(
                "INSERT INTO supervisors VALUES (%s, now()) "
                "ON CONFLICT (instance) DO UPDATE SET seen = now()",
                (self.instance,),
            )
            for table in ("approval_requests", "approvers"):
                db.execute(f"DELETE FROM {table} WHERE instance = %s", (self.instance,))

    def _goodbye(self) -> None:
        """Leave now rather than in 15 s: this supervisor's rows stop counting."""
        with self._pool.connection() as db, db.transaction():
            for table in ("approval_requests", "approvers", "sandboxes", "supervisors"):
                db.execute(f"DELETE FROM {table} WHERE instance = %s", (self.instance,))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(BEAT_S)
            try:
                await asyncio.to_thread(self._alive)
                if self._held is not None:
                    await self._ledger.sync(self._held)
                await asyncio.to_thread(self._board.resync)
                if self._always is not None:
                    await asyncio.to_thread(self._always.reload)
            except psycopg.Error as exc:
                log.warning("shared state: heartbeat failed: %s", _reason(exc))
            except Exception:  # the heartbeat must go on: without it this supervisor is "gone"
                log.exception("shared state: heartbeat failed")

    def _alive(self) -> None:
        """This supervisor seen now; the rows of supervisors gone for an hour (killed, never
        to come back under that id: a pod's state directory dies with it) removed."""
        with self._pool.connection() as db, db.transaction():
            db.execute(
                "INSERT INTO supervisors VALUES (%s, now()) "
                "ON CONFLICT (instance) DO UPDATE SET seen = now()",
                (self.instance,),
            )
            gone = "SELECT instance FROM supervisors WHERE seen < now() - interval '1 hour'"
            for table in ("approval_requests", "approvers", "sandboxes"):
                db.execute(f"DELETE FROM {table} WHERE instance IN ({gone})")
            db.execute(f"DELETE FROM supervisors WHERE instance IN ({gone})")

    def _listen(self) -> None:
        """The others' notifications, until close; a lost connection is made again (and the
        board resynced: what was missed meanwhile)."""
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    self._url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_S)
                ) as db:
                    db.execute(f"LISTEN {_channel()}")
                    self._board.resync()
                    if self._always is not None:
                        self._always.reload()
                    while not self._stop.is_set():
                        for note in db.notifies(timeout=0.5):
                            self._heard(note.payload)
            except psycopg.Error as exc:
                if not self._stop.is_set():
                    log.warning("shared state: listening failed (again in 1 s): %s", _reason(exc))
                    self._stop.wait(1.0)

    def _heard(self, payload: str) -> None:
        try:
            note = json.loads(payload)
        except ValueError:
            return
        if not isinstance(note, dict) or note.get("i") == self.instance:
            return
        try:
            if note.get("k") == "always" and self._always is not None:
                self._always.reload()
            else:
                self._board.heard({str(k): str(v) for k, v in note.items()})
        except psycopg.Error as exc:
            log.warning("shared state: a notification could not be followed: %s", _reason(exc))


UPSERT = (
    "INSERT INTO sandboxes VALUES (%s, %s, %s, %s) ON CONFLICT (instance, tenant, key) "
    "DO UPDATE SET memory_mb = excluded.memory_mb"
)


class PgLedger:
    """The tenants' sandboxes across supervisors (table sandboxes: one row per supervisor
    and key). An admission counts the tenant's keys held by live supervisors, under the
    tenant's advisory lock, and reserves the key in the same transaction: two supervisors
    admitting at once cannot both take the last place."""

    def __init__(self, pool: ConnectionPool[Any], instance: str, where: str = "") -> None:
        self._pool, self._instance, self._where = pool, instance, where
        self._lock = asyncio.Lock()
        """admit and sync in turn: a sync's picture of the sandboxes never drops a
        reservation made after it was taken."""

    async def admit(self, key: str, memory_mb: int, limits: TenantConfig) -> None:
        async with self._lock:
            await asyncio.to_thread(self._admit, key, memory_mb, limits)

    def _admit(self, key: str, memory_mb: int, limits: TenantConfig) -> None:
        tenant, plain = split(key)
        with answering(self._where), self._pool.connection() as db, db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key("tenant", tenant),))
            if limits.max_sandboxes or limits.max_memory_mb:
                row = db.execute(
                    "SELECT count(*), coalesce(sum(memory_mb), 0) FROM ("
                    "SELECT DISTINCT ON (b.key) b.key, b.memory_mb FROM sandboxes b "
                    "JOIN supervisors s ON s.instance = b.instance "
                    f"WHERE b.tenant = %s AND b.key <> %s AND s.seen > {FRESH}) held",
                    (tenant, plain),
                ).fetchone()
                others, memory = (int(row[0]), int(row[1])) if row else (0, 0)
                if limits.max_sandboxes and others + 1 > limits.max_sandboxes:
                    raise QuotaExceeded(
                        f"tenant {tenant!r} may have at most {limits.max_sandboxes} sandbox(es) "
                        f"(tenants.{tenant}.max_sandboxes), counted across the supervisors "
                        "sharing state.url; destroy one first"
                    )
                if limits.max_memory_mb and memory + memory_mb > limits.max_memory_mb:
                    raise QuotaExceeded(
                        f"tenant {tenant!r} may use at most {limits.max_memory_mb} MiB of "
                        f"sandbox memory (tenants.{tenant}.max_memory_mb), counted across the "
                        f"supervisors sharing state.url; another sandbox of {memory_mb} MiB "
                        f"would make {memory + memory_mb} MiB"
                    )
            db.execute(UPSERT, (self._instance, tenant, plain, memory_mb))

    async def sync(self, held: Callable[[], Mapping[str, int]]) -> None:
        async with self._lock:
            now = dict(held())
            await asyncio.to_thread(self._sync, now)

    def _sync(self, held: Mapping[str, int]) -> None:
        rows = {split(k): m for k, m in held.items()}
        with self._pool.connection() as db, db.transaction():
            found = db.execute(
                "SELECT tenant, key FROM sandboxes WHERE instance = %s", (self._instance,)
            ).fetchall()
            with db.cursor() as cur:
                gone = [(self._instance, t, k) for t, k in found if (t, k) not in rows]
                cur.executemany(
                    "DELETE FROM sandboxes WHERE instance = %s AND tenant = %s AND key = %s", gone
                )
                cur.executemany(UPSERT, [(self._instance, t, k, m) for (t, k), m in rows.items()])


async def _advisory(db: psycopg.Connection[Any], lock_id: int) -> None:
    """Take a session advisory lock on db, trying again (with backoff) while another
    holds it. A cancelled wait that had just taken it gives it back."""
    delay = LOCK_POLL_S[0]
    while True:
        attempt = asyncio.ensure_future(asyncio.to_thread(_try_lock, db, lock_id))
        try:
            got = await asyncio.shield(attempt)
        except asyncio.CancelledError:
            if await attempt:
                await asyncio.to_thread(db.execute, "SELECT pg_advisory_unlock(%s)", (lock_id,))
            raise
        if got:
            return
        await asyncio.sleep(delay)
        delay = min(delay * 2, LOCK_POLL_S[1])


def _try_lock(db: psycopg.Connection[Any], lock_id: int) -> bool:
    row = db.execute("SELECT pg_try_advisory_lock(%s)", (lock_id,)).fetchone()
    return bool(row and row[0])


def _channel() -> str:
    from stockade.supervisor.state.pg_approvals import CHANNEL

    return CHANNEL


def _reason(exc: BaseException) -> str:
    """An error's text without the connection string (psycopg's name host and port only,
    but a failure to parse the URL may quote it)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if "://" not in text else type(exc).__name__


def _close(pools: list[ConnectionPool[Any]]) -> None:
    for pool in pools:
        with contextlib.suppress(Exception):
            pool.close()
