"""Snapshots of a sandbox through the real supervisor (issue 16), where bench/snapshots.py
measures the store alone: what the API costs a caller and how long the sandbox is frozen.

Per engine, one `stockade serve` (the defaults: no auth, workspaces uncapped):

- pause and resume: `rounds` rounds of PauseSandbox, ResumeSandbox, then `exec true` (the
  first call after a resume), and a call to a paused sandbox (which resumes it first); median
  and p90 of each, ms;
- a workspace of `files` files totalling `mib` MiB (folders of 100; filled from the host
  through the workspace path, as the sandbox user's host ids: quick, and the same files the
  sandbox would have written), then ten snapshots, the first of the whole tree and each
  later one after 1% of the files were rewritten: each SnapshotSandbox's wall time, and its
  frozen_seconds and files_read_frozen as the supervisor reports them;
- the store's size after the ten (ListSnapshotsResponse.bytes, after deduplication) over one
  copy of the workspace's files (target <= 1.2x);
- one more snapshot, of 1% changed 1.5 s before (past the window in which a capture reads
  a changed file again while the sandbox is frozen: SETTLE_S);
- ForkSandbox of one new key and of `forks` in one call (each fork removed with its
  workspace after; layered where the host can), then RestoreSandbox of the first snapshot
  into the same key (the files changed since copied back, the others linked, the container
  re-created) and into a new key (a layered workspace where the host can: nothing copied).
  The forks come first: a restore that links moves the linked files' ctime, so the next
  capture of the key (a fork's) reads them all again (docs/benchmarks.md).

Alone: `python -m bench.sandbox_snapshots [--engine E] [--files N] [--mib M] [--rounds R]
[--forks F]` or `python -m bench --only snapshots`, which put the figures under
engines.<engine>.snapshots in bench/results.json and keep the rest of the record.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from bench import RESULTS
from bench.compare import read_results, write_results
from bench.compare_stats import nearest_rank
from bench.engines import ENGINES, bring_up
from bench.served import served, state_parent, without_journal
from bench.stockade_runs import destroy, exec_true
from bench.timing import progress
from stockade.client import Stockade
from stockade.v1 import sandbox_pb2, sandbox_pb2_grpc

KEY = "bench-snap"
PAUSE_KEY = "bench-pause"
SNAPSHOTS = 10
CHANGED = 0.01
"""Of the files, what each snapshot after the first finds rewritten."""
TARGET_STORE_RATIO = 1.2
RPC_TIMEOUT_S = 1800.0
SETTLE_S = 1.5
"""A capture reads again while the sandbox is frozen every file whose ctime is within 1 s of
its first pass (a write in the kernel's clock tick could go unseen): a change this long
before the snapshot is read by the first pass alone."""


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    answer = call()
    return time.perf_counter() - started, answer


def spread(seconds: Sequence[float]) -> dict[str, float]:
    """Median and p90 (nearest rank) in ms."""
    ms = [s * 1000 for s in seconds]
    return {
        "median_ms": round(statistics.median(ms), 2),
        "p90_ms": round(nearest_rank(ms, 0.9), 2),
    }


def pause_resume(client: Stockade, rounds: int) -> dict[str, Any]:
    """PauseSandbox and ResumeSandbox round trips, the first call after a resume, and a call
    to a paused sandbox (the call resumes it)."""
    exec_true(client, PAUSE_KEY)
    samples: dict[str, list[float]] = {
        "pause": [],
        "resume": [],
        "call_after": [],
        "call_paused": [],
    }
    try:
        for _ in range(rounds):
            for name, verb in (("pause", client.pause_sandbox), ("resume", client.resume_sandbox)):
                started = time.perf_counter()
                changed = verb(PAUSE_KEY)
                samples[name].append(time.perf_counter() - started)
                if not changed:
                    raise RuntimeError(f"{name} changed nothing")
            samples["call_after"].append(timed(lambda: exec_true(client, PAUSE_KEY))[0])
            client.pause_sandbox(PAUSE_KEY)
            samples["call_paused"].append(timed(lambda: exec_true(client, PAUSE_KEY))[0])
    finally:
        destroy(client, PAUSE_KEY)
    return {"rounds": rounds, **{name: spread(s) for name, s in samples.items()}}


def fill(workspace: Path, files: int, total: int, rng: random.Random) -> list[Path]:
    """`files` files of total // files random bytes in folders of 100, owned as the workspace
    is (the sandbox user's ids on the host)."""
    owner = workspace.stat()
    size = max(1, total // files)
    paths = []
    for i in range(files):
        folder = workspace / f"d{i // 100:04d}"
        if i % 100 == 0:
            folder.mkdir()
            os.chown(folder, owner.st_uid, owner.st_gid)
        path = folder / f"f{i:06d}"
        path.write_bytes(rng.randbytes(size))
        os.chown(path, owner.st_uid, owner.st_gid)
        paths.append(path)
    return paths


def rewrite(paths: list[Path], rng: random.Random) -> None:
    for path in rng.sample(paths, max(1, round(len(paths) * CHANGED))):
        path.write_bytes(rng.randbytes(path.stat().st_size))


class Snapshots:
    """The snapshot RPCs through the generated stubs (the client has no methods for them
    here), timed."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = sandbox_pb2_grpc.SandboxServiceStub(self.channel)

    def call(self, method: str, request: Any) -> tuple[float, Any]:
        rpc = getattr(self.stub, method)
        return timed(lambda: rpc(request, timeout=RPC_TIMEOUT_S))

    def snapshot(self, name: str) -> dict[str, Any]:
        took, info = self.call(
            "SnapshotSandbox", sandbox_pb2.SnapshotSandboxRequest(key=KEY, name=name)
        )
        return {
            "seconds": round(took, 3),
            "frozen_seconds": round(info.frozen_seconds, 3),
            "files_read_frozen": info.files_read_frozen,
            "files": info.files,
        }


def snapshots(client: Stockade, target: str, files: int, mib: int, forks: int) -> dict[str, Any]:
    rng = random.Random(16)
    exec_true(client, KEY)
    workspace = Path(client.sandbox(KEY).info().workspace_path)
    progress(f"filling the workspace: {files:,} files, {mib} MiB")
    took, paths = timed(lambda: fill(workspace, files, mib << 20, rng))
    one_copy = sum(p.stat().st_size for p in paths)
    out: dict[str, Any] = {"files": files, "bytes": one_copy, "fill_s": round(took, 1)}
    snaps = Snapshots(target)
    try:
        taken = []
        for n in range(SNAPSHOTS):
            if n:
                rewrite(paths, rng)
            taken.append(snaps.snapshot(f"s{n}"))
            progress(f"snapshot {n}: {taken[-1]}")
        later = taken[1:]
        out["snapshot_first"] = taken[0]
        out["snapshot_changed_1pct"] = taken[1] if later else None
        if later:
            out["snapshot_changed_1pct_median"] = {
                k: round(statistics.median(t[k] for t in later), 3)
                for k in ("seconds", "frozen_seconds", "files_read_frozen")
            }
        _, listed = snaps.call("ListSnapshots", sandbox_pb2.ListSnapshotsRequest())
        out["snapshots"] = listed.count
        out["store_bytes"] = listed.bytes
        out["store_over_one_copy"] = round(listed.bytes / one_copy, 3)
        out["store_target"] = TARGET_STORE_RATIO
        rewrite(paths, rng)
        time.sleep(SETTLE_S)
        out["snapshot_changed_settled"] = snaps.snapshot("settled")
        for count in sorted({1, forks}):
            keys = [f"{KEY}-fork-{i}" for i in range(count)]
            request = sandbox_pb2.ForkSandboxRequest(source_key=KEY, new_keys=keys)
            try:
                took, reply = snaps.call("ForkSandbox", request)
            finally:
                for key in keys:
                    destroy(client, key)
            out[f"fork_{count}"] = {
                "seconds": round(took, 3),
                "frozen_seconds": round(reply.capture.frozen_seconds, 3),
                "files_read_frozen": reply.capture.files_read_frozen,
            }
            progress(f"fork of {count}: {took:.1f} s")
        took, _ = snaps.call(
            "RestoreSandbox", sandbox_pb2.RestoreSandboxRequest(key=KEY, snapshot="s0")
        )
        out["restore_s"] = round(took, 3)
        progress(f"restore: {took:.1f} s")
        other = f"{KEY}-restored"
        try:
            took, _ = snaps.call(
                "RestoreSandbox", sandbox_pb2.RestoreSandboxRequest(key=other, snapshot="s0")
            )
        finally:
            destroy(client, other)
        out["restore_other_s"] = round(took, 3)
        progress(f"restore into a new key: {took:.1f} s")
    finally:
        snaps.channel.close()
        destroy(client, KEY)
    return out


def measure_engine(engine: str, files: int, mib: int, rounds: int, forks: int) -> dict[str, Any]:
    """Bring the engine up, serve, measure; the figures of one engine."""
    bring_up(engine)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    with served(engine) as sup, Stockade(sup.target) as client:
        progress(f"{engine}: pause and resume, {rounds} rounds")
        paused = pause_resume(client, rounds)
        progress(f"{engine}: snapshots of {files:,} files, {mib} MiB")
        snapped = snapshots(client, sup.target, files, mib, forks)
    return {
        "started_at": started,
        "state_parent": str(state_parent()),
        "no_journal": without_journal(state_parent()),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "pause": paused,
        **snapped,
    }


TARGETS_S = (("fork_1", "a fork of 1 new key", 0.15), ("fork_10", "ten forks in one call", 1.0))
"""Issue 30's targets for a 1 GiB / 10,000-file workspace (docs/benchmarks.md), seconds."""
TARGET_RESTORE_S = 0.3


def targets(result: dict[str, Any]) -> list[str]:
    """Issue 30's fork and restore targets, each met or MISSED (a fork's row when measured)."""
    rows = [(label, result[k]["seconds"], t) for k, label, t in TARGETS_S if result.get(k)]
    rows.append(("a restore", result["restore_s"], TARGET_RESTORE_S))
    if "restore_other_s" in result:
        rows.append(("a restore into a new key", result["restore_other_s"], TARGET_RESTORE_S))
    return [
        f"  target: {label} <= {limit:g} s: {took:.2f} s   {'met' if took <= limit else 'MISSED'}"
        for label, took, limit in rows
    ]


def section(engine: str, result: dict[str, Any]) -> str:
    """The table printed for one engine."""
    head = f"== {engine}: sandbox snapshots through the supervisor =="
    if "error" in result:
        return f"{head}\n  n/a: {result['error']}"
    p = result["pause"]
    lines = [
        f"== {engine}: sandbox snapshots through the supervisor, {result['files']:,} files, "
        f"{result['bytes'] / (1 << 20):,.0f} MiB ==",
        f"  {'':44}{'median':>9}{'p90':>9}   ({p['rounds']} rounds, ms)",
    ]
    for name, label in (
        ("pause", "PauseSandbox"),
        ("resume", "ResumeSandbox"),
        ("call_after", "exec true just after ResumeSandbox"),
        ("call_paused", "exec true on a paused sandbox (resumes it)"),
    ):
        lines.append(f"  {label:44}{p[name]['median_ms']:>9.2f}{p[name]['p90_ms']:>9.2f}")
    lines.append(f"  {'':44}{'wall s':>9}{'frozen s':>9}{'read frozen':>13}")
    rows = [
        ("snapshot_first", "SnapshotSandbox, first"),
        ("snapshot_changed_1pct", "SnapshotSandbox, 1% of files changed"),
        ("snapshot_changed_1pct_median", f"  the same, median of {SNAPSHOTS - 1}"),
        ("snapshot_changed_settled", f"  the same, changed {SETTLE_S:g} s before"),
        ("fork_1", "ForkSandbox, 1 new key"),
    ]
    rows += [
        (k, f"ForkSandbox, {k[5:]} new keys in one call")
        for k in result
        if k.startswith("fork_") and k != "fork_1"
    ]
    for key, label in rows:
        if r := result.get(key):
            lines.append(
                f"  {label:44}{r['seconds']:>9.2f}{r['frozen_seconds']:>9.3f}"
                f"{r['files_read_frozen']:>13,}"
            )
    lines.append(f"  {'RestoreSandbox of the first':44}{result['restore_s']:>9.2f}")
    if "restore_other_s" in result:
        lines.append(f"  {'  the same into a new key':44}{result['restore_other_s']:>9.2f}")
    lines += targets(result)
    if result.get("no_journal"):
        lines.append(
            f"  note: {result['state_parent']} is an ext4 without a journal: files made just "
            "after many were deleted are slow to create there (docs/benchmarks.md); "
            "STOCKADE_BENCH_DIR=a folder elsewhere"
        )
    ratio = result["store_over_one_copy"]
    verdict = "met" if ratio <= result["store_target"] else "MISSED"
    lines.append(
        f"  store after {result['snapshots']} snapshots, 1% changed each: "
        f"{result['store_bytes'] / (1 << 20):,.0f} MiB = {ratio:.3f}x one copy   "
        f"target <= {result['store_target']}x   {verdict}"
    )
    return "\n".join(lines)


def write(by_engine: dict[str, dict[str, Any]], path: Path = RESULTS) -> None:
    """Put each engine's figures under engines.<engine>.snapshots, keeping the rest."""
    record = read_results(path)
    engines = record.get("engines")
    engines = dict(engines) if isinstance(engines, dict) else {}
    for engine, result in by_engine.items():
        previous = engines.get(engine)
        engines[engine] = {**(previous if isinstance(previous, dict) else {}), "snapshots": result}
    write_results({**record, "engines": engines}, path)
    progress(f'snapshot figures written to {path} ("engines.<engine>.snapshots")')


def run(engines: Sequence[str], files: int, mib: int, rounds: int, forks: int) -> int:
    """This measurement alone, on each engine: print, record; 1 if one failed."""
    by_engine: dict[str, dict[str, Any]] = {}
    for engine in engines:
        try:
            by_engine[engine] = measure_engine(engine, files, mib, rounds, forks)
        except Exception as exc:  # the other engine is still measured
            progress(f"{engine}: snapshot measurement failed: {type(exc).__name__}: {exc}")
            by_engine[engine] = {"error": f"{type(exc).__name__}: {exc}"}
        print(section(engine, by_engine[engine]), end="\n\n", flush=True)
    write(by_engine)
    return 1 if any("error" in r for r in by_engine.values()) else 0


def add_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(f"--{prefix}files", type=int, help="files in the workspace (10000)")
    parser.add_argument(f"--{prefix}mib", type=int, help="MiB in them (1024)")
    parser.add_argument(f"--{prefix}rounds", type=int, help="pause/resume rounds (20)")
    parser.add_argument(f"--{prefix}forks", type=int, help="new keys of the big fork (10)")


def sizes(ns: argparse.Namespace, defaults: dict[str, int], prefix: str = "") -> dict[str, int]:
    """The sizes given on the command line (`prefix` + name), else the defaults."""
    given = {k: getattr(ns, prefix + k) for k in defaults}
    return {k: defaults[k] if v is None else v for k, v in given.items()}


FULL = {"files": 10_000, "mib": 1024, "rounds": 20, "forks": 10}
QUICK = {"files": 1000, "mib": 32, "rounds": 5, "forks": 3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sandbox_snapshots", description=__doc__)
    parser.add_argument("--engine", choices=[*ENGINES, "both"], default="both")
    parser.add_argument("--quick", action="store_true", help=f"a short run: {QUICK}")
    add_arguments(parser)
    ns = parser.parse_args(argv)
    chosen = sizes(ns, QUICK if ns.quick else FULL)
    if min(chosen.values()) < 1 or chosen["forks"] > 64:
        parser.error("sizes must be at least 1, and --forks at most 64")
    engines = ENGINES if ns.engine == "both" else (ns.engine,)
    return run(engines, **chosen)


if __name__ == "__main__":
    sys.exit(main())
