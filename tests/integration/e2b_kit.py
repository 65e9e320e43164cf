"""What the E2B front's integration tests share: a real `stockade serve` with `[e2b] listen`
on a free loopback port and bearer tokens for two tenants (acme and other), and the SDK's
connection options for it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.harness import Supervisor, serving_front


@dataclass
class E2bServed:
    sup: Supervisor
    url: str
    token: str
    """Tenant acme's."""
    other: str
    """Tenant other's."""

    def opts(self, token: str | None = None) -> dict[str, Any]:
        """The SDK's connection options: what E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY
        would give."""
        return {"api_url": self.url, "sandbox_url": self.url, "api_key": token or self.token}


@contextlib.contextmanager
def serving_e2b(engine: str, folder: Path, extra: str = "", e2b: str = "") -> Iterator[E2bServed]:
    """The supervisor with `extra` config and `e2b` more lines of the [e2b] table."""
    with serving_front(engine, folder, "e2b", f"{e2b}{extra}") as (sup, address, tokens):
        token, other = tokens
        yield E2bServed(sup, f"http://{address}", token, other)
