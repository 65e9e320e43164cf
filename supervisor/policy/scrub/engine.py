r"""Finding credentials by format: one Hyperscan pass over the text finds where any rule may
match, and Python's `re` confirms each rule only on the lines it was found on (or, for the
few rules that span lines, over the text once).

Hyperscan works on bytes. The text is given to it as ASCII with every other character (also
a lone surrogate) as one NUL byte, so a byte offset is a character offset and nothing is
mapped back. Every anchor takes a NUL wherever its rule's regex takes a character that is not
ASCII (negated classes, `\S`), and the rules' other classes are ASCII: the scan misses no
match. The database is compiled once a process (~0.2 s), when the first Scrubber is made.
Imports nothing of the scrubber but its rule modules.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache

import hyperscan

from stockade.supervisor.policy.scrub import keybody as scrub_keybody
from stockade.supervisor.policy.scrub.context import (
    KEYWORD_ANCHOR,
    RULES,
    XML_ANCHOR,
    keyword_spans,
    xml_spans,
)
from stockade.supervisor.policy.scrub.formats import FORMATS

__all__ = ["as_bytes", "compile_literals", "format_spans", "hits", "prepare"]

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
    anchors += ((anchor, 0, _Check(_xml, "keybody")) for anchor in scrub_keybody.ANCHORS)
    database = hyperscan.Database()
    database.compile(
        expressions=[anchor.encode() for anchor, _, _ in anchors],
        ids=list(range(len(anchors))),
        elements=len(anchors),
        flags=[flags for _, flags, _ in anchors],
    )
    return _Engine(database, tuple(check for _, _, check in anchors))


def prepare() -> None:
    """Compile the formats' database now (~0.2 s, once a process) rather than on the first
    text scrubbed."""
    _engine()


def as_bytes(text: str) -> bytes:
    """The text as Hyperscan reads it: one byte a character, NUL for any not ASCII."""
    return text.encode("ascii", "stockade-nul")


def compile_literals(words: Sequence[str], anchors: Sequence[str] = ()) -> hyperscan.Database:
    """A database of ASCII `words` (ids 0...), then regex `anchors` (the ids after)."""
    expressions = [re.sub(r"([^A-Za-z0-9])", r"\\\1", word).encode() for word in words]
    expressions += [anchor.encode() for anchor in anchors]
    database = hyperscan.Database()
    database.compile(
        expressions=expressions,
        ids=list(range(len(expressions))),
        elements=len(expressions),
        flags=[0] * len(expressions),
    )
    return database


def hits(database: hyperscan.Database, data: bytes) -> list[tuple[int, int]]:
    """(id, end offset) of every match, in the order Hyperscan reports them."""
    found: list[tuple[int, int]] = []
    add = found.append

    def on_match(rule: int, _start: int, end: int, _flags: int, _context: object) -> None:
        add((rule, end))

    database.scan(data, match_event_handler=on_match)
    return found


def format_spans(text: str, data: bytes) -> list[_Span]:
    """Where the known formats and context rules find credentials in `text` (`data` is
    `as_bytes(text)`), unsorted, possibly overlapping."""
    engine = _engine()
    found = hits(engine.database, data)
    if not found:
        return []
    spans: list[_Span] = []
    seen: set[tuple[int, int]] = set()
    key_lines: list[int] = []
    size = len(text)
    line_start = line_end = -1
    for rule, end in found:
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
                newline = text.find("\n", end - 1)
                line_end = size if newline == -1 else newline
            if (rule, line_start) not in seen:
                seen.add((rule, line_start))
                spans += check.find(text, line_start, line_end)
    if key_lines:
        spans += scrub_keybody.spans(text, sorted(key_lines))
    return spans
