"""The shell session's benchmark section (bench/report.py session_section): what it prints
of a measurement, a missed target and a failed measurement."""

from __future__ import annotations

from bench.report import session_section


def summary(median: float) -> dict[str, float]:
    return {"n": 10, "min_ms": median - 0.1, "median_ms": median, "p95_ms": median + 1}


def test_the_section_shows_both_sides_the_difference_and_the_verdict() -> None:
    measured = {**summary(3.4), "plain": summary(3.0), "extra_median_ms": 0.4, "sh": summary(2.6)}
    text = session_section("podman", measured)
    assert "plain exec (bash)" in text
    assert "plain exec under sh (dash)" in text
    assert "+0.40 ms   target <= 0.5 ms met" in text
    missed = session_section("docker", {**measured, "extra_median_ms": 0.9})
    assert "MISSED" in missed
    assert session_section("docker", {"error": "no engine"}).endswith("n/a: no engine")
