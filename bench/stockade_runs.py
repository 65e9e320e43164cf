"""What is measured through Stockade itself: the health floor, warm exec, cold start and
memory per idle sandbox. All calls go through the public sync client over TCP."""

from __future__ import annotations

import contextlib
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import memory
from bench.timing import Result, summarize, time_calls
from stockade.client import Stockade, StockadeError

SETTLE_S = 1.0
"""Pause before reading memory, so start-up transients are over."""


def health_floor(target: str, n: int, warmup: int) -> Result:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest()
        return time_calls(lambda: stub.Check(request, timeout=10), n, warmup)


def exec_true(client: Stockade, key: str) -> None:
    result = client.sandbox(key).exec("true")
    if result.is_error or result.exit_code != 0:
        raise RuntimeError(f"exec true on {key!r} failed: {result.error_code} {result.for_llm}")


def destroy(client: Stockade, key: str) -> None:
    """Remove the sandbox and its workspace; a key that never got one is no error here."""
    with contextlib.suppress(StockadeError):
        client.destroy_sandbox(key, delete_workspace=True)


def warm_exec(client: Stockade, n: int, warmup: int) -> Result:
    """`exec true` on one sandbox that already runs (the first warm-up call creates it)."""
    key = "bench-warm"
    try:
        return time_calls(lambda: exec_true(client, key), n, max(warmup, 1))
    finally:
        destroy(client, key)


SESSION_ROUNDS = 10


def session_exec(client: Stockade, n: int, warmup: int) -> Result:
    """A warm `exec true` in a shell session beside a plain one on one sandbox (issue 29:
    the session's capture and restore, target <= 0.5 ms more). The two alternate in rounds
    (plain then session, then session then plain, ...) so drift falls on both alike. The
    session's summary, the plain one's, and the difference of the medians."""
    key = "bench-session"
    box = client.sandbox(key)

    def plain() -> None:
        exec_true(client, key)

    def in_session() -> None:
        result = box.exec("true", session="bench")
        if result.is_error or result.exit_code != 0:
            raise RuntimeError(f"exec true in a session failed: {result.error_code}")

    calls = {"plain": plain, "session": in_session}
    samples: dict[str, list[float]] = {"plain": [], "session": []}
    batch = max(n // SESSION_ROUNDS, 1)
    try:
        for call in calls.values():
            for _ in range(max(warmup, 1)):
                call()
        for round_ in range(SESSION_ROUNDS):
            for side in ("plain", "session") if round_ % 2 == 0 else ("session", "plain"):
                for _ in range(batch):
                    started = time.perf_counter()
                    calls[side]()
                    samples[side].append(time.perf_counter() - started)
    finally:
        destroy(client, key)
    plain_r, session_r = summarize(samples["plain"]), summarize(samples["session"])
    extra = round(session_r["median_ms"] - plain_r["median_ms"], 3)
    return {**session_r, "plain": plain_r, "extra_median_ms": extra}


def interact_line(client: Stockade, n: int, warmup: int) -> Result:
    """One line in, the same line out: `cat` behind Interact, from send to the echoed line
    read by the client (stdin write through the agent, output relayed and scrubbed)."""
    key = "bench-interact"
    counter = iter(range(1 << 30))
    try:
        with client.sandbox(key).interact("cat") as session:
            session.started  # noqa: B018 (wait until it runs)

            def one_line() -> None:
                line = f"line {next(counter)}\n"
                session.send(line)
                session.read_until(line)

            return time_calls(one_line, n, max(warmup, 1))
    finally:
        destroy(client, key)


def cold_start(client: Stockade, n: int) -> Result:
    """The first call on a new key, until its result; each sandbox is destroyed after."""
    samples = []
    for i in range(n):
        key = f"bench-cold-{i}"
        started = time.perf_counter()
        try:
            exec_true(client, key)
            samples.append(time.perf_counter() - started)
        finally:
            destroy(client, key)
    return summarize(samples)


def idle_memory(client: Stockade, m: int) -> Result:
    """Average host memory per sandbox, over m sandboxes that each served one call and idle."""
    keys = [f"bench-idle-{i}" for i in range(m)]
    try:
        for key in keys:
            exec_true(client, key)
        ids = [client.get_sandbox(key).container_id for key in keys]
        time.sleep(SETTLE_S)
        procs = memory.processes()
        return memory.average([memory.container_memory(cid, procs) for cid in ids])
    finally:
        for key in keys:
            destroy(client, key)
