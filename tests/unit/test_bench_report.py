"""bench/report.py prints issue 30's targets of a warm call beside their figures: the
supervisor's CPU per warm `exec true` and that call over the health round trip, met or not."""

from __future__ import annotations

from bench.report import _row, engine_section, summary


def _figures(warm_ms: float, health_ms: float, cpu_us: float) -> dict[str, object]:
    def timed(median: float) -> dict[str, float]:
        return {"n": 10, "min_ms": median, "median_ms": median, "p95_ms": median}

    return {
        "health": timed(health_ms),
        "stockade_warm": timed(warm_ms),
        "supervisor_cpu": {"cpu_us_per_call": cpu_us, **timed(warm_ms)},
    }


def _line(section: str, label: str) -> str:
    return next(line for line in section.splitlines() if label in line)


def test_the_warm_call_targets_are_met_or_missed_beside_their_figures() -> None:
    met = engine_section("podman", _figures(warm_ms=1.5, health_ms=0.6, cpu_us=480))
    assert _line(met, "warm ÷ health").split()[-1] == "met"
    assert "2.5x" in _line(met, "warm ÷ health")
    assert _line(met, "supervisor CPU").split()[-1] == "met"
    missed = engine_section("docker", _figures(warm_ms=3.9, health_ms=0.6, cpu_us=1330))
    assert _line(missed, "warm ÷ health").split()[-1] == "MISSED"
    assert "1330 us" in _line(missed, "supervisor CPU")
    assert _line(missed, "supervisor CPU").split()[-1] == "MISSED"


def test_an_unmeasured_figure_is_not_applicable() -> None:
    section = engine_section("podman", {})
    assert _line(section, "supervisor CPU").split()[-1] == "n/a"
    assert _line(section, "warm ÷ health").split()[-1] == "n/a"


def test_the_side_by_side_summary_shows_the_cpu_of_each_engine() -> None:
    both = {
        "podman": _figures(1.5, 0.6, 480),
        "docker": _figures(3.9, 0.6, 1330),
    }
    assert _line(summary(both), "supervisor CPU").split()[-2:] == ["480", "1330"]


def test_the_pool_row_counts_every_pooled_sample() -> None:
    """Each pooled sample comes with a second new key from the pool (bench/coldstart.py):
    the row says how many of all of them the pool served, not of the first ones only."""
    pooled = {"n": 3, "min_ms": 7.0, "median_ms": 8.0, "p95_ms": 9.0, "from_pool": 6}
    assert "(6 of 6 from the pool)" in _row("pool", {**pooled, "n_pooled": 6})
    assert "(3 of 3 from the pool)" in _row("pool", {**pooled, "from_pool": 3})
