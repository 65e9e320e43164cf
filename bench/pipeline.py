"""`python -m bench.pipeline`: the host-side pipeline's own cost per call — tool policy,
argument validation, guard, approvals check, rate limit, scrub, caps and audit — for an exec
call returning 4 KiB of output, with the sandbox replaced by a stub that answers at once."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.scrub import section as scrub_section
from bench.timing import Result, summarize, time_calls
from stockade.supervisor.agent_client import AgentReply
from stockade.supervisor.app import build_policy
from stockade.supervisor.config import Config, LimitsConfig
from stockade.supervisor.models import CallContext, ToolCall
from stockade.supervisor.pipeline import ToolPipeline

COMMAND = "cd src && git status --short && pytest -q tests/unit -k 'not slow'"
OUTPUT = ("tests/unit/test_app.py ....................................... [ 42%]\n" * 60)[:4096]


class _InstantSandbox:
    """Answers like the agent, with 4 KiB of stdout, without any container."""

    def __init__(self) -> None:
        self.reply = AgentReply(
            "", "", {"exit_code": 0, "stdout": OUTPUT, "stderr": "", "duration_ms": 5}
        )

    async def ensure(self, *args: Any) -> None:
        """The pipeline makes the sandbox ready first (its own stage); this one always is."""

    async def invoke(self, *args: Any) -> AgentReply:
        return self.reply


async def _time_async(call: Any, n: int, warmup: int) -> Result:
    for _ in range(warmup):
        await call()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return summarize(samples)


def run_pipeline_bench(n: int = 2000, warmup: int = 200) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="stk-bench-") as state:
        limits = LimitsConfig(rate_per_s=1e9, burst=10**9)
        config = Config(state_dir=Path(state), limits=limits, scrub=Config().scrub)
        policy = build_policy(config)
        pipeline = ToolPipeline(config, _InstantSandbox(), policy)  # type: ignore[arg-type]
        call = ToolCall("bench", "exec", f'{{"command": "{COMMAND}"}}', CallContext("agent"))
        whole = asyncio.run(_time_async(lambda: pipeline.call(call), n, warmup))
        parts = _parts(policy, n, warmup)
        if policy.audit is not None:
            policy.audit.close()
    return {"pipeline_4k": whole, **parts}


def _parts(policy: Any, n: int, warmup: int) -> dict[str, Result]:
    from stockade.supervisor.schemas import validate_arguments

    spec = policy.catalog.resolve("exec")
    ctx = CallContext("agent")
    return {
        "policy": time_calls(lambda: policy.tools.decide("exec", ctx), n, warmup),
        "validate": time_calls(
            lambda: validate_arguments(spec.parameters, {"command": COMMAND}), n, warmup
        ),
        "guard": time_calls(lambda: policy.guard.check(COMMAND), n, warmup),
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
        ("  guard (parse + rules)", pipeline["guard"]),
        ("  scrub 4 KiB", pipeline["scrub_4k"]),
        ("scrub 1 MiB of tool output", scrub["1MiB"]),
    ]
    for name, r in rows:
        lines.append(
            f"{name:<36}{r['n']:>6}{r['min_ms']:>10.3f}{r['median_ms']:>10.3f}{r['p95_ms']:>10.3f}"
        )
    overhead = pipeline["pipeline_4k"]["median_ms"]
    lines.append(
        f"  pipeline median {overhead:.3f} ms   target <= 0.5 ms   {_met(overhead <= 0.5)}"
    )
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
