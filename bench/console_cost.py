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
import shutil
import tempfile
import time
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
from bench.timing import progress, summarize
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


# The console's pages on a large installation (issue 32): no engine, no container.

PAGE_SANDBOXES = 1000
PAGE_RECORDS = 1_000_000
PAGE_READS = 20
PAGE_TENANTS = 10
PAGE_BUDGET_MS = 100.0
PAGE_STATES = (("RUNNING", 900), ("PAUSED", 50), ("BROKEN", 20), ("EXITED", 20), ("ABSENT", 10))
"""How the sandboxes of the page bench are spread over the states (per 1,000)."""
PAGE_QUARANTINED = 5
SPAN_S = 7 * 86400.0
PAGES = (
    ("overview, 1 h", "/overview"),
    ("overview, 7 d", "/overview?window=7d"),
    ("overview.json", "/overview.json?window=24h"),
    ("sandboxes", "/sandboxes"),
    ("sandboxes.json", "/sandboxes.json"),
    ("sandboxes, PAUSED", "/sandboxes?state=PAUSED"),
    ("a sandbox", "/sandbox?tenant=t3&key=k3"),
    ("quarantine", "/quarantines"),
    ("approvals", "/approvals"),
    ("audit, all tenants", "/audit"),
    ("audit, t1 refused", "/audit?tenant=t1&outcome=refused"),
    ("audit record", "/audit/record?tenant=t1&id=RECORD"),
)


def fill_audit(path: Path, count: int) -> float:
    """`count` records of the last week, oldest first, written by SQLite itself (a recursive
    CTE, one INSERT ... SELECT: no Python per record; its "random" draws are hashes of the
    record's number, the same at every run), ten tenants; mostly exec and file
    calls, 1% network and housekeeping, 1% alarms, 5% refused or failed (guard, rate limit,
    approval, exit code). Returns the seconds it took."""
    from stockade.supervisor import database
    from stockade.supervisor.observe.audit import COLUMNS

    now = time.time()
    values = {
        "time": f"{now - SPAN_S} + {SPAN_S} * i / {max(count, 1)}",
        "request_id": "printf('%016x', i)",
        "caller": "'token:bench'",
        "sandbox_key": f"'k' || (i % {PAGE_SANDBOXES // PAGE_TENANTS})",
        "agent_id": "'agent-' || (r1 % 20)",
        "provider": "'anthropic'",
        "tool": "CASE WHEN r1 < 60 THEN 'exec' WHEN r1 < 75 THEN 'read_file' "
        "WHEN r1 < 85 THEN 'write_file' WHEN r1 < 97 THEN 'grep' WHEN r1 < 98 THEN 'network' "
        "WHEN r1 < 99 THEN 'alarm' ELSE 'housekeeping' END",
        "arguments_json": "'{\"command\": \"pytest -q tests/unit/test_' || (i % 400) || '.py\"}'",
        "policy_step": "CASE WHEN r2 = 1 THEN 'limits.rate' ELSE 'allowed' END",
        "guard_rule": "CASE WHEN r2 = 0 THEN 'rm-root' ELSE '' END",
        "approval": "CASE WHEN r2 = 2 THEN 'deny' ELSE '' END",
        "duration_ms": "r3",
        "exit_code": "CASE WHEN r2 = 3 THEN 1 ELSE 0 END",
        "redactions": "CASE WHEN r1 = 7 THEN 1 ELSE 0 END",
        "error_code": "CASE r2 WHEN 0 THEN 'PERMISSION_DENIED' WHEN 1 THEN 'RATE_LIMITED' "
        "WHEN 2 THEN 'APPROVAL_DENIED' WHEN 3 THEN 'EXIT_NONZERO' WHEN 4 THEN 'TIMEOUT' "
        "ELSE '' END",
        "is_error": "CASE WHEN r2 < 5 THEN 1 ELSE 0 END",
        "tenant": f"'t' || (i % {PAGE_TENANTS})",
        "front": "'grpc'",
    }
    numbers = {"output_bytes", "exit_code", "duration_ms", "redactions", "is_error"}
    select = ", ".join(values.get(c, "0" if c in numbers else "''") for c in COLUMNS)
    sql = (
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?), "
        "r AS (SELECT i, i * 2654435761 % 4294967291 % 100 AS r1, "
        "i * 48271 % 2147483647 % 100 AS r2, "
        "i * 69621 % 2147483647 % 100 + (i % 10 = 0) * (i * 16807 % 2147483647 % 900) AS r3 "
        "FROM n) "
        f"INSERT INTO audit ({', '.join(COLUMNS)}) SELECT {select} FROM r"
    )
    started = time.perf_counter()
    db = database.connect(path)
    try:
        with db:
            db.execute(sql, (count,))
    finally:
        db.close()
    return time.perf_counter() - started


class Held:
    """The quarantines the inventory holds (Quarantines' `held` and `list`)."""

    def __init__(self) -> None:
        self.held: dict[str, Any] = {}

    def list(self) -> list[Any]:
        return sorted(self.held.values(), key=lambda r: (r.since, r.key))


class Inventory:
    """The sandbox manager's inventory as the console reads it (list, get, the registry,
    state counts, the quarantines), for `count` sandboxes that are records, not containers:
    each "running" one names this process, so that a row's cgroup figures and a sandbox's
    processes are read from /proc as for a container's."""

    def __init__(self, config: Any, count: int) -> None:
        from types import SimpleNamespace

        from stockade.supervisor.keys import scope
        from stockade.supervisor.models import SandboxInfo, SandboxState
        from stockade.supervisor.sandboxes.quarantine import Quarantine

        self.config = config
        now = datetime.now(UTC)
        states = [s for s, n in PAGE_STATES for _ in range(n * count // 1000)]
        states += ["RUNNING"] * (count - len(states))
        self.infos: dict[str, SandboxInfo] = {}
        self.registry: dict[str, Any] = {}
        for i, state in enumerate(states):
            key = scope(f"t{i % PAGE_TENANTS}", f"k{i // PAGE_TENANTS}")
            running = state == "RUNNING"
            self.infos[key] = SandboxInfo(
                key=key, container_id=f"c{i}", container_name=f"stockade-{i}", engine="podman",
                image="bench", state=SandboxState(state), created_at=now, last_used_at=now,
                workspace_path=f"/w/{i}", network_mode="none",
            )  # fmt: skip
            if state != "ABSENT":  # a held sandbox: its state, its container's pid
                container = SimpleNamespace(running=running, pid=os.getpid() if running else 0)
                self.registry[key] = SimpleNamespace(state=SandboxState(state), info=container)
        self.quarantines = SimpleNamespace(
            held={}, list=lambda: list(self.quarantines.held.values())
        )
        for key in [k for k, i in self.infos.items() if i.state == "PAUSED"][:PAGE_QUARANTINED]:
            self.quarantines.held[key] = Quarantine(key, time.time(), frozen=True)

    def state_counts(self) -> dict[str, int]:
        counts = {s: 0 for s in ("RUNNING", "PAUSED", "BROKEN", "EXITED")}
        for held in self.registry.values():
            counts[held.state.name] += 1
        return counts

    async def list(self) -> list[Any]:
        return list(self.infos.values())

    async def get(self, key: str) -> Any:
        from stockade.supervisor.errors import SandboxNotFound

        if key not in self.infos:
            raise SandboxNotFound(f"no sandbox for key {key!r}")
        return self.infos[key]

    async def inspect_isolation(self, key: str) -> Any:
        raise NotImplementedError("records, not containers")


def measure_pages(
    records: int = PAGE_RECORDS, sandboxes: int = PAGE_SANDBOXES, reads: int = PAGE_READS
) -> dict[str, Any]:
    """Each page of PAGES read `reads` times (after one read) over loopback from a console
    serving `sandboxes` sandboxes and an audit log of `records` records; the trends' first
    fold of the log timed apart (done at the console's start, in the background)."""
    import asyncio
    import threading

    from stockade.supervisor.app import build_policy
    from stockade.supervisor.auth import Authenticator
    from stockade.supervisor.config import load_config
    from stockade.supervisor.fronts.console.context import ConsoleContext
    from stockade.supervisor.fronts.console.server import ConsoleFront

    with tenants_file("ops", *(f"t{i}" for i in range(PAGE_TENANTS))) as (tokens, by_tenant):
        state = Path(tempfile.mkdtemp(prefix="stkb-console-", dir="/tmp"))
        config = load_config(
            None,
            {
                "state_dir": str(state),
                "auth.tokens_file": str(tokens),
                "console.listen": "127.0.0.1:0",
                "console.operators": ["ops"],
            },
        )
        policy = build_policy(config)
        audit = policy.audit
        assert audit is not None
        progress(f"console pages: {records:,} audit records into the store")
        fill_s = fill_audit(audit._path, records)
        manager = Inventory(config, sandboxes)
        authenticator = Authenticator(config.auth)
        ctx = ConsoleContext(config, policy, authenticator, manager, None)
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        front: list[ConsoleFront] = []

        async def start() -> None:
            front.append(ConsoleFront(ctx))
            await front[0].start()
            ready.set()

        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        asyncio.run_coroutine_threadsafe(start(), loop).result(60)
        try:
            started = time.perf_counter()
            trends = ctx.trends
            assert trends is not None
            while trends._catching_up is None or trends._catching_up.is_alive():
                time.sleep(0.05)
            fold_s = time.perf_counter() - started
            base = f"http://127.0.0.1:{front[0].port}"
            newest_of_t1 = records - (records - 2) % PAGE_TENANTS  # its id: i + 1, i % 10 == 1
            timed = read_pages(base, by_tenant["ops"], reads, newest_of_t1)
        finally:
            asyncio.run_coroutine_threadsafe(front[0].stop(1), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
            audit.close()
            shutil.rmtree(state, ignore_errors=True)
    return {
        "records": records,
        "sandboxes": sandboxes,
        "reads": reads,
        "fill_s": round(fill_s, 1),
        "first_fold_s": round(fold_s, 2),
        "pages": timed,
        "budget_ms": PAGE_BUDGET_MS,
        "not_met": [name for name, r in timed.items() if r["median_ms"] > PAGE_BUDGET_MS],
    }


def read_pages(base: str, token: str, reads: int, record_id: int) -> dict[str, Any]:
    import httpx

    with httpx.Client(base_url=base, follow_redirects=False, timeout=60) as client:
        answer = client.post("/login", data={"token": token}, headers={"origin": base})
        if answer.status_code != 303:
            raise RuntimeError(f"sign-in: {answer.status_code}")
        timed: dict[str, Any] = {}
        for name, path in PAGES:
            path = path.replace("RECORD", str(record_id))
            samples = []
            for i in range(reads + 1):
                started = time.perf_counter()
                answer = client.get(path)
                took = time.perf_counter() - started
                if answer.status_code != 200:
                    raise RuntimeError(f"{path}: {answer.status_code} {answer.text[:200]}")
                if i:
                    samples.append(took)
            timed[name] = {**summarize(samples), "bytes": len(answer.content)}
    return timed


def pages_section(result: dict[str, Any]) -> str:
    """The table `make bench` prints of the console's pages: each page's median and p95,
    met or not met (its median within the budget), and the pages not met."""
    head = "== console pages"
    if "error" in result:
        return f"{head} ==\n  n/a: {result['error']}"
    lines = [
        f"{head}: {result['sandboxes']:,} sandboxes, {result['records']:,} audit records "
        f"(filled in {result['fill_s']} s; the trends' first fold {result['first_fold_s']} s, "
        f"in the background), {result['reads']} reads a page ==",
        f"  {'page':<24}{'median ms':>10}{'p95 ms':>10}{'KiB':>8}  <= {result['budget_ms']:g} ms",
    ]
    for name, r in result["pages"].items():
        verdict = "not met" if name in result["not_met"] else "met"
        lines.append(
            f"  {name:<24}{r['median_ms']:>10.1f}{r['p95_ms']:>10.1f}"
            f"{r['bytes'] / 1024:>8.0f}  {verdict}"
        )
    missed = ", ".join(result["not_met"])
    lines.append(
        f"  every page's median <= {result['budget_ms']:g} ms: "
        + (f"not met ({missed})" if missed else "met")
    )
    return "\n".join(lines)
