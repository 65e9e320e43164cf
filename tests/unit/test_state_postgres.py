"""The PostgreSQL shared state (supervisor/state/postgres.py) against a real server the tests
start (tests/pg.py): two states on one database play two supervisors. Migrations run twice
and at once; the audit is one log; allow-always, pending approvals and tenant counts are
shared; the key lock excludes across states; no password reaches a log or an error."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from stockade.supervisor import database
from stockade.supervisor.config import ApprovalsConfig, TenantConfig
from stockade.supervisor.errors import (
    ApprovalNotFound,
    ConfigError,
    QuotaExceeded,
    StateUnavailable,
)
from stockade.supervisor.keys import scope
from stockade.supervisor.observe.audit import AuditQuery, AuditRecord
from stockade.supervisor.observe.retention import Retention
from stockade.supervisor.policy.approvals import ApprovalManager, Closed, Event, Pending
from stockade.supervisor.state import SqliteState, postgres, redacted_url
from stockade.supervisor.state.pg_schema import VERSION
from stockade.supervisor.state.postgres import PostgresState
from tests.pg import PASSWORD, PgServer, postgres_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    with postgres_server() as found:
        yield found


@pytest.fixture
def url(server: PgServer) -> str:
    return server.create_database(f"t{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def pair(url: str) -> AsyncIterator[tuple[PostgresState, PostgresState]]:
    one, two = PostgresState.open(url, "instance-one"), PostgresState.open(url, "instance-two")
    for state in (one, two):
        await state.start()
    try:
        yield one, two
    finally:
        for state in (one, two):
            await state.close()


async def eventually(check: object, timeout: float = 10.0) -> None:
    """Wait until check() is true (news between states travel by NOTIFY or heartbeat)."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def record(key: str, tool: str = "exec", when: float | None = None) -> AuditRecord:
    return AuditRecord(
        time=time.time() if when is None else when, request_id="r", caller="c",
        sandbox_key=key, agent_id="", provider="", tool=tool, arguments_json="{}",
        policy_step="allowed",
    )  # fmt: skip


def test_migrations_run_twice_and_at_once(url: str) -> None:
    errors: list[BaseException] = []
    opened: list[PostgresState] = []

    def open_one(n: int) -> None:
        try:
            opened.append(PostgresState.open(url, f"i{n}"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    again = PostgresState.open(url, "later")  # a fifth time, on a migrated database
    for state in (*opened, again):
        asyncio.run(state.close())
    with psycopg.connect(url) as db:
        assert db.execute("SELECT version FROM stockade_schema").fetchall() == [(VERSION,)]


def test_a_newer_schema_is_refused(url: str) -> None:
    asyncio.run(PostgresState.open(url, "a").close())
    with psycopg.connect(url) as db:
        db.execute("UPDATE stockade_schema SET version = %s", (VERSION + 1,))
    with pytest.raises(ConfigError, match="newer than this supervisor"):
        PostgresState.open(url, "b")


COLUMNS_OF_AUDIT = (
    "SELECT column_name, data_type, is_nullable, column_default FROM information_schema.columns "
    "WHERE table_schema = current_schema() AND table_name = 'audit' ORDER BY ordinal_position"
)


def test_the_audit_table_has_the_sqlite_audit_logs_columns(url: str, tmp_path: Path) -> None:
    """One definition (database.py), two dialects: the same columns in the same order."""
    asyncio.run(PostgresState.open(url, "a").close())
    with psycopg.connect(url) as db:
        postgres = [str(row[0]) for row in db.execute(COLUMNS_OF_AUDIT).fetchall()]
    lite = database.connect(tmp_path / "stockade.db")
    sqlite = [str(row[1]) for row in lite.execute("PRAGMA table_info(audit)").fetchall()]
    lite.close()
    assert postgres == sqlite == [column.name for column in database.AUDIT_COLUMNS]


def test_an_older_audit_table_gets_the_columns_it_lacks(url: str) -> None:
    """A table made before a column (here: before tenants, fronts, checkpoints and the hash
    chain) gets it, with its default in the rows already there, as a new database has it;
    the rows are chained once."""
    asyncio.run(PostgresState.open(url, "a").close())
    with psycopg.connect(url) as db:
        made_new = db.execute(COLUMNS_OF_AUDIT).fetchall()
        db.execute(
            "ALTER TABLE audit DROP COLUMN front, DROP COLUMN tenant, DROP COLUMN context_json, "
            "DROP COLUMN checkpoint, DROP COLUMN prev_hash, DROP COLUMN hash"
        )
        db.execute("DROP TABLE audit_chain")
        db.execute(
            "INSERT INTO audit (time, request_id, caller, sandbox_key, agent_id, provider, tool, "
            "arguments_json, policy_step, guard_rule, approval, approver, duration_ms, "
            "exit_code, output_bytes, redactions, error_code, is_error) "
            "VALUES (1, 'r', 'c', 'k', '', '', 'exec', '{}', 'allowed', '', '', '', 0, 0, 0, "
            "0, '', 0)"
        )
    asyncio.run(PostgresState.open(url, "b").close())
    with psycopg.connect(url) as db:
        assert db.execute(COLUMNS_OF_AUDIT).fetchall() == made_new
        assert db.execute("SELECT tenant, front FROM audit").fetchall() == [("", "")]
        chained = db.execute("SELECT prev_hash, length(hash) FROM audit").fetchall()
        assert chained == [(database.GENESIS, 64)]
        indexes = db.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'audit'")
        names = {str(row[0]) for row in indexes.fetchall()}
    assert {index.name for index in database.AUDIT_INDEXES} <= names


def test_passwords_stay_out_of_logs_and_errors(
    url: str, server: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    assert PASSWORD in url
    shown = redacted_url(url)
    assert PASSWORD not in shown
    assert "stockade@" not in shown
    assert shown.startswith("postgresql://127.0.0.1:")
    assert shown.endswith(url.rsplit("/", 1)[1])
    state = PostgresState.open(url, "x")
    assert PASSWORD not in state.description
    asyncio.run(state.close())
    wrong = url.replace(PASSWORD, "not-" + PASSWORD)
    with pytest.raises(ConfigError) as refused:
        PostgresState.open(wrong, "y")
    assert "password authentication failed" in str(refused.value)
    assert PASSWORD not in str(refused.value)
    assert "127.0.0.1" in str(refused.value)
    assert caplog.records
    assert all(PASSWORD not in r.getMessage() for r in caplog.records)


async def test_one_audit_log_for_both(pair: tuple[PostgresState, PostgresState]) -> None:
    one, two = pair
    logs = one.audit_log(), two.audit_log()
    try:
        logs[0].record(record(scope("acme", "k1"), tool="read_file"))
        logs[1].record(record(scope("acme", "k2")))
        logs[1].record(record(scope("other", "k3")))
        logs[1].flush()
        for log in logs:
            found = await log.query(AuditQuery(tenant="acme"))
            assert {(r.sandbox_key, r.tool) for r in found} == {("k1", "read_file"), ("k2", "exec")}
            assert [r.sandbox_key for r in await log.query(AuditQuery(tenant="other"))] == ["k3"]
            only = await log.query(AuditQuery(tenant="acme", sandbox_key="k2"))
            assert [r.tool for r in only] == ["exec"]
            assert len(await log.query(AuditQuery(tenant="acme", limit=1))) == 1
    finally:
        for log in logs:
            log.close()


async def test_audit_retention_by_age_exports_each_record_once(
    pair: tuple[PostgresState, PostgresState], tmp_path: Path
) -> None:
    one, two = pair
    day = 86400.0
    keep = Retention(max_age_s=day, max_bytes=0, export_dir=tmp_path, chunk_rows=3)
    writer = one.audit_log()
    for n in range(7):
        writer.record(record(f"old{n}", when=time.time() - 2 * day))
    writer.record(record("new"))
    writer.close()
    trimmers = one.audit_log(keep), two.audit_log(keep)
    try:
        assert all(t.trim() for t in trimmers)
        left = await trimmers[0].query(AuditQuery(limit=100))
        assert [r.sandbox_key for r in left] == ["new"]
        lines = "".join(p.read_text() for p in tmp_path.glob("audit-*.jsonl")).splitlines()
        assert sorted(line.split('"sandbox_key": "')[1].split('"')[0] for line in lines) == [
            f"old{n}" for n in range(7)
        ]
    finally:
        for log in trimmers:
            log.close()


async def test_allow_always_is_shared(pair: tuple[PostgresState, PostgresState]) -> None:
    one, two = pair
    a, b = one.allow_always(), two.allow_always()
    a.add("make test", "alice", "acme")
    assert a.has("acme", "make test")
    await eventually(lambda: b.has("acme", "make test"))
    assert not b.has("other", "make test")
    assert b.commands("acme") == ["make test"]


def approvals(state: PostgresState, timeout_s: float = 30.0) -> ApprovalManager:
    config = ApprovalsConfig(mode="always", timeout_s=timeout_s)
    return ApprovalManager(config, {}, state.allow_always(), board=state.board)


async def watch_into(mgr: ApprovalManager, tenant: str, events: list[Event]) -> asyncio.Task[None]:
    async def run() -> None:
        async for event in mgr.watch(tenant):
            events.append(event)

    task = asyncio.create_task(run())
    await eventually(lambda: mgr.watchers_of(tenant) >= 1)
    return task


async def ask(
    mgr: ApprovalManager, command: str = "make deploy", diff: str = ""
) -> asyncio.Task[object]:
    async def preview() -> str:
        return diff

    return asyncio.create_task(
        mgr.check(
            sandbox_key=scope("acme", "k"),
            agent_id="",
            tool="exec",
            command=command,
            request_id="r",
            preview=preview if diff else None,
        )
    )


@pytest.mark.parametrize("decision", ["allow-once", "allow-always", "deny"])
async def test_asked_through_one_decided_through_the_other(
    pair: tuple[PostgresState, PostgresState], decision: str
) -> None:
    one, two = pair
    asking, answering = approvals(one), approvals(two)
    events: list[Event] = []
    watcher = await watch_into(answering, "acme", events)
    try:
        # no approver on `one` itself: the one connected to `two` counts (else: no-approver)
        await eventually(lambda: asking.watchers_of("acme") == 1)
        assert asking.watchers_of("other") == 0
        diff = "--- a/app.toml\n+++ b/app.toml\n@@ -1 +1 @@\n-port = 8080\n+port = 9090\n"
        waiting = await ask(asking, diff=diff)
        await eventually(lambda: any(isinstance(e, Pending) for e in events))
        request = events[0]
        assert isinstance(request, Pending)
        assert request.command == "make deploy"
        assert request.diff == diff  # a file change's diff reaches the other's approvers
        assert [p.id for p in answering.pending("acme")] == [request.id]
        assert answering.pending("other") == []
        with pytest.raises(ApprovalNotFound):  # another tenant's approver cannot decide it
            await answering.decide(request.id, decision, "mallory", tenant="other")
        await answering.decide(request.id, decision, "alice", tenant="acme")
        outcome = await asyncio.wait_for(waiting, 10)
        assert (outcome.allowed, outcome.how, outcome.approver) == (  # type: ignore[attr-defined]
            decision != "deny",
            decision,
            "alice",
        )
        assert any(isinstance(e, Closed) and e.id == request.id for e in events)
        assert answering.pending("acme") == []
        assert asking.pending("acme") == []
        with pytest.raises(ApprovalNotFound):  # decided once
            await answering.decide(request.id, "allow-once", "bob", tenant="acme")
        if decision == "allow-always":
            assert answering.always_allowed("acme") == ["make deploy"]
            await eventually(lambda: asking.always_allowed("acme") == ["make deploy"])
            assert asking.reason_to_ask("", "make deploy", "acme") is None
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


async def test_a_timeout_through_one_closes_the_request_on_the_other(
    pair: tuple[PostgresState, PostgresState],
) -> None:
    one, two = pair
    asking, answering = approvals(one, timeout_s=1.0), approvals(two)
    events: list[Event] = []
    watcher = await watch_into(answering, "acme", events)
    try:
        await eventually(lambda: asking.watchers_of("acme") == 1)
        outcome = await (await ask(asking))
        assert outcome.how == "timeout"  # type: ignore[attr-defined]
        await eventually(lambda: any(isinstance(e, Closed) for e in events))
        closed = [e for e in events if isinstance(e, Closed)]
        assert [c.outcome for c in closed] == ["timeout"]
        assert answering.pending("acme") == []
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    # the watcher gone, `one` sees no approver again: the fallback applies at once
    await eventually(lambda: asking.watchers_of("acme") == 0)
    assert (await (await ask(asking))).how == "no-approver"  # type: ignore[attr-defined]


async def test_tenant_quota_counts_across_supervisors(
    pair: tuple[PostgresState, PostgresState], url: str
) -> None:
    one, two = pair
    limits = TenantConfig(max_sandboxes=2, max_memory_mb=0)
    await one.ledger.admit(scope("acme", "a"), 512, limits)
    await two.ledger.admit(scope("acme", "b"), 512, limits)
    await two.ledger.admit(scope("acme", "b"), 512, limits)  # the same key again: no new place
    await one.ledger.admit(scope("other", "a"), 512, limits)  # another tenant's count
    with pytest.raises(QuotaExceeded, match="at most 2 sandbox"):
        await one.ledger.admit(scope("acme", "c"), 512, limits)
    with pytest.raises(QuotaExceeded, match="MiB"):
        await one.ledger.admit(scope("other", "b"), 512, TenantConfig(max_memory_mb=1000))
    # `two` gives "b" up: the place is free again
    await two.ledger.sync(lambda: {})
    await one.ledger.admit(scope("acme", "c"), 512, limits)
    # a supervisor that stopped beating (killed) stops counting
    three = TenantConfig(max_sandboxes=3)
    await two.ledger.admit(scope("acme", "x"), 512, TenantConfig())
    with pytest.raises(QuotaExceeded):  # a, c (one) and x (two)
        await one.ledger.admit(scope("acme", "d"), 512, three)
    assert two._beat is not None
    two._beat.cancel()  # as if killed: no more heartbeats
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(
            "UPDATE supervisors SET seen = now() - interval '1 minute' WHERE instance = %s",
            ("instance-two",),
        )
    await one.ledger.admit(scope("acme", "d"), 512, three)


async def test_the_key_lock_excludes_across_supervisors(
    pair: tuple[PostgresState, PostgresState],
) -> None:
    one, two = pair
    order: list[str] = []
    async with one.lock(scope("acme", "k")):
        waiter = asyncio.create_task(_take(two, scope("acme", "k"), order))
        other = asyncio.create_task(_take(two, scope("acme", "other"), order))
        await asyncio.wait_for(other, 10)  # another key is not held up
        await asyncio.sleep(0.3)
        assert not waiter.done()
        order.append("released")
    await asyncio.wait_for(waiter, 10)
    assert order == [scope("acme", "other"), "released", scope("acme", "k")]
    # a cancelled wait leaves the lock free
    async with one.lock(scope("acme", "k")):
        cancelled = asyncio.create_task(_take(two, scope("acme", "k"), order))
        await asyncio.sleep(0.2)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
    await asyncio.wait_for(_take(one, scope("acme", "k"), order), 5)
    await asyncio.wait_for(_take(two, scope("acme", "k"), order), 5)


async def _take(state: PostgresState, key: str, order: list[str]) -> None:
    async with state.lock(key):
        order.append(key)


async def test_sqlite_state_shares_nothing(tmp_path: Path) -> None:
    state = SqliteState(tmp_path / "stockade.db")
    assert state.board is None
    assert state.ledger is None
    async with state.lock("k"), state.lock("k"):  # the manager's own lock is the one held
        pass
    always = state.allow_always()
    always.add("make", "me")
    assert state.allow_always().commands() == ["make"]
    always.close()


async def test_a_gone_supervisors_request_is_withdrawn_not_decided(
    pair: tuple[PostgresState, PostgresState], url: str
) -> None:
    one, two = pair
    asking, answering = approvals(one), approvals(two)
    events: list[Event] = []
    watcher = await watch_into(answering, "acme", events)
    try:
        await eventually(lambda: asking.watchers_of("acme") == 1)
        waiting = await ask(asking)
        await eventually(lambda: answering.pending("acme") != [])
        request_id = answering.pending("acme")[0].id
        assert one._beat is not None
        one._beat.cancel()  # `one` is killed: no more heartbeats
        with psycopg.connect(url, autocommit=True) as db:
            db.execute(
                "UPDATE supervisors SET seen = now() - interval '1 minute' WHERE instance = %s",
                ("instance-one",),
            )
        assert not await two.board.decide(request_id, "acme", "allow-once", "bob")
        await eventually(lambda: answering.pending("acme") == [])  # the next resync
        closed = [e for e in events if isinstance(e, Closed)]
        assert [(c.id, c.outcome) for c in closed] == [(request_id, "withdrawn")]
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


async def test_the_replicas_alive_are_those_whose_heartbeat_is_fresh(
    pair: tuple[PostgresState, PostgresState], url: str
) -> None:
    """What the warm pool of pods reaps by: a replica whose heartbeat stopped is gone."""
    one, two = pair
    assert await one.replicas() == await two.replicas() == {"instance-one", "instance-two"}
    assert one._beat is not None
    one._beat.cancel()  # `one` is killed: no more heartbeats
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(
            "UPDATE supervisors SET seen = now() - interval '1 minute' WHERE instance = %s",
            ("instance-one",),
        )
    assert await two.replicas() == {"instance-two"}
    assert await one.replicas() == {"instance-one", "instance-two"}  # a replica knows itself
    assert await SqliteState(Path("/nonexistent/stockade.db")).replicas() is None


def test_a_config_repr_holds_no_state_password() -> None:
    from stockade.supervisor.config import Config
    from stockade.supervisor.config.service import StateConfig

    config = Config(state=StateConfig(url=f"postgresql://u:{PASSWORD}@db/x"))
    assert PASSWORD not in repr(config)


async def test_a_lost_database_is_state_unavailable_without_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(postgres, "POOL_WAIT_S", 1.0)  # a request waits that long, then fails
    with postgres_server() as own:
        state = PostgresState.open(own.url, "lonely")
        await state.start()
        try:
            own.stop()
            with pytest.raises(StateUnavailable) as lost:
                await state.ledger.admit(scope("acme", "k"), 512, TenantConfig())
            assert f"127.0.0.1:{own.port}/postgres" in str(lost.value)
            assert PASSWORD not in str(lost.value)
            with pytest.raises(StateUnavailable):
                async with state.lock(scope("acme", "k")):
                    pass
            with pytest.raises(StateUnavailable):
                await state.board.decide("nope", "acme", "deny", "bob")
        finally:
            await state.close()


async def test_the_password_may_come_from_pgpassword(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As deploy/kubernetes does: the URL names no password, libpq reads PGPASSWORD (for the
    pools and the listening connection alike)."""
    bare = url.replace(f":{PASSWORD}@", "@")
    assert PASSWORD not in bare
    with pytest.raises(ConfigError, match="password"):
        PostgresState.open(bare, "no-password")
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    one, two = PostgresState.open(bare, "env-one"), PostgresState.open(bare, "env-two")
    for state in (one, two):
        await state.start()
    try:
        a, b = one.allow_always(), two.allow_always()
        a.add("make", "alice")
        await eventually(lambda: b.has("", "make"))  # by notification or heartbeat
    finally:
        for state in (one, two):
            await state.close()
