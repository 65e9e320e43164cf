"""bench/pipeline.py and bench/scrub.py run: the host-side section of `make bench`, with tiny
counts, through the real pipeline and policy over the bench's stand-in sandboxes (a change of
the call path that the stand-in no longer fits breaks this test, not `make bench`)."""

from __future__ import annotations

from bench.pipeline import host_section, run_pipeline_bench
from bench.scrub import run_scrub_bench


def test_the_host_side_bench_runs_and_prints_its_section() -> None:
    measured = run_pipeline_bench(n=5, warmup=1)
    assert set(measured) == {
        "pipeline_4k",
        "policy",
        "validate",
        "guard",
        "guard_first",
        "scrub_4k",
    }
    assert all(result["n"] == 5 for result in measured.values())
    scrub = run_scrub_bench(runs_4k=3, runs_1m=1)
    assert scrub["corpora"]["recall"] >= 0.995
    section = host_section(measured, scrub)
    assert "pipeline per call, 4 KiB output" in section
    assert "recall" in section
    assert "target <= 0.15 ms" in section
    assert "target <= 0.06 ms" in section
