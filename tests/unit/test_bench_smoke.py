"""`python -m bench --smoke` (bench/smoke.py): its sizes reach every section, it refuses to
mix with other runs, and a section's error anywhere in the record fails it, named."""

from __future__ import annotations

import pytest

from bench import smoke
from bench.__main__ import brokered_sizes, parse_args


def test_smoke_sizes_are_tiny_everywhere() -> None:
    ns = parse_args(["--smoke"])
    assert (ns.n, ns.cold, ns.idle, ns.load_keys, ns.load_calls) == (6, 1, 1, 2, 3)
    assert ns.warmup == 1
    assert ns.rounds == 2
    assert ns.snap == smoke.SNAPSHOTS
    assert ns.checkpoints == smoke.CHECKPOINTS
    assert (ns.listener_requests, ns.listener_rounds) == (20, 1)
    assert brokered_sizes(ns) == (10, 1)
    assert brokered_sizes(parse_args(["--quick"])) == (30, 50)
    assert (ns.load_wide, ns.load_wide_calls, ns.density, ns.density_calls) == (3, 2, 3, 10)


def test_the_wide_load_and_density_are_opt_in() -> None:
    ns = parse_args([])
    assert (ns.load_wide, ns.density, ns.density_calls) == (0, 0, 1000)
    ns = parse_args(["--load-wide", "500", "--density", "300"])
    assert (ns.load_wide, ns.load_wide_calls, ns.density) == (500, 20, 300)


@pytest.mark.parametrize(
    "wrong", [["--density", "-1"], ["--load-wide", "-5"], ["--density-calls", "0"]]
)
def test_wrong_wide_load_and_density_sizes_are_refused(
    wrong: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args(wrong)
    assert "must be 0 (none) or more" in capsys.readouterr().err


@pytest.mark.parametrize("other", [["--quick"], ["--only", "mcp"], ["--compare", "HEAD"]])
def test_smoke_is_a_run_of_its_own(other: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--smoke", *other])
    assert "--smoke is a run of its own" in capsys.readouterr().err


def test_an_error_anywhere_fails_the_smoke_named(capsys: pytest.CaptureFixture[str]) -> None:
    record = {
        "host": {"pipeline": {"median_ms": 0.3}, "audit": {"error": "OSError: disk"}},
        "engines": {
            "podman": {"cold_start": {"median_ms": 200.0}, "mcp": {"grpc": {"error": "boom"}}}
        },
        "settings": {"n": 6, "smoke": True},
    }
    assert list(smoke.failures(record)) == [
        "host.audit: OSError: disk",
        "engines.podman.mcp.grpc: boom",
    ]
    assert smoke.verdict(record, 42.0) == 1
    out = capsys.readouterr().out
    assert "smoke run: 42 s, 2 section(s) without figures" in out
    assert "FAILED engines.podman.mcp.grpc: boom" in out


def test_a_clean_record_passes() -> None:
    record = {"host": {"pipeline": {"median_ms": 0.3}}, "engines": {"docker": {"load": {}}}}
    assert smoke.verdict(record, 1.0) == 0


def test_failed_calls_in_a_load_run_fail_the_smoke() -> None:
    # the wide load run once reused the first run's keys, whose leftover files made 350 of
    # its calls fail: figures were printed, but of failing calls
    load = {"calls_per_s": 255.0, "errors": 350, "first_errors": ["load-002#3 list_files: x"]}
    record = {"engines": {"podman": {"load": {"errors": 0}, "load_wide": load}}}
    assert list(smoke.failures(record)) == [
        "engines.podman.load_wide: 350 call(s) failed, first: ['load-002#3 list_files: x']"
    ]
    assert smoke.verdict(record, 1.0) == 1
