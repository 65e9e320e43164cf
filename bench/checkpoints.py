"""What a checkpoint adds to a call (issue 31, docs/undo.md): one `stockade serve` per engine
with two tenants, `on` ([checkpoints] on for write_file) and `off` (tenants.off checkpoints =
false), each with a sandbox whose workspace holds `files` files totalling `mib` MiB (filled
from the host as the sandbox user's ids, as bench/sandbox_snapshots.py does). A first
write_file of `on` takes the full checkpoint; then `rounds` rounds, each rewriting 1% of the
files of both workspaces and timing one write_file of each tenant. The figure is the median
of on's call minus the median of off's (target <= 50 ms), the p90s beside.

Alone: `python -m bench.checkpoints [--engine E] [--files N] [--mib M] [--rounds R]` or
`python -m bench --only checkpoints`, which put the figures under
engines.<engine>.checkpoints in bench/results.json and keep the rest of the record.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import secrets
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import RESULTS
from bench.compare import read_results, write_results
from bench.compare_stats import nearest_rank
from bench.engines import ENGINES, bring_up
from bench.sandbox_snapshots import fill, rewrite
from bench.served import served
from bench.stockade_runs import destroy, exec_true
from bench.timing import progress
from stockade.client import Stockade

KEY = "bench-ckpt"
TARGET_MS = 50.0
CONFIG = '[checkpoints]\nenabled = true\nbefore = ["overwrite"]\nkeep = 1000\nmax_mb = 0\n'
TENANTS = "[tenants.off]\ncheckpoints = false\n"
FULL = {"files": 10_000, "mib": 100, "rounds": 20}
QUICK = {"files": 1000, "mib": 8, "rounds": 5}


def figures(on: Sequence[float], off: Sequence[float]) -> dict[str, Any]:
    """The calls' median and p90 in ms, with and without a checkpoint, and what it adds."""
    on_ms, off_ms = [s * 1000 for s in on], [s * 1000 for s in off]
    extra = statistics.median(on_ms) - statistics.median(off_ms)
    return {
        "rounds": len(on_ms),
        "with_median_ms": round(statistics.median(on_ms), 2),
        "with_p90_ms": round(nearest_rank(on_ms, 0.9), 2),
        "without_median_ms": round(statistics.median(off_ms), 2),
        "without_p90_ms": round(nearest_rank(off_ms, 0.9), 2),
        "extra_median_ms": round(extra, 2),
        "target_ms": TARGET_MS,
        "met": extra <= TARGET_MS,
    }


@contextlib.contextmanager
def two_tenants() -> Iterator[tuple[str, dict[str, str]]]:
    """An [auth] table naming a tokens file of the tenants on and off, and their tokens."""
    folder = Path(tempfile.mkdtemp(prefix="stkckpt", dir="/tmp"))
    tokens = {name: secrets.token_hex(16) for name in ("on", "off")}
    path = folder / "tokens"
    path.write_text("".join(f"{token} {name}\n" for name, token in tokens.items()))
    path.chmod(0o600)
    try:
        yield f'[auth]\ntokens_file = "{path}"\n', tokens
    finally:
        path.unlink(missing_ok=True)
        folder.rmdir()


def timed_write(client: Stockade, n: int) -> float:
    started = time.perf_counter()
    client.sandbox(KEY).write_file("bench-note.txt", f"round {n}\n")
    return time.perf_counter() - started


def measure_engine(
    engine: str, files: int, mib: int, rounds: int, freeze: bool = True
) -> dict[str, Any]:
    """freeze=False: [checkpoints] freeze = false (no engine pause around the pass)."""
    bring_up(engine)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    config = CONFIG + ("" if freeze else "freeze = false\n") + TENANTS
    with (
        two_tenants() as (auth, tokens),
        served(engine, config, auth=auth) as sup,
        Stockade(sup.target, token=tokens["on"]) as on,
        Stockade(sup.target, token=tokens["off"]) as off,
    ):
        trees = {}
        try:
            for name, client in (("on", on), ("off", off)):
                exec_true(client, KEY)
                workspace = Path(client.sandbox(KEY).info().workspace_path)
                progress(f"{engine}: filling {name}'s workspace: {files:,} files, {mib} MiB")
                trees[name] = fill(workspace, files, mib << 20, random.Random(31))
            first = timed_write(on, 0)  # the full checkpoint
            progress(f"{engine}: the first checkpoint (every file): {first:.2f} s")
            samples: dict[str, list[float]] = {"on": [], "off": []}
            for n in range(1, rounds + 1):
                for name, client in (("on", on), ("off", off)):
                    rewrite(trees[name], random.Random(n))
                    samples[name].append(timed_write(client, n))
            out = figures(samples["on"], samples["off"])
        finally:
            destroy(on, KEY)
            destroy(off, KEY)
    progress(f"{engine}: {out}")
    return {
        "started_at": started, "files": files, "mib": mib, "freeze": freeze,
        "first_s": round(first, 3), **out,
    }  # fmt: skip


def section(engine: str, result: dict[str, Any]) -> str:
    head = f"== {engine}: a checkpoint before a call =="
    if "error" in result:
        return f"{head}\n  n/a: {result['error']}"
    verdict = "met" if result["met"] else "MISSED"
    return "\n".join(
        [
            f"== {engine}: write_file with and without a checkpoint, {result['files']:,} files "
            f"({result['mib']} MiB), 1% changed before each"
            + ("" if result.get("freeze", True) else ", no freeze")
            + " ==",
            f"  {'':36}{'median':>9}{'p90':>9}   ({result['rounds']} rounds, ms)",
            f"  {'with a checkpoint':36}{result['with_median_ms']:>9.2f}"
            f"{result['with_p90_ms']:>9.2f}",
            f"  {'without':36}{result['without_median_ms']:>9.2f}{result['without_p90_ms']:>9.2f}",
            f"  the checkpoint adds {result['extra_median_ms']:.2f} ms (median)   target <= "
            f"{result['target_ms']:g} ms   {verdict}",
            f"  the first checkpoint (every file read): {result['first_s']:.2f} s",
        ]
    )


def write(by_engine: dict[str, dict[str, Any]], path: Path = RESULTS) -> None:
    """Put each engine's figures under engines.<engine>.checkpoints, keeping the rest."""
    record = read_results(path)
    engines = record.get("engines")
    engines = dict(engines) if isinstance(engines, dict) else {}
    for engine, result in by_engine.items():
        previous = engines.get(engine)
        engines[engine] = {
            **(previous if isinstance(previous, dict) else {}), "checkpoints": result,
        }  # fmt: skip
    write_results({**record, "engines": engines}, path)
    progress(f'checkpoint figures written to {path} ("engines.<engine>.checkpoints")')


def run(engines: Sequence[str], files: int, mib: int, rounds: int, freeze: bool = True) -> int:
    by_engine: dict[str, dict[str, Any]] = {}
    for engine in engines:
        try:
            by_engine[engine] = measure_engine(engine, files, mib, rounds, freeze)
        except Exception as exc:  # the other engine is still measured
            progress(f"{engine}: checkpoint measurement failed: {type(exc).__name__}: {exc}")
            by_engine[engine] = {"error": f"{type(exc).__name__}: {exc}"}
        print(section(engine, by_engine[engine]), end="\n\n", flush=True)
    write(by_engine)
    return 1 if any("error" in r for r in by_engine.values()) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoints", description=__doc__)
    parser.add_argument("--engine", choices=[*ENGINES, "both"], default="both")
    parser.add_argument("--quick", action="store_true", help=f"a short run: {QUICK}")
    parser.add_argument("--files", type=int, help=f"files in each workspace ({FULL['files']})")
    parser.add_argument("--mib", type=int, help=f"MiB in them ({FULL['mib']})")
    parser.add_argument("--rounds", type=int, help=f"timed calls per tenant ({FULL['rounds']})")
    parser.add_argument(
        "--no-freeze", action="store_true", help="[checkpoints] freeze = false: no engine pause"
    )
    ns = parser.parse_args(argv)
    defaults = QUICK if ns.quick else FULL
    chosen = {k: defaults[k] if getattr(ns, k) is None else getattr(ns, k) for k in defaults}
    if min(chosen.values()) < 1:
        parser.error("sizes must be at least 1")
    engines = ENGINES if ns.engine == "both" else (ns.engine,)
    return run(engines, **chosen, freeze=not ns.no_freeze)


if __name__ == "__main__":
    raise SystemExit(main())
