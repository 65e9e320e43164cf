"""Failed authentications slowed per client address, on every HTTP front (the console's
sign-in, MCP's bearer token, E2B's API key and envd's access token): an ASGI middleware over
the front's app. A request that presents credentials (as the front defines it) and is
answered 401 is a failure of its client address; past [http] auth_free_failures, each
further failure makes the address wait twice as long as the one before (1 s, 2 s, ...
up to auth_backoff_max_s), and meanwhile every request from it presenting credentials is
answered 429 with Retry-After without being checked, so that waiting is the only way on.
The credentials themselves are never checked here, nor logged. The audit record of a refused
authentication is each front's (observe/refusals.py), naming the same client (`client_of`).

The same middleware slows a tenant that keeps being refused (docs/security.md#fair-share):
an answer of REFUSALS (a body too large or malformed, a cap reached) to a request presenting
the same credentials (an API key, an access token, a bearer token: one tenant or one of its
sandboxes) counts against them; past [http] refusal_free_count of them, each further request
with those credentials waits before it is handled, 10 ms, then twice as long each refusal up
to refusal_backoff_max_s (at most REFUSAL_WAITING of them wait at once; more are answered
429 at once). A client that stops being refused for REFUSAL_FORGET_S starts over. A flood of
refused creates, oversized metadata or compression bombs then costs the supervisor a few
requests a second, not thousands, and another tenant's calls keep their pace."""

from __future__ import annotations

import asyncio
import hashlib
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
Presented = Callable[[Scope], bytes | None]
"""The credentials a request presents (b"" when they cannot be told apart, e.g. a sign-in
form's), None when it presents none."""
REFUSALS = frozenset({400, 413, 414, 415, 422, 429, 431})
"""Answers that count against a tenant's credentials for the refusal back-off."""
REFUSAL_WAITING = 8
"""Requests of one tenant's credentials held back at once; more are answered 429 at once."""
REFUSAL_BASE_S = 0.01
REFUSAL_FORGET_S = 10.0


class Backoff:
    """Failures per client address and the wait they earn; `clock` is injectable."""

    def __init__(
        self,
        free: int,
        max_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        base_s: float = 1.0,
        forget_s: float | None = None,
    ) -> None:
        """The first wait past `free` failures is `base_s`; a key with no failure for
        `forget_s` (twice max_s unless given) starts over."""
        self.free = free
        self.max_s = max_s
        self.base_s = base_s
        self.forget_s = 2 * max_s if forget_s is None else forget_s
        self._clock = clock
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def _entry(self, address: str) -> tuple[int, float]:
        count, last = self._failures.get(address, (0, 0.0))
        if count and self._clock() - last >= self.forget_s:
            del self._failures[address]
            return 0, 0.0
        return count, last

    def _delay(self, count: int) -> float:
        if count <= self.free:
            return 0.0
        return min(self.max_s, self.base_s * 2.0 ** min(count - self.free - 1, 64))

    def earned(self, key: str) -> float:
        """The wait `key`'s failures so far earn each of its next requests: none until it has
        `free` (and at least one), then base_s, doubling with each further failure."""
        count, _last = self._entry(key)
        if not count or count < self.free:
            return 0.0
        return min(self.max_s, self.base_s * 2.0 ** min(count - max(self.free, 1), 64))

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
    """Credentials are presented when any of these request headers is: their values."""

    def presented(scope: Scope) -> bytes | None:
        values = [(name, header(scope, name)) for name in names]
        if all(value is None for _name, value in values):
            return None
        return b"\0".join(name + b"=" + (value or b"") for name, value in values)

    return presented


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
        refused: Backoff | None = None,
    ) -> None:
        """refused: the refusal back-off per credentials (None: none)."""
        self._app = app
        self._backoff = backoff
        self._refused = refused
        self._waiting: dict[str, int] = {}
        self._trusted = frozenset(address_key(a) for a in config.trusted_proxies)
        self._front = front
        self._presented = presented

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        address = scope[CLIENT] = client_address(scope, self._trusted)
        credentials = self._presented(scope)
        if credentials is None:
            await self._app(scope, receive, send)
            return
        wait = self._backoff.wait_s(address)
        if wait > 0:
            await _too_many(send, wait, AUTH_WAIT)
            return
        key = ""
        if self._refused is not None and credentials:
            key = hashlib.blake2b(credentials, digest_size=16).hexdigest()
            if not await self._held(key, send):
                return

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                if status == 401:
                    self._failed(address)
                elif key and status in REFUSALS and self._refused is not None:
                    self._refused.failed(key)
            await send(message)

        await self._app(scope, receive, watched)

    async def _held(self, key: str, send: Send) -> bool:
        """Wait as long as the refusals of `key` earned; False when too many of its requests
        wait already (answered 429 here)."""
        assert self._refused is not None
        wait = self._refused.earned(key)
        if not wait:
            return True
        waiting = self._waiting.get(key, 0)
        if waiting >= REFUSAL_WAITING:
            await _too_many(send, wait, REFUSED_WAIT)
            return False
        self._waiting[key] = waiting + 1
        try:
            await asyncio.sleep(wait)
        finally:
            if left := self._waiting[key] - 1:
                self._waiting[key] = left
            else:
                del self._waiting[key]
        return True

    def _failed(self, address: str) -> None:
        wait = self._backoff.failed(address)
        if wait:
            log.warning(
                "%s: failed authentication from %s; it waits %g s", self._front, address, wait
            )


AUTH_WAIT = "too many failed authentications from this address: try again in {} s\n"
REFUSED_WAIT = (
    "too many refused requests with these credentials, and "
    f"{REFUSAL_WAITING} of them waiting already: wait for their answers, then try again in "
    "{} s\n"
)


async def _too_many(send: Send, wait: float, text: str) -> None:
    seconds = max(1, math.ceil(wait))
    body = text.format(seconds).encode()
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
    refused = Backoff(
        config.refusal_free_count,
        config.refusal_backoff_max_s,
        base_s=REFUSAL_BASE_S,
        forget_s=REFUSAL_FORGET_S,
    )
    return Throttled(app, backoff, config, front, presented, refused)
