"""The command guard against its two corpora (tests/corpora), with the default config:
no ordinary command refused, at least 99% of the destructive ones denied."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.guard import (
    DESTRUCTIVE,
    DESTRUCTIVE_TARGET,
    MANUALS,
    ORDINARY,
    load_corpus,
    load_ordinary,
    run_guard_bench,
    section,
)
from stockade.supervisor.policy.guard import Guard
from tests.corpora.generate import TLDR_ENV

GUARD = Guard()


def test_the_corpora_are_as_large_as_promised() -> None:
    ordinary, destructive = load_ordinary(), load_corpus(DESTRUCTIVE)
    assert len(load_corpus(ORDINARY)) >= 450
    assert len(load_corpus(MANUALS)) >= 3000
    assert len(destructive) >= 230
    assert len(set(ordinary)) == len(ordinary), "a command listed twice"
    assert len(set(destructive)) == len(destructive), "a command listed twice"
    assert not set(ordinary) & set(destructive)


def test_no_ordinary_command_is_refused() -> None:
    refused = {}
    for command in load_ordinary():
        result = GUARD.check(command)
        if result.action != "allow":
            refused[command] = result.reason
    assert refused == {}


def test_destructive_commands_are_denied() -> None:
    commands = load_corpus(DESTRUCTIVE)
    passed = {}
    for command in commands:
        result = GUARD.check(command)
        if result.action != "deny":
            passed[command] = f"{result.action}: {result.reason}"
    for command, why in passed.items():
        print(f"not denied: {command!r} ({why})")
    denied = len(commands) - len(passed)
    assert denied / len(commands) >= DESTRUCTIVE_TARGET, passed


def test_a_backslash_at_the_end_of_a_line_goes_on_with_the_next(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("# comment\n\ncat <<'EOF' > f\\\nx\\\nEOF\nls\n", encoding="utf-8")
    assert load_corpus(corpus) == ["cat <<'EOF' > f\nx\nEOF", "ls"]
    corpus.write_text("ls \\\n", encoding="utf-8")
    with pytest.raises(ValueError, match="ends in a backslash"):
        load_corpus(corpus)


def test_the_bench_section_lists_refusals_by_rule_with_a_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TLDR_ENV, raising=False)
    results = run_guard_bench()
    text = section(results)
    assert "tldr-pages examples: not measured" in text
    results["ordinary_by_rule"] = {"privilege-escalation": [("sudo ls", "privilege escalation")]}
    results["tldr"] = {
        "commands": 3,
        "refused": 2,
        "counts": {"parse-error": 2},
        "by_rule": {"parse-error": [("a (", "x")]},
        "parse_errors_bash_accepts": ["echo =="],
        "check_median_us": 1.0,
        "check_max_us": 2.0,
    }
    text = section(results)
    assert "    privilege-escalation (1): not the agent's to do" in text
    assert "bash -n rejects 1 of these 2 too" in text
    assert "... and 1 more" in text
    assert "accepts  1  target 0  MISSED" in text
