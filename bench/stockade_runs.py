"""What is measured through Stockade itself: the health floor, warm exec and
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


def session_exec(client: Stockade, n: int, warmup: int, sh_profile: str | None = None) -> Result:
    """A warm `exec true` in a shell session beside a plain one on one sandbox (issue 29:
    the session's capture and restore, target <= 0.5 ms more). The sides alternate in rounds
    (plain then session, then session then plain, ...) so drift falls on all alike. The
    session's summary, the plain one's, and the difference of the medians; with `sh_profile`
    (a profile whose shell is sh) also a plain exec under sh, the shell before issue 29."""
    key, sh_key = "bench-session", "bench-session-sh"
    box = client.sandbox(key)

    def in_session() -> None:
        result = box.exec("true", session="bench")
        if result.is_error or result.exit_code != 0:
            raise RuntimeError(f"exec true in a session failed: {result.error_code}")

    calls = {"plain": lambda: exec_true(client, key), "session": in_session}
    if sh_profile is not None:
        client.ensure_sandbox(sh_key, profile=sh_profile)
        calls["sh"] = lambda: exec_true(client, sh_key)
    samples: dict[str, list[float]] = {side: [] for side in calls}
    batch = max(n // SESSION_ROUNDS, 1)
    try:
        for call in calls.values():
            for _ in range(max(warmup, 1)):
                call()
        for round_ in range(SESSION_ROUNDS):
            order = list(calls) if round_ % 2 == 0 else list(reversed(calls))
            for side in order:
                for _ in range(batch):
                    started = time.perf_counter()
                    calls[side]()
                    samples[side].append(time.perf_counter() - started)
    finally:
        destroy(client, key)
        if sh_profile is not None:
            destroy(client, sh_key)
    summaries = {side: summarize(taken) for side, taken in samples.items()}
    extra = round(summaries["session"]["median_ms"] - summaries["plain"]["median_ms"], 3)
    result = {**summaries["session"], "plain": summaries["plain"], "extra_median_ms": extra}
    if "sh" in summaries:
        result["sh"] = summaries["sh"]
    return result


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
