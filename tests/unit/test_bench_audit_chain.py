"""bench/audit_chain.py runs: the hash chain's and policy replay's section of `make bench`,
with tiny counts, through the real chain, AuditLog and replayer (a change that the bench no
longer fits breaks this test, not `make bench`). Its figures are the bench's, not checked."""

from __future__ import annotations

from bench.audit_chain import run_chain_bench, section


def test_the_chain_and_replay_bench_runs_and_prints_its_section() -> None:
    measured = run_chain_bench(n=300, replayed=200)
    assert set(measured) == {"link_200B", "link_4KiB", "written", "replay", "replay_distinct"}
    assert measured["link_4KiB"]["n"] == 3
    assert measured["replay"]["calls"] == 200
    printed = section(measured)
    assert "chain per call" in printed
    assert "recorded calls:" in printed
    assert section({"error": "boom"}).endswith("n/a: boom")
