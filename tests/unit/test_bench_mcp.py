"""The arithmetic and record of the MCP-against-gRPC measurement (bench/mcp_front.py): no
engine, no supervisor, no clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.__main__ import parse_args
from bench.compare_stats import Round, schedule
from bench.mcp_front import FRONTS, compared, pairwise, rotation, section, verdict, write
from bench.report import summary

HZ = 100


def rounds_of(ms_per_round: list[list[float]], us_per_call: float = 1000) -> list[Round]:
    """Rounds with the given call durations (ms) and supervisor thread time per call (µs)."""
    return [
        Round(tuple(m / 1000 for m in calls), 1, int(len(calls) * us_per_call * 1000))
        for calls in ms_per_round
    ]


def fronts(grpc: list[Round], rest: list[Round], **given: list[Round]) -> dict[str, list[Round]]:
    """Each front's rounds: the MCP fronts not `given` get `rest`."""
    return {"grpc": grpc, **dict.fromkeys(FRONTS[1:], rest), **given}


def test_the_fronts_take_turns_going_first() -> None:
    assert FRONTS == ("grpc", "mcp", "mcp_session", "mcp_plain")
    assert rotation(4) == [
        (0, "grpc"), (0, "mcp"), (0, "mcp_session"), (0, "mcp_plain"),
        (1, "mcp"), (1, "mcp_session"), (1, "mcp_plain"), (1, "grpc"),
        (2, "mcp_session"), (2, "mcp_plain"), (2, "grpc"), (2, "mcp"),
        (3, "mcp_plain"), (3, "grpc"), (3, "mcp"), (3, "mcp_session"),
    ]  # fmt: skip
    assert rotation(4, ("old", "new")) == schedule(4)  # two fronts: --compare's order
    with pytest.raises(ValueError, match="at least 1"):
        rotation(0)


def test_differences_pooled_and_per_pair() -> None:
    grpc = rounds_of([[2.0, 2.0, 2.2]] * 6, us_per_call=1200)
    mcp = rounds_of([[2.5, 2.6, 2.7]] * 6, us_per_call=1500)
    session = rounds_of([[2.2, 2.3, 2.3]] * 6, us_per_call=1300)
    result = compared(fronts(grpc, mcp, mcp_session=session), HZ)
    extra = result["mcp_minus_grpc"]["median_ms"]
    assert extra["pooled"] == pytest.approx(0.6)
    assert extra["pairs_median"] == pytest.approx(0.6)
    assert extra["pairs_median_ci95"] == pytest.approx([0.6, 0.6])
    assert extra["pairs"] == 6
    assert result["mcp_minus_grpc"]["cpu_us_per_call"]["pairs_median"] == pytest.approx(300)
    assert (result["grpc"]["median_ms"], result["mcp"]["median_ms"]) == (2.0, 2.6)
    session_extra = result["mcp_session_minus_grpc"]
    assert session_extra["median_ms"]["pooled"] == pytest.approx(0.3)
    assert session_extra["cpu_us_per_call"]["pairs_median"] == pytest.approx(100)
    assert result["mcp_plain_minus_grpc"]["median_ms"]["pooled"] == pytest.approx(0.6)
    assert result["judged"] == {
        "mcp": {"met": True, "verdict": "met"},
        "mcp_session": {"met": True, "verdict": "met"},
    }
    assert result["met"] is True
    assert result["verdict"] == "default mode: met; session: met"


def test_a_difference_over_the_target_is_missed() -> None:
    grpc = rounds_of([[2.0]] * 6)
    result = compared(fronts(grpc, rounds_of([[3.5]] * 6)), HZ)
    assert result["met"] is False
    assert result["verdict"] == "default mode: MISSED; session: MISSED"


@pytest.mark.parametrize("missed", ["mcp", "mcp_session"])
def test_either_mode_over_the_target_misses_it(missed: str) -> None:
    grpc = rounds_of([[2.0]] * 6)
    result = compared(fronts(grpc, rounds_of([[2.5]] * 6), **{missed: rounds_of([[3.5]] * 6)}), HZ)
    assert result["met"] is False
    assert {f: j["met"] for f, j in result["judged"].items()} == {
        "mcp": missed != "mcp",
        "mcp_session": missed != "mcp_session",
    }


def test_the_plain_client_is_shown_not_judged() -> None:
    grpc = rounds_of([[2.0]] * 6)
    result = compared(fronts(grpc, rounds_of([[2.5]] * 6), mcp_plain=rounds_of([[9.0]] * 6)), HZ)
    assert result["mcp_plain_minus_grpc"]["median_ms"]["pooled"] == pytest.approx(7.0)
    assert "mcp_plain" not in result["judged"]
    assert result["met"] is True


def test_noise_across_the_target_is_named() -> None:
    grpc = rounds_of([[2.0]] * 8)
    mcp = rounds_of([[2.5], [3.5], [2.6], [3.4], [2.7], [3.3], [2.8], [2.9]])
    result = compared(fronts(grpc, mcp), HZ)
    assert result["met"] is True  # pooled: 2.85 - 2.0
    assert result["judged"]["mcp"]["verdict"].startswith("met (the rounds' interval ")
    assert "reaches across" in result["judged"]["mcp"]["verdict"]


def test_few_rounds_get_no_interval() -> None:
    extra = {"pooled": 0.5, "pairs": 3, "pairs_median_ci95": [0.1, 2.0]}
    assert verdict(extra, 1.0) == "met (< 6 rounds: no interval)"


def test_differences_refuse_unpaired_rounds() -> None:
    with pytest.raises(ValueError, match="rounds differ"):
        compared(fronts(rounds_of([[1.0]] * 2), rounds_of([[1.0]] * 3)), HZ)
    with pytest.raises(ValueError, match="rounds differ: grpc 2, mcp_plain 0"):
        compared(fronts(rounds_of([[1.0]] * 2), rounds_of([[1.0]] * 2), mcp_plain=[]), HZ)
    with pytest.raises(ValueError, match="rounds differ"):
        compared(fronts([], []), HZ)
    with pytest.raises(ValueError, match="rounds differ"):
        pairwise(rounds_of([[1.0]]), [], {}, {})


def test_the_section_shows_the_fronts_the_differences_and_the_target() -> None:
    grpc, sdk = rounds_of([[2.0]] * 6), rounds_of([[2.4]] * 6)
    session, plain = rounds_of([[2.2]] * 6), rounds_of([[2.1]] * 6)
    result = compared(fronts(grpc, sdk, mcp_session=session, mcp_plain=plain), HZ)
    for front in FRONTS:
        result[front]["client_cpu_us_per_call"] = 100.0
    result["mcp"]["protocol"] = "2026-07-28"
    printed = section("docker", {"rounds": 6, "calls_per_round": 1, **result})
    assert "6 interleaved rounds of 1 calls a front" in printed
    _, sdk_block, rest = printed.split("MCP, SDK client, ")
    session_block, plain_block = rest.split("MCP, plain client, a session")
    assert sdk_block.startswith("default mode (2026-07-28)\n")
    assert session_block.startswith("a session\n")
    assert "  warm exec true, median (ms)        2.00     2.40      0.40" in sdk_block
    assert "  warm exec true, median (ms)        2.00     2.20      0.20" in session_block
    assert "  warm exec true, median (ms)        2.00     2.10      0.10" in plain_block
    last = printed.splitlines()[-2:]
    assert last[0].startswith("  MCP - gRPC, default mode")
    assert last[0].endswith("0.40 ms   target <= 1 ms   met")
    assert last[1].startswith("  MCP - gRPC, session")
    assert last[1].endswith("0.20 ms   target <= 1 ms   met")
    assert section("podman", {"error": "RuntimeError: no engine"}).endswith(
        "n/a: RuntimeError: no engine"
    )


def test_write_keeps_the_rest_of_the_record(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(
        json.dumps(
            {
                "settings": {"n": 300},
                "engines": {"docker": {"stockade_warm": {"median_ms": 2.4}, "mcp": {"old": 1}}},
                "compare": {"old_rev": "abc"},
            }
        )
    )
    write({"docker": {"met": True}, "podman": {"error": "x"}}, path)
    record = json.loads(path.read_text())
    assert record["settings"] == {"n": 300}
    assert record["compare"] == {"old_rev": "abc"}
    assert record["engines"]["docker"] == {
        "stockade_warm": {"median_ms": 2.4},
        "mcp": {"met": True},
    }
    assert record["engines"]["podman"] == {"mcp": {"error": "x"}}


def test_write_starts_a_record_when_there_is_none(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text("not json")
    write({"docker": {"met": False}}, path)
    assert json.loads(path.read_text()) == {"engines": {"docker": {"mcp": {"met": False}}}}


def test_only_mcp_is_its_own_run(capsys: pytest.CaptureFixture[str]) -> None:
    ns = parse_args(["--only", "mcp", "--n", "50", "--rounds", "5"])
    assert (ns.only, ns.n, ns.rounds) == ("mcp", 50, 5)
    for wrong in (["--only", "mcp", "--compare", "HEAD"], ["--rounds", "0"], ["--only", "x"]):
        with pytest.raises(SystemExit):
            parse_args(wrong)
    assert "--compare and --only" in capsys.readouterr().err


def test_the_summary_has_a_row_for_each_mcp_mode() -> None:
    measured = {
        "mcp_minus_grpc": {"median_ms": {"pooled": 0.84}},
        "mcp_session_minus_grpc": {"median_ms": {"pooled": 0.42}},
    }
    lines = summary({"podman": {"mcp": measured}, "docker": {"mcp": {"error": "x"}}}).splitlines()
    rows = [line for line in lines if line.startswith("MCP - gRPC")]
    assert len(rows) == 2
    assert rows[0].startswith("MCP - gRPC, SDK default")
    assert rows[0].split()[-2:] == ["0.84", "n/a"]
    assert rows[1].startswith("MCP - gRPC, session")
    assert rows[1].split()[-2:] == ["0.42", "n/a"]
