"""The checkpoint measurement's parts that need no engine (bench/checkpoints.py): its figure,
its table, its command line and its place in `python -m bench`."""

from __future__ import annotations

import pytest

from bench import checkpoints
from bench.__main__ import parse_args


def test_the_figure_is_the_difference_of_the_medians() -> None:
    got = checkpoints.figures([0.030, 0.040, 0.050], [0.010, 0.012, 0.014])
    assert got["with_median_ms"] == 40.0
    assert got["without_median_ms"] == 12.0
    assert got["extra_median_ms"] == 28.0
    assert got["met"] is True
    assert checkpoints.figures([0.2], [0.1])["met"] is False


def test_the_table_says_met_or_missed_and_an_error_is_na() -> None:
    result = {"files": 10_000, "mib": 100, "first_s": 1.5,
              **checkpoints.figures([0.030, 0.040], [0.010, 0.012])}  # fmt: skip
    table = checkpoints.section("podman", result)
    assert "the checkpoint adds 24.00 ms (median)   target <= 50 ms   met" in table
    assert "10,000 files (100 MiB)" in table
    assert "n/a: boom" in checkpoints.section("docker", {"error": "boom"})


def test_only_checkpoints_and_quick_sizes() -> None:
    assert parse_args(["--only", "checkpoints"]).checkpoints == checkpoints.FULL
    assert parse_args(["--quick"]).checkpoints == checkpoints.QUICK
    assert checkpoints.FULL["files"] == 10_000
    with pytest.raises(SystemExit):
        checkpoints.main(["--files", "0"])


def test_the_config_turns_them_on_for_writes_and_off_for_one_tenant() -> None:
    import tomllib

    from stockade.supervisor.config import Config
    from stockade.supervisor.config.loading import _build

    data = tomllib.loads(checkpoints.CONFIG + checkpoints.TENANTS)
    config = _build(Config, data, "")
    assert config.checkpoints_on("on")
    assert not config.checkpoints_on("off")
    assert config.checkpoints.before == ("overwrite",)
