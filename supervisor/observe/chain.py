"""The audit log's hash chain, signed: the key, the checkpoints of the chain's head and the
anchors retention leaves, and the proof of a stretch of the chain (docs/audit.md).

Each record carries the hash of the one before it (database.py's rules: canonical bytes,
SHA-256, the head in audit_chain). A checkpoint is an Ed25519 signature over a head's id
and hash: `head` ones at an interval and at shutdown, an `anchor` for the last record a
retention chunk removed, so the records after it still prove they follow a record that was
there. Verify walks records in id order and names the first one whose link does not hold.

Works on a DB-API connection of either store (sqlite3 or psycopg: `mark` is its
placeholder); imports nothing above the database layer."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from stockade.supervisor.database import GENESIS, HASHED, HEAD, link_hash

CHECKPOINT_FORMAT = "stockade-audit-checkpoint-1"
KEY_FILE = "audit-signing.key"
"""The signing key's file in the state directory when audit.signing_key is not set."""
CHECKPOINT_COLUMNS = ("time", "kind", "last_id", "last_hash", "public_key", "signature")
ROW_COLUMNS = ("id", *(name for name in HASHED if name != "id"), "prev_hash", "hash")
"""A record's columns as the chain's readers select them: the hashed ones in order, then
its previous hash and its own."""


class SigningKeyError(Exception):
    """The signing key cannot be read, is not an Ed25519 key, or others may read it."""


@dataclass(frozen=True)
class Checkpoint:
    time: float
    kind: str
    """"head" (the chain's head at an interval or at shutdown) or "anchor" (the last record
    a retention chunk removed)."""
    last_id: int
    last_hash: str
    public_key: str = ""
    """The signer's raw Ed25519 public key, 64 hex digits."""
    signature: str = ""

    def message(self) -> bytes:
        """What is signed: the UTF-8 of the compact JSON array [CHECKPOINT_FORMAT, kind,
        last_id, last_hash, time]."""
        body = [CHECKPOINT_FORMAT, self.kind, self.last_id, self.last_hash, self.time]
        return json.dumps(body, separators=(",", ":")).encode()

    def signed_by(self, trusted: Iterable[str]) -> bool:
        """Whether one of the trusted public keys (hex) made its signature."""
        return self.public_key in set(trusted) and self.verifies(self.message())

    def verifies(self, message: bytes) -> bool:
        """Whether its signature is its public key's over `message`."""
        try:
            public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(self.public_key))
            public.verify(bytes.fromhex(self.signature), message)
        except (ValueError, InvalidSignature):
            return False
        return True


class Signer:
    def __init__(self, key: Ed25519PrivateKey, clock: Callable[[], float] = time.time) -> None:
        self._key, self._clock = key, clock
        self.public_key = public_hex(key.public_key())

    def sign(self, kind: str, last_id: int, last_hash: str) -> Checkpoint:
        unsigned = Checkpoint(self._clock(), kind, last_id, last_hash, self.public_key)
        return Checkpoint(**{**unsigned.__dict__, "signature": self.sign_bytes(unsigned.message())})

    def sign_bytes(self, message: bytes) -> str:
        """An Ed25519 signature of `message`, hex."""
        return self._key.sign(message).hex()


@dataclass(frozen=True)
class Sealing:
    """How the audit writer signs its chain: a head checkpoint every interval_s (when new
    records came) and at close; anchors at each retention chunk."""

    signer: Signer
    interval_s: float = 300.0


def public_hex(key: Ed25519PublicKey) -> str:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def load_signing_key(path: Path, create: bool = False) -> Ed25519PrivateKey:
    """The Ed25519 key in `path` (PKCS#8 PEM). `create`: made there, mode 0600, when there is
    no file yet. A key others may read or write is refused."""
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # made by another at the same moment: read theirs
            return load_signing_key(path)
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
        return key
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"the audit signing key {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SigningKeyError(f"the audit signing key {path} is open to others: chmod 600 it")
    try:
        loaded = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(f"the audit signing key {path} does not parse: {exc}") from None
    if not isinstance(loaded, Ed25519PrivateKey):
        raise SigningKeyError(f"the audit signing key {path} is not an Ed25519 key")
    return loaded


def load_public_key(path: Path) -> str:
    """A trusted public key from a file: 64 hex digits, a PEM public key or a private key."""
    text = path.read_text(encoding="ascii", errors="replace").strip()
    if len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text):
        return text.lower()
    if "PRIVATE KEY" in text:
        return public_hex(load_signing_key(path).public_key())
    try:
        key = serialization.load_pem_public_key(text.encode())
    except ValueError as exc:
        raise SigningKeyError(f"{path}: not a public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"{path}: not an Ed25519 public key")
    return public_hex(key)


def add_checkpoint(db: Any, mark: str, checkpoint: Checkpoint) -> None:
    values = tuple(getattr(checkpoint, name) for name in CHECKPOINT_COLUMNS)
    marks = ", ".join([mark] * len(values))
    db.cursor().execute(
        f"INSERT INTO audit_checkpoints ({', '.join(CHECKPOINT_COLUMNS)}) VALUES ({marks})",
        values,
    )


def seal_head(db: Any, mark: str, signer: Signer) -> Checkpoint | None:
    """Sign the chain's head unless the last checkpoint signs it already (a head, or the
    anchor retention left for it), in the caller's transaction; the checkpoint made."""
    cur = db.cursor()
    head = cur.execute(HEAD).fetchone()
    if head is None or int(head[0]) == 0:
        return None
    signed = cur.execute("SELECT max(last_id) FROM audit_checkpoints").fetchone()
    if signed is not None and signed[0] is not None and int(signed[0]) >= int(head[0]):
        return None  # a head checkpoint, or the anchor of retention having removed it
    checkpoint = signer.sign("head", int(head[0]), str(head[1]))
    add_checkpoint(db, mark, checkpoint)
    return checkpoint


def write_anchor(db: Any, mark: str, signer: Signer | None, last_id: int) -> None:
    """The anchor of a retention chunk that removes the records up to `last_id` (called
    before they go, in the same transaction), in place of the checkpoints of the records
    before it (no longer of use: verify starts from the latest anchor). Unsigned without a
    signer: verify then cannot prove what follows, and says so."""
    row = db.cursor().execute(f"SELECT hash FROM audit WHERE id = {mark}", (last_id,)).fetchone()
    db.cursor().execute(f"DELETE FROM audit_checkpoints WHERE last_id <= {mark}", (last_id,))
    last_hash = str(row[0]) if row else ""
    if signer is not None:
        add_checkpoint(db, mark, signer.sign("anchor", last_id, last_hash))
    else:
        add_checkpoint(db, mark, Checkpoint(time.time(), "anchor", last_id, last_hash))


def checkpoints(db: Any) -> list[Checkpoint]:
    rows = db.cursor().execute(
        f"SELECT {', '.join(CHECKPOINT_COLUMNS)} FROM audit_checkpoints ORDER BY id"
    )
    return [_checkpoint(row) for row in rows.fetchall()]


def _checkpoint(row: Sequence[Any]) -> Checkpoint:
    t, kind, last_id, last_hash, public_key, signature = row
    return Checkpoint(float(t), str(kind), int(last_id), str(last_hash), public_key, signature)


def records(db: Any, mark: str, first: int = 0, last: int = 0, chunk: int = 5000) -> Iterator[Any]:
    """The records from id `first` to `last` (0: the newest) in id order, ROW_COLUMNS each,
    read `chunk` at a time."""
    after, cur = first - 1, db.cursor()
    until = f" AND id <= {mark}" if last else ""
    sql = (
        f"SELECT {', '.join(ROW_COLUMNS)} FROM audit "
        f"WHERE id > {mark}{until} ORDER BY id LIMIT {mark}"
    )
    while True:
        params = (after, last, chunk) if last else (after, chunk)
        rows = cur.execute(sql, params).fetchall()
        yield from rows
        if len(rows) < chunk:
            return
        after = int(rows[-1][0])


def hash_before(db: Any, mark: str, first: int) -> tuple[int, str] | None:
    """The id and stored hash of the record just before id `first`, if there is one."""
    row = (
        db.cursor()
        .execute(f"SELECT id, hash FROM audit WHERE id < {mark} ORDER BY id DESC LIMIT 1", (first,))
        .fetchone()
    )
    return (int(row[0]), str(row[1])) if row else None


@dataclass
class Report:
    """What a verification found: the first broken link (None: the chain holds)."""

    checked: int = 0
    first_id: int = 0
    last_id: int = 0
    checkpoints: int = 0
    """Trusted checkpoints whose record was found with the hash they sign."""
    broken_id: int | None = None
    reason: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.broken_id is None and not self.reason


class Verifier:
    """Walks records in id order (ROW_COLUMNS each) and proves each link; stops at the
    first that does not hold.

    `start`: the hash the first record walked must follow. For a walk from the start of
    the log: GENESIS, or the hash the latest trusted anchor signs (the records before it
    were removed by retention); for a walk from a record in the middle: the stored hash of
    the record before it (the walk proves what follows it, not what precedes)."""

    def __init__(
        self,
        start: str,
        trusted: Iterable[str],
        signed: Sequence[Checkpoint] = (),
        start_why: str = "",
        start_id: int = 0,
    ) -> None:
        """start_id: the id of the record `start` is the hash of, when it is still there."""
        self._prev, self._prev_id, self._why = start, start_id, start_why
        self._trusted = frozenset(trusted)
        trusted_signed = [c for c in signed if c.signed_by(self._trusted)]
        self._heads = {c.last_id: c for c in trusted_signed if c.kind == "head"}
        self._anchored = max((c.last_id for c in trusted_signed if c.kind == "anchor"), default=0)
        """Records up to this id were removed by retention, as a trusted anchor says."""
        self.report = Report()

    @property
    def last_hash(self) -> str:
        """The hash of the last record that verified (the start's before any)."""
        return self._prev

    def feed(self, row: Sequence[Any]) -> bool:
        """One record; False once the chain is broken (at it or before)."""
        report = self.report
        if not report.ok:
            return False
        record_id, prev_hash, digest = int(row[0]), str(row[-2]), str(row[-1])
        if prev_hash != self._prev:
            after = f"record {self._prev_id}" if self._prev_id else self._why or "the start"
            return self._break(
                record_id,
                f"its previous hash is not that of {after}: a record between them was "
                "deleted or inserted, or the records were reordered",
            )
        if link_hash(prev_hash, row[:-2]) != digest:
            return self._break(record_id, "its contents do not match its hash: it was edited")
        signed = self._heads.get(record_id)
        if signed is not None:
            if signed.last_hash != digest:
                return self._break(record_id, "its hash is not the one its signed checkpoint holds")
            report.checkpoints += 1
        report.checked += 1
        report.first_id = report.first_id or record_id
        report.last_id = self._prev_id = record_id
        self._prev = digest
        return True

    def finish(self, last_id: int = 0) -> Report:
        """After the last record walked: a trusted checkpoint past it (up to `last_id`, 0:
        any) names records deleted from the end."""
        report = self.report
        if report.ok:
            missing = [
                c.last_id
                for c in self._heads.values()
                if c.last_id > max(report.last_id, self._anchored)
                and (not last_id or c.last_id <= last_id)
            ]
            if missing:
                self._break(
                    min(missing),
                    f"a signed checkpoint names record {min(missing)}, which is gone: the "
                    f"records after {report.last_id or 'the start'} were deleted",
                )
        return report

    def _break(self, record_id: int, reason: str) -> bool:
        self.report.broken_id, self.report.reason = record_id, reason
        return False


def start_of(
    signed: Sequence[Checkpoint], trusted: Iterable[str], first_id: int
) -> tuple[str, str]:
    """The hash the first record of the log (id `first_id`) must follow, and what it is:
    the latest trusted anchor before it, else GENESIS."""
    keys = frozenset(trusted)
    anchors = [
        c for c in signed if c.kind == "anchor" and c.last_id < first_id and c.signed_by(keys)
    ]
    if not anchors:
        return GENESIS, "the start of the log"
    latest = max(anchors, key=lambda c: c.last_id)
    return latest.last_hash, f"record {latest.last_id} (removed by retention; a signed anchor)"


def verify(db: Any, mark: str, trusted: Iterable[str], first: int = 0, last: int = 0) -> Report:
    """Prove the records from id `first` to `last` (0: the whole log) against their chain
    and the checkpoints signed by a trusted key (public keys, hex)."""
    trusted = frozenset(trusted)
    signed = checkpoints(db)
    before = hash_before(db, mark, first) if first else None
    rows = records(db, mark, first, last)
    if before is not None:
        verifier = Verifier(before[1], trusted, signed, start_id=before[0])
    else:
        head = next(rows, None)
        if head is None:
            return Verifier(GENESIS, trusted, signed).finish(last)
        start, why = start_of(signed, trusted, int(head[0]))
        verifier = Verifier(start, trusted, signed, why)
        verifier.feed(head)
    for row in rows:
        if not verifier.feed(row):
            break
    report = verifier.finish(last)
    untrusted = [c for c in signed if not c.signed_by(trusted)]
    if untrusted:
        report.notes.append(f"{len(untrusted)} checkpoint(s) not signed by a trusted key: ignored")
    return report
