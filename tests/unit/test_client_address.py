"""One client address per request for everything that names one (fronts/backoff.py
client_of): the back-off, the audit of refused requests, a console action's actor. Behind a
trusted proxy it is the client X-Forwarded-For names, not the proxy."""

from __future__ import annotations

from typing import Any

from starlette.types import Receive, Scope, Send

from stockade.supervisor.config import HttpConfig
from stockade.supervisor.fronts.backoff import client_of, presents, throttled


async def seen_by_the_app(peer: str, headers: list[tuple[bytes, bytes]], trusted: list[str]) -> str:
    found: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        found.append(client_of(scope))

    front = throttled(app, HttpConfig(trusted_proxies=tuple(trusted)), "t", presents(b"x-key"))
    scope: dict[str, Any] = {
        "type": "http", "path": "/", "headers": headers, "client": (peer, 5000),
    }  # fmt: skip

    async def nothing() -> Any:
        return {"type": "http.request"}

    async def drop(_message: Any) -> None:
        pass

    await front(scope, nothing, drop)
    return found[0]


async def test_the_peer_or_a_trusted_proxys_client_with_or_without_credentials() -> None:
    forwarded = [(b"x-forwarded-for", b"203.0.113.9, 198.51.100.7")]
    for headers in (forwarded, [*forwarded, (b"x-key", b"k")]):
        assert await seen_by_the_app("10.0.0.2", headers, ["10.0.0.2"]) == "198.51.100.7"
        assert await seen_by_the_app("10.0.0.3", headers, ["10.0.0.2"]) == "10.0.0.3"  # untrusted


def test_a_scope_the_listener_never_saw_names_its_peer() -> None:
    assert client_of({"client": ("127.0.0.1", 1)}) == "127.0.0.1"
    assert client_of({}) == ""
