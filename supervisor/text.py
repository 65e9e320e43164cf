"""Text helpers every layer may use: text that protobuf and JSON can carry, and text safe for one
line of a terminal. Imports nothing of Stockade."""

from __future__ import annotations

import json
import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def wire_text(text: str) -> str:
    """Text that protobuf can carry: lone surrogates (from names that are not UTF-8) become
    U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def wire_json(data: object) -> str:
    """JSON for the wire: UTF-8 as is, lone surrogates as \\udcXX escapes (lossless)."""
    text = json.dumps(data, ensure_ascii=False)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def printable(text: str) -> str:
    """`text` for one line of a terminal: every character that is not printable (newlines,
    carriage returns, escape sequences, direction overrides) as its Python escape, so a key or
    a command cannot forge lines, repaint the screen or hide what it says."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
