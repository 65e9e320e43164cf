"""The printed table of the console's cost (bench/console_cost.py), the tokens file it
serves both supervisors with, and its place among the bench's choices: no engine, no
supervisor, no clock."""

from __future__ import annotations

import stat
from pathlib import Path

from bench.__main__ import parse_args
from bench.compare_stats import compare
from bench.console_cost import PAGES, fill_audit, measure_pages, pages_section, section, tokens_file
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


def test_only_console_pages_is_a_choice() -> None:
    assert parse_args(["--only", "console-pages"]).only == "console-pages"


def test_the_pages_bench_runs_small() -> None:
    """The page bench end to end at tiny sizes (no engine: the sandboxes are records): each
    page answers, the trends hold every call and alarm it wrote, the table says met or not."""
    result = measure_pages(records=500, sandboxes=40, reads=1)
    assert set(result["pages"]) == {name for name, _ in PAGES}
    assert all(r["n"] == 1 for r in result["pages"].values())
    assert result["first_fold_s"] >= 0
    text = pages_section(result)
    assert text.startswith("== console pages: 40 sandboxes, 500 audit records")
    assert text.splitlines()[-1].startswith("  every page's median <= 100 ms: ")
    assert len(text.splitlines()) == 2 + len(PAGES) + 1


def test_the_filled_log_has_its_mix(tmp_path: Path) -> None:
    from stockade.supervisor import database

    path = tmp_path / "audit.db"
    database.connect(path).close()
    fill_audit(path, 2000)
    db = database.reader(path)
    try:
        tools = dict(db.execute("SELECT tool, count(*) FROM audit GROUP BY tool").fetchall())
        tenants = db.execute("SELECT count(DISTINCT tenant) FROM audit").fetchone()[0]
        errors = db.execute("SELECT count(*) FROM audit WHERE is_error = 1").fetchone()[0]
        ordered = db.execute(
            "SELECT count(*) FROM audit a JOIN audit b ON b.id = a.id + 1 WHERE b.time < a.time"
        ).fetchone()[0]
    finally:
        db.close()
    assert sum(tools.values()) == 2000
    assert tools["exec"] > tools["alarm"] > 0
    assert tenants == 10
    assert 0 < errors < 400
    assert ordered == 0  # oldest first, as a log is written


def test_the_pages_table_names_what_is_not_met() -> None:
    page = {"n": 3, "median_ms": 150.0, "p95_ms": 180.0, "bytes": 2048}
    fast = {**page, "median_ms": 5.0, "p95_ms": 9.0}
    result = {
        "records": 10, "sandboxes": 2, "reads": 3, "fill_s": 0.1, "first_fold_s": 0.0,
        "budget_ms": 100.0, "pages": {"overview, 1 h": fast, "audit record": page},
        "not_met": ["audit record"],
    }  # fmt: skip
    lines = pages_section(result).splitlines()
    assert lines[2].split()[-1] == "met"
    assert lines[3].endswith("not met")
    assert lines[-1] == "  every page's median <= 100 ms: not met (audit record)"
