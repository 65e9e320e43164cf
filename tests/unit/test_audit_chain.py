"""The audit log's hash chain (database.py's rules, observe/chain.py): records written through
the real writer of each store, SQLite and PostgreSQL 15 (tests/pg.py), then tampered with
in the database as an attacker with write access would: editing, deleting, reordering or
inserting any record is found by verify, naming the first broken record; a checkpoint
signed by another key proves nothing; retention trims a prefix and leaves a signed anchor
the rest verifies from; an older version's records are chained at the upgrade."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stockade.supervisor import database
from stockade.supervisor.observe import chain
from stockade.supervisor.observe.audit import AuditLog, AuditRecord
from stockade.supervisor.observe.retention import Retention
from tests.pg import PgServer, postgres_server

pytestmark = pytest.mark.timeout(120)
NOW = 1_800_000_000.0
DAY = 86400.0
COUNT = 40


def record(i: int, when: float = NOW) -> AuditRecord:
    return AuditRecord(
        time=when + i, request_id=f"r{i}", caller="c", sandbox_key=f"k{i % 3}", agent_id="a",
        provider="p", tool="exec", arguments_json=f'{{"command": "make test-{i} \u00e9"}}',
        policy_step="allowed", exit_code=i % 2, is_error=i % 5 == 0, tenant="acme",
    )  # fmt: skip


@dataclass
class Store:
    """One store's audit log and a raw connection to its database (the attacker's)."""

    make_log: Callable[..., AuditLog]
    raw: Callable[[], AbstractContextManager[Any]]
    mark: str

    def write(self, records: list[AuditRecord], signer: chain.Signer | None = None) -> None:
        sealing = chain.Sealing(signer) if signer else None
        log = self.make_log(sealing=sealing)
        for r in records:
            log.record(r)
        log.close()  # a head checkpoint at close

    def run(self, sql: str, *params: object) -> None:
        with self.raw() as db:
            db.cursor().execute(sql.replace("?", self.mark), params)

    def verify(self, trusted: list[str], first: int = 0, last: int = 0) -> chain.Report:
        with self.raw() as db:
            return chain.verify(db, self.mark, trusted, first, last)


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PgServer]:
    with postgres_server() as found:
        yield found


def sqlite_store(tmp_path: Path) -> Store:
    path = tmp_path / "stockade.db"

    @contextmanager
    def raw() -> Iterator[sqlite3.Connection]:
        db = database.connect(path)
        try:
            yield db
        finally:
            db.close()

    return Store(lambda **kw: AuditLog(path, **kw), raw, "?")


@contextmanager
def pg_store(server: PgServer) -> Iterator[Store]:
    with pg_store_at(server.create_database(f"t{uuid.uuid4().hex[:12]}")) as store:
        yield store


@contextmanager
def pg_store_at(url: str) -> Iterator[Store]:
    import psycopg
    from psycopg_pool import ConnectionPool

    from stockade.supervisor.state.pg_audit import PgAuditLog
    from stockade.supervisor.state.pg_schema import migrate

    pool: ConnectionPool[Any] = ConnectionPool(url, min_size=1, max_size=4, open=True)
    with pool.connection() as db:
        migrate(db)

    @contextmanager
    def raw() -> Iterator[Any]:
        with psycopg.connect(url, autocommit=True) as db:
            yield db

    try:
        yield Store(lambda **kw: PgAuditLog(pool, **kw), raw, "%s")
    finally:
        pool.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        yield sqlite_store(tmp_path)
        return
    with pg_store(request.getfixturevalue("pg_server")) as found:
        yield found


@pytest.fixture
def signer() -> chain.Signer:
    return chain.Signer(Ed25519PrivateKey.generate(), clock=lambda: NOW)


def test_an_untouched_chain_verifies_with_its_checkpoint(
    store: Store, signer: chain.Signer
) -> None:
    store.write([record(i) for i in range(COUNT)], signer)
    report = store.verify([signer.public_key])
    assert report.ok, report.reason
    assert (report.checked, report.first_id, report.last_id) == (COUNT, 1, COUNT)
    assert report.checkpoints == 1  # the head, signed at close


def test_two_writers_in_turn_make_one_chain(store: Store, signer: chain.Signer) -> None:
    """Another log (a restart, or another supervisor of a shared state) goes on from the head."""
    store.write([record(i) for i in range(10)], signer)
    store.write([record(i) for i in range(10, 25)], signer)
    report = store.verify([signer.public_key])
    assert report.ok, report.reason
    assert (report.checked, report.checkpoints) == (25, 2)


POSITIONS = [1, 17, COUNT]
"""The first record, one in the middle, the last."""


@pytest.mark.parametrize("target", POSITIONS)
def test_an_edited_record_is_named(store: Store, signer: chain.Signer, target: int) -> None:
    store.write([record(i) for i in range(COUNT)], signer)
    store.run("UPDATE audit SET arguments_json = ? WHERE id = ?", '{"command": "ls"}', target)
    report = store.verify([signer.public_key])
    assert (report.broken_id, "edited" in report.reason) == (target, True)


def test_an_edit_with_its_hash_recomputed_breaks_the_next_link(
    store: Store, signer: chain.Signer
) -> None:
    store.write([record(i) for i in range(COUNT)], signer)
    with store.raw() as db:
        rows = list(chain.records(db, store.mark, 17, 17))
    values, where = list(rows[0][:-2]), chain.ROW_COLUMNS.index("exit_code")
    values[where] = 1 - values[where]
    forged = database.link_hash(rows[0][-2], values)
    store.run("UPDATE audit SET exit_code = ?, hash = ? WHERE id = 17", values[where], forged)
    assert store.verify([signer.public_key]).broken_id == 18


@pytest.mark.parametrize("target", POSITIONS)
def test_a_deleted_record_is_found(store: Store, signer: chain.Signer, target: int) -> None:
    """The record after it names the break; the last one's loss, its signed checkpoint."""
    store.write([record(i) for i in range(COUNT)], signer)
    store.run("DELETE FROM audit WHERE id = ?", target)
    report = store.verify([signer.public_key])
    assert report.broken_id == (target + 1 if target < COUNT else COUNT)
    assert "deleted" in report.reason


@pytest.mark.parametrize(("one", "two"), [(1, 2), (5, 30), (COUNT - 1, COUNT)])
def test_reordered_records_are_found(
    store: Store, signer: chain.Signer, one: int, two: int
) -> None:
    store.write([record(i) for i in range(COUNT)], signer)
    spare = 10_000_000
    store.run("UPDATE audit SET id = ? WHERE id = ?", spare, one)
    store.run("UPDATE audit SET id = ? WHERE id = ?", one, two)
    store.run("UPDATE audit SET id = ? WHERE id = ?", two, spare)
    assert store.verify([signer.public_key]).broken_id == one


def test_an_inserted_record_is_found(store: Store, signer: chain.Signer) -> None:
    """Made to link to the record before it: the one after no longer does."""
    store.write([record(i) for i in range(COUNT)], signer)
    for record_id in range(COUNT, 20, -1):  # make room at 21
        store.run("UPDATE audit SET id = ? WHERE id = ?", record_id + 1, record_id)
    with store.raw() as db:
        before = chain.hash_before(db, store.mark, 21)
    assert before is not None
    values = (21, *_row_values(record(99)))  # the forger's record
    store.run(
        f"INSERT INTO audit ({', '.join(chain.ROW_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(chain.ROW_COLUMNS))})",
        *values, before[1], database.link_hash(before[1], values),
    )  # fmt: skip
    assert store.verify([signer.public_key]).broken_id == 22


def _row_values(rec: AuditRecord) -> tuple[object, ...]:
    """The hashed values of a record but its id, as the writer stores them."""
    from stockade.supervisor.observe.audit import _row

    return _row(rec)[:-2]


def test_a_checkpoint_of_another_key_proves_nothing(store: Store, signer: chain.Signer) -> None:
    """A forger who deletes the last records and the checkpoints, and signs a new head with a
    key of theirs: that checkpoint is ignored, and the next record written links to the head
    the forger removed, so the gap shows."""
    store.write([record(i) for i in range(COUNT)], signer)
    store.run("DELETE FROM audit WHERE id > 30")
    store.run("DELETE FROM audit_checkpoints")
    forger = chain.Signer(Ed25519PrivateKey.generate())
    with store.raw() as db:
        chain.add_checkpoint(db, store.mark, forger.sign("head", 30, "0" * 64))
    report = store.verify([signer.public_key])
    assert report.ok  # nothing left proves the end: that is what checkpoints are for
    assert report.notes == ["1 checkpoint(s) not signed by a trusted key: ignored"]
    store.write([record(i) for i in range(3)], signer)  # the supervisor writes on
    report = store.verify([signer.public_key])
    assert report.broken_id == COUNT + 1
    assert "record 30" in report.reason


def test_a_changed_signature_is_not_trusted(store: Store, signer: chain.Signer) -> None:
    store.write([record(i) for i in range(COUNT)], signer)
    store.run("DELETE FROM audit WHERE id = ?", COUNT)
    store.run("UPDATE audit_checkpoints SET last_id = ?", COUNT - 1)  # the signed id moved
    report = store.verify([signer.public_key])
    assert report.ok
    assert report.checkpoints == 0
    assert report.notes


def test_a_stretch_is_verified_from_the_record_before_it(
    store: Store, signer: chain.Signer
) -> None:
    store.write([record(i) for i in range(COUNT)], signer)
    report = store.verify([signer.public_key], first=10, last=20)
    assert (report.ok, report.first_id, report.last_id, report.checked) == (True, 10, 20, 11)
    store.run("UPDATE audit SET caller = 'x' WHERE id = 15")
    assert store.verify([signer.public_key], first=10, last=20).broken_id == 15
    assert store.verify([signer.public_key], first=16).ok  # proves what follows, not before


def test_retention_leaves_an_anchor_the_rest_verifies_from(
    store: Store, signer: chain.Signer
) -> None:
    """By age, in chunks: each chunk removes a prefix and signs its last record's hash."""
    old = [record(i, NOW - 10 * DAY) for i in range(30)]
    store.write([*old, *(record(i, NOW - 60) for i in range(30, 50))], signer)
    keep = Retention(max_age_s=DAY, max_bytes=0, chunk_rows=7)
    log = store.make_log(retention=keep, clock=lambda: NOW, sealing=chain.Sealing(signer))
    assert log.trim()
    log.close()
    report = store.verify([signer.public_key])
    assert report.ok, report.reason
    assert (report.first_id, report.last_id) == (31, 50)
    with store.raw() as db:  # the anchors of earlier chunks, the heads of removed records: gone
        kept = [(c.kind, c.last_id) for c in chain.checkpoints(db)]
    assert kept == [("head", 50), ("anchor", 30)]
    store.run("DELETE FROM audit WHERE id = 31")  # one more from the start: no anchor for it
    report = store.verify([signer.public_key])
    assert report.broken_id == 32
    assert "record 30" in report.reason


def test_without_a_signer_the_anchor_proves_nothing(store: Store) -> None:
    store.write([record(i, NOW - 10 * DAY) for i in range(10)])
    store.write([record(i) for i in range(10, 12)])
    log = store.make_log(retention=Retention(max_age_s=DAY, max_bytes=0), clock=lambda: NOW + 99)
    assert log.trim()
    log.close()
    report = store.verify([])
    assert report.broken_id == 11
    assert "start of the log" in report.reason


def test_sqlite_retention_by_size_keeps_the_chain(tmp_path: Path, signer: chain.Signer) -> None:
    store = sqlite_store(tmp_path)
    store.write([record(i) for i in range(3000)], signer)
    log = store.make_log(
        retention=Retention(max_age_s=0, max_bytes=300_000, chunk_rows=500),
        sealing=chain.Sealing(signer),
    )
    assert log.trim()
    log.close()
    report = store.verify([signer.public_key])
    assert report.ok, report.reason
    assert report.first_id > 1
    assert report.last_id == 3000


def test_an_older_versions_records_are_chained_at_the_upgrade(tmp_path: Path) -> None:
    from tests.unit.test_audit_retention import OLD_SCHEMA

    path = tmp_path / "stockade.db"
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    old.executemany(
        "INSERT INTO audit (time, request_id, caller, sandbox_key, agent_id, provider, tool, "
        "arguments_json, policy_step, guard_rule, approval, approver, duration_ms, exit_code, "
        "output_bytes, redactions, error_code, is_error) "
        "VALUES (?, 'r', 'c', 'k', '', '', 'exec', '{}', 'allowed', '', '', '', 1, 0, 0, 0, '', 0)",
        [(NOW + i,) for i in range(500)],
    )
    old.commit()
    old.close()
    store = sqlite_store(tmp_path)
    store.write([record(1)])
    report = store.verify([])
    assert report.ok, report.reason
    assert report.checked == 501


def test_two_supervisors_writing_at_once_make_one_chain(pg_server: PgServer) -> None:
    """Two PostgreSQL audit logs (two supervisors of one shared state), each writing from
    its own thread at the same time: their batches take their turn at the head."""
    import threading

    signer = chain.Signer(Ed25519PrivateKey.generate())
    with pg_store(pg_server) as store:
        logs = [store.make_log(sealing=chain.Sealing(signer)) for _ in range(2)]

        def write(log: AuditLog, base: int) -> None:
            for i in range(400):
                log.record(record(base + i))

        threads = [
            threading.Thread(target=write, args=(log, n * 1000)) for n, log in enumerate(logs)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for log in logs:
            log.close()
        report = store.verify([signer.public_key])
    assert report.ok, report.reason
    assert (report.checked, report.last_id) == (800, 800)


def test_the_command_verifies_a_postgresql_store(
    pg_server: PgServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stockade audit verify` on a shared state (state.url), trusting a key given by file."""
    from stockade.supervisor.cli.main import main

    url = pg_server.create_database(f"t{uuid.uuid4().hex[:12]}")
    key = Ed25519PrivateKey.generate()
    signer = chain.Signer(key)
    (tmp_path / "audit.pub").write_text(signer.public_key + "\n")
    config = tmp_path / "stockade.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[state]\nurl = "{url}"\n')
    with pg_store_at(url) as store:
        store.write([record(i) for i in range(COUNT)], signer)
        args = [
            "audit",
            "verify",
            "--config",
            str(config),
            "--public-key",
            str(tmp_path / "audit.pub"),
        ]
        assert main(args) == 0
        assert f"ok: records 1 to {COUNT} ({COUNT}), 1 signed checkpoint" in capsys.readouterr().out
        store.run("UPDATE audit SET id = 1000 WHERE id = 7")
        store.run("UPDATE audit SET id = 7 WHERE id = 8")
        store.run("UPDATE audit SET id = 8 WHERE id = 1000")
        assert main(args) == 1
        assert "BROKEN at record 7" in capsys.readouterr().out


@pytest.fixture(scope="module")
def written_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A SQLite log of COUNT records and its signed head, to copy for each attack."""
    folder = tmp_path_factory.mktemp("written")
    signer = chain.Signer(Ed25519PrivateKey.generate(), clock=lambda: NOW)
    sqlite_store(folder).write([record(i) for i in range(COUNT)], signer)
    return folder / "stockade.db", signer.public_key


EDITABLE = [name for name in chain.ROW_COLUMNS if name not in ("id", "prev_hash", "hash")]


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    attack=st.sampled_from(["edit", "delete", "swap"]),
    first=st.integers(1, COUNT),
    other=st.integers(1, COUNT),
    column=st.sampled_from(EDITABLE),
)
def test_any_record_edited_deleted_or_swapped_is_named(
    written_log: tuple[Path, str], tmp_path: Path, attack: str, first: int, other: int, column: str
) -> None:
    """Whichever record, whichever column: verify names the record the attack broke first."""
    import shutil

    source, key = written_log
    folder = tmp_path / uuid.uuid4().hex
    folder.mkdir()
    shutil.copy(source, folder / "stockade.db")
    store = sqlite_store(folder)
    if attack == "edit":
        changed = f"{column} = {column} + 1" if column != "is_error" else "is_error = 1 - is_error"
        if column not in (
            "time",
            "duration_ms",
            "exit_code",
            "output_bytes",
            "redactions",
            "is_error",
        ):
            changed = f"{column} = {column} || 'x'"
        store.run(f"UPDATE audit SET {changed} WHERE id = ?", first)
        expected = first
    elif attack == "delete":
        store.run("DELETE FROM audit WHERE id = ?", first)
        expected = first + 1 if first < COUNT else COUNT
    else:
        if first == other:
            return
        low, high = sorted((first, other))
        store.run("UPDATE audit SET id = -1 WHERE id = ?", low)
        store.run("UPDATE audit SET id = ? WHERE id = ?", low, high)
        store.run("UPDATE audit SET id = ? WHERE id = -1", high)
        expected = low
    assert store.verify([key]).broken_id == expected
