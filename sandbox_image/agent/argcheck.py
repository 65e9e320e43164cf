"""Fetch and type-check tool arguments from a decoded JSON object.

Type names in messages are JSON's (string, integer, number, boolean, object,
array, null), since that is what the model wrote. An optional argument given
as null counts as absent. A boolean is never accepted as a number.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeGuard, TypeVar

from .errors import ToolError

Args = Mapping[str, Any]
D = TypeVar("D")
T = TypeVar("T")


def json_type(value: object) -> str:
    """The JSON name of `value`'s type."""
    if value is None:
        return "null"
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string")):
        if isinstance(value, kind):
            return name
    if isinstance(value, list | tuple):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def expect_only(args: Args, allowed: Collection[str]) -> None:
    """Refuse argument names outside `allowed`, naming them."""
    unknown = sorted(repr(str(name)) for name in args if name not in allowed)
    if unknown:
        raise ToolError(
            "INVALID_ARGS",
            f"unknown argument {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}",
        )


def req_str(args: Args, name: str) -> str:
    """A required string argument."""
    if name not in args:
        raise ToolError("INVALID_ARGS", f"argument '{name}' is required")
    return _check(name, args[name], "a string", _is_str)


def opt_str(args: Args, name: str, default: D) -> str | D:
    """An optional string argument."""
    value = args.get(name)
    return default if value is None else _check(name, value, "a string", _is_str)


def req_int(args: Args, name: str) -> int:
    """A required integer argument."""
    if name not in args:
        raise ToolError("INVALID_ARGS", f"argument '{name}' is required")
    return _check(name, args[name], "an integer", _is_int)


def opt_int(args: Args, name: str, default: D) -> int | D:
    """An optional integer argument (not a boolean, not a float)."""
    value = args.get(name)
    return default if value is None else _check(name, value, "an integer", _is_int)


def opt_number(args: Args, name: str, default: D) -> float | D:
    """An optional finite number (integer or float, not a boolean)."""
    value = args.get(name)
    return default if value is None else _check(name, value, "a finite number", _is_number)


def opt_bool(args: Args, name: str, default: D) -> bool | D:
    """An optional boolean argument."""
    value = args.get(name)
    return default if value is None else _check(name, value, "a boolean", _is_bool)


def opt_str_map(args: Args, name: str) -> dict[str, str]:
    """An optional object whose values are all strings; {} when absent."""
    value = args.get(name)
    if value is None:
        return {}
    mapping = _check(name, value, "an object", _is_dict)
    for key, item in mapping.items():
        if not isinstance(item, str):
            raise ToolError(
                "INVALID_ARGS",
                f"argument '{name}' must map names to strings; '{key}' is {json_type(item)}",
            )
    return {str(key): str(item) for key, item in mapping.items()}


def encoded(text: str, name: str) -> bytes:
    """`text` as the bytes it stands for: UTF-8, with the lone surrogates that stand for bytes
    of names that are not UTF-8 (U+DC80-U+DCFF, PEP 383) turned back into those bytes. Any
    other lone surrogate stands for nothing: INVALID_ARGS naming the argument."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise ToolError(
            "INVALID_ARGS", f"argument '{name}' holds a lone surrogate at index {exc.start}"
        ) from None


def _check(name: str, value: object, expected: str, ok: Callable[[object], TypeGuard[T]]) -> T:
    if not ok(value):
        raise ToolError(
            "INVALID_ARGS", f"argument '{name}' must be {expected}, got {json_type(value)}"
        )
    return value


def _is_str(value: object) -> TypeGuard[str]:
    return isinstance(value, str)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[float]:
    if _is_int(value):
        return True
    return isinstance(value, float) and math.isfinite(value)


def _is_bool(value: object) -> TypeGuard[bool]:
    return isinstance(value, bool)


def _is_dict(value: object) -> TypeGuard[dict[object, object]]:
    return isinstance(value, dict)
