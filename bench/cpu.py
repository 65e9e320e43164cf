"""CPU time per warm `exec true`, per process: `python -m bench.cpu [--engine E] [--n N]`.

Wall-clock medians swing with whatever else the machine runs; the CPU time each process
spends per call does much less. One sandbox is made and warmed up, then N calls are made
while the utime+stime of the supervisor, of the agent (its host pid: tini's child in the
container) and of the commands it reaped (the agent's cutime+cstime) are read before and
after, from /proc. The client's own CPU time is counted too. Prints one JSON object.
`--hold S` keeps calling for S more seconds afterwards (for py-spy or strace from outside),
printing the pids first.

Like `python -m bench`, it first builds the image that $STOCKADE_IMAGE_REF names (else the
shared localhost/stockade-sandbox:latest) when it is stale: to measure a changed agent, name
a tag of your own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import stockade_runs
from bench.engines import bring_up, cli
from bench.served import Served, served
from bench.timing import summarize
from stockade.client import Stockade

KEY = "bench-cpu"
IDLE_S = 5.0
TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(utime+stime, cutime+cstime) of `pid` (all its threads), in clock ticks."""
    return cpu_ticks_of(Path(f"/proc/{pid}/stat"))


def thread_ticks(pid: int) -> dict[str, int]:
    """utime+stime per thread name ("main" for the main thread; threads of one name added
    up), in clock ticks."""
    ticks: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = "main" if task.name == str(pid) else (task / "comm").read_text().strip()
            ticks[name] = ticks.get(name, 0) + cpu_ticks_of(task / "stat")[0]
        except OSError:  # a thread that ended meanwhile
            continue
    return ticks


def cpu_ticks_of(stat_path: Path) -> tuple[int, int]:
    # after "(comm) ", fields[0] is field 3 (state): utime is 14, stime 15, cutime 16, cstime 17
    stat = stat_path.read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def agent_pid(engine: str, state_dir: Path) -> int:
    """The host pid of the agent of KEY's sandbox in this instance: tini's only child."""
    instance = (state_dir / "instance-id").read_text().strip()
    found = cli(
        engine, "ps", "-q",
        "--filter", f"label=io.stockade.instance={instance}",
        "--filter", f"label=io.stockade.key={KEY}",
    ).stdout.split()  # fmt: skip
    if len(found) != 1:
        raise RuntimeError(f"expected one container for {KEY}, found {found}")
    tini = int(cli(engine, "inspect", "--format", "{{.State.Pid}}", found[0]).stdout.strip())
    children = Path(f"/proc/{tini}/task/{tini}/children").read_text().split()
    if len(children) != 1:
        raise RuntimeError(f"tini ({tini}) has children {children}, expected the agent alone")
    return int(children[0])


def supervisor_cpu(sup: Served, client: Stockade, n: int, warmup: int) -> dict[str, Any]:
    """`make bench`'s figure: the supervisor's CPU time per warm `exec true` (all its
    threads, from /proc, over n calls after `warmup`; its target: report.TARGET_CPU_US)."""
    for _ in range(warmup):
        stockade_runs.exec_true(client, KEY)
    before = cpu_ticks(sup.pid)[0]
    samples = _timed_calls(client, n)
    used = cpu_ticks(sup.pid)[0] - before
    stockade_runs.destroy(client, KEY)
    return {"n": n, "cpu_us_per_call": round(used / TICK / n * 1e6, 1), **summarize(samples)}


def measure(engine: str, n: int, hold: float) -> dict[str, object]:
    bring_up(engine)
    with served(engine) as sup, Stockade(sup.target) as client:
        for _ in range(50):
            stockade_runs.exec_true(client, KEY)
        agent = agent_pid(engine, sup.state_dir)
        idle = _idle_us_per_s(sup.pid, IDLE_S)
        sup_before, agent_before = cpu_ticks(sup.pid)[0], cpu_ticks(agent)
        threads_before = {"supervisor": thread_ticks(sup.pid), "agent": thread_ticks(agent)}
        client_before = time.process_time()
        samples = _timed_calls(client, n)
        client_s = time.process_time() - client_before
        sup_after, agent_after = cpu_ticks(sup.pid)[0], cpu_ticks(agent)
        threads = {
            who: _delta(thread_ticks(pid), threads_before[who])
            for who, pid in (("supervisor", sup.pid), ("agent", agent))
        }
        if hold > 0:
            print(json.dumps({"supervisor_pid": sup.pid, "agent_pid": agent}), flush=True)
            deadline = time.monotonic() + hold
            while time.monotonic() < deadline:
                stockade_runs.exec_true(client, KEY)
        stockade_runs.destroy(client, KEY)

    def per_call_us(ticks: int) -> float:
        return round(ticks / TICK / n * 1e6, 1)

    return {
        "engine": engine,
        "n": n,
        "cpu_us_per_call": {
            "supervisor": per_call_us(sup_after - sup_before),
            "agent": per_call_us(agent_after[0] - agent_before[0]),
            "commands_reaped_by_agent": per_call_us(agent_after[1] - agent_before[1]),
            "client": round(client_s / n * 1e6, 1),
        },
        "supervisor_idle_us_per_s": idle,
        "threads_us_per_call": {
            who: {name: per_call_us(t) for name, t in sorted(ticks.items(), key=lambda i: -i[1])}
            for who, ticks in threads.items()
        },
        "wall": summarize(samples),
    }


def _idle_us_per_s(pid: int, seconds: float) -> float:
    """CPU time the process spends per second with no call in flight (its timers and
    background tasks: part of every figure per call, in proportion to the call's wall time)."""
    before = cpu_ticks(pid)[0]
    time.sleep(seconds)
    return round((cpu_ticks(pid)[0] - before) / TICK / seconds * 1e6, 1)


def _timed_calls(client: Stockade, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        stockade_runs.exec_true(client, KEY)
        samples.append(time.perf_counter() - started)
    return samples


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {name: t - before.get(name, 0) for name, t in after.items() if t != before.get(name, 0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu", description=__doc__)
    parser.add_argument("--engine", choices=["podman", "docker"], default="docker")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--hold", type=float, default=0.0, help="seconds of calls afterwards")
    ns = parser.parse_args(argv)
    print(json.dumps(measure(ns.engine, ns.n, ns.hold), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
