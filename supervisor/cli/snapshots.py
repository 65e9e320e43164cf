"""The snapshot commands: `snapshot`, `snapshots`, `snapshot-rm`, `restore` and `fork`
(docs/sandboxes.md#snapshots), and `undo` (docs/undo.md). Errors are the client's: main
prints them and exits 2."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from stockade.client import Rollback, SnapshotInfo, SnapshotList, Stockade
from stockade.supervisor.text import printable

SKIPPED_SHOWN = 10
"""Entries not captured that `snapshot` names; the rest are counted."""


def run(client: Stockade, ns: argparse.Namespace) -> int:
    return _HANDLERS[ns.command](client, ns)


def _snapshot(client: Stockade, ns: argparse.Namespace) -> int:
    info = client.snapshot_sandbox(ns.key, ns.name, include_tmp=ns.tmp)
    print(f"{printable(info.name)}: {describe(info)}; {frozen(info)}")
    for path in info.skipped[:SKIPPED_SHOWN]:
        print(f"  not captured (not a file, folder or link): {printable(path)}")
    if len(info.skipped) > SKIPPED_SHOWN:
        print(f"  ... and {len(info.skipped) - SKIPPED_SHOWN} more not captured")
    return 0


def _snapshots(client: Stockade, ns: argparse.Namespace) -> int:
    listing = client.list_snapshots(ns.key)
    if ns.json:
        print(json.dumps(listing_dict(listing), indent=2, ensure_ascii=False))
        return 0
    print("\n".join(table(listing)))
    return 0


def _remove(client: Stockade, ns: argparse.Namespace) -> int:
    freed = client.delete_snapshot(ns.name)
    print(f"{printable(ns.name)}: deleted, {size(freed)} freed")
    return 0


def _restore(client: Stockade, ns: argparse.Namespace) -> int:
    done = client.restore_sandbox(ns.key, ns.snapshot)
    how = "restored from" if done.replaced else "created from"
    container = done.sandbox.container_id[:12]
    print(
        f"{printable(ns.key)}: {how} {printable(done.snapshot.name)} ({describe(done.snapshot)})"
        + (f"; container {container}" if container else "")
    )
    return 0


def _fork(client: Stockade, ns: argparse.Namespace) -> int:
    forked = client.fork_sandbox(ns.source, ns.new_keys, include_tmp=ns.tmp)
    for box in forked.sandboxes:
        container = box.container_id[:12]
        print(
            f"{printable(box.key)}: forked from {printable(ns.source)}"
            + (f"; container {container}" if container else "")
        )
    print(f"capture: {describe(forked.capture)}; {frozen(forked.capture)}")
    return 0


def _undo(client: Stockade, ns: argparse.Namespace) -> int:
    """Show what the undo takes back, ask (unless --yes), then apply it."""
    shown = client.rollback_sandbox(ns.key, ns.to, apply=False)
    print(undo_summary(shown))
    if shown.diff:
        print("\n".join(printable(line) for line in shown.diff.splitlines()))
    if not ns.yes:
        if not sys.stdin.isatty():
            print("not applied: run again with --yes to apply", file=sys.stderr)
            return 1
        answer = input("apply this undo? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("not applied")
            return 1
    done = client.rollback_sandbox(ns.key, shown.call_id, apply=True)
    print(f"{printable(ns.key)}: undone to before call {printable(done.call_id)}")
    return 0


def undo_summary(undo: Rollback) -> str:
    added, removed, changed = undo.counts
    when = undo.checkpoint_time.isoformat(timespec="seconds") if undo.checkpoint_time else "?"
    return (
        f"checkpoint before call {printable(undo.call_id)} ({printable(undo.tool)}, {when}); "
        f"the undo takes back: {added} added, {removed} removed, {changed} changed"
    )


_HANDLERS: dict[str, Callable[[Stockade, argparse.Namespace], int]] = {
    "snapshot": _snapshot,
    "snapshots": _snapshots,
    "snapshot-rm": _remove,
    "restore": _restore,
    "fork": _fork,
    "undo": _undo,
}


def describe(info: SnapshotInfo) -> str:
    """What a snapshot holds: "12 files, 3.4 MiB" (and ", with /tmp", ", with memory")."""
    parts = (("/tmp", info.includes_tmp), ("memory", info.includes_memory))
    held = "".join(f", with {what}" for what, on in parts if on)
    return f"{count(info.files, 'file')}, {size(info.bytes)}{held}"


def frozen(info: SnapshotInfo) -> str:
    """How long the capture kept the sandbox frozen, and what it read meanwhile."""
    seconds = info.frozen_seconds
    took = f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"
    return f"frozen {took} ({count(info.files_read_frozen, 'file')} read frozen)"


def count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def size(n: int) -> str:
    """Bytes for people: 512 B, 1.5 KiB, 3.4 MiB, ..."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def table(listing: SnapshotList) -> list[str]:
    """The snapshots, oldest first, then the tenant's usage against its limits."""
    rows = [
        (
            printable(s.name),
            printable(s.source_key),
            s.created_at.astimezone().strftime("%Y-%m-%d %H:%M:%S"),
            str(s.files),
            size(s.bytes),
        )
        for s in listing.snapshots
    ]
    header = ("NAME", "SOURCE", "CREATED", "FILES", "SIZE")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        f"{n:<{widths[0]}}  {k:<{widths[1]}}  {c:<{widths[2]}}  {f:>{widths[3]}}  {b:>{widths[4]}}"
        for n, k, c, f, b in [header, *rows]
    ]
    return [*lines, usage(listing)]


def usage(listing: SnapshotList) -> str:
    """The tenant's whole store (not only the keys listed), on disk after deduplication."""
    count = f"{listing.count} of {listing.max_count}" if listing.max_count else f"{listing.count}"
    stored = (
        f"{size(listing.bytes)} of {size(listing.max_bytes)}"
        if listing.max_bytes
        else size(listing.bytes)
    )
    caps = (("count", listing.max_count), ("size", listing.max_bytes))
    free = [what for what, cap in caps if not cap]
    return f"tenant: {count} snapshots, {stored} on disk" + (
        f" (no limit on {' or '.join(free)})" if free else ""
    )


def listing_dict(listing: SnapshotList) -> dict[str, Any]:
    """The listing with the .proto's field names; times in ISO 8601."""
    out = asdict(listing)
    for snapshot in out["snapshots"]:
        snapshot["created_at"] = snapshot["created_at"].isoformat()
        snapshot["skipped"] = list(snapshot["skipped"])
    return out
