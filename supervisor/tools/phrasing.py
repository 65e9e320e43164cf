"""How JSON values and types are named in argument errors and in schema notes: "an
integer", a value quoted and cut short, never a huge repr."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeGuard

QUOTE_LIMIT: Final = 100


ARTICLE: Final = {
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
}


def unique(values: Iterable[Any]) -> Iterable[Any]:
    seen: list[Any] = []
    for value in values:
        if not any(value == s and type(value) is type(s) for s in seen):
            seen.append(value)
            yield value


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def quote(value: Any) -> str:
    """A value for a message: strings quoted and cut at QUOTE_LIMIT, containers by type."""
    if isinstance(value, str):
        short = value if len(value) <= QUOTE_LIMIT else value[:QUOTE_LIMIT] + "..."
        return repr(short)
    if isinstance(value, int) and abs(value).bit_length() > 3 * QUOTE_LIMIT:
        return "<integer>"  # too long to show; str() refuses ints over 4300 digits anyway
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    return f"<{json_type(value)}>"
