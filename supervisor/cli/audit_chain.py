"""`stockade audit verify | export | public-key` (docs/audit.md): run on the supervisor's host
(or anywhere its state is reachable) with its config, against the audit store itself, not
through the API: a proof that goes through the server it checks would prove little.

verify exits 0 when the chain holds, 1 naming the first broken record; export writes JSON
lines (signed with --signed: scripts/verify_audit.py checks them offline)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stockade.supervisor.config import Config, load_config
from stockade.supervisor.errors import StockadeError
from stockade.supervisor.observe import chain
from stockade.supervisor.observe.audit_export import ChainBroken, check_witness, export


def run(ns: argparse.Namespace) -> int:
    try:
        config = load_config(ns.config)
        return _ACTIONS[ns.action](config, ns)
    except (StockadeError, chain.SigningKeyError, OSError) as exc:
        print(f"stockade audit {ns.action}: {exc}", file=sys.stderr)
        return 2


@contextlib.contextmanager
def open_store(config: Config) -> Iterator[tuple[Any, str]]:
    """A connection to the configured audit store and its placeholder: the SQLite file
    (read only) or the shared PostgreSQL database."""
    if config.state.url:
        import psycopg

        with psycopg.connect(config.state.url) as db:
            db.read_only = True
            yield db, "%s"
        return
    from stockade.supervisor import database
    from stockade.supervisor.state import SqliteState

    path = SqliteState.from_config(config).path
    if not path.exists():
        raise StockadeError(f"no audit database at {path}")
    database.connect(path).close()  # an older version's file: migrated (and chained) first
    lite = database.reader(path)
    try:
        yield lite, "?"
    finally:
        lite.close()


def key_path(config: Config) -> Path:
    from stockade.supervisor.app import signing_key_path

    return signing_key_path(config)


def trusted_keys(config: Config, given: list[Path] | None) -> list[str]:
    """The installation's public key (from its signing key, when this host has it) and
    those given with --public-key."""
    keys = [chain.load_public_key(path) for path in given or []]
    path = key_path(config)
    if path.exists():
        keys.append(chain.public_hex(chain.load_signing_key(path).public_key()))
    if not keys:
        raise chain.SigningKeyError(
            f"no public key to trust: no signing key at {path}; give --public-key FILE"
        )
    return keys


def _verify(config: Config, ns: argparse.Namespace) -> int:
    trusted = trusted_keys(config, ns.public_key)
    with open_store(config) as (db, mark):
        report = chain.verify(db, mark, trusted, ns.first, ns.last)
        witnessed = [
            (path, check_witness(db, mark, path.read_bytes(), trusted)) for path in ns.witness or []
        ]
    failed = [(path, wrong) for path, wrong in witnessed if wrong is not None]
    for note in report.notes:
        print(f"note: {note}")
    if not report.ok:
        print(f"BROKEN at record {report.broken_id}: {report.reason}")
        if report.checked:
            print(f"(records {report.first_id} to {report.last_id} verified before it)")
    for path, wrong in failed:
        print(f"BROKEN against the witness {path}: {wrong}")
    if not report.ok or failed:
        return 1
    span = f"records {report.first_id} to {report.last_id}" if report.checked else "no records"
    witnesses = f", {len(witnessed)} witness(es) held" if witnessed else ""
    print(
        f"ok: {span} ({report.checked}), {report.checkpoints} signed checkpoint(s) matched"
        + witnesses
    )
    return 0


def _export(config: Config, ns: argparse.Namespace) -> int:
    signer = chain.Signer(chain.load_signing_key(key_path(config))) if ns.signed else None
    trusted = trusted_keys(config, ns.public_key)
    with open_store(config) as (db, mark), _output(ns.output) as out:
        try:
            report = export(db, mark, out, signer, trusted, ns.first, ns.last)
        except ChainBroken as exc:
            print(f"stockade audit export: BROKEN at {exc}: not exported", file=sys.stderr)
            return 1
    print(f"exported {report.checked} record(s)", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _output(path: Path | None) -> Iterator[Any]:
    if path is None:
        yield sys.stdout.buffer
        sys.stdout.flush()
        return
    with path.open("wb") as out:
        yield out


def _public_key(config: Config, ns: argparse.Namespace) -> int:
    print(chain.public_hex(chain.load_signing_key(key_path(config)).public_key()))
    return 0


_ACTIONS = {"verify": _verify, "export": _export, "public-key": _public_key}


def add_options(audit: argparse.ArgumentParser) -> None:
    """The audit command's actions beside its listing (which goes through the API)."""
    audit.add_argument(
        "action", nargs="?", default="list", choices=["list", "verify", "export", "public-key"],
        help="list (default; through the API), or on the supervisor's host: verify the hash "
        "chain, export it as JSON lines, print the signing key's public half",
    )  # fmt: skip
    audit.add_argument("--config", type=Path, help="verify/export: the supervisor's config")
    audit.add_argument("--from", dest="first", type=int, default=0, help="first record id")
    audit.add_argument("--to", dest="last", type=int, default=0, help="last record id")
    audit.add_argument(
        "--public-key", type=Path, action="append",
        help="verify/export: a public key to trust (file), besides this host's signing key",
    )  # fmt: skip
    audit.add_argument(
        "--witness", type=Path, action="append",
        help="verify: an earlier signed export kept elsewhere; the record it ends at must be there",
    )  # fmt: skip
    audit.add_argument("--signed", action="store_true", help="export: seal it with the key")
    audit.add_argument("-o", "--output", type=Path, help="export: this file (default stdout)")
