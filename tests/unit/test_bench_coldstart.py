"""The cold start's breakdown by stage: the supervisor's StageClock line
(sandboxes/containers.py) and bench/coldstart.py reading it back from the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.coldstart import FIRST_CALL, stages_of, stages_section
from stockade.supervisor.engines.userns import NO_USERNS, IdMaps
from stockade.supervisor.sandboxes.containers import StageClock


def test_the_clock_counts_each_stage_and_the_hand_over_apart() -> None:
    clock = StageClock()
    clock.lap("prepare")
    seen: list[IdMaps] = []
    clock.around(seen.append, "create")(NO_USERNS)
    clock.lap("start")
    clock.lap("agent ready")
    assert list(clock.stages) == ["prepare", "create", "hand over", "start", "agent ready"]
    assert seen == [NO_USERNS]
    line = str(clock)
    assert line.startswith("up in ")
    assert ": prepare " in line
    assert ", agent ready " in line


def test_the_bench_reads_one_start_back_with_the_first_call(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text("2026-11-29 stockade INFO container stockade-1-a up in 1.0 ms: prepare 1.0\n")
    offset = log.stat().st_size
    with log.open("a") as f:
        f.write(
            "2026-11-29 stockade INFO container stockade-1-b up in 150.5 ms: prepare 3.5, "
            "create 15.0, hand over 0.5, start 50.0, agent ready 81.5\nother line\n"
        )
    stages = stages_of(log, offset, 160.0)
    assert stages == {
        "prepare": 3.5, "create": 15.0, "hand over": 0.5, "start": 50.0, "agent ready": 81.5,
        FIRST_CALL: 9.5,
    }  # fmt: skip
    text = stages_section("docker", {"cold_start": {"stages_median_ms": stages}})
    assert "hand over 0.5" in text
    assert "first call 9.5" in text


def test_none_or_two_starts_in_one_sample_is_an_error(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text("")
    with pytest.raises(RuntimeError, match="0 container starts"):
        stages_of(log, 0, 10.0)
    line = "container c up in 1.0 ms: prepare 1.0\n"
    log.write_text(line * 2)
    with pytest.raises(RuntimeError, match="2 container starts"):
        stages_of(log, 0, 10.0)


def test_the_targets_are_judged_against_today_and_a_warm_call() -> None:
    results = {
        "cold_start": {"median_ms": 100.0},
        "cold_start_pool": {"median_ms": 12.0},
        "stockade_warm": {"median_ms": 4.0},
    }
    text = stages_section("podman", results)
    assert "cold start 100.0 ms   target <= 106 ms" in text
    assert "this VM before issue 30)   met" in text
    assert (
        "from the pool 12.0 ms = 3.0x a warm call back to back (4.00 ms)   target <= 2x   "
        "NOT met" in text
    )
    assert "like for like" not in text, "no reference was measured"


def test_the_pool_is_judged_also_like_for_like() -> None:
    """Each line with its own verdict: the issue's ratio is never replaced."""
    results = {
        "cold_start_pool": {"median_ms": 7.0, "warm_after_pause": {"median_ms": 5.0}},
        "stockade_warm": {"median_ms": 3.0},
    }
    text = stages_section("docker", results)
    assert (
        "from the pool 7.0 ms = 2.3x a warm call back to back (3.00 ms)   target <= 2x   "
        "NOT met" in text
    )
    assert (
        "like for like, after the same 3 s pause: from the pool 7.0 ms = 1.4x a warm call "
        "(5.00 ms)   target <= 2x   met" in text
    )
    assert "back to back: from" not in text, "no first call right after a warm one was measured"
    both = {
        "cold_start_pool": {
            "median_ms": 7.0,
            "warm_back_to_back": {"median_ms": 2.5},
            "pool_after_warm": {"median_ms": 4.5},
        },
    }
    text = stages_section("docker", both)
    assert (
        "from the pool 7.0 ms = 2.8x a warm call back to back (2.50 ms)   target <= 2x   "
        "NOT met" in text
    ), "without the run's warm call: the section's own back-to-back one"
    assert (
        "like for like, back to back: from the pool right after a warm call 4.5 ms = 1.8x "
        "a warm call (2.50 ms)   target <= 2x   met" in text
    )
    slow = {
        **results,
        "cold_start_pool": {"median_ms": 11.0, "warm_after_pause": {"median_ms": 5.0}},
    }
    assert "2.2x a warm call (5.00 ms)   target <= 2x   NOT met" in stages_section("docker", slow)
