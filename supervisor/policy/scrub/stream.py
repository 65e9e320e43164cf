"""Scrubbing a stream of output chunks, so that a credential split across two chunks is still
caught before any of it leaves the host.

Text is released up to its last newline: the credential formats the scrubber knows do not span
lines, except private key blocks (PEM, SSH2, PuTTY), which are held until their end line, and
configured secrets in wrapped base64 (`env | base64`): with secrets configured, a last line that
looks like base64 is held until the next, and the cut never falls inside a credential found
across it. A released last line that holds 40 base64 characters is kept as context for the
next text (Scrubber.scrub_after), so a key body's lines released apart are still seen
together. When the stream goes quiet, the open line is released but for a tail that may
still be the start of a credential (Scrubber.open_tail: a partial token with a known lead, a
long run of key characters, a keyword's value, the start of a configured secret), so that a
prompt or a partial line arrives at once; flush() releases the rest at the end. A line
longer than MAX_HOLD is released but for a tail that may still start a credential, and never
in the middle of one it holds.

With `whole_reads` (a command's output: calls/streaming.py), a read that ends mid-line is held
whole, its whole lines too, until the quiet spell (flush_open) or a read that ends a line, so
that one write of the process (`Hello,\nWorld!`) arrives as one chunk; the next read that
ends mid-line releases the lines held before it (a block-buffered flood is delayed by one read
at most), and MAX_HOLD bounds what is held as without it."""

from __future__ import annotations

import re

from stockade.supervisor.policy.scrub.scrubber import Scrubber

MAX_HOLD = 64 * 1024
TAIL = 4096
MAX_KEY_HOLD = 1 << 20
CONTEXT = 4096
"""How much of an open line released by a pause is kept as the context of its rest."""
KEY_BLOCKS = (
    ("-----BEGIN", "PRIVATE KEY", "-----END"),
    ("---- BEGIN SSH2", "PRIVATE KEY", "---- END"),
    ("PuTTY-User-Key-File-", "", "Private-MAC:"),
)
"""Private key blocks over lines: how one starts, what its first 80 characters include, and
how it ends."""
BASE64_LINE = re.compile(r"[A-Za-z0-9+/=_-]{16,}\r?\n")
KEY_LINE = re.compile(r"(?:^|\n)([^\n]*[A-Za-z0-9+/_-]{40}[^\n]*\n)\Z")
"""A released last line that may be a line of a key body: kept as context for the next text,
so that the base64 lines after it (the short last line of a key) are seen next to it."""


class StreamScrubber:
    def __init__(self, scrubber: Scrubber | None, whole_reads: bool = False) -> None:
        self._scrubber = scrubber
        self._whole_reads = whole_reads
        self._lines = 0
        """With whole_reads: where the whole lines held only because their read ended mid-line
        end (0: none; lines the scrubber holds back are not counted, so that they cost no
        rescan per read)."""
        self._parts: list[str] = []
        self._size = 0
        self._before = ""
        self._open_line = ""
        """The part of the open line released already (by a pause): the context of its rest."""
        self.redactions = 0

    def feed(self, text: str) -> str:
        """Scrubbed text that is safe to send now (may be empty). Without a line end, and
        short of MAX_HOLD, nothing new can be released: the chunk is only kept (so that a
        line that comes a character at a time costs no rescans). With whole_reads, a chunk
        that ends mid-line is kept whole and releases only the lines held before it."""
        held = self._size
        self._parts.append(text)
        self._size += len(text)
        limit = None
        if self._size <= MAX_HOLD:
            if self._whole_reads and not text.endswith("\n"):
                if not self._lines:
                    self._lines = held + text.rfind("\n") + 1 if "\n" in text else 0
                    return ""
                limit = self._lines  # the lines of the reads before this one
            elif "\n" not in text:
                return ""
        pending = self._take()
        cut = self._safe_cut(pending, limit)
        self._keep(pending[cut:])
        if limit is not None and cut == limit:  # this read's own lines wait for the next
            self._lines = (
                len(pending) - cut - len(text) + text.rfind("\n") + 1 if "\n" in text else 0
            )
        return self._scrub(pending[:cut])

    def flush(self) -> str:
        """Everything held, scrubbed."""
        return self._scrub(self._take())

    def flush_open(self) -> str:
        """On a pause: release what is held but for what must wait for more (a line or key
        block that may go on across lines, the tail of the open line that may still begin a
        credential); the cut never falls inside a credential found."""
        if not self._size:
            return ""
        pending = self._take()
        line = pending.rfind("\n") + 1
        cut = self._safe_cut(pending) if line else 0
        if cut == line:  # nothing before the open line waits
            cut = len(pending)
            for begin, marker, end in KEY_BLOCKS:
                cut = min(cut, self._open_key_block(pending, cut, begin, marker, end))
            if self._scrubber is not None and cut > line:
                released = "" if line else self._open_line  # what the line began with
                tail = self._scrubber.open_tail(released + pending) - len(released)
                cut = max(line, min(cut, tail))
                cut = self._outside_credentials(pending, cut, whole_lines=False)
        self._keep(pending[cut:])
        return self._scrub(pending[:cut])

    @property
    def holding(self) -> bool:
        return self._size > 0

    def _take(self) -> str:
        text = "".join(self._parts)
        self._parts, self._size = [], 0
        return text

    def _keep(self, text: str) -> None:
        if text:
            self._parts, self._size = [text], len(text)
        self._lines = 0

    def _safe_cut(self, text: str, limit: int | None = None) -> int:
        """Where `text` may be cut: after its last line end (before `limit`) but for what must
        wait for more."""
        cut = text.rfind("\n", 0, limit) + 1
        for begin, marker, end in KEY_BLOCKS:
            cut = min(cut, self._open_key_block(text, cut, begin, marker, end))
        if cut and self._scrubber is not None and self._scrubber.spans_lines:
            line = text.rfind("\n", 0, cut - 1) + 1
            begun = self._open_line if line == 0 else ""  # released by a pause
            if BASE64_LINE.fullmatch(begun + text[line:cut]):
                return self._outside_credentials(text, line, whole_lines=True)
        if cut == 0 and len(text) > MAX_HOLD:
            return self._outside_credentials(text, len(text) - TAIL, whole_lines=False)
        return cut

    @staticmethod
    def _open_key_block(text: str, cut: int, begin: str, marker: str, end: str) -> int:
        """Where a private key block that has not ended before `cut` starts (and is not
        absurdly long); else `cut`."""
        start = text.rfind(begin, 0, cut)
        if start == -1 or marker not in text[start : start + 80]:
            return cut
        if text.find(end, start, cut) != -1 or len(text) - start >= MAX_KEY_HOLD:
            return cut
        return start

    def _outside_credentials(self, text: str, cut: int, whole_lines: bool) -> int:
        """`cut`, moved back to the start of a credential it falls inside (or of its line:
        base64 is only found across whole lines), or to its end when that start is the start
        of the text, so that a credential is scrubbed whole."""
        if self._scrubber is None:
            return cut
        for start, end in self._scrubber.spans(text):
            if start < cut < end:
                begin = text.rfind("\n", 0, start) + 1 if whole_lines else start
                cut = begin or end
        return cut

    def _scrub(self, text: str) -> str:
        if not text or self._scrubber is None:
            return text
        cleaned, count = self._scrubber.scrub_after(self._before + self._open_line, text)
        last = KEY_LINE.search(text, max(len(text) - 4096, 0))
        self._before = last[1] if last else ""
        line = text.rfind("\n")
        opened = self._open_line + text if line == -1 else text[line + 1 :]
        self._open_line = opened[-CONTEXT:]
        self.redactions += count
        return cleaned
