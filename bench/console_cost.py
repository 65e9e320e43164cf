"""The console's cost to tool calls when nobody has it open (issue 20: "no measurable cost"):
warm `exec true` through a supervisor serving `[console] listen` beside one without it.

Two `stockade serve` children at once, alike but for the console: the same engine, image,
tokens file (the console needs `[auth] tokens_file`, so both check a bearer token on every
call) and policy. No browser signs in: the console's port is open and idle. After a warm-up
on each, warm `exec true` goes to each in rounds that alternate (off, on, then on, off, ...:
bench.compare_stats.schedule), each round reading its supervisor's CPU time from /proc. The
figures are compare_stats's: each side's median, p90 and CPU per call, on/off pooled and per
pair of rounds with its 95% interval, and the verdict ("within noise" when the interval
holds 1.0).

Part of every `make bench` (`engines.<engine>.console` in bench/results.json), or alone:
`python -m bench --only console [--engine E] [--n N] [--rounds R]`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from bench import stockade_runs
from bench.compare import one_round
from bench.compare_stats import Round, compare, schedule, table
from bench.cpu import TICK
from bench.engines import bring_up
from bench.mcp_front import run_alone
from bench.served import Served, free_port, served
from bench.timing import progress
from stockade.client import Stockade

KEY = "bench-console"


@contextlib.contextmanager
def tokens_file() -> Iterator[tuple[Path, str]]:
    """A tokens file with one token (tenant "bench", an operator of the console)."""
    with tenants_file("bench") as (path, tokens):
        yield path, tokens["bench"]


@contextlib.contextmanager
def tenants_file(*tenants: str) -> Iterator[tuple[Path, dict[str, str]]]:
    """A private tokens file with one new token for each tenant: it and the tokens by
    tenant; removed after."""
    folder = Path(tempfile.mkdtemp(prefix="stkb-tokens-", dir="/tmp"))
    tokens = {tenant: secrets.token_hex(20) for tenant in tenants}
    path = folder / "tokens"
    path.write_text("".join(f"{token} {tenant}\n" for tenant, token in tokens.items()))
    path.chmod(0o600)
    try:
        yield path, tokens
    finally:
        path.unlink(missing_ok=True)
        folder.rmdir()


def measure(
    sups: dict[str, Served], token: str, rounds: int, calls: int, warmup: int
) -> dict[str, list[Round]]:
    measured: dict[str, list[Round]] = {side: [] for side in sups}
    with (
        Stockade(sups["old"].target, token=token) as off,
        Stockade(sups["new"].target, token=token) as on,
    ):
        clients = {"old": off, "new": on}
        try:
            for client in clients.values():
                for _ in range(warmup):
                    stockade_runs.exec_true(client, KEY)
            for _, side in schedule(rounds):
                measured[side].append(one_round(clients[side], sups[side].pid, calls, KEY))
        finally:
            for client in clients.values():
                stockade_runs.destroy(client, KEY)
    return measured


def measure_engine(engine: str, n: int, rounds: int, warmup: int) -> dict[str, Any]:
    image = bring_up(engine)
    calls = max(n // rounds, 1)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    progress(f"{engine}: console off and on, {rounds} interleaved rounds of {calls} warm calls")
    with tokens_file() as (path, token):
        auth = f'[auth]\ntokens_file = "{path}"\n'
        common = f'[sandbox]\nimage = "{image}"\n'
        console = f'[console]\nlisten = "127.0.0.1:{free_port()}"\noperators = ["bench"]\n'
        with (
            served(engine, common, auth=auth) as off,
            served(engine, common + console, auth=auth) as on,
        ):
            measured = measure({"old": off, "new": on}, token, rounds, calls, warmup)
    return {
        "started_at": started,
        "image": image,
        "rounds": rounds,
        "calls_per_round": calls,
        "warmup": warmup,
        # the bench runs on a shared machine: how busy it was, 1/5/15-minute averages
        "load_average": {"before": load_before, "after": os.getloadavg()},
        **compare(measured["old"], measured["new"], TICK),
    }


def section(engine: str, result: dict[str, Any]) -> str:
    """The table `make bench` prints for one engine (compare_stats.table: its "old" side is
    the console off, "new" on)."""
    head = f"== {engine}: warm exec true, console off against on (nobody on it)"
    if "error" in result:
        return f"{head} ==\n  n/a: {result['error']}"
    lines = table(engine, {**result, "old_rev": "", "new_rev": ""}).splitlines()
    lines[0] = (
        f"{head}, {result['rounds']} interleaved rounds of {result['calls_per_round']} "
        "calls a side =="
    )
    lines[1] = lines[1].replace("     old", "     off").replace("     new", "      on")
    lines[1] = lines[1].replace(" new/old", "  on/off")
    return "\n".join(lines)


def run(engines: Sequence[str], n: int, rounds: int, warmup: int) -> int:
    """`python -m bench --only console`: measure, print, record under engines.<e>.console."""
    measure_one = partial(measure_engine, n=n, rounds=rounds, warmup=warmup)
    return run_alone(engines, measure_one, section, "console")
