"""Failed authentications slowed per client address, on every HTTP front (the console's
sign-in, MCP's bearer token, E2B's API key and envd's access token): an ASGI middleware over
the front's app. A request that presents credentials (as the front defines it) and is
answered 401 is a failure of its client address; past [http] auth_free_failures, each
further failure makes the address wait twice as long as the one before (1 s, 2 s, ...
up to auth_backoff_max_s), and meanwhile every request from it presenting credentials is
answered 429 with Retry-After without being checked, so that waiting is the only way on.
The credentials themselves are never read here, nor logged. The audit record of a refused
authentication is each front's (observe/refusals.py), naming the same client (`client_of`)."""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stockade.supervisor.config import HttpConfig
from stockade.supervisor.fronts.listener import address_key

log = logging.getLogger("stockade.http")
MAX_ADDRESSES = 65536
"""Addresses remembered at most (the longest-quiet forgotten first)."""
Presented = Callable[[Scope], bool]


class Backoff:
    """Failures per client address and the wait they earn; `clock` is injectable."""

    def __init__(
        self, free: int, max_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.free = free
        self.max_s = max_s
        self._clock = clock
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def _entry(self, address: str) -> tuple[int, float]:
        count, last = self._failures.get(address, (0, 0.0))
        if count and self._clock() - last >= 2 * self.max_s:
            del self._failures[address]
            return 0, 0.0
        return count, last

    def _delay(self, count: int) -> float:
        if count <= self.free:
            return 0.0
        return min(self.max_s, 2.0 ** min(count - self.free - 1, 64))

    def wait_s(self, address: str) -> float:
        """How long `address` must wait before its next attempt (0: it may try now)."""
        count, last = self._entry(address)
        return max(0.0, last + self._delay(count) - self._clock()) if count else 0.0

    def failed(self, address: str) -> float:
        """Count a failure of `address`; the wait it now has."""
        count, _last = self._entry(address)
        self._failures[address] = (count + 1, self._clock())
        self._failures.move_to_end(address)
        while len(self._failures) > MAX_ADDRESSES:
            self._failures.popitem(last=False)
        return self._delay(count + 1)


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def presents(*names: bytes) -> Presented:
    """Credentials are presented when any of these request headers is."""
    return lambda scope: any(header(scope, name) is not None for name in names)


CLIENT = "stockade.client"
"""The scope's key for the client's address as Throttled found it (the one the back-off, the
refusals' audit and a console action's actor all name)."""


def client_of(scope: Scope) -> str:
    """The request's client address: the one Throttled found (a trusted proxy's client, an
    IPv6 address's /64), else the peer's own."""
    found = scope.get(CLIENT)
    if found is not None:
        return str(found)
    peer = scope.get("client")
    return str(peer[0]) if peer else ""


def client_address(scope: Scope, trusted: frozenset[str]) -> str:
    """The client's address (an IPv6 one's /64): the peer, or when the peer is a trusted
    proxy, the last address its X-Forwarded-For names."""
    peer = scope.get("client")
    address = address_key(peer[0]) if peer else ""
    if address in trusted:
        forwarded = header(scope, b"x-forwarded-for")
        if forwarded:
            last = forwarded.decode("latin-1").rsplit(",", 1)[-1].strip()
            return address_key(last) if last else address
    return address


class Throttled:
    """The front's app behind the back-off."""

    def __init__(
        self,
        app: ASGIApp,
        backoff: Backoff,
        config: HttpConfig,
        front: str,
        presented: Presented,
    ) -> None:
        self._app = app
        self._backoff = backoff
        self._trusted = frozenset(address_key(a) for a in config.trusted_proxies)
        self._front = front
        self._presented = presented

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        address = scope[CLIENT] = client_address(scope, self._trusted)
        if not self._presented(scope):
            await self._app(scope, receive, send)
            return
        wait = self._backoff.wait_s(address)
        if wait > 0:
            await _too_many(send, wait)
            return

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                self._failed(address)
            await send(message)

        await self._app(scope, receive, watched)

    def _failed(self, address: str) -> None:
        wait = self._backoff.failed(address)
        if wait:
            log.warning(
                "%s: failed authentication from %s; it waits %g s", self._front, address, wait
            )


async def _too_many(send: Send, wait: float) -> None:
    seconds = max(1, math.ceil(wait))
    body = (
        f"too many failed authentications from this address: try again in {seconds} s\n"
    ).encode()
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(seconds).encode()),
    ]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def throttled(app: Any, config: HttpConfig, front: str, presented: Presented) -> Throttled:
    """`app` behind a back-off of its own, with [http]'s settings."""
    backoff = Backoff(config.auth_free_failures, config.auth_backoff_max_s)
    return Throttled(app, backoff, config, front, presented)
