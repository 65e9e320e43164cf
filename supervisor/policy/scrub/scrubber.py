r"""Credential scrubbing: the last step before any text leaves the host.

`Scrubber.scrub(text)` returns the text with every credential it recognises replaced by
`[REDACTED]`, and how many replacements it made. Two sources of credentials:

- literal secrets from the config (values injected into sandboxes), also URL-encoded (`%XX`
  in either case, `+` for a space, whatever set of characters the encoder leaves alone),
  JSON-escaped (`\uXXXX` in either case, `\/`), HTML-escaped or backslash-escaped, and in
  base64 (standard and URL-safe, padded or not, also inside a longer base64 stream at any of
  its three alignments, and wrapped over lines as `base64` and PEM write it);
- known formats, below. A prefix that tells the reader what was hidden stays outside the
  redaction: `password=[REDACTED]`, `Authorization: Bearer [REDACTED]`,
  `https://user:[REDACTED]@host`.

Formats known by their shape (tokens of source hosts, registries, CI systems, chat and
webhook services, cloud providers, payment and AI providers, database URLs, JWTs): the table
`FORMATS` in formats.py, one row per format with its service and the documentation it
comes from; formats.md lists them all (generated from the table, a test keeps it so).
Rules that read a credential from its context are in context.py:

| Rule          | Redacts                                                                    |
|---------------|----------------------------------------------------------------------------|
| pem           | a `-----BEGIN ... PRIVATE KEY[ BLOCK]-----` block through its END line     |
|               | (RSA, EC, DSA, OPENSSH, ENCRYPTED, PGP...); with no END line, up to the    |
|               | next `-----` or the end of the text: a truncated key is hidden too         |
| key body      | key material without its frame, line by line (keybody.py): `sed -n`, |
|               | `head`, `tail`, `grep -v BEGIN`, `grep -n`, `cat -n`, `search` hits; long  |
|               | random base64 alone on a line                                              |
| url           | the password in `scheme://user:password@host` (postgres, mongodb+srv...)   |
| bearer        | `Bearer <16+ token characters>` anywhere (also `bearer`, `BEARER`)          |
| cookie        | the rest of a `Cookie:` or `Set-Cookie:` header line                       |
| xml           | the text of an element named like a keyword: `<password>x</password>`      |
| putty / ssh2  | PuTTY `Private-Lines`; `---- BEGIN SSH2 ... PRIVATE KEY ----` blocks        |
| cli flag      | `--password X`, `--github-token X` (not `--password-stdin`); the password  |
|               | of `curl -u user:pass` / `--user` (not `-u 1000:1000`), `sshpass -p X`,    |
|               | `mysql ... -pX`                                                            |
| netrc         | `login U password P`                                                       |
| keyword       | the value in `NAME: value`, `NAME = value`, `NAME => value` where NAME     |
|               | ends in a `_KEYWORDS` word, any case: `GITHUB_TOKEN=x`, `"password": "x"`  |
|               | `aws_secret_access_key = x`, `AccountKey=x;`, `:_authToken=x`,             |
|               | `client-key-data: x`; `pwd` and `auth` only as a whole name part           |
|               | (`Pwd=x;`, `"auth": "x"`, not `OLDPWD=`), `pass` only before `=`, `sig`    |
|               | only as `sig=` (Azure SAS). `Authorization: Basic x` keeps its scheme.     |

Trade-offs, chosen to keep ordinary output readable:
- Stripe publishable keys (`pk_live_`, `pk_test_`) and Twilio account SIDs (`AC...`) are
  identifiers meant to be public: they stay. Bare 32/40/64-hex strings stay (git SHAs,
  checksums) although some tokens look like them: label them or configure them.
- A keyword value without quotes ends at whitespace or one of `` ,;&<>()[]{}"'` ``;
  a password containing those is only partly hidden unless quoted or configured.
- Not taken for keyword values: `null`, `true`, `None`, type names (`token: str`);
  identifiers that name a secret (`token = self.token`, `password=key_password`);
  `$VAR`; calls, subscripts and generics (`token = get()`, `os.environ["X"]`,
  `Option<T>`); `PWD=/path`; a ` #comment`; and, after `:`, a word followed by more
  words, which is prose (`auth: fix the login`, `:param token: The token`). An unquoted
  multi-word YAML password therefore stays; without that rule only its first word went.
- Source code loses some values it did not need to (`token = Name.Builtin`): redacting
  too much is the safe side. Measured: 253 changed lines in 34 MB of site-packages,
  none in the 5,013 lines of the ordinary corpus (tests/corpora).
- Key bodies: a line of 40 to 128 random-looking base64 characters alone (after a line
  number at most) is taken for key material, so a partial view of a certificate's body goes
  too; 76-column `base64` output, base64 of text, hex and labelled hashes stay. In
  `scrub_value`, once an all-base64 string had something redacted, later all-base64
  strings of 8 characters or more in the same value go whole (a key's short last line as a
  `search` match of its own).
- Overlapping hits become one `[REDACTED]`; the count is the number of `[REDACTED]`
  inserted. A `[REDACTED]` already there is left alone, so scrubbing twice changes nothing.

Speed: one Hyperscan scan of the text (engine.py) finds where any rule may match: each
format by its literal prefix, each context rule by an anchor; Python's `re` then confirms a rule
only on the lines where it was found (the few rules that span lines, over the text once). The
configured secrets' forms are a second, per-scrubber Hyperscan database of literals (also the
pieces a wrapped form leaves at a line break); the text is unwrapped only around those. 1 MiB
of tool output takes ~1.8 ms with every format on (24 regex passes took 14.7 ms), 4 KiB
~0.014 ms: `python -m bench.scrub`.
Configured secrets with characters that encoders change are still one `re` pass each.
"""

from __future__ import annotations

import base64
import html
import json
import re
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from urllib.parse import quote

import hyperscan

from stockade.supervisor.policy.scrub.context import alternation
from stockade.supervisor.policy.scrub.engine import (
    as_bytes,
    compile_literals,
    format_spans,
    hits,
    prepare,
)
from stockade.supervisor.policy.scrub.partial import open_tail
from stockade.supervisor.policy.scrub.partial import warm as warm_partial
from stockade.supervisor.text import wire_text

__all__ = ["REDACTED", "Scrubber"]

REDACTED = "[REDACTED]"

_Span = tuple[int, int]


_PLAIN = frozenset("-_.")
"""Characters besides ASCII letters and digits that no encoder changes."""


def _plain(c: str) -> bool:
    return (c.isascii() and c.isalnum()) or c in _PLAIN


def _char_pattern(c: str) -> str:
    """`c` as encoders write it: itself, `%XX` (either case; `+` for a space), a JSON `\\uXXXX`
    (either case) or other backslash escape, an HTML entity."""
    if _plain(c):
        return re.escape(c)
    raw = c.encode("utf-8", "surrogatepass")
    units = c.encode("utf-16-be", "surrogatepass")
    u16 = "".join(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))
    forms = {c, "\\" + c, json.dumps(c)[1:-1], html.escape(c), f"&#{ord(c)};", f"&#x{ord(c):x};"}
    forms |= {"".join(f"%{b:02X}" for b in raw), "".join(f"%{b:02x}" for b in raw)}
    forms |= {u16, u16.upper().replace("\\U", "\\u")}
    if c == " ":
        forms.add("+")
    return f"(?:{alternation(forms)})"


def _base64_forms(raw: bytes) -> set[str]:
    """The base64 of a secret alone (padded or not) and inside a longer stream: at each of
    the three alignments, the characters made only of the secret's bits; each also
    URL-encoded, in either case."""
    forms: set[str] = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(raw).decode()
        forms |= {whole, whole.rstrip("=")}
        for shift in range(3):
            shifted = encode(bytes(shift) + raw).decode()
            forms.add(shifted[(8 * shift + 5) // 6 : 8 * (shift + len(raw)) // 6])
    forms = {form for form in forms if len(form) >= _MIN_BASE64}
    escaped = {quote(form, safe="") for form in forms}
    return forms | escaped | {re.sub("%..", lambda m: m[0].lower(), e) for e in escaped}


_MIN_CUT = 3
"""A piece of a secret at a cut shorter than this (3 characters or less) stays."""
_MIN_BASE64 = 6
"""Shorter pieces of base64 (of a secret of 4 characters or less) would match elsewhere."""


_WRAPPED = re.compile(
    r"\n(?:(?<=[A-Za-z0-9+/=_-]{40}\n)|(?<=[A-Za-z0-9+/=_-]{40}\r\n))(?=[A-Za-z0-9+/_-]{4})"
)
"""A line break inside base64: `base64` wraps its output at 76 columns, PEM at 64."""


def _unwrapped(text: str) -> tuple[str, array[int], array[int]]:
    """The text without line breaks between base64-like lines; where each break was in the
    result, and how many characters were removed up to and including it."""
    where, removed = array("q"), array("q")
    if "\n" not in text:
        return text, where, removed
    pieces, done, count = [], 0, 0
    for m in _WRAPPED.finditer(text):
        start = m.start() - (text[m.start() - 1] == "\r")
        pieces.append(text[done:start])
        where.append(start - count)
        count += m.end() - start
        removed.append(count)
        done = m.end()
    pieces.append(text[done:])
    return "".join(pieces), where, removed


def _original(where: array[int], removed: array[int], at: int, end: bool) -> int:
    """An offset in the unwrapped text as one in the original: a start goes past the breaks
    at its offset, an end does not."""
    before = bisect_left(where, at) if end else bisect_right(where, at)
    return at + (removed[before - 1] if before else 0)


_PREFIX = 16
"""Literal secrets are searched by their first characters, one pass per distinct prefix: the
forms of a secret (padded, unpadded, cut to the characters made of it alone, URL-encoded)
mostly share one."""


def _by_prefix(words: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The words by their first `_PREFIX` characters, longest first in each group."""
    groups: dict[str, list[str]] = {}
    for word in words:
        groups.setdefault(word[:_PREFIX], []).append(word)
    return {prefix: tuple(sorted(group, key=len, reverse=True)) for prefix, group in groups.items()}


def _occurrences(groups: dict[str, tuple[str, ...]], text: str) -> Iterator[_Span]:
    """Where the words occur (at each place the longest), overlapping ones too."""
    for prefix, words in groups.items():
        at = text.find(prefix)
        while at != -1:
            for word in words:
                if text.startswith(word, at):
                    yield at, at + len(word)
                    break
            at = text.find(prefix, at + 1)


_WRAP_ANCHOR = r"[A-Za-z0-9+/=_-]{40}\r?\n[A-Za-z0-9+/_-]{4}"
"""For Hyperscan: a line break that `_unwrapped` would take out."""
_ONE_BREAK = 42
"""A base64 form shorter than this crosses at most one break (a wrapped line has 40 or more
characters), so one of its two pieces holds half of it or more."""


def _wrap_pieces(forms: Iterable[str]) -> tuple[list[str], bool]:
    """What a base64 form leaves at a line break when wrapped: its first half or more before
    the break, or its last half or more after it; and whether some form is long enough to
    cross two breaks (then only `_WRAP_ANCHOR` finds them all)."""
    pieces: set[str] = set()
    for form in forms:
        for size in range((len(form) + 1) // 2, len(form)):
            pieces |= {form[:size] + "\n", form[:size] + "\r\n", "\n" + form[-size:]}
    return sorted(pieces), any(len(form) >= _ONE_BREAK for form in forms)


@dataclass(frozen=True)
class _Literals:
    """The configured secrets: `words` found as they are, `base64` also across line breaks
    (both by prefix), `patterns` (secrets with characters that encoders change) as regexes.
    `database` finds the words and base64 forms as they are (ids in `found`'s order), and
    after them the pieces a wrapped base64 form leaves at a line break (and `_WRAP_ANCHOR`
    when a form may cross two); only around those is the text unwrapped and searched by
    prefix."""

    words: dict[str, tuple[str, ...]] = field(default_factory=dict)
    base64: dict[str, tuple[str, ...]] = field(default_factory=dict)
    patterns: tuple[re.Pattern[str], ...] = ()
    forms: tuple[str, ...] = ()
    """Every secret as it is and its base64 forms, for a piece left at a cut."""
    found: tuple[str, ...] = ()
    database: hyperscan.Database | None = None
    secrets: tuple[str, ...] = ()
    """The values as configured (Scrubber.learn adds to them)."""

    @classmethod
    def of(cls, secrets: Iterable[str]) -> _Literals:
        secrets = tuple(secrets)
        words: set[str] = set()
        encoded: set[str] = set()
        patterns: list[re.Pattern[str]] = []
        for secret in secrets:
            encoded |= _base64_forms(secret.encode("utf-8", "surrogatepass"))
            if all(_plain(c) for c in secret):
                words.add(secret)
            else:
                patterns.append(re.compile("".join(_char_pattern(c) for c in secret)))
        found = tuple(sorted(words | encoded))
        pieces, long_forms = _wrap_pieces(encoded - words)
        anchors = (_WRAP_ANCHOR,) if long_forms else ()
        database = compile_literals((*found, *pieces), anchors) if found else None
        return cls(
            _by_prefix(words),
            _by_prefix(encoded - words),
            tuple(patterns),
            (*secrets, *encoded),
            found,
            database,
            secrets,
        )

    def spans(self, text: str, data: bytes) -> Iterator[_Span]:
        breaks: list[int] = []
        if self.database is not None:
            for number, end in hits(self.database, data):
                if number < len(self.found):
                    yield end - len(self.found[number]), end
                else:
                    breaks.append(end)
        for pattern in self.patterns:
            yield from _overlapping(pattern, text)
        if breaks and self.base64:
            for start, stop in _wrapped_regions(text, breaks):
                joined, where, removed = _unwrapped(text[start:stop])
                for s, e in _occurrences(self.base64, joined):
                    yield (
                        start + _original(where, removed, s, end=False),
                        start + _original(where, removed, e, end=True),
                    )


def _wrapped_regions(text: str, breaks: list[int]) -> Iterator[_Span]:
    """The runs of lines around line breaks inside base64 (`breaks`: where the pieces of a
    wrapped form or `_WRAP_ANCHOR` end, after the break), joined where they touch."""
    region: _Span | None = None
    for end in sorted(breaks):
        at = text.rfind("\n", 0, end)
        start = text.rfind("\n", 0, at) + 1
        stop = text.find("\n", at + 1)
        stop = len(text) if stop == -1 else stop
        if region and start <= region[1] + 1:
            region = (region[0], max(region[1], stop))
            continue
        if region:
            yield region
        region = (start, stop)
    if region:
        yield region


def _overlapping(pattern: re.Pattern[str], text: str) -> Iterator[_Span]:
    """Every match, also those that start inside another (overlapping secrets)."""
    match = pattern.search(text)
    while match:
        yield match.span()
        match = pattern.search(text, match.start() + 1)


def _redact(text: str, spans: list[_Span]) -> tuple[str, int]:
    """Replace the union of `spans`; overlapping spans become one `[REDACTED]`."""
    if not spans:
        return text, 0
    spans.sort()
    pieces: list[str] = []
    count = done = 0
    for start, end in spans:
        if end <= done or text[start:end] == REDACTED:  # covered, or redacted before
            continue
        if start < done:  # overlaps the last redaction: extend it
            done = end
            continue
        pieces += (text[done:start], REDACTED)
        count, done = count + 1, end
    pieces.append(text[done:])
    return "".join(pieces), count


class Scrubber:
    """Replaces credentials in text by `[REDACTED]`; safe to share: immutable but for learn(),
    which only widens it."""

    __slots__ = ("_formats", "_literals")

    def __init__(self, secrets: Iterable[str] = (), *, min_secret_length: int = 8) -> None:
        """secrets: literal values to hide (e.g. values injected into the sandbox
        environment), also in their base64 (standard and URL-safe, padded or not),
        URL-encoded (`quote`, `quote_plus`) and JSON-escaped forms.

        A secret shorter than min_secret_length raises ValueError: it could not be hidden
        without destroying ordinary text. Messages never include the secret itself."""
        if min_secret_length < 1:
            raise ValueError(f"min_secret_length must be at least 1, not {min_secret_length}")
        if isinstance(secrets, str):
            raise ValueError("secrets must be a collection of strings, not one string")
        checked: list[str] = []
        for number, secret in enumerate(secrets, 1):
            if not isinstance(secret, str):
                raise ValueError(f"secret #{number} is a {type(secret).__name__}, not a string")
            if len(secret) < min_secret_length:
                raise ValueError(
                    f"secret #{number} has {len(secret)} characters; at least "
                    f"{min_secret_length} are needed to redact it without damaging other text"
                )
            checked.append(secret)
        self._literals = _Literals.of(checked)
        self._formats = True
        prepare()

    def learn(self, secrets: Iterable[str]) -> None:
        """Also hide these values from now on (a reload's new brokered values), the known
        ones kept: the values' database is rebuilt and swapped in one assignment, so a scrub
        under way ends with the one it began with. The one change a Scrubber allows."""
        known = self._literals.secrets
        fresh = [s for s in secrets if s not in known]
        if fresh:
            self._literals = _Literals.of([*known, *fresh])

    def secrets_only(self) -> Scrubber | None:
        """A scrubber for the configured secrets alone, without the formats; None when no
        secret is configured."""
        if not (self._literals.words or self._literals.base64 or self._literals.patterns):
            return None
        only = Scrubber()
        only._literals, only._formats = self._literals, False
        return only

    @property
    def spans_lines(self) -> bool:
        """Whether a configured secret may be found across a line break (in wrapped base64)."""
        return bool(self._literals.base64)

    def spans(self, text: str) -> list[_Span]:
        """Where the credentials in `text` are (start, end), in order, possibly overlapping."""
        data = as_bytes(text)
        spans = list(self._literals.spans(text, data))
        if self._formats:
            spans += format_spans(text, data)
        spans.sort()
        return spans

    def scrub(self, text: str) -> tuple[str, int]:
        """The text with every credential replaced by `[REDACTED]`, and how many were."""
        return _redact(text, self.spans(text))

    def scrub_after(self, before: str, text: str) -> tuple[str, int]:
        """`scrub` for `text` that follows `before` (released already): the rules that read
        across lines (the base64 lines next to a key body's line) see `before`; only `text`
        is redacted and returned."""
        if not before:
            return self.scrub(text)
        size = len(before)
        spans = [(max(s - size, 0), e - size) for s, e in self.spans(before + text) if e > size]
        return _redact(text, spans)

    def warm(self) -> None:
        """What open_tail compiles on first use, compiled now (policy/scrub/partial.py)."""
        if self._formats:
            warm_partial()

    def open_tail(self, text: str) -> int:
        """Where the end of `text`'s open (last) line may still be the start of a credential,
        which a quiet stream keeps back (len(text): nowhere; policy/scrub/partial.py)."""
        return open_tail(text, self.spans, self._literals.forms, self._formats)

    def scrub_cut(self, text: str) -> tuple[str, int]:
        """`scrub` for a text cut short at its end (a truncated output): a configured secret
        cut there leaves a piece no pattern knows, so a tail of 4 characters or more that
        begins one of its forms becomes `[REDACTED]` too."""
        cleaned, count = self.scrub(text)
        longest = 0
        for form in self._literals.forms:
            for size in range(min(len(form) - 1, len(cleaned)), max(_MIN_CUT, longest), -1):
                if cleaned.endswith(form[:size]):
                    longest = size
                    break
        if longest:
            return cleaned[:-longest] + REDACTED, count + 1
        return cleaned, count

    def scrub_value(self, value: object) -> tuple[object, int]:
        """`scrub` through dicts (values only), lists, tuples and strings; anything else, and
        any container with nothing to redact, is returned as it is (not copied).

        Once a string that is all base64 has had something redacted (a line of a key body,
        as `search` returns matched lines one by one), every later string in the value that
        is all base64 is redacted whole: the short last line of a key is key material too,
        although too short to tell alone."""
        return self._scrub_value(value, [False])

    def _scrub_value(self, value: object, key_seen: list[bool]) -> tuple[object, int]:
        if isinstance(value, str):
            return self._scrub_string(value, key_seen)
        if isinstance(value, dict):
            items = [(key, *self._scrub_value(item, key_seen)) for key, item in value.items()]
            count = sum(n for _, _, n in items)
            return ({key: item for key, item, _ in items} if count else value), count
        if isinstance(value, list | tuple):
            results = [self._scrub_value(item, key_seen) for item in value]
            count = sum(n for _, n in results)
            if not count:
                return value, 0
            cleaned = [item for item, _ in results]
            return (cleaned if isinstance(value, list) else tuple(cleaned)), count
        return value, 0

    def _scrub_string(self, value: str, key_seen: list[bool]) -> tuple[str, int]:
        cleaned, count = self.scrub(value)
        if self._formats and _BASE64_VALUE.fullmatch(value.strip()):
            if count:
                key_seen[0] = True
            elif key_seen[0]:
                return REDACTED, 1
        return cleaned, count


_BASE64_VALUE = re.compile(r"[A-Za-z0-9+/_-]{8,}={0,2}")
"""A string value that is nothing but base64 (a line of a key body)."""


def scrubbed(text: str, scrubber: Scrubber | None) -> str:
    """`text` scrubbed (when there is a scrubber), and made fit for the wire."""
    return wire_text(text if scrubber is None else scrubber.scrub(text)[0])
