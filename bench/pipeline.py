"""`python -m bench.pipeline`: the host-side pipeline's own cost per call — tool policy,
argument validation, guard, approvals check, rate limit, scrub, caps and audit — for an exec
call returning 4 KiB of output, with the sandbox replaced by a stub that answers at once."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.scrub import section as scrub_section
from bench.timing import Result, summarize, time_calls
from stockade.supervisor.app import build_policy
from stockade.supervisor.calls.pipeline import CallLease, HostPolicy, ToolPipeline
from stockade.supervisor.calls.streaming import AgentEvent
from stockade.supervisor.config import AuditConfig, Config, LimitsConfig
from stockade.supervisor.models import CallContext, ToolCall
from stockade.supervisor.policy.guard import Guard
from stockade.supervisor.sandboxes.agent_link import AgentReply
from stockade.supervisor.sandboxes.lease import Deadline

COMMAND = "cd src && git status --short && pytest -q tests/unit -k 'not slow'"
OUTPUT = ("tests/unit/test_app.py ....................................... [ 42%]\n" * 60)[:4096]


PIPELINE_TARGET_MS = 0.15
GUARD_TARGET_MS = 0.06
"""Issue 30's targets (0.5 ms before it)."""


class _InstantLease:
    """Answers like the agent, with 4 KiB of stdout, without any container."""

    generation = "instant"
    """The container serving the key (CallLease.generation: a shell session lives in one)."""

    def __init__(self) -> None:
        self.reply = AgentReply(
            "", "", {"exit_code": 0, "stdout": OUTPUT, "stderr": "", "duration_ms": 5}
        )

    async def invoke(
        self,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        request_id: str,
        /,
        *,
        deadline: Deadline = "caller",
    ) -> AgentReply:
        return self.reply

    async def stream(
        self,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        request_id: str,
        /,
        *,
        deadline: Deadline = "caller",
    ) -> AsyncIterator[AgentEvent]:
        yield self.reply


class _InstantSandboxes:
    """The sandboxes as the pipeline sees them (calls/pipeline.py Sandboxes): every key's
    sandbox ready at once, its lease the instant one."""

    def __init__(self) -> None:
        self._lease = _InstantLease()

    @contextlib.asynccontextmanager
    async def _held(self) -> AsyncIterator[CallLease]:
        yield self._lease

    def lease(self, key: str, /) -> contextlib.AbstractAsyncContextManager[CallLease]:
        return self._held()


async def _time_async(call: Any, n: int, warmup: int) -> Result:
    for _ in range(warmup):
        await call()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return summarize(samples)


CALL = ToolCall("bench", "exec", f'{{"command": "{COMMAND}"}}', CallContext("agent"))


def _pipeline(state: Path, audit: AuditConfig | None = None) -> tuple[ToolPipeline, HostPolicy]:
    """A pipeline with the default policy (audit log in state/stockade.db), no rate limit."""
    limits = LimitsConfig(rate_per_s=1e9, burst=10**9)
    config = Config(state_dir=state, limits=limits, audit=audit or AuditConfig())
    policy = build_policy(config)
    return ToolPipeline(config, _InstantSandboxes(), policy), policy


def _close(policy: HostPolicy) -> None:
    if policy.audit is not None:
        policy.audit.close()


def run_pipeline_bench(n: int = 2000, warmup: int = 200) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="stk-bench-") as state:
        pipeline, policy = _pipeline(Path(state))
        whole = asyncio.run(_time_async(lambda: pipeline.call(CALL), n, warmup))
        parts = _parts(policy, n, warmup)
        _close(policy)
    return {"pipeline_4k": whole, **parts}


def call_cost(
    states: dict[str, Path], n: int = 2000, rounds: int = 8, audit: AuditConfig | None = None
) -> dict[str, Result]:
    """A call's cost with each state directory's audit log, side by side: the pipelines take
    turns in `rounds` blocks of n/rounds calls, so a disturbance of the machine falls on all.
    Each result also says how many records retention removed meanwhile ("trimmed")."""
    pipelines = {name: _pipeline(state, audit) for name, state in states.items()}
    samples: dict[str, list[float]] = {name: [] for name in states}

    async def block(pipeline: ToolPipeline, out: list[float], count: int) -> None:
        for _ in range(count):
            started = time.perf_counter()
            await pipeline.call(CALL)
            out.append(time.perf_counter() - started)

    try:
        for pipeline, _ in pipelines.values():  # warm-up
            asyncio.run(block(pipeline, [], max(n // 10, 1)))
        for _ in range(rounds):
            for name, (pipeline, _) in pipelines.items():
                asyncio.run(block(pipeline, samples[name], max(n // rounds, 1)))
        trimmed = {name: _trimmed(policy) for name, (_, policy) in pipelines.items()}
    finally:
        for _, policy in pipelines.values():
            _close(policy)
    return {name: {**summarize(s), "trimmed": trimmed[name]} for name, s in samples.items()}


def _trimmed(policy: HostPolicy) -> int:
    trimmer = policy.audit.trimmer if policy.audit is not None else None
    return trimmer.removed if trimmer is not None else 0


def _parts(policy: Any, n: int, warmup: int) -> dict[str, Result]:
    from stockade.supervisor.tools.schemas import validate_arguments

    spec = policy.catalog.resolve("exec")
    ctx = CallContext("agent")
    fresh = Guard(cache_entries=0)  # every check as the first one of its command
    return {
        "policy": time_calls(lambda: policy.tools.decide("exec", ctx), n, warmup),
        "validate": time_calls(
            lambda: validate_arguments(spec.parameters, {"command": COMMAND}), n, warmup
        ),
        "guard": time_calls(lambda: policy.guard.check(COMMAND), n, warmup),
        "guard_first": time_calls(lambda: fresh.check(COMMAND), n, warmup),
        "scrub_4k": time_calls(lambda: policy.scrubber.scrub(OUTPUT), n, warmup),
    }


def host_section(pipeline: dict[str, Result], scrub: dict[str, Any]) -> str:
    """The printed host-side section, with the targets of the policy issue."""
    lines = [
        "== host-side policy (no sandbox, no engine) ==",
        f"{'':<36}{'n':>6}{'min':>10}{'median':>10}{'p95':>10}   ms",
    ]
    rows = [
        ("pipeline per call, 4 KiB output", pipeline["pipeline_4k"]),
        ("  tool policy decision", pipeline["policy"]),
        ("  argument validation", pipeline["validate"]),
        ("  guard (verdict remembered)", pipeline["guard"]),
        ("  guard, first check (parse + rules)", pipeline["guard_first"]),
        ("  scrub 4 KiB", pipeline["scrub_4k"]),
        ("scrub 1 MiB of tool output", scrub["1MiB"]),
    ]
    for name, r in rows:
        lines.append(
            f"{name:<36}{r['n']:>6}{r['min_ms']:>10.3f}{r['median_ms']:>10.3f}{r['p95_ms']:>10.3f}"
        )
    overhead, guard = pipeline["pipeline_4k"]["median_ms"], pipeline["guard"]["median_ms"]
    lines += [
        f"  pipeline median {overhead:.3f} ms   target <= {PIPELINE_TARGET_MS} ms   "
        + _met(overhead <= PIPELINE_TARGET_MS),
        f"  guard median {guard:.3f} ms   target <= {GUARD_TARGET_MS} ms   "
        + _met(guard <= GUARD_TARGET_MS)
        + "   (a command checked before: its verdict is remembered)",
    ]
    lines += ["", *scrub_section(scrub)]
    return "\n".join(lines)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> int:
    from bench.scrub import run_scrub_bench

    print(host_section(run_pipeline_bench(), run_scrub_bench()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
