"""Recall over the credential corpus and false positives over the ordinary one, for the unit
test that holds the thresholds and for `python -m bench`."""

from __future__ import annotations

from typing import Any

from stockade.supervisor.policy.scrub.scrubber import Scrubber
from tests.corpora.generate import credentials, leaked, ordinary

MIN_RECALL = 0.995
MAX_FALSE_POSITIVE_RATE = 0.001


def measure(scrubber: Scrubber | None = None) -> dict[str, Any]:
    """Each credential counts as found when no 12 characters of it in a row survive; each
    ordinary line counts as a false positive when scrubbing changes it."""
    scrubber = scrubber or Scrubber()
    cases = credentials()
    total = missed = 0
    missed_kinds: list[str] = []
    for case in cases:
        cleaned, _ = scrubber.scrub(case.text)
        for secret in case.secrets:
            total += 1
            if leaked(secret, cleaned):
                missed += 1
                missed_kinds.append(case.kind)
    lines = ordinary()
    text = "\n".join(lines) + "\n"
    cleaned, _ = scrubber.scrub(text)
    changed = [a for a, b in zip(lines, cleaned.split("\n"), strict=False) if a != b]
    if len(cleaned.split("\n")) != len(lines) + 1:  # a redaction took a line break with it
        changed.append("(line count changed)")
    return {
        "credentials": total,
        "cases": len(cases),
        "formats": len({case.kind.split("/")[0] for case in cases}),
        "recall": round((total - missed) / total, 5),
        "missed": missed_kinds,
        "ordinary_lines": len(lines),
        "false_positive_lines": len(changed),
        "false_positive_rate": round(len(changed) / len(lines), 5),
        "changed": changed[:20],
    }
