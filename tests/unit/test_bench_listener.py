"""bench/listener.py runs: plain uvicorn against the hardened listener, end to end with tiny
counts (both server processes on loopback, the real MCP and E2B apps, the printed table), so
that a change of the fronts the bench no longer fits breaks this test, not `make bench`; and
its verdicts on made-up rounds (no clock)."""

from __future__ import annotations

from bench.__main__ import parse_args
from bench.listener import APPS, TITLES, compared, measure, section
from tests.unit.test_bench_mcp import rounds_of

HZ = 100


def test_the_listener_section_runs_end_to_end_and_prints_its_table() -> None:
    result = measure(requests=5, rounds=2)
    assert set(result["apps"]) == set(APPS)
    for app in APPS:
        figures = result["apps"][app]
        assert figures["plain"]["calls"] == figures["hardened"]["calls"] == 10
        assert figures["added"]["median_ms"]["pairs"] == 2
    head, columns, *rows = section(result).splitlines()
    assert "plain uvicorn (httptools) against the hardened listener with back-off" in head
    assert "2 interleaved rounds of 5 requests a side" in head
    assert columns.split()[:3] == ["plain", "hardened", "added"]
    assert "target: added <= 100 µs" in columns
    for title in TITLES.values():
        assert title in rows
    judged = [r for r in rows if r.lstrip().startswith(("latency, median", "server CPU"))]
    assert len(judged) == 2 * len(APPS)
    assert all("(< 6 rounds: no interval)" in r for r in judged)
    assert rows[-1].startswith("  the hardened listener adds <= 100 µs a request: ")


def made_up(plain_ms: float, hardened_ms: float, cpu_us: tuple[float, float]) -> dict[str, object]:
    """Every app measured alike: 8 rounds a side of the given latency and server CPU."""
    plain = rounds_of([[plain_ms, plain_ms]] * 8, us_per_call=cpu_us[0])
    hardened = rounds_of([[hardened_ms, hardened_ms]] * 8, us_per_call=cpu_us[1])
    measured = {app: {"old": plain, "new": hardened} for app in APPS}
    return {"rounds": 8, "requests_per_round": 2, **compared(measured, HZ)}


def test_an_added_cost_within_the_target_is_met() -> None:
    result = made_up(0.050, 0.072, (30.0, 45.0))
    assert result["met"] is True
    text = section(result)
    median = next(r for r in text.splitlines() if "latency, median" in r)
    assert median.split()[3:6] == ["50.0", "72.0", "22.0"]
    assert median.endswith("met")
    assert text.endswith("a request: met")


def test_an_added_cost_past_the_target_is_not_met() -> None:
    slow = made_up(0.050, 0.200, (30.0, 45.0))
    assert slow["met"] is False
    median = next(r for r in section(slow).splitlines() if "latency, median" in r)
    assert median.endswith("NOT met")
    costly = made_up(0.050, 0.060, (30.0, 180.0))
    assert costly["met"] is False
    cpu = next(r for r in section(costly).splitlines() if "server CPU" in r)
    assert cpu.endswith("NOT met")
    assert section(costly).endswith("a request: NOT met")


def test_a_failed_measurement_says_why() -> None:
    assert section({"error": "boom"}).endswith("n/a: boom")


def test_listener_is_a_choice_with_its_own_counts() -> None:
    ns = parse_args(["--only", "listener", "--listener-requests", "40"])
    assert (ns.only, ns.listener_requests, ns.listener_rounds) == ("listener", 40, 15)
    assert parse_args(["--quick"]).listener_requests == 300
