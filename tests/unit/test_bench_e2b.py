"""The arithmetic and the printed table of the E2B-against-gRPC measurement
(bench/e2b_front.py): no engine, no supervisor, no clock."""

from __future__ import annotations

from bench.__main__ import parse_args
from bench.e2b_front import TARGET_MS, compared, section
from bench.mcp_front import run_record
from tests.unit.test_bench_mcp import rounds_of

HZ = 100


def test_the_target_is_judged_on_what_the_e2b_front_adds() -> None:
    grpc = rounds_of([[4.5, 4.6, 4.7]] * 4)
    fast = compared({"grpc": grpc, "e2b": rounds_of([[5.0, 5.2, 6.5]] * 4)}, HZ)
    assert fast["e2b_minus_grpc"]["median_ms"]["pooled"] == 0.6
    assert fast["added_ms"] == 0.6
    assert fast["met"] is True
    assert fast["rounds_met"] == 4
    slow = compared({"grpc": grpc, "e2b": rounds_of([[6.0, 6.5, 7.0]] * 3 + [[4.6] * 3])}, HZ)
    assert slow["added_ms"] == 1.9
    assert slow["met"] is False
    assert slow["rounds_met"] == 1
    assert slow["target_ms"] == TARGET_MS == 1.0


def test_an_e2b_front_faster_than_grpc_meets_it() -> None:
    quick = compared({"grpc": rounds_of([[5.0]] * 2), "e2b": rounds_of([[4.8]] * 2)}, HZ)
    assert quick["met"] is True
    assert quick["added_ms"] < 0


def test_the_table_says_met_or_not_met_beside_grpc_bash() -> None:
    measured = {"grpc": rounds_of([[4.2]] * 2), "e2b": rounds_of([[5.5]] * 2)}
    result = run_record(
        compared(measured, HZ), {"grpc": 0.01, "e2b": 0.02}, "now", (0, 0, 0), 2, 1, 1
    )
    text = section("podman", result)
    assert "against gRPC exec '/bin/bash -l -c true'" in text
    assert "E2B front adds 1.30 ms (median of the pairs; E2B median 5.50 ms, gRPC 4.20 ms)" in text
    assert "E2B front adds <= 1 ms: not met (0 of 2 pairs of rounds within it)" in text
    met = compared({"grpc": rounds_of([[4.2]] * 2), "e2b": rounds_of([[4.9]] * 2)}, HZ)
    text = section("podman", run_record(met, {"grpc": 0, "e2b": 0}, "now", (0, 0, 0), 2, 1, 1))
    assert "E2B front adds <= 1 ms: met (2 of 2 pairs of rounds within it)" in text
    assert section("docker", {"error": "boom"}).endswith("n/a: boom")


def test_only_e2b_is_a_choice() -> None:
    assert parse_args(["--only", "e2b"]).only == "e2b"
