"""Scrubbing a stream of output chunks, so that a credential split across two chunks is still
caught before any of it leaves the host.

Text is released up to its last newline: the credential formats the scrubber knows do not span
lines, except private key blocks, which are held until their END line. When the stream goes
quiet, an open line is released only if it looks like a prompt (it ends in whitespace or one of
`:>?$#]`), never in the middle of a word that may be half a token; flush() releases the rest at
the end. A line longer than MAX_HOLD is released but for a tail that may still start a
credential."""

from __future__ import annotations

from stockade.supervisor.policy.scrub import Scrubber

MAX_HOLD = 64 * 1024
TAIL = 4096
MAX_KEY_HOLD = 1 << 20
PROMPT_ENDS = frozenset(" \t:>?$#]")


class StreamScrubber:
    def __init__(self, scrubber: Scrubber | None) -> None:
        self._scrubber = scrubber
        self._pending = ""
        self.redactions = 0

    def feed(self, text: str) -> str:
        """Scrubbed text that is safe to send now (may be empty)."""
        self._pending += text
        cut = self._safe_cut()
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return self._scrub(out)

    def flush(self) -> str:
        """Everything held, scrubbed."""
        out, self._pending = self._pending, ""
        return self._scrub(out)

    def flush_prompt(self) -> str:
        """On a pause: release the open line if it ends like a prompt; else keep holding."""
        if self._pending and self._pending[-1] in PROMPT_ENDS:
            return self.flush()
        return ""

    @property
    def holding(self) -> bool:
        return bool(self._pending)

    def _safe_cut(self) -> int:
        text = self._pending
        cut = text.rfind("\n") + 1
        begin = text.rfind("-----BEGIN", 0, cut)
        if begin != -1 and self._open_key_block(text, begin):
            cut = begin
        if cut == 0 and len(text) > MAX_HOLD:
            cut = len(text) - TAIL
        return cut

    @staticmethod
    def _open_key_block(text: str, begin: int) -> bool:
        """A private key block starts at `begin` and has not ended (and is not absurdly long)."""
        is_key = "PRIVATE KEY" in text[begin : begin + 80]
        return is_key and text.find("-----END", begin) == -1 and len(text) - begin < MAX_KEY_HOLD

    def _scrub(self, text: str) -> str:
        if not text or self._scrubber is None:
            return text
        cleaned, count = self._scrubber.scrub(text)
        self.redactions += count
        return cleaned
