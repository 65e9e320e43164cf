"""`python -m bench --compare REV`: this tree's supervisor against REV's, side by side.

REV is checked out into a temporary git worktree (removed after). Two `stockade serve`
children run at once, one from each tree (PYTHONPATH=<tree>/src, the same venv, engine and
sandbox image: this tree's image, named in both configs, since the agent is not what is
compared). After a warm-up, warm `exec true` is called in rounds that alternate between the
two (bench.compare_stats.schedule), and each round reads the supervisor's CPU time from /proc.
The printed table and bench/results.json ("compare") hold old, new, new/old and the noise.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import RESULTS, stockade_runs
from bench.compare_stats import Round, batches, compare, schedule, table
from bench.cpu import TICK, cpu_ticks
from bench.engines import bring_up
from bench.machine import machine_info
from bench.served import Served, served
from bench.timing import progress
from stockade.client import Stockade

TREE = Path(__file__).resolve().parents[1]
KEY = "bench-compare"


def git(*args: str, cwd: Path = TREE) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def resolve(rev: str) -> str:
    """REV's full commit hash; a clear error when it names no commit."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except RuntimeError:
        raise SystemExit(f"bench --compare: {rev!r} is no commit of {TREE}") from None


SUPERVISOR_CODE = ("supervisor", "client", "proto", "src", "sandbox_image")
"""What the supervisor runs from a tree: changes elsewhere (bench/, docs) do not count."""


def tree_label() -> str:
    """This tree's short hash, with "+changes" when its supervisor's code differs from it."""
    label = git("rev-parse", "--short", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no", "--", *SUPERVISOR_CODE)
    return label + "+changes" if changed else label


@contextlib.contextmanager
def checked_out(commit: str) -> Iterator[Path]:
    """A detached worktree of `commit` under /tmp, removed on exit."""
    parent = Path(tempfile.mkdtemp(prefix="stockade-compare-"))
    path = parent / "tree"
    git("worktree", "add", "--detach", str(path), commit)
    try:
        yield path
    finally:
        git("worktree", "remove", "--force", str(path))
        parent.rmdir()


def thread_ns(pid: int) -> int:
    """Run time of the live threads of `pid` in ns (first field of each task's schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total


def one_round(client: Stockade, pid: int, calls: int, key: str = KEY) -> Round:
    """`calls` warm `exec true` on `key`, timed, with the supervisor's CPU over them."""
    samples = []
    ticks, ns = cpu_ticks(pid)[0], thread_ns(pid)
    for _ in range(calls):
        started = time.perf_counter()
        stockade_runs.exec_true(client, key)
        samples.append(time.perf_counter() - started)
    return Round(tuple(samples), cpu_ticks(pid)[0] - ticks, thread_ns(pid) - ns)


def measure(
    sups: dict[str, Served], rounds: int, calls: int, warmup: int
) -> dict[str, list[Round]]:
    """Warm both sides up, then run the interleaved rounds."""
    measured: dict[str, list[Round]] = {side: [] for side in sups}
    with Stockade(sups["old"].target) as old, Stockade(sups["new"].target) as new:
        clients = {"old": old, "new": new}
        try:
            for client in clients.values():
                for _ in range(warmup):
                    stockade_runs.exec_true(client, KEY)
            for _, side in schedule(rounds):
                measured[side].append(one_round(clients[side], sups[side].pid, calls))
        finally:
            for client in clients.values():
                stockade_runs.destroy(client, KEY)
    return measured


def compare_engine(
    engine: str, old_tree: Path, rounds: int, calls: int, warmup: int
) -> dict[str, Any]:
    image = bring_up(engine)
    config = f'[sandbox]\nimage = "{image}"\n'
    progress(f"{engine}: {rounds} rounds of {calls} warm calls a side, old and new interleaved")
    with (
        served(engine, config, tree=old_tree) as old,
        served(engine, config, tree=TREE) as new,
    ):
        measured = measure({"old": old, "new": new}, rounds, calls, warmup)
    return {"image": image, **compare(measured["old"], measured["new"], TICK)}


def run(rev: str, engines: tuple[str, ...], n: int, rounds: int, warmup: int) -> int:
    """Compare REV with this tree on each engine; print and record the figures."""
    commit = resolve(rev)
    old_rev, new_rev = commit[:7], tree_label()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    calls = batches(n, rounds)
    by_engine: dict[str, Any] = {}
    with checked_out(commit) as old_tree:
        progress(f"{old_rev} checked out at {old_tree}")
        for engine in engines:
            try:
                result = compare_engine(engine, old_tree, rounds, calls, warmup)
            except Exception as exc:  # the other engine is still measured
                progress(f"{engine}: comparison failed: {type(exc).__name__}: {exc}")
                by_engine[engine] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            by_engine[engine] = {"old_rev": old_rev, "new_rev": new_rev, **result}
            print(table(engine, by_engine[engine]), end="\n\n", flush=True)
    record = {
        "started_at": started,
        "old_rev": old_rev,
        "new_rev": new_rev,
        "settings": {"n": n, "rounds": rounds, "calls_per_round": calls, "warmup": warmup},
        "machine": machine_info(engines),
        # the bench runs on a shared machine: how busy it was, 1/5/15-minute averages
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "engines": by_engine,
    }
    write_record(record)
    return 1 if any("error" in r for r in by_engine.values()) else 0


def write_record(record: dict[str, Any], path: Path = RESULTS) -> None:
    """Put the comparison under "compare" in bench/results.json, keeping the rest."""
    write_results({**read_results(path), "compare": record}, path)
    progress(f'comparison written to {path} ("compare")')


def write_full_run(record: dict[str, Any], path: Path = RESULTS) -> None:
    """Write a full `python -m bench` run's record, keeping the last comparison."""
    if "compare" in (previous := read_results(path)):
        record = {**record, "compare": previous["compare"]}
    write_results(record, path)
    progress(f"results written to {path}")


def read_results(path: Path) -> dict[str, Any]:
    """The record in `path`; {} when there is none (no file, no JSON, no object)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def write_results(record: dict[str, Any], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
