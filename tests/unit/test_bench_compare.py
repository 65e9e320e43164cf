"""The arithmetic of `python -m bench --compare` (bench/compare_stats.py) and its record:
no engine, no supervisor, no clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import parse_args
from bench.compare import write_full_run, write_record
from bench.compare_stats import (
    Round,
    batches,
    compare,
    median_ci,
    quartiles,
    schedule,
    side_summary,
    table,
)

HZ = 100


def rounds_of(ms_per_round: list[list[float]], ticks: int = 3, ns: int = 0) -> list[Round]:
    """Rounds with the given call durations (ms); thread time = `ns`, else 1 ms per call."""
    return [
        Round(tuple(m / 1000 for m in calls), ticks, ns or len(calls) * 1_000_000)
        for calls in ms_per_round
    ]


def test_schedule_alternates_which_side_goes_first() -> None:
    order = schedule(4)
    assert order == [
        (0, "old"), (0, "new"), (1, "new"), (1, "old"),
        (2, "old"), (2, "new"), (3, "new"), (3, "old"),
    ]  # fmt: skip


def test_schedule_gives_each_side_each_round_once() -> None:
    order = schedule(7)
    assert sorted(order) == sorted((r, s) for r in range(7) for s in ("old", "new"))


@pytest.mark.parametrize("rounds", [0, -1])
def test_schedule_refuses_no_rounds(rounds: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        schedule(rounds)


def test_batches_split_calls_evenly() -> None:
    assert batches(300, 10) == 30
    assert batches(5, 5) == 1


@pytest.mark.parametrize(("n", "rounds"), [(301, 10), (5, 10), (10, 0)])
def test_batches_refuse_uneven_splits(n: int, rounds: int) -> None:
    with pytest.raises(ValueError, match="multiple of --rounds"):
        batches(n, rounds)


def test_quartiles_of_one_value_are_the_value() -> None:
    assert quartiles([1.25]) == (1.25, 1.25)
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)


def test_median_ci_takes_the_sign_tests_order_statistics() -> None:
    # n = 60: ranks 30 -+ 0.98 sqrt(60) = 22.4 and 38.6, i.e. the 22nd and the 39th value
    assert median_ci([float(v) for v in range(60, 0, -1)]) == (22.0, 39.0)
    # n = 100: ranks 40.2 and 60.8, the 40th and the 61st
    assert median_ci([float(v) for v in range(1, 101)]) == (40.0, 61.0)


@pytest.mark.parametrize("values", [[1.5], [3.0, 1.0], [2.0, 4.0, 1.0, 3.0]])
def test_median_ci_of_few_values_is_their_range(values: list[float]) -> None:
    assert median_ci(values) == (min(values), max(values))


def test_side_summary_pools_calls_and_counts_cpu_per_call() -> None:
    rounds = rounds_of([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], ticks=3, ns=5_000_000)
    s = side_summary(rounds, HZ)
    assert s["calls"] == 10
    assert s["median_ms"] == 5.5
    assert s["p90_ms"] == 9.0  # nearest rank: the 9th of 10
    assert s["round_median_ms"] == [3.0, 8.0]
    assert s["round_median_spread"] == round((8 - 3) / 5.5, 3)
    # 6 ticks of 10 ms over 10 calls; 10 ms of thread run time over 10 calls
    assert s["cpu_us_per_call"] == 6000.0
    assert s["thread_cpu_us_per_call"] == 1000.0
    assert s["round_thread_cpu_us"] == [1000.0, 1000.0]
    assert s["round_thread_cpu_spread"] == 0.0


def test_side_summary_refuses_no_calls() -> None:
    with pytest.raises(ValueError, match="no calls"):
        side_summary([], HZ)


def test_a_new_side_slower_in_every_pair_is_slower() -> None:
    old = rounds_of([[2, 2, 2]] * 6)
    new = rounds_of([[3, 3, 3]] * 6, ns=6_000_000)
    result = compare(old, new, HZ)
    median = result["ratios"]["median_ms"]
    assert median["new_over_old"] == 1.5
    assert (median["pairs_q1"], median["pairs_median"], median["pairs_q3"]) == (1.5, 1.5, 1.5)
    assert median["verdict"] == "slower"
    assert result["ratios"]["cpu_us_per_call"]["pairs_median"] == 2.0
    assert result["ratios"]["cpu_us_per_call"]["verdict"] == "slower"


def test_a_new_side_faster_in_every_pair_is_faster() -> None:
    result = compare(rounds_of([[4, 4]] * 6), rounds_of([[2, 2]] * 6), HZ)
    assert result["ratios"]["median_ms"]["new_over_old"] == 0.5
    assert result["ratios"]["median_ms"]["verdict"] == "faster"


def test_pairs_that_go_both_ways_are_within_noise() -> None:
    # machine noise: the same shift hits both sides of a pair; new is 10% up, then 10% down
    old = rounds_of([[2], [4], [2], [4], [2], [4]])
    new = rounds_of([[2.2], [3.6], [1.8], [4.4], [2.2], [3.6]])
    ratios = compare(old, new, HZ)["ratios"]["median_ms"]
    assert (ratios["pairs_min"], ratios["pairs_max"]) == (0.9, 1.1)
    assert ratios["pairs_q1"] < 1 < ratios["pairs_q3"]
    assert ratios["pairs_median_ci95"] == [0.9, 1.1]
    assert ratios["verdict"] == "within noise"


def test_a_small_steady_difference_shows_through_many_noisy_pairs() -> None:
    # 40 pairs: 30 with new 3% up, 10 with new 20% down (noise): the lower quartile of the
    # ratios falls below 1, but the median's interval stays above it
    old = rounds_of([[10.0]] * 40)
    new = rounds_of([[10.3]] * 30 + [[8.0]] * 10)
    ratios = compare(old, new, HZ)["ratios"]["median_ms"]
    assert ratios["pairs_min"] == 0.8
    assert ratios["pairs_q1"] < 1
    assert ratios["pairs_median_ci95"] == [1.03, 1.03]
    assert ratios["verdict"] == "slower"


def test_pairs_cancel_noise_that_hits_both_sides() -> None:
    # every round twice as slow as the one before, on both sides; new is always 5% up:
    # pooled, the spread swamps the 5%; paired, every round says so
    old = rounds_of([[1 * 2**r] for r in range(6)])
    new = rounds_of([[1.05 * 2**r] for r in range(6)])
    result = compare(old, new, HZ)
    assert result["old"]["round_median_spread"] > 5
    assert result["ratios"]["median_ms"]["pairs_q1"] == pytest.approx(1.05, abs=0.001)
    assert result["ratios"]["median_ms"]["verdict"] == "slower"


@pytest.mark.parametrize(
    ("new_ms", "verdict"),
    [(10.1, "slower by < 2%"), (9.9, "faster by < 2%"), (10.3, "slower"), (9.7, "faster")],
)
def test_a_steady_difference_under_the_margin_is_named_so(new_ms: float, verdict: str) -> None:
    # one commit against itself moved by about 1%: significant, but no slowdown to act on
    result = compare(rounds_of([[10.0]] * 10), rounds_of([[new_ms]] * 10), HZ)
    assert result["ratios"]["median_ms"]["verdict"] == verdict


def test_too_few_rounds_get_no_verdict() -> None:
    # 5 of 5 pairs slower happens by chance 1 time in 16 (either way): no 95% claim
    result = compare(rounds_of([[10.0]] * 5), rounds_of([[12.0]] * 5), HZ)
    assert result["ratios"]["median_ms"]["new_over_old"] == 1.2
    assert result["ratios"]["median_ms"]["verdict"] == "n/a: < 6 rounds"


def test_compare_refuses_unpaired_rounds() -> None:
    with pytest.raises(ValueError, match="rounds differ"):
        compare(rounds_of([[1]] * 3), rounds_of([[1]] * 2), HZ)
    with pytest.raises(ValueError, match="rounds differ"):
        compare([], [], HZ)


def test_table_shows_both_sides_the_ratio_and_the_verdict() -> None:
    result = compare(rounds_of([[2, 2]] * 6), rounds_of([[3, 3]] * 6), HZ)
    printed = table("podman", {"old_rev": "c077f17", "new_rev": "abc1234", **result})
    assert "c077f17 (old) vs abc1234 (new), 6 interleaved rounds of 2 calls a side" in printed
    median_row = next(line for line in printed.splitlines() if "median (ms)" in line)
    assert median_row.split()[-7:] == [
        "2.00", "3.00", "1.500", "1.500", "[1.500..1.500],", "1.50..1.50", "slower",
    ]  # fmt: skip


def test_write_record_keeps_the_full_runs_figures(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"engines": {"podman": {"x": 1}}, "compare": {"old": 1}}))
    write_record({"old_rev": "c077f17"}, results)
    assert json.loads(results.read_text()) == {
        "engines": {"podman": {"x": 1}},
        "compare": {"old_rev": "c077f17"},
    }


@pytest.mark.parametrize("content", ["not json", "[1, 2]"])
def test_write_record_replaces_a_file_that_is_no_record(tmp_path: Path, content: str) -> None:
    results = tmp_path / "results.json"
    results.write_text(content)
    write_record({"old_rev": "c077f17"}, results)
    assert json.loads(results.read_text()) == {"compare": {"old_rev": "c077f17"}}


def test_compare_needs_n_to_split_into_the_rounds(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--compare", "c077f17", "--n", "25", "--rounds", "10"])
    assert "multiple of --rounds" in capsys.readouterr().err
    ns = parse_args(["--compare", "c077f17", "--n", "20", "--rounds", "10"])
    assert (ns.compare, ns.n, ns.rounds) == ("c077f17", 20, 10)


def test_a_full_run_keeps_the_last_comparison(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"engines": {"old": 1}, "compare": {"old_rev": "c077f17"}}))
    write_full_run({"engines": {"new": 2}}, results)
    assert json.loads(results.read_text()) == {
        "engines": {"new": 2},
        "compare": {"old_rev": "c077f17"},
    }


@pytest.mark.parametrize("content", [None, "not json", '["compare"]', '{"engines": {}}'])
def test_a_full_run_without_a_comparison_writes_its_own_record(
    tmp_path: Path, content: str | None
) -> None:
    results = tmp_path / "results.json"
    if content is not None:
        results.write_text(content)
    write_full_run({"engines": {"new": 2}}, results)
    assert json.loads(results.read_text()) == {"engines": {"new": 2}}
