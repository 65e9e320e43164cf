"""Finding credentials by format: one Hyperscan pass over the text finds where any rule may
match, and Python's `re` confirms each rule only on the lines it was found on (or, for the
few rules that span lines, over the text once).

Hyperscan works on bytes. The text is given to it as ASCII with every other character (also
a lone surrogate) as one NUL byte, so a byte offset is a character offset; no rule's anchor
matches a NUL where the confirming regex would not take a non-ASCII character. The database
is compiled once, on first use. Imports nothing of the scrubber but its rule modules.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache

import hyperscan

from stockade.supervisor.policy import scrub_keybody
from stockade.supervisor.policy.scrub_context import (
    KEYWORD_ANCHOR,
    RULES,
    XML_ANCHOR,
    keyword_spans,
    xml_spans,
)
from stockade.supervisor.policy.scrub_formats import FORMATS

__all__ = ["format_spans"]

_Span = tuple[int, int]


def _to_nul(error: UnicodeError) -> tuple[str, int]:
    assert isinstance(error, UnicodeEncodeError)
    return "\0" * (error.end - error.start), error.end


codecs.register_error("stockade-nul", _to_nul)


@dataclass(frozen=True)
class _Check:
    """A rule as the engine runs it: `find(text, start, end)` yields the spans to redact in
    text[start:end] (`start`, `end` whole lines, or the whole text). Scope `keybody`: the
    hits are handed to scrub_keybody together, at the end."""

    find: Callable[[str, int, int], Iterator[_Span]]
    scope: str = "line"


def _regex_check(pattern: re.Pattern[str], groups: tuple[str | int, ...]) -> _Check:
    def find(text: str, start: int, end: int) -> Iterator[_Span]:
        for match in pattern.finditer(text, start, end):
            for group in groups:
                if match.start(group) >= 0:
                    yield match.span(group)
                    break

    return _Check(find)


def _keywords(text: str, start: int, end: int) -> Iterator[_Span]:
    for s, e in keyword_spans(text[start:end]):
        yield s + start, e + start


def _xml(text: str, _start: int, _end: int) -> Iterator[_Span]:
    return xml_spans(text)


@dataclass(frozen=True)
class _Engine:
    database: hyperscan.Database
    checks: tuple[_Check, ...]


@cache
def _engine() -> _Engine:
    anchors: list[tuple[str, int, _Check]] = []
    for fmt in FORMATS:
        anchors.append((fmt.prefilter(), 0, _regex_check(re.compile(fmt.regex()), ("s",))))
    caseless = hyperscan.HS_FLAG_CASELESS
    for rule in RULES:
        check = _regex_check(rule.pattern, rule.groups)
        anchors.append((rule.anchor, caseless, _Check(check.find, rule.scope)))
    anchors.append((KEYWORD_ANCHOR, caseless, _Check(_keywords)))
    anchors.append((XML_ANCHOR, caseless, _Check(_xml, "text")))
    anchors.append((scrub_keybody.ANCHOR, hyperscan.HS_FLAG_MULTILINE, _Check(_xml, "keybody")))
    database = hyperscan.Database()
    database.compile(
        expressions=[anchor.encode() for anchor, _, _ in anchors],
        ids=list(range(len(anchors))),
        elements=len(anchors),
        flags=[flags for _, flags, _ in anchors],
    )
    return _Engine(database, tuple(check for _, _, check in anchors))


def _hits(database: hyperscan.Database, text: str) -> list[tuple[int, int]]:
    data = text.encode("ascii", "stockade-nul")
    hits: list[tuple[int, int]] = []
    add = hits.append

    def on_match(rule: int, _start: int, end: int, _flags: int, _context: object) -> None:
        add((rule, end))

    database.scan(data, match_event_handler=on_match)
    return hits


def format_spans(text: str) -> list[_Span]:
    """Where the known formats and context rules find credentials in `text` (unsorted,
    possibly overlapping)."""
    engine = _engine()
    hits = _hits(engine.database, text)
    if not hits:
        return []
    spans: list[_Span] = []
    seen: set[tuple[int, int]] = set()
    key_lines: list[int] = []
    size = len(text)
    line_start = line_end = -1
    for rule, end in hits:
        check = engine.checks[rule]
        if check.scope == "keybody":
            key_lines.append(end)
        elif check.scope == "text":
            if (rule, -1) not in seen:
                seen.add((rule, -1))
                spans += check.find(text, 0, size)
        else:
            if not line_start <= end - 1 < line_end:  # hits come by their end: a new line
                line_start = text.rfind("\n", 0, max(end - 1, 0)) + 1
                found = text.find("\n", end - 1)
                line_end = size if found == -1 else found
            if (rule, line_start) not in seen:
                seen.add((rule, line_start))
                spans += check.find(text, line_start, line_end)
    if key_lines:
        spans += scrub_keybody.spans(text, sorted(key_lines))
    return spans
