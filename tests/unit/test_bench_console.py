"""The printed table of the console's cost (bench/console_cost.py), the tokens file it
serves both supervisors with, and its place among the bench's choices: no engine, no
supervisor, no clock."""

from __future__ import annotations

import stat

from bench.__main__ import parse_args
from bench.compare_stats import compare
from bench.console_cost import section, tokens_file
from tests.unit.test_bench_mcp import rounds_of

HZ = 100


def result(off_ms: float, on_ms: float, rounds: int = 8) -> dict[str, object]:
    off = rounds_of([[off_ms, off_ms + 0.1]] * rounds)
    on = rounds_of([[on_ms, on_ms + 0.1]] * rounds, us_per_call=1000 * on_ms / off_ms)
    return {"rounds": rounds, "calls_per_round": 2, **compare(off, on, HZ)}


def test_the_table_names_off_and_on_and_the_ratio() -> None:
    text = section("podman", result(2.0, 2.0))
    head, columns, *rows = text.splitlines()
    assert head.startswith("== podman: warm exec true, console off against on (nobody on it)")
    assert "8 interleaved rounds of 2 calls a side ==" in head
    assert columns.split()[:3] == ["off", "on", "on/off"]
    median = next(r for r in rows if r.startswith("warm exec true, median"))
    assert median.split()[5:8] == ["2.05", "2.05", "1.000"]
    assert median.endswith("within noise")


def test_a_slower_side_is_called_slower() -> None:
    text = section("docker", result(2.0, 3.0))
    median = next(r for r in text.splitlines() if r.startswith("warm exec true, median"))
    assert "1.488" in median
    assert median.endswith("slower")


def test_a_failed_measurement_says_why() -> None:
    assert section("docker", {"error": "boom"}).endswith("n/a: boom")


def test_the_tokens_file_is_private_and_removed() -> None:
    with tokens_file() as (path, token):
        assert path.read_text() == f"{token} bench\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert len(token) == 40
    assert not path.exists()
    assert not path.parent.exists()


def test_only_console_is_a_choice() -> None:
    assert parse_args(["--only", "console"]).only == "console"
