"""The encoded forms of a secret that a server reflecting it, or code in a sandbox sending it,
plausibly uses, and `Forms`: one Hyperscan database of every form of a few values, which finds
or masks them all in one pass whatever their number.

Forms of a value (ASCII, so a match is bytes of the same length everywhere):
- the literal;
- base64, standard and URL-safe, and standard with its `+/=` percent-encoded: for each of the
  three alignments (the value's first byte at offset 0, 1 or 2 of a 3-byte group) the
  characters that depend on the value alone (so whatever precedes or follows it), and that
  core run on to the end as when the value ends the encoded data, padded and not;
- hex, lower and upper case (matched caseless);
- percent-encoding of every byte (caseless), and of the reserved ones as the common encoders
  do (RFC 3986's unreserved kept, also `/` for a path; `encodeURIComponent`; Java's and
  PHP's, which escape `~`), `%XX` upper and lower;
- JSON string escapes: `\\"` and `\\\\` (as any encoder), `\\/` (as PHP and others escape
  slashes), `<>&` as `\\u003c`... (as Go does), and every character as `\\uXXXX`;
- HTML entities: `&amp;` `&lt;` `&gt;` `&quot;` `&#x27;` (named where they apply), and every
  character as a decimal or hex reference;
- quoted-printable (`=` as `=3D`, bytes outside ASCII as `=XX`).

An encoded form shorter than MIN_ENCODED is dropped (a short core of base64 would be found in
ordinary text); the literal always stays. Transforms that leave no fixed bytes (reversal,
splitting across fields, compression, encryption of one's own) cannot be matched by anyone.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import string
from collections.abc import Iterable, Sequence
from urllib.parse import quote

import hyperscan

__all__ = ["MIN_ENCODED", "Forms", "forms", "longest_form"]

MIN_ENCODED = 12
"""The shortest encoded form kept (a value's literal is always kept)."""


_ALNUM = string.ascii_letters + string.digits
_UNESCAPED = (
    _ALNUM + "-._~",  # RFC 3986's unreserved: Python's quote, Go's QueryEscape
    _ALNUM + "-._~/",  # a path
    _ALNUM + "-._~!'()*",  # JavaScript's encodeURIComponent
    _ALNUM + "-._*",  # Java's URLEncoder, PHP's urlencode (~ escaped)
)
"""The bytes each common percent-encoder leaves as they are (every other one is %XX)."""


def _b64_cores(value: bytes) -> Iterable[tuple[bytes, bool]]:
    """(form, caseless) of the base64 of value at each alignment: the characters that depend
    on value alone, and those run on to the end of the data (padded and not)."""
    for offset in range(3):
        data = b"\0" * offset + value
        start = -(-offset * 8 // 6)  # the first character with no bit of what precedes
        stop = len(data) * 8 // 6  # the last with no bit of what follows
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            whole = encode(data)
            yield whole[start:stop], False
            yield whole[start:], False
            yield whole[start:].rstrip(b"="), False
        whole = base64.b64encode(data)
        for run in (whole[start:stop], whole[start:]):
            escaped = quote(run, safe="")
            yield escaped.encode(), False
            yield _lower_escapes(escaped).encode(), False


def _json_forms(text: str) -> Iterable[str]:
    escaped = json.dumps(text)[1:-1]  # \" \\ and \uXXXX outside ASCII
    yield escaped
    yield escaped.replace("/", "\\/")
    go = escaped.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    yield go
    yield go.replace("/", "\\/")
    utf16 = text.encode("utf-16-be", "surrogatepass")
    units = [utf16[i : i + 2].hex() for i in range(0, len(utf16), 2)]
    yield "".join(f"\\u{unit}" for unit in units)
    yield "".join(f"\\u{unit.upper()}" for unit in units)


def _html_forms(text: str) -> Iterable[tuple[str, bool]]:
    yield html.escape(text, quote=True), False
    yield html.escape(text, quote=False), False
    yield html.escape(text, quote=True).replace("&#x27;", "&#39;"), False
    yield "".join(f"&#{ord(c)};" for c in text), False
    yield "".join(f"&#x{ord(c):x};" for c in text), True


def forms(value: bytes) -> list[tuple[bytes, bool]]:
    """Every form of value (the literal first), each once, with whether it is matched caseless
    (forms whose letters are all hex digits of the value's bytes)."""
    text = value.decode("utf-8", "surrogateescape")
    found: list[tuple[bytes, bool]] = [(value, False)]
    found += _b64_cores(value)
    found += [(value.hex().encode(), True)]
    found += [("".join(f"%{b:02X}" for b in value).encode(), True)]
    for keep in _UNESCAPED:
        encoded = "".join(chr(b) if chr(b) in keep else f"%{b:02X}" for b in value)
        found += [(encoded.encode(), False), (_lower_escapes(encoded).encode(), False)]
    found += [(form.encode("ascii"), False) for form in _json_forms(text)]
    found += [
        (form.encode("ascii", "xmlcharrefreplace"), caseless)
        for form, caseless in _html_forms(text)
    ]
    found += [(binascii.b2a_qp(value, istext=False), False)]
    out: dict[bytes, bool] = {}
    for form, caseless in found:
        key = form.lower() if caseless else form
        if form and (form == value or len(form) >= MIN_ENCODED) and key not in out:
            out[key] = caseless
    return [(form, caseless) for form, caseless in out.items()]


def _lower_escapes(encoded: str) -> str:
    parts = encoded.split("%")
    return parts[0] + "".join("%" + p[:2].lower() + p[2:] for p in parts[1:])


def longest_form(length: int) -> int:
    """The longest form a value of `length` bytes may have (a decimal HTML reference of every
    byte as a character: `&#NNN;`, or `\\uXXXX`)."""
    return 6 * length + 8


class Forms:
    """One Hyperscan database of every form of `values`: `spans` finds them, `mask` puts
    asterisks over them (same length), `owner(i)` says whose form match i was. Compiled in
    the constructor (a few ms for a sandbox's values): build it once, off the event loop."""

    def __init__(self, values: Sequence[bytes], encoded: bool = True) -> None:
        self.values = [v for v in values if v]
        patterns: list[tuple[bytes, bool, int]] = []
        seen: set[bytes] = set()
        for index, value in enumerate(self.values):
            for form, caseless in forms(value) if encoded else [(value, False)]:
                if form not in seen:
                    seen.add(form)
                    patterns.append((form, caseless, index))
        self.patterns = [form for form, _, _ in patterns]
        self.owners = [index for _, _, index in patterns]
        self.longest = max((len(p) for p in self.patterns), default=0)
        self._database: hyperscan.Database | None = None
        if patterns:
            database = hyperscan.Database()
            database.compile(
                expressions=[_literal_regex(form) for form in self.patterns],
                ids=list(range(len(patterns))),
                elements=len(patterns),
                flags=[hyperscan.HS_FLAG_CASELESS if c else 0 for _, c, _ in patterns],
            )
            self._database = database

    def spans(self, data: bytes) -> list[tuple[int, int, int]]:
        """(start, end, pattern id) of every form in data, by end."""
        if self._database is None or not data:
            return []
        found: list[tuple[int, int, int]] = []
        lengths = self.patterns

        def on_match(ident: int, _start: int, end: int, _flags: int, _context: object) -> None:
            found.append((end - len(lengths[ident]), end, ident))

        self._database.scan(data, match_event_handler=on_match)
        return found

    def mask(self, data: bytes) -> bytes:
        """data with asterisks over every form in it (same length, so framing holds)."""
        found = self.spans(data)
        if not found:
            return data
        out = bytearray(data)
        for start, end, _ in found:
            out[start:end] = b"*" * (end - start)
        return bytes(out)


def _literal_regex(form: bytes) -> bytes:
    return b"".join(
        bytes([b]) if chr(b).isascii() and chr(b).isalnum() else b"\\x%02x" % b for b in form
    )
