"""`python -m bench --smoke`: every section of `make bench`, on both engines, with tiny sizes
(seconds a section, not minutes), so that `make bench` cannot break unseen
(tests/integration/test_bench_smoke.py runs it inside `make test`). It asserts that each
section produced figures (no section's result holds an "error"), never that they meet their
targets: tiny samples say nothing of speed. Nothing is written to bench/results.json.

Where a section repeats one measurement over a list (the abuses of a neighbour, the attacks
on the fronts), the smoke keeps one of each list: the section's code path is the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

SIZES = {"n": 6, "cold": 1, "idle": 1, "load_keys": 2, "load_calls": 3, "audit_records": 1000}
"""The sizes of `--smoke` (as `--quick`'s, in parse_args)."""
WARMUP = 1
ROUNDS = 2
LISTENER = {"requests": 20, "rounds": 1}
SNAPSHOTS = {"files": 20, "mib": 1, "rounds": 1, "forks": 1}
CHECKPOINTS = {"files": 20, "mib": 1, "rounds": 1}
BROKERED = {"n": 10, "mb": 1}
LOAD_WIDE = {"keys": 3, "calls": 2}
DENSITY = {"sandboxes": 3, "calls": 10}
AUDIT = {"calls": 50, "queries": 3}
CHAIN = {"n": 200, "replayed": 1000}
CONSOLE_PAGES = {"sandboxes": 100, "reads": 2}
"""100 sandboxes: the page of one sandbox reads t3/k3, the 34th (bench/console_cost.py PAGES)."""
EGRESS_BYTES = 64 * 1024
"""The download and upload through the capped link (the full run's 8 MiB take 4 s each)."""
ABUSE = "cpu spin"
"""The one abuse of bench/abuse.py the smoke keeps up beside the quiet sandbox."""
ATTACK = "JSON nested 100,000 deep"
"""The one attack of bench/front_abuse.py (as tests/integration/test_bench_front_abuse.py)."""


def failures(record: Mapping[str, Any], path: str = "") -> Iterator[str]:
    """Where a result holds an "error" (a section that failed) or a count of failed calls
    ("errors" above 0: a load or density run), as dotted paths with the error:
    `podman.cold_start: RuntimeError: ...`."""
    for name, value in record.items():
        if not isinstance(value, Mapping):
            continue
        where = f"{path}.{name}" if path else str(name)
        if "error" in value and isinstance(value["error"], str):
            yield f"{where}: {value['error']}"
        elif isinstance(value.get("errors"), int) and value["errors"] > 0:
            # a load or density run whose calls failed: figures, but not of working calls
            first = value.get("first_errors") or []
            yield f"{where}: {value['errors']} call(s) failed, first: {first[:1]}"
        else:
            yield from failures(value, where)


def verdict(record: Mapping[str, Any], seconds: float) -> int:
    """The smoke run's exit status: 0 when every section produced figures, else 1 with the
    failed ones listed (on stdout, after the tables)."""
    failed = list(failures(record))
    print(f"\nsmoke run: {seconds:.0f} s, {len(failed)} section(s) without figures")
    for line in failed:
        print(f"  FAILED {line}")
    return 1 if failed else 0
