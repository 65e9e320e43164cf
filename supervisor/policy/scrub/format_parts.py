"""The shape of a credential format: a sequence of parts, literals (or a choice of literals)
and runs of characters from a class. From the parts come the regex that confirms a hit
(Python `re`, with the boundaries), the shorter regex Hyperscan searches for (the parts up to
the first run of open length after the first part, at its least), and fake examples for the
tests and corpora. The rows themselves are in formats.py."""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass

__all__ = ["Choice", "Format", "Run", "example", "fmt", "run", "uuid"]


@dataclass(frozen=True)
class Run:
    """`least` to `most` characters of a class (`most` None: no limit)."""

    chars: str
    least: int
    most: int | None

    def regex(self, prefilter: bool = False) -> str:
        cls = _CLASSES[self.chars]
        if prefilter or self.most == self.least:
            return f"[{cls}]{{{self.least}}}"
        return f"[{cls}]{{{self.least},{'' if self.most is None else self.most}}}"


@dataclass(frozen=True)
class Choice:
    options: tuple[str, ...]

    def regex(self, prefilter: bool = False) -> str:
        return "(?:" + "|".join(re.escape(o) for o in self.options) + ")"


Part = str | Run | Choice

_ALPHABETS = {
    "alnum": string.ascii_letters + string.digits,
    "hex": "0123456789abcdef",
    "HEX": "0123456789ABCDEF",
    "Hex": "0123456789abcdefABCDEF",
    "upper": string.ascii_uppercase + string.digits,
    "lower": string.ascii_lowercase + string.digits,
    "word": string.ascii_letters + string.digits + "_",
    "url": string.ascii_letters + string.digits + "_-",
    "b64": string.ascii_letters + string.digits + "+/",
    "digit": string.digits,
    "b32": "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567",
    "bech32": "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L",
    "azure": string.ascii_letters + string.digits + "_.~-",
    "path": string.ascii_letters + string.digits + "_-/",
    "slug": string.ascii_lowercase + string.digits + "_-",
}
_CLASSES = {
    "alnum": "A-Za-z0-9",
    "hex": "a-f0-9",
    "HEX": "A-F0-9",
    "Hex": "a-fA-F0-9",
    "upper": "A-Z0-9",
    "lower": "a-z0-9",
    "word": "A-Za-z0-9_",
    "url": "A-Za-z0-9_-",
    "b64": "A-Za-z0-9+/",
    "digit": "0-9",
    "b32": "A-Z2-7",
    "bech32": "0-9A-Z",
    "azure": "A-Za-z0-9_.~-",
    "path": "A-Za-z0-9_/-",
    "slug": "a-z0-9_-",
}


def run(chars: str, least: int, most: int | None = -1) -> Run:
    """A run of `least` characters (exactly, by default), or `least` to `most` (None: more)."""
    return Run(chars, least, least if most == -1 else most)


def uuid(chars: str = "hex") -> tuple[Part, ...]:
    return (
        run(chars, 8),
        "-",
        run(chars, 4),
        "-",
        run(chars, 4),
        "-",
        run(chars, 4),
        "-",
        run(chars, 12),
    )


@dataclass(frozen=True)
class Format:
    name: str
    service: str
    parts: tuple[Part, ...]
    doc: str
    """The published documentation the shape comes from."""
    redact_from: int = 0
    """The parts before this index stay readable (`https://hooks.slack.com/services/`)."""
    before: str = "A-Za-z0-9_-"
    """Characters that may not come right before (empty: any)."""
    after: str = ""
    """Characters that may not come right after (for formats of fixed length)."""
    negative: str = ""
    """A look-alike that must stay, for formats easily confused with ordinary text."""
    lead: str = ""
    """A regex of fixed width that must come right before, and stays (not matched)."""

    def regex(self) -> str:
        """The confirming regex; group `s` is what is redacted."""
        head = "".join(_regex(p) for p in self.parts[: self.redact_from])
        tail = "".join(_regex(p) for p in self.parts[self.redact_from :])
        before = f"(?<![{self.before}])" if self.before else ""
        before += f"(?<={self.lead})" if self.lead else ""
        after = f"(?![{self.after}])" if self.after else ""
        return f"{before}{head}(?P<s>{tail}){after}"

    def prefilter(self) -> str:
        """The parts up to the first run of open length after the first part, each run at its
        least: any match of `regex` holds a match of this on its line (a first run of
        open length is matched by its last characters)."""
        pieces: list[str] = [self.lead]
        for number, part in enumerate(self.parts):
            pieces.append(_regex(part, prefilter=True))
            if number and isinstance(part, Run) and part.most != part.least:
                break
        return "".join(pieces)


def _regex(part: Part, prefilter: bool = False) -> str:
    return re.escape(part) if isinstance(part, str) else part.regex(prefilter)


def example(fmt: Format, rng: random.Random) -> str:
    """A fake credential of this format: random characters, never a real key."""
    pieces: list[str] = ["".join(rng.choices(_ALPHABETS["alnum"], k=3))] if fmt.lead else []
    for part in fmt.parts:
        if isinstance(part, str):
            pieces.append(part)
        elif isinstance(part, Choice):
            pieces.append(rng.choice(part.options))
        else:
            top = part.most if part.most is not None else part.least + 12
            size = rng.randint(part.least, top)
            pieces.append("".join(rng.choices(_ALPHABETS[part.chars], k=size)))
    return "".join(pieces)


def fmt(name: str, service: str, doc: str, *parts: Part, **kw: object) -> Format:
    return Format(name, service, parts, doc, **kw)  # type: ignore[arg-type]
