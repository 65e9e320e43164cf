"""Snapshot store: size and times for a tree of N files totalling S bytes, ten snapshots
each changing 1% of the files (`python -m bench.snapshots --files 10000 --mib 1024`; smaller
for a quick look). Measures the store alone (no sandbox, no freeze): capture (the first, full,
and the incremental ones), restore, and the store's size over one copy."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from stockade.supervisor.sandboxes.snapshots.repository import SnapshotStore


def _tree(root: Path, files: int, total: int, rng: random.Random) -> list[Path]:
    size = max(1, total // files)
    paths = []
    for i in range(files):
        folder = root / f"d{i // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"f{i:05d}"
        path.write_bytes(rng.randbytes(size))
        paths.append(path)
    return paths


def measure(files: int, total_bytes: int, workdir: Path, snapshots: int = 10) -> dict[str, Any]:
    rng = random.Random(16)
    tree, store_dir = workdir / "tree", workdir / "store"
    paths = _tree(tree, files, total_bytes, rng)
    one_copy = sum(p.stat().st_size for p in paths)
    store = SnapshotStore(store_dir)
    captures = []
    for n in range(snapshots):
        if n:
            for path in rng.sample(paths, max(1, files // 100)):
                path.write_bytes(rng.randbytes(path.stat().st_size))
        _, stats = store.capture("bench", f"s{n}", tree, lineage="tree")
        captures.append(stats.seconds)
    usage = store.usage("bench")
    started = time.monotonic()
    store.restore("bench", f"s{snapshots - 1}", workdir / "restored", (os.getuid(), os.getgid()))
    restore_s = time.monotonic() - started
    return {
        "files": files,
        "bytes": one_copy,
        "snapshots": snapshots,
        "store_bytes": usage.bytes,
        "store_over_one_copy": round(usage.bytes / one_copy, 3),
        "capture_full_s": round(captures[0], 3),
        "capture_incremental_s": round(sorted(captures[1:])[len(captures[1:]) // 2], 3)
        if snapshots > 1
        else None,
        "restore_s": round(restore_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--dir", type=Path, default=None, help="where (default: a temp folder)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="stockade-snap-", dir=args.dir))
    try:
        print(json.dumps(measure(args.files, args.mib << 20, workdir), indent=2))
    finally:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
