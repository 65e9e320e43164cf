"""Sandbox keys: validation and the names derived from them."""

from __future__ import annotations

import hashlib

from stockade.supervisor.errors import InvalidRequest

MAX_KEY_BYTES = 256


def validate_key(key: str) -> str:
    """Return the key if it is usable, else raise InvalidRequest saying why."""
    if not key:
        raise InvalidRequest("sandbox key is empty")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"sandbox key is not valid UTF-8 (a lone surrogate at index {exc.start})"
        ) from None
    if size > MAX_KEY_BYTES:
        raise InvalidRequest(f"sandbox key is {size} bytes; the limit is {MAX_KEY_BYTES}")
    if "\x00" in key:
        raise InvalidRequest("sandbox key contains a NUL character")
    return key


def sandbox_id(key: str) -> str:
    """A short stable id for the key: names its container and its host directory."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
