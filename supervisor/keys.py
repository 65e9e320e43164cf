"""Sandbox keys: validation and the names derived from them."""

from __future__ import annotations

import hashlib
import re

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


TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""Tenant names: short and plain (they appear in logs, labels and the audit log)."""
_SEPARATOR = "\x00"


def validate_tenant(name: str) -> str:
    if not TENANT_PATTERN.fullmatch(name):
        raise InvalidRequest(
            f"tenant name {name[:80]!r} must be 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def scope(tenant: str, key: str) -> str:
    """The caller's key as the rest of the supervisor knows it: validated, and for a tenant
    prefixed with its name and a NUL. No key may hold a NUL, so one tenant's key can never
    be spelled as another tenant's, nor as a key of no tenant (auth disabled)."""
    validate_key(key)
    return f"{tenant}{_SEPARATOR}{key}" if tenant else key


def split(scoped: str) -> tuple[str, str]:
    """(tenant, the caller's key) of a scoped key; the tenant is "" for a key of no tenant."""
    tenant, sep, key = scoped.partition(_SEPARATOR)
    return (tenant, key) if sep else ("", scoped)


def shown(scoped: str) -> str:
    """The key as its caller wrote it (for messages and replies)."""
    return split(scoped)[1]


def validate_scoped(scoped: str) -> str:
    """validate_key() for a key that went through scope()."""
    tenant, key = split(scoped)
    if tenant:
        validate_tenant(tenant)
    validate_key(key)
    return scoped
