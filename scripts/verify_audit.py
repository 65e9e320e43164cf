#!/usr/bin/env python3
"""Verify an export of Stockade's audit log (`stockade audit export --signed`) offline, with
the installation's public key alone: no Stockade, no database; Python 3.9+ and the
`cryptography` package. See docs/audit.md.

    python3 verify_audit.py --public-key KEY export.jsonl

KEY: the public key `stockade audit public-key` prints (64 hex digits), or a file holding it.
Exit 0 when the file verifies, 1 with the first thing that does not (and the line it is on).

What it checks: the seal's Ed25519 signature, by that key, over the SHA-256 of every line
before it (any byte changed, any line added, dropped or moved breaks it); every line in
canonical form; each record's link to the one before it and its hash (SHA-256 over the
previous hash and the record's canonical bytes), from the header's start hash to the seal's
end hash; each checkpoint's signature and the hash of the record it names."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

EXPORT_FORMAT = "stockade-audit-export-1"
CHAIN_FORMAT = "stockade-audit-1"
CHECKPOINT_FORMAT = "stockade-audit-checkpoint-1"
GENESIS = "0" * 64


class Broken(Exception):
    pass


def canonical_line(obj: dict) -> bytes:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass") + b"\n"


CHAIN_BASE = 22
"""The columns of the chain's first format; later ones, when unset ("") at the end, are left
out of the canonical form."""


def record_hash(prev_hash: str, values: list) -> str:
    values = list(values)
    while len(values) > CHAIN_BASE and values[-1] == "":
        values.pop()
    body = json.dumps(
        [CHAIN_FORMAT, *values], ensure_ascii=False, separators=(",", ":"), allow_nan=False
    ).encode("utf-8", "surrogatepass")
    return hashlib.sha256(bytes.fromhex(prev_hash) + body).hexdigest()


def check_signature(public: Ed25519PublicKey, signature: str, message: bytes, what: str) -> None:
    try:
        public.verify(bytes.fromhex(signature), message)
    except (ValueError, InvalidSignature):
        raise Broken(f"{what}: the signature does not verify with this public key") from None


def verify(lines: list[bytes], public_key: str) -> str:
    """A summary when the export verifies; Broken saying where it does not."""
    public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key))
    if not lines:
        raise Broken("the file is empty")
    objects = []
    for number, raw in enumerate(lines, 1):
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise Broken(f"line {number}: not JSON ({exc})") from None
        if not isinstance(obj, dict) or canonical_line(obj) != raw:
            raise Broken(f"line {number}: not in canonical form (changed after export)")
        objects.append(obj)
    seal = objects[-1]
    if seal.get("type") != "seal":
        raise Broken("the last line is not a seal: the file is cut, or was not exported --signed")
    digest = hashlib.sha256(b"".join(lines[:-1])).hexdigest()
    unsigned = canonical_line({k: v for k, v in seal.items() if k != "signature"})
    if seal.get("public_key") != public_key:
        raise Broken("the seal names another public key")
    check_signature(public, str(seal.get("signature", "")), unsigned, "the seal")
    if seal["sha256"] != digest:
        raise Broken("the lines before the seal are not those it signs: the file was changed")
    header = objects[0]
    if header.get("type") != "header" or header.get("format") != EXPORT_FORMAT:
        raise Broken(f"line 1: not a header of format {EXPORT_FORMAT}")
    columns = header["columns"]
    prev, last_id, count, checkpoints, hashes = header["start_hash"], 0, 0, [], {}
    for number, obj in enumerate(objects[1:-1], 2):
        if obj["type"] == "checkpoint":
            checkpoints.append((number, obj))
            continue
        if obj["type"] != "record":
            raise Broken(f"line {number}: unknown line type {obj['type']!r}")
        if obj["prev_hash"] != prev:
            raise Broken(f"line {number}: record {obj['id']} does not follow the one before it")
        values = [obj[name] for name in columns]
        if record_hash(prev, values) != obj["hash"]:
            raise Broken(f"line {number}: record {obj['id']} does not match its hash")
        prev, last_id, count = obj["hash"], obj["id"], count + 1
        hashes[last_id] = prev
    if (seal["start_hash"], seal["end_hash"]) != (header["start_hash"], prev):
        raise Broken("the seal's start and end hashes are not the chain's")
    if (seal["records"], seal["last_id"]) != (count, last_id):
        raise Broken("the seal's count of records is not the file's")
    for number, c in checkpoints:
        message = json.dumps(
            [CHECKPOINT_FORMAT, c["kind"], c["last_id"], c["last_hash"], c["time"]],
            separators=(",", ":"),
        ).encode()
        if c["public_key"] != public_key:
            raise Broken(f"line {number}: a checkpoint signed by another key")
        check_signature(public, c["signature"], message, f"line {number}: checkpoint")
        if c["kind"] == "anchor" and c["last_hash"] != header["start_hash"]:
            raise Broken(f"line {number}: the anchor is not the hash the records start from")
        if c["kind"] == "head" and hashes.get(c["last_id"]) != c["last_hash"]:
            raise Broken(f"line {number}: checkpoint of record {c['last_id']} does not match it")
    start = "the first record of the log" if header["start_hash"] == GENESIS else header["start"]
    span = f"records {seal['first_id']} to {last_id}" if count else "no records"
    return f"ok: {span} ({count}), following {start}; {len(checkpoints)} signed checkpoint(s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--public-key", required=True, help="64 hex digits, or a file of them")
    parser.add_argument("export", type=Path, help="the JSON lines of `stockade audit export`")
    ns = parser.parse_args(argv)
    key = ns.public_key
    if len(key) != 64 or not all(c in "0123456789abcdef" for c in key.lower()):
        key = Path(key).read_text(encoding="ascii").strip()
    try:
        print(verify(ns.export.read_bytes().splitlines(keepends=True), key.lower()))
    except Broken as exc:
        print(f"BROKEN: {exc}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, ValueError) as exc:
        print(f"BROKEN: a line lacks what the format needs ({exc!r})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
