"""Where the end of an open line may still be the start of a credential: what a stream that
went quiet must keep back while it releases the rest (policy/scrub/stream.py), so that a
prompt or a partial line arrives at once and a credential written in two pieces is still
redacted whole.

A tail is kept back from the earliest of:
- a partial match of MIN_LEAD characters or more, running to the end of the line, of a
  format that begins with a literal lead (`ghp_`, `sk-proj-`, `AKIA`, `postgres://`: 181 of
  the 191 formats), as the `regex` module's partial matching finds it (Python's `re` has
  none);
- a run of credential characters (base64, URL-safe base64, hex, `.~`) of LONG_RUN or more
  at the end: the formats without a lead (Azure keys, Mailchimp, Telegram), base64-wrapped
  secrets, a value without a keyword;
- any credential the scrubber would find if the line went on (PROBES: text of three
  alphabets appended): a keyword's value (`password: hun`), a bearer token, a URL password;
- the start of a configured secret in any of its forms (given by the scrubber).
What is not kept back: text that can only be the start of a prefix-less credential shorter
than LONG_RUN, or a single character that begins a lead. A program that writes such a piece
and pauses for the stream's quiet interval has that piece released before the rest is
written; the rest is then scrubbed with the released part as its context, which finds a
format with a lead but not every prefix-less one (docs/security.md#streamed-output-issue-28)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cache

import regex

from stockade.supervisor.policy.scrub.formats import FORMATS

LONG_RUN = 16
WINDOW = 512
"""How much of the open line's end is searched (a credential is shorter)."""
_RUN = re.compile(r"[A-Za-z0-9+/=_.~-]+\Z")
MIN_LEAD = 2
"""A partial match of a lead is kept back from its second character (a lone `c` at the end
of `abc` may begin `chat.googleapis.com/`, but so does every word ending in c)."""
PROBES = ("a" * 96, "7" * 96)
"""Continuations the scrubber is asked about: letters, digits. Of low entropy on purpose: a
random-looking one is itself a key body to the scrubber, whatever came before it."""


NEUTRAL = ("zqzqzqzq", "77777777", "zq7-zq7_")
"""Words that begin no credential with a lead: a format whose regex may begin any of them
(Azure's keys, 88 characters of base64) has no lead of its own."""


@cache
def _lead_formats() -> tuple[regex.Pattern[str], ...]:
    """The formats with a lead (a literal, maybe after a few characters of a class, as
    `xxx8Q~` of Azure AD's secrets), compiled once a process for partial matching."""
    compiled = (regex.compile(f.regex()) for f in FORMATS)
    return tuple(p for p in compiled if not any(p.match(w, partial=True) for w in NEUTRAL))


def warm() -> None:
    """Compile the formats with a lead now (~35 ms of `regex` work, once a process), so that
    the first stream that goes quiet mid-line does not pay it: a prompt of the supervisor's
    first streamed call arrived ~40 ms late before (calls `serve` makes at start)."""
    _lead_formats()


def open_tail(
    text: str,
    spans: Callable[[str], Sequence[tuple[int, int]]],
    forms: Sequence[str] = (),
    formats: bool = True,
) -> int:
    """The offset in `text` from which its end may still be the start of a credential
    (len(text): none). `spans`: the scrubber's search; `forms`: the configured secrets'
    forms; `formats`: whether the scrubber knows the formats (not a secrets-only one)."""
    start = text.rfind("\n") + 1
    start = max(start, len(text) - WINDOW)
    line = text[start:]
    if not line:
        return len(text)
    hold = len(line)
    for pattern in _lead_formats() if formats else ():
        for match in pattern.finditer(line, partial=True):
            if match.partial and len(line) - match.start() >= MIN_LEAD:
                hold = min(hold, match.start())
    if formats and (run := _RUN.search(line)) is not None and len(run[0]) >= LONG_RUN:
        hold = min(hold, run.start())
    for probe in PROBES:
        for s, e in spans(line + probe):
            if s < len(line) < e:
                hold = min(hold, s)
    for form in forms:
        for size in range(min(len(form) - 1, len(line)), 0, -1):
            if line.endswith(form[:size]):
                hold = min(hold, len(line) - size)
                break
    return start + hold
