"""bench/grpc_floor.py runs: grpc.aio's own CPU per call with each handler (an empty one, a
gRPC relay and a framed unix-socket relay), tiny counts, loopback and unix sockets only."""

from __future__ import annotations

from bench.grpc_floor import KINDS, measure


def test_each_floor_is_measured() -> None:
    results = [measure(kind, 20) for kind in KINDS]
    assert [r["handler"] for r in results] == ["empty", "relay", "framed"]
    for r in results:
        assert r["n"] == 20
        assert r["server_cpu_us_per_call"] >= 0
        assert r["wall_ms_per_call"] > 0
    assert results[0]["relayed_server_cpu_us_per_call"] == 0
