"""What the E2B front's integration tests share: a real `stockade serve` with `[e2b] listen`
on a free loopback port and bearer tokens for two tenants (acme and other), and the SDK's
connection options for it."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
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


def rest(
    served: E2bServed, method: str, path: str, body: Any = None, token: str | None = None
) -> tuple[int, Any]:
    """A control-plane request over plain HTTP, as an older SDK sends it (tenant acme's
    unless `token`): (status, the parsed body or None)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"X-API-KEY": token or served.token, "Content-Type": "application/json"}
    request = urllib.request.Request(served.url + path, data, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read()
            return int(response.status), json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())
