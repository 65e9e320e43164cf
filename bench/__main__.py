"""`python -m bench [--engine podman|docker|both] [--n N] [--quick]`, or
`python -m bench --compare REV [--engine E] [--n N] [--rounds R]` for this tree's supervisor
against REV's, side by side (bench/compare.py), or `python -m bench --only mcp [--engine E]
[--n N] [--rounds R]` for the MCP front against gRPC alone (bench/mcp_front.py), or
`python -m bench --only snapshots [--engine E] [--snap-files N] [--snap-mib M]
[--snap-rounds R] [--snap-forks F]` for pause, resume, snapshots, restore and forks through
the supervisor alone (bench/sandbox_snapshots.py), or `python -m bench --only e2b [--engine E]
[--n N] [--rounds R]` for the E2B front's commands.run against gRPC (bench/e2b_front.py), or
`python -m bench --only console [--engine E] [--n N] [--rounds R]` for warm calls through a
supervisor with the console on (nobody on it) against one without (bench/console_cost.py), or
`python -m bench --only listener [--listener-requests N] [--listener-rounds R]` for plain
uvicorn against the hardened HTTP listener, no engine (bench/listener.py), or `python -m bench
--only front-abuse [--engine E] [--n N]` for another tenant's warm calls while one attacks the
HTTP fronts (bench/front_abuse.py), or `python -m bench --only checkpoints [--engine E]` for
what a checkpoint adds to a call (bench/checkpoints.py)."""

from __future__ import annotations

import argparse
import secrets
import signal
import sys
import time
from datetime import UTC, datetime
from typing import Any, NoReturn

from bench import (
    abuse,
    audit,
    audit_chain,
    brokered,
    checkpoints,
    coldstart,
    compare,
    console_cost,
    cpu,
    density,
    e2b_front,
    egress,
    front_abuse,
    listener,
    load,
    mcp_front,
    peers,
    report,
    sandbox_snapshots,
    smoke,
    stockade_runs,
)
from bench.compare_stats import batches
from bench.engines import ENGINES, bring_up, remove_labelled
from bench.guard import run_guard_bench
from bench.guard import section as guard_section
from bench.machine import machine_info
from bench.pipeline import host_section, run_pipeline_bench
from bench.scrub import run_scrub_bench
from bench.served import served
from bench.timing import guarded, progress
from stockade.client import Stockade

NO_USERNS = "[sandbox]\nuser_namespace = false\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--engine", choices=[*ENGINES, "both"], default="both")
    parser.add_argument("--n", type=int, help="warm iterations per measurement (default 300)")
    parser.add_argument("--cold", type=int, help="cold starts (default 10)")
    parser.add_argument("--idle", type=int, help="idle sandboxes for memory (default 5)")
    parser.add_argument("--load-keys", type=int, help="keys in the load run (default 50)")
    parser.add_argument("--load-calls", type=int, help="mixed calls per key (default 200)")
    parser.add_argument(
        "--load-wide",
        type=int,
        default=0,
        metavar="KEYS",
        help="also a load run over this many keys, e.g. 500 (default 0: none)",
    )
    parser.add_argument(
        "--load-wide-calls", type=int, default=20, help="mixed calls per key of it (default 20)"
    )
    parser.add_argument(
        "--density",
        type=int,
        default=0,
        metavar="N",
        help="also N idle sandboxes, then warm calls on random ones, e.g. 300 (default 0: none)",
    )
    parser.add_argument(
        "--density-calls",
        type=int,
        default=density.CALLS,
        help=f"warm calls of the density run (default {density.CALLS})",
    )
    parser.add_argument(
        "--audit-records", type=int, help="records in the full audit log (default 1,000,000)"
    )
    parser.add_argument(
        "--compare",
        metavar="REV",
        help="only compare warm exec and supervisor CPU of REV's supervisor with this tree's",
    )
    parser.add_argument(
        "--only",
        choices=[
            "mcp",
            "snapshots",
            "e2b",
            "console",
            "console-pages",
            "listener",
            "front-abuse",
            "session",
            "checkpoints",
        ],
        help="only one measurement: mcp, the MCP front against gRPC (bench/mcp_front.py); "
        "snapshots, pause/resume, snapshots, restore and forks (bench/sandbox_snapshots.py); "
        "e2b, the E2B front's commands.run against gRPC (bench/e2b_front.py); console, warm "
        "calls with the console on and off (bench/console_cost.py); console-pages, the console's "
        "pages with 1,000 sandboxes and --audit-records records, no engine "
        "(bench/console_cost.py); listener, plain uvicorn "
        "against the hardened HTTP listener, no engine (bench/listener.py); front-abuse, another "
        "tenant's warm calls while one attacks the HTTP fronts (bench/front_abuse.py); session, "
        "warm exec in a shell session beside a plain one (bench/stockade_runs.py); "
        "checkpoints, a call with a checkpoint against one without (bench/checkpoints.py)",
    )
    sandbox_snapshots.add_arguments(parser, "snap-")
    parser.add_argument(
        "--listener-requests",
        type=int,
        help=f"requests a round, side and app of the listener's measurement (default "
        f"{listener.REQUESTS}; --quick {listener.QUICK_REQUESTS})",
    )
    parser.add_argument(
        "--listener-rounds",
        type=int,
        default=listener.ROUNDS,
        help=f"interleaved rounds of the listener's measurement (default {listener.ROUNDS})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=10,
        help="interleaved rounds of --compare and of the MCP and E2B measurements (default 10)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run: n=30, cold=3, idle=2, load 10x50, audit log of 100,000, "
        "snapshots of 1,000 files in 32 MiB",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="every section with tiny sizes, asserting each produced figures, not their targets "
        "(bench/smoke.py; tests/integration/test_bench_smoke.py runs it in `make test`)",
    )
    ns = parser.parse_args(argv)
    if ns.smoke and (ns.quick or ns.compare is not None or ns.only is not None):
        parser.error("--smoke is a run of its own: not with --quick, --compare or --only")
    quick = smoke.SIZES if ns.smoke else (
        {"n": 30, "cold": 3, "idle": 2, "load_keys": 10, "load_calls": 50, "audit_records": 10**5}
        if ns.quick
        else {"n": 300, "cold": 10, "idle": 5, "load_keys": 50, "load_calls": 200,
              "audit_records": 10**6}
    )  # fmt: skip
    if ns.compare is not None and ns.only is not None:
        parser.error("--compare and --only are two different runs: one at a time")
    if ns.rounds < 1 or ns.listener_rounds < 1:
        parser.error("--rounds and --listener-rounds must be at least 1")
    if ns.listener_requests is None:
        ns.listener_requests = listener.QUICK_REQUESTS if ns.quick else listener.REQUESTS
    if ns.listener_requests < 1:
        parser.error("--listener-requests must be at least 1")
    if min(ns.load_wide, ns.density) < 0 or min(ns.load_wide_calls, ns.density_calls) < 1:
        parser.error("--load-wide and --density must be 0 (none) or more, their calls at least 1")
    for name, default in quick.items():
        if getattr(ns, name) is None:
            setattr(ns, name, default)
        if getattr(ns, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    ns.warmup = smoke.WARMUP if ns.smoke else min(max(ns.n // 10, 5), 30)
    sizes = sandbox_snapshots.QUICK if ns.quick else sandbox_snapshots.FULL
    ns.snap = sandbox_snapshots.sizes(ns, smoke.SNAPSHOTS if ns.smoke else sizes, "snap_")
    ns.checkpoints = checkpoints.QUICK if ns.quick else checkpoints.FULL
    if ns.smoke:
        ns.load_wide, ns.load_wide_calls = smoke.LOAD_WIDE["keys"], smoke.LOAD_WIDE["calls"]
        ns.density, ns.density_calls = smoke.DENSITY["sandboxes"], smoke.DENSITY["calls"]
        ns.checkpoints = smoke.CHECKPOINTS
        ns.rounds = smoke.ROUNDS
        ns.listener_requests = smoke.LISTENER["requests"]
        ns.listener_rounds = smoke.LISTENER["rounds"]
    if min(ns.snap.values()) < 1 or ns.snap["forks"] > 64:
        parser.error("--snap-* sizes must be at least 1, and --snap-forks at most 64")
    if ns.compare is not None:
        try:
            batches(ns.n, ns.rounds)
        except ValueError as exc:
            parser.error(str(exc))
    return ns


def bench_engine(engine: str, ns: argparse.Namespace, run_id: str) -> dict[str, Any]:
    """Everything for one engine. Stockade is measured first, then stopped, then the peers:
    each runs alone on the machine, and Podman's exec conmons (llm-sandbox) come last."""
    image = bring_up(engine)
    results: dict[str, Any] = {"image": image}
    with served(engine) as sup, Stockade(sup.target) as client:
        results["health"] = guarded(
            f"{engine}: gRPC health floor",
            lambda: stockade_runs.health_floor(sup.target, ns.n, ns.warmup),
        )
        results["idle_memory"] = guarded(
            f"{engine}: memory of {ns.idle} idle sandboxes",
            lambda: stockade_runs.idle_memory(client, ns.idle),
        )
        results["cold_start"] = guarded(
            f"{engine}: {ns.cold} cold starts",
            lambda: coldstart.cold_starts(client, ns.cold, pooled=False, log=sup.log),
        )
        results["stockade_warm"] = guarded(
            f"{engine}: Stockade warm exec",
            lambda: stockade_runs.warm_exec(client, ns.n, ns.warmup),
        )
        results["supervisor_cpu"] = guarded(
            f"{engine}: supervisor CPU per warm exec true",
            lambda: cpu.supervisor_cpu(sup, client, max(ns.n, 200), ns.warmup),
        )
        results["session_exec"] = guarded(
            f"{engine}: exec true in a shell session beside a plain one",
            lambda: stockade_runs.session_exec(client, ns.n, ns.warmup),
        )
        results["load"] = guarded(
            f"{engine}: load, {ns.load_keys} keys x {ns.load_calls} mixed calls",
            lambda: load.run_load(sup.target, keys=ns.load_keys, calls=ns.load_calls),
        )
        if ns.load_wide:
            results["load_wide"] = guarded(
                f"{engine}: load, {ns.load_wide} keys x {ns.load_wide_calls} mixed calls",
                lambda: load.run_load(
                    sup.target, keys=ns.load_wide, calls=ns.load_wide_calls, prefix="wide"
                ),
            )
        if ns.density:
            results["density"] = guarded(
                f"{engine}: density, {ns.density} idle sandboxes and {ns.density_calls} calls",
                lambda: density.run_density(client, sup.target, ns.density, ns.density_calls),
            )
        results["interact_line"] = guarded(
            f"{engine}: Stockade Interact line echo",
            lambda: stockade_runs.interact_line(client, ns.n, ns.warmup),
        )
    # a supervisor of its own, serving MCP too; alone on the machine as the one above was
    results["mcp"] = guarded(
        f"{engine}: MCP against gRPC",
        lambda: mcp_front.measure_engine(engine, ns.n, ns.rounds, ns.warmup),
    )
    results["e2b"] = guarded(
        f"{engine}: E2B against gRPC",
        lambda: e2b_front.measure_engine(engine, ns.n, ns.rounds, ns.warmup),
    )
    results["console"] = guarded(
        f"{engine}: console on against off",
        lambda: console_cost.measure_engine(engine, ns.n, ns.rounds, ns.warmup),
    )
    results["snapshots"] = guarded(
        f"{engine}: sandbox snapshots ({ns.snap['files']:,} files, {ns.snap['mib']} MiB)",
        lambda: sandbox_snapshots.measure_engine(engine, **ns.snap),
    )
    results["checkpoints"] = guarded(
        f"{engine}: a checkpoint before a call ({ns.checkpoints['files']:,} files)",
        lambda: checkpoints.measure_engine(engine, **ns.checkpoints),
    )
    if engine == "podman":  # the default gives each sandbox a user namespace: its cost
        with served(engine, NO_USERNS) as sup, Stockade(sup.target) as client:
            results["cold_start_no_userns"] = guarded(
                f"{engine}: {ns.cold} cold starts without a user namespace",
                lambda: coldstart.cold_starts(client, ns.cold, pooled=False, log=sup.log),
            )
            results["stockade_warm_no_userns"] = guarded(
                f"{engine}: Stockade warm exec without a user namespace",
                lambda: stockade_runs.warm_exec(client, ns.n, ns.warmup),
            )
    with served(engine, coldstart.POOL_CONFIG) as sup, Stockade(sup.target) as client:
        results["cold_start_pool"] = guarded(
            f"{engine}: {ns.cold} cold starts with a warm pool",
            lambda: coldstart.cold_starts(client, ns.cold, pooled=True),
        )
    results["egress"] = guarded(
        f"{engine}: egress bandwidth cap and proxy",
        lambda: egress.egress(engine, ns.n, smoke.EGRESS_BYTES if ns.smoke else egress.SIZE),
    )
    with served(engine, abuse.CONFIG) as sup, Stockade(sup.target) as client:
        results["neighbour_abuse"] = guarded(
            f"{engine}: a quiet sandbox's latency while another abuses",
            lambda: abuse.neighbour_latency(
                client, ns.n, ns.warmup, [smoke.ABUSE] if ns.smoke else tuple(abuse.ABUSES)
            ),
        )
    results["front_abuse"] = guarded(
        f"{engine}: another tenant's calls while one attacks the HTTP fronts",
        lambda: front_abuse.measure_engine(
            engine, ns.n, ns.warmup, [smoke.ATTACK] if ns.smoke else tuple(front_abuse.ATTACKS)
        ),
    )
    results["python_floor"] = guarded(
        f"{engine}: memory of an idle python3 in a container (the agent's floor)",
        lambda: peers.python_floor(engine, image, run_id),
    )
    results["engine_cli"] = guarded(
        f"{engine}: {engine} exec CLI",
        lambda: peers.cli_exec(engine, image, run_id, ns.n, ns.warmup),
    )
    results["llm_sandbox"] = guarded(
        f"{engine}: llm-sandbox",
        lambda: peers.llm_sandbox_exec(engine, image, run_id, ns.n, ns.warmup),
    )
    results["ratios"] = report.ratios(results)
    return results


SH_PROFILE = '[profiles.dash]\nshell = "sh"\n'
"""A profile whose commands run under sh (dash), for `--only session`'s third side."""


def session_only(engines: tuple[str, ...], n: int, warmup: int) -> int:
    """`--only session`: a warm exec in a shell session beside a plain one, per engine."""
    for engine in engines:
        bring_up(engine)
        with served(engine, SH_PROFILE) as sup, Stockade(sup.target) as client:
            result = guarded(
                f"{engine}: exec true in a shell session beside a plain one, and under sh",
                lambda: stockade_runs.session_exec(client, n, warmup, sh_profile="dash"),
            )
        print(report.session_section(engine, result))
    return 0


def brokered_sizes(ns: argparse.Namespace) -> tuple[int, int]:
    """Requests each way and the download's MB of the brokered-credentials measurement."""
    if ns.smoke:
        return smoke.BROKERED["n"], smoke.BROKERED["mb"]
    return ns.n, 50 if ns.quick else 200


def _terminate(signum: int, _frame: object) -> NoReturn:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)  # clean up on kill as on Ctrl-C
    engines = ENGINES if ns.engine == "both" else (ns.engine,)
    if ns.compare is not None or ns.only is not None:
        try:
            if ns.compare is not None:
                return compare.run(ns.compare, engines, ns.n, ns.rounds, ns.warmup)
            if ns.only == "snapshots":
                return sandbox_snapshots.run(engines, **ns.snap)
            if ns.only == "checkpoints":
                return checkpoints.run(engines, **ns.checkpoints)
            if ns.only == "console":
                return console_cost.run(engines, ns.n, ns.rounds, ns.warmup)
            if ns.only == "console-pages":
                print(console_cost.pages_section(console_cost.measure_pages(ns.audit_records)))
                return 0
            if ns.only == "listener":
                return listener.run(ns.listener_requests, ns.listener_rounds)
            if ns.only == "front-abuse":
                return front_abuse.run(engines, ns.n, ns.warmup)
            if ns.only == "session":
                return session_only(engines, ns.n, ns.warmup)
            if ns.only == "e2b":
                return e2b_front.run(engines, ns.n, ns.rounds, ns.warmup)
            return mcp_front.run(engines, ns.n, ns.rounds, ns.warmup)
        except KeyboardInterrupt:
            progress("interrupted; cleaning up")
            return 130
    run_id = secrets.token_hex(6)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    clock = time.monotonic()
    settings = {
        "n": ns.n, "warmup": ns.warmup, "cold": ns.cold, "idle": ns.idle, "quick": ns.quick,
        "load_keys": ns.load_keys, "load_calls": ns.load_calls, "audit_records": ns.audit_records,
        "rounds": ns.rounds, "snapshots": ns.snap, "checkpoints": ns.checkpoints,
        "smoke": ns.smoke, "load_wide": ns.load_wide, "load_wide_calls": ns.load_wide_calls,
        "density": ns.density, "density_calls": ns.density_calls,
        "listener_requests": ns.listener_requests, "listener_rounds": ns.listener_rounds,
    }  # fmt: skip
    by_engine: dict[str, Any] = {}
    progress("host-side pipeline, scrubber and guard corpora")
    host = {"pipeline": run_pipeline_bench(), "scrub": run_scrub_bench()}
    host["guard"] = run_guard_bench()
    host["brokered"] = guarded(
        "brokered credentials: the intercepting egress proxy",
        lambda: brokered.run_brokered_bench(*brokered_sizes(ns)),
    )
    host["audit"] = guarded(
        f"audit log of {ns.audit_records:,} records",
        lambda: audit.run_audit_bench(ns.audit_records, **(smoke.AUDIT if ns.smoke else {})),
    )
    host["audit_chain"] = guarded(
        "audit hash chain and policy replay",
        lambda: audit_chain.run_chain_bench(**(smoke.CHAIN if ns.smoke else {})),
    )
    host["console_pages"] = guarded(
        f"the console's pages, {console_cost.PAGE_SANDBOXES:,} sandboxes and "
        f"{ns.audit_records:,} audit records",
        lambda: console_cost.measure_pages(
            ns.audit_records, **(smoke.CONSOLE_PAGES if ns.smoke else {})
        ),
    )
    host["listener"] = guarded(
        listener.what(ns.listener_requests, ns.listener_rounds),
        lambda: listener.measure(ns.listener_requests, ns.listener_rounds),
    )
    try:
        for engine in engines:
            by_engine[engine] = bench_engine(engine, ns, run_id)
    except KeyboardInterrupt:
        progress("interrupted; cleaning up")
        return 130
    finally:
        for engine in engines:
            if left := remove_labelled(engine, run_id):
                progress(f"removed {left} leftover {engine} container(s)")
    machine = machine_info(engines)
    print(report.header(machine, settings), end="\n\n")
    print(host_section(host["pipeline"], host["scrub"]), end="\n\n")
    print(guard_section(host["guard"]), end="\n\n")
    print(brokered.section(host["brokered"]), end="\n\n")
    print(audit.printed(host["audit"]), end="\n\n")
    print(audit_chain.section(host["audit_chain"]), end="\n\n")
    print(console_cost.pages_section(host["console_pages"]), end="\n\n")
    print(listener.section(host["listener"]), end="\n\n")
    for engine, results in by_engine.items():
        print(report.engine_section(engine, results), end="\n\n")
        print(coldstart.stages_section(engine, results), end="\n\n")
        if "load_wide" in results:
            print(report.load_section(engine, results["load_wide"]), end="\n\n")
        if "density" in results:
            print(density.section(engine, results["density"]), end="\n\n")
        print(abuse.section(engine, results["neighbour_abuse"]), end="\n\n")
        print(front_abuse.section(engine, results["front_abuse"]), end="\n\n")
        print(mcp_front.section(engine, results["mcp"]), end="\n\n")
        print(e2b_front.section(engine, results["e2b"]), end="\n\n")
        print(console_cost.section(engine, results["console"]), end="\n\n")
        print(sandbox_snapshots.section(engine, results["snapshots"]), end="\n\n")
        print(checkpoints.section(engine, results["checkpoints"]), end="\n\n")
    print(report.summary(by_engine))
    record = {
        "started_at": started,
        "machine": machine,
        "settings": settings,
        "host": host,
        "engines": by_engine,
    }
    if ns.smoke:
        return smoke.verdict(record, time.monotonic() - clock)
    compare.write_full_run(record)  # --compare's figures stay
    return 0


if __name__ == "__main__":
    sys.exit(main())
