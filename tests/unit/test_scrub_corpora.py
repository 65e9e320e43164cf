"""The scrubber over its two corpora (tests/corpora, generated from a fixed seed): recall of
at least 99.5% of the fake credentials, false positives on at most 0.1% of the ordinary lines.
A correctness test: no time is measured here (bench/scrub.py prints the speed)."""

from __future__ import annotations

from typing import Any

import pytest

from stockade.supervisor.policy.scrub.formats import FORMATS
from tests.corpora.generate import credentials, ordinary
from tests.corpora.measure import MAX_FALSE_POSITIVE_RATE, MIN_RECALL, measure


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    return measure()


def test_the_corpora_are_as_large_as_promised() -> None:
    cases = credentials()
    assert sum(len(case.secrets) for case in cases) >= 1000
    assert len(ordinary()) >= 5000
    covered = {case.kind.split("/")[0] for case in cases}
    assert {fmt.name for fmt in FORMATS} <= covered
    assert {"partial-view", "labelled", "standalone-token"} <= covered


def test_the_corpora_are_deterministic() -> None:
    assert credentials() == credentials()
    assert ordinary() == ordinary()


def test_recall(figures: dict[str, Any]) -> None:
    assert figures["recall"] >= MIN_RECALL, figures["missed"]


def test_false_positives(figures: dict[str, Any]) -> None:
    assert figures["false_positive_rate"] <= MAX_FALSE_POSITIVE_RATE, figures["changed"]
