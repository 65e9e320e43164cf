"""The arithmetic and the printed table of the E2B-against-gRPC measurement
(bench/e2b_front.py): no engine, no supervisor, no clock."""

from __future__ import annotations

from bench.__main__ import parse_args
from bench.e2b_front import TARGET_MS, compared, section
from bench.mcp_front import run_record
from tests.unit.test_bench_mcp import rounds_of

HZ = 100


def test_the_target_is_judged_on_the_e2b_median() -> None:
    grpc = rounds_of([[2.5, 2.6, 2.7]] * 4)
    fast = compared({"grpc": grpc, "e2b": rounds_of([[2.8, 2.9, 3.5]] * 4)}, HZ)
    assert fast["met"] is True
    assert fast["rounds_met"] == 4
    assert fast["e2b_minus_grpc"]["median_ms"]["pooled"] == 0.3
    slow = compared({"grpc": grpc, "e2b": rounds_of([[5.0, 5.5, 6.0]] * 3 + [[2.0] * 3])}, HZ)
    assert slow["met"] is False
    assert slow["rounds_met"] == 1
    assert slow["target_ms"] == TARGET_MS


def test_the_table_says_met_or_missed() -> None:
    measured = {"grpc": rounds_of([[2.6]] * 2), "e2b": rounds_of([[5.3]] * 2)}
    result = run_record(
        compared(measured, HZ), {"grpc": 0.01, "e2b": 0.02}, "now", (0, 0, 0), 2, 1, 1
    )
    text = section("podman", result)
    assert "E2B median 5.30 ms   target <= 3 ms   MISSED (0 of 2 rounds within it)" in text
    assert "gRPC" in text
    assert section("docker", {"error": "boom"}).endswith("n/a: boom")


def test_only_e2b_is_a_choice() -> None:
    assert parse_args(["--only", "e2b"]).only == "e2b"
