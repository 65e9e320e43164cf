"""`stockade audit export`: a stretch of the audit chain as JSON lines that verify offline
with the installation's public key alone (scripts/verify_audit.py; docs/audit.md).

Every line is one JSON object in canonical form (keys sorted, compact, UTF-8 as is):

- `header` first: the format, the public key, the hashed columns in order, and the hash
  the first record follows (`start_hash`) with what it is;
- a `record` per record in id order (its columns, prev_hash and hash);
- a `checkpoint` per signed checkpoint of the stretch, and the anchor it starts from;
- with `signed`, a `seal` last: the SHA-256 of every line before it, the first and last ids
  and hashes, Ed25519-signed, so a byte changed anywhere, a line added, dropped or moved is
  found, and the chain inside is recomputed as well.

The stretch is verified as it is written: a broken chain is not exported (nor signed)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from dataclasses import asdict
from typing import IO, Any

from stockade.supervisor.database import GENESIS, HASHED
from stockade.supervisor.observe import chain

EXPORT_FORMAT = "stockade-audit-export-1"


class ChainBroken(Exception):
    """The stretch asked for does not verify: nothing signed is written for it."""

    def __init__(self, report: chain.Report) -> None:
        super().__init__(f"record {report.broken_id}: {report.reason}")
        self.report = report


def line(obj: dict[str, Any]) -> bytes:
    """One line's canonical bytes, its newline included."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass") + b"\n"


def seal_message(seal: dict[str, Any]) -> bytes:
    """What a seal's signature covers: its canonical line without the signature."""
    return line({k: v for k, v in seal.items() if k != "signature"})


def export(
    db: Any,
    mark: str,
    out: IO[bytes],
    signer: chain.Signer | None,
    trusted: Iterable[str],
    first: int = 0,
    last: int = 0,
) -> chain.Report:
    """Write the records from id `first` to `last` (0: all) to `out`, sealed by `signer`
    when given; the verification's report. Raises ChainBroken before the seal when the
    stretch does not verify (what was written up to there is not signed)."""
    trusted = frozenset([*trusted, *([signer.public_key] if signer else [])])
    signed = chain.checkpoints(db)
    rows = chain.records(db, mark, first, last)
    head = next(rows, None)
    if head is None:
        start, why, start_id = GENESIS, "no records", 0
    else:
        before = chain.hash_before(db, mark, int(head[0])) if first else None
        if before is not None:
            start, why, start_id = before[1], f"record {before[0]} (not exported)", before[0]
        else:
            start, why = chain.start_of(signed, trusted, int(head[0]))
            start_id = 0
    verifier = chain.Verifier(start, trusted, signed, why, start_id)
    digest = hashlib.sha256()

    def put(obj: dict[str, Any]) -> None:
        data = line(obj)
        digest.update(data)
        out.write(data)

    put({
        "type": "header", "format": EXPORT_FORMAT, "columns": list(HASHED),
        "public_key": signer.public_key if signer else "", "start_hash": start,
        "start": why,
    })  # fmt: skip
    anchor = next((c for c in signed if c.kind == "anchor" and c.last_hash == start), None)
    if anchor is not None and start != GENESIS:
        put({"type": "checkpoint", **asdict(anchor)})
    for row in [head, *rows] if head is not None else []:
        if not verifier.feed(row):
            raise ChainBroken(verifier.report)
        put({"type": "record", **dict(zip(chain.ROW_COLUMNS, row, strict=True))})
    report = verifier.finish(last)
    if not report.ok:
        raise ChainBroken(report)
    lo, hi = report.first_id, report.last_id
    for c in signed:
        if lo <= c.last_id <= hi and c.kind == "head" and c.signed_by(trusted):
            put({"type": "checkpoint", **asdict(c)})
    if signer is not None:
        seal: dict[str, Any] = {
            "type": "seal", "format": EXPORT_FORMAT, "sha256": digest.hexdigest(),
            "records": report.checked, "first_id": lo, "last_id": hi, "start_hash": start,
            "end_hash": verifier.last_hash, "time": time.time(),
            "public_key": signer.public_key,
        }  # fmt: skip
        seal["signature"] = signer.sign_bytes(seal_message(seal))
        out.write(line(seal))
    return report


def check_witness(db: Any, mark: str, export_file: bytes, trusted: Iterable[str]) -> str | None:
    """An earlier signed export as a witness kept off the host: the record its seal ends at
    must still be in the log with the hash the seal signs, or have been removed by
    retention (a trusted anchor at or after it). None when it holds, else what is wrong.
    A log wiped whole and begun again verifies on its own; it fails this."""
    lines = export_file.splitlines()
    try:
        seal = json.loads(lines[-1]) if lines else None
    except ValueError:
        seal = None
    if not isinstance(seal, dict) or seal.get("type") != "seal":
        return "the witness does not end with a seal (not an export made with --signed)"
    keys = frozenset(trusted)
    if seal.get("public_key") not in keys or not _seal_signed(seal):
        return "the witness's seal is not signed by a trusted key"
    last_id, end_hash = int(seal["last_id"]), str(seal["end_hash"])
    if not last_id:
        return None
    row = db.cursor().execute(f"SELECT hash FROM audit WHERE id = {mark}", (last_id,)).fetchone()
    if row is not None:
        if str(row[0]) == end_hash:
            return None
        return f"record {last_id} is not the one the witness sealed: it was changed"
    anchors = [
        c for c in chain.checkpoints(db)
        if c.kind == "anchor" and c.last_id >= last_id and c.signed_by(keys)
    ]  # fmt: skip
    if anchors:
        return None
    return f"record {last_id}, which the witness sealed, is gone and no signed anchor covers it"


def _seal_signed(seal: dict[str, Any]) -> bool:
    unsigned = dict(seal)
    signature = str(unsigned.pop("signature", ""))
    check = chain.Checkpoint(0.0, "", 0, "", str(seal["public_key"]), signature)
    return check.verifies(seal_message(unsigned))
