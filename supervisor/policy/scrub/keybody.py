"""Key material seen without its frame: lines of a private key's body shown by `sed -n 5,20p`,
`head`, `tail`, `grep -v BEGIN`, a `read_file` line range or a `search` that returns matched
lines one at a time, and long random base64 standing alone on a line (`cat token.txt`).

A line is taken when, after an optional `path:` or `path:N:` / `N:` / `N<tab>` prefix (grep,
search, `cat -n`), it is one run of base64 or base64url of 40 to 128 characters (longer is a
blob, `base64 -w0 file`, not a key's line or a token) that:
- is not hex (git SHAs, checksums, digests), nor a labelled hash (`sha512-...` integrity);
- holds upper case, lower case and digits, and looks random (Shannon entropy of at least
  4.5 bits a character: `QUFBQUFB...` or a long identifier is not random);
- is not base64 of text (it decodes to 90% printable ASCII: JSON, a sentence);
- does not start like a known file type (PNG, GIF, JPEG, PDF, ZIP, gzip, SVG, XML);
- is not a line of `base64`'s 76-column output next to another (a wrapped fixture), and
  its block does not follow a `-----BEGIN` line of something public (a certificate).
An OpenSSH key body (`b3BlbnNzaC1rZXktdjE`) is taken whatever it looks like. The lines of
base64 next to a line taken (the short last line of a key body) are taken with it.
Imports nothing of the scrubber.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections import Counter
from collections.abc import Iterator

__all__ = ["ANCHORS", "spans"]

_Span = tuple[int, int]
_PREFIX = r"(?:[\w./-]*:)?(?:[ \t]*[0-9]+(?:[:-]|\t))?[ \t]*"
_RUN = "[A-Za-z0-9+/_-]{40}"
_FILES = "pem|key|txt|asc|b64|p8|enc|der|pub|env"
ANCHORS = (
    rf"(?:\n[ \t]*(?:[0-9]+[:-])?|\t|:[0-9]+[:-][ \t]*|\.(?:{_FILES}):){_RUN}",
    rf"^[ \t]*(?:[0-9]+[:-])?{_RUN}",
)
"""For Hyperscan: 40 base64 characters at the start of a line, after a line number or a tab
(`grep -n`, `search`, `cat -n`), or after a key file's name (`grep -r`); the rest of the
line is checked in Python. (A 40-character run anywhere is ~3 times slower to search.)"""
_LINE = re.compile(rf"{_PREFIX}(?P<s>[A-Za-z0-9+/_-]+={{0,2}})[ \t]*\r?", re.ASCII)
_NEIGHBOUR = re.compile(
    r"(?:(?:[\w./-]*:)?[ \t]*[0-9]+(?:[:-]|\t))?[ \t]*(?P<s>[A-Za-z0-9+/_-]+={0,2})[ \t]*\r?",
    re.ASCII,
)
"""A line next to key material: base64 after nothing but a line number (not `label:`)."""
_HEX = re.compile(r"[0-9a-fA-F]+")
_KNOWN_FILES = ("iVBORw0KGgo", "R0lGOD", "/9j/", "JVBERi0", "UEsDB", "H4sI", "PHN2Zy", "PD94bWwg")
_HASH_LABELS = ("sha1-", "sha256-", "sha384-", "sha512-", "md5-")
_OPENSSH = "b3BlbnNzaC1rZXktdjE"
_MIN_ENTROPY = 4.5
_MAX_LINE = 128
"""Longer runs are blobs (`base64 -w0 file`), not a key's line or a token."""
_BASE64_WIDTH = 76


def _entropy(token: str) -> float:
    counts = Counter(token)
    size = len(token)
    return -sum(n / size * math.log2(n / size) for n in counts.values())


def _encoded_text(token: str) -> bool:
    """Whether the token is base64 of text (JSON, a sentence), not of random bytes."""
    body = token.rstrip("=")
    if len(body) % 4 == 1:
        return False
    try:
        raw = base64.b64decode(
            body + "=" * (-len(body) % 4),
            altchars=b"-_" if "-" in body or "_" in body else None,
            validate=True,
        )
    except (ValueError, binascii.Error):
        return False
    printable = sum(1 for b in raw if 32 <= b < 127 or b in (9, 10, 13))
    return printable >= 0.9 * len(raw)


def _random(token: str) -> bool:
    if token.startswith(_OPENSSH):
        return True
    if (
        not 40 <= len(token) <= _MAX_LINE
        or _HEX.fullmatch(token)
        or token.startswith(_KNOWN_FILES + _HASH_LABELS)
    ):
        return False
    has = (any(c.isupper() for c in token), any(c.islower() for c in token))
    return (
        all(has)
        and any(c.isdigit() for c in token)
        and _entropy(token) >= _MIN_ENTROPY
        and not _encoded_text(token)
    )


def _line_at(text: str, at: int) -> tuple[int, int]:
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at)
    return start, len(text) if end == -1 else end


def _token(text: str, start: int, end: int) -> re.Match[str] | None:
    return _LINE.fullmatch(text, start, end)


def _neighbours(text: str, start: int, end: int, step: int) -> Iterator[tuple[int, int, str]]:
    """The base64 lines next to a line, going up (step -1) or down (step 1)."""
    while True:
        if (step < 0 and start == 0) or (step > 0 and end >= len(text)):
            return
        start, end = _line_at(text, start - 1 if step < 0 else end + 1)
        line = _NEIGHBOUR.fullmatch(text, start, end)
        if (
            line is None
            or len(line["s"]) < 4
            or (len(line["s"]) >= 16 and _HEX.fullmatch(line["s"]))
        ):
            return
        yield line.start("s"), line.end("s"), line["s"]


def _fixture(text: str, start: int, end: int, token: str) -> bool:
    """A line of 76-column `base64` output next to another of the same width."""
    if len(token) != _BASE64_WIDTH:
        return False
    return any(
        len(other) == _BASE64_WIDTH
        for step in (-1, 1)
        for _, _, other in _neighbours(text, start, end, step)
    )


def _public_block(text: str, first: int) -> bool:
    """Whether the line before a block is a `-----BEGIN` line of something not private."""
    if first == 0:
        return False
    start, end = _line_at(text, first - 1)
    line = text[start:end]
    return "-----BEGIN " in line and "PRIVATE" not in line


def spans(text: str, line_ends: list[int]) -> Iterator[_Span]:
    """The key material on the lines that end at `line_ends` (Hyperscan's hits, in order),
    with the base64 lines around each; each line is its own span."""
    covered = -1
    for at in line_ends:
        if at <= covered:
            continue
        start, end = _line_at(text, max(at - 1, 0))
        line = _token(text, start, end)
        if line is None or not _random(line["s"]) or _fixture(text, start, end, line["s"]):
            continue
        above = list(_neighbours(text, start, end, -1))
        first = above[-1][0] if above else start
        if _public_block(text, first):
            continue
        for s, e, _ in above:
            yield s, e
        yield line.span("s")
        for s, e, _ in _neighbours(text, start, end, 1):
            covered = e
            yield s, e
        covered = max(covered, end)
