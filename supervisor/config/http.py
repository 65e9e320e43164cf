"""The `[http]` section: the limits every HTTP front (MCP, E2B, the console) holds a client
to, each front on its own port with its own counts (docs/security.md#the-http-listener), and
their checks."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

from stockade.supervisor.errors import ConfigError


@dataclass(frozen=True)
class HttpConfig:
    """Enforced by the listener before a request reaches a front's app (and its
    authentication): what a request head may hold, how long a client may take to send it or
    sit idle, how many connections one address and all together may hold, how many requests
    may be in progress, and the back-off after failed authentications."""

    max_request_line_bytes: int = 8192
    """The longest request line (method, target, version); longer: 414 and the connection
    closed."""
    max_head_bytes: int = 32768
    """The most bytes of a request head (the request line and every header, their separators
    included), and of a chunked body's trailers; more: 431 and the connection closed."""
    max_headers: int = 100
    """The most header fields in a head (or trailer fields after a chunked body); more: 431."""
    header_timeout_s: float = 15.0
    """A head must arrive whole within this long of its first byte (or of the connection's
    start); later: 408 and the connection closed."""
    idle_timeout_s: float = 75.0
    """A kept-alive connection with no request for this long is closed (longer than the E2B
    and MCP SDKs' own pools keep one, so that the client, not the server, ends it)."""
    max_requests_per_connection: int = 10000
    """After this many requests a connection's last answer says `Connection: close`."""
    max_connections: int = 2048
    """Connections a front holds at once. A new one past it closes the connection that has
    waited longest without a request in progress (idle, or still sending its head); when
    every one has a request in progress, the new one is answered 503."""
    max_connections_per_address: int = 256
    """Connections one client address (an IPv6 address's /64) holds at once, the same way:
    its own longest-waiting connection yields to its new one, else 503. The addresses in
    trusted_proxies are not held to it (their clients are, by the proxy)."""
    max_active_requests: int = 1024
    """Requests in progress at once on a front (head received, answer not finished: an open
    event stream counts, an idle connection does not); past it: 503 with Retry-After."""
    auth_free_failures: int = 5
    """Failed authentications one client address may make before its back-off starts: after
    the next failure it waits 1 s, then 2 s, 4 s ... (every request presenting credentials
    from it answered 429 with Retry-After meanwhile, never checked)."""
    auth_backoff_max_s: float = 300.0
    """The longest back-off; an address with no failure for twice this long starts over."""
    refusal_free_count: int = 20
    """Refused requests (400, 413, 414, 415, 422, 429, 431: a body too large or malformed, a
    cap reached) one tenant's credentials may earn before each further request with them
    waits: 10 ms, then twice as long each refusal (fronts/backoff.py; docs/security.md#fair-
    share). No refusal for 10 s: it starts over."""
    refusal_backoff_max_s: float = 1.0
    """The longest such wait."""
    trusted_proxies: tuple[str, ...] = ()
    """Addresses of reverse proxies in front of the HTTP fronts: a request from one is the
    client's named last in its X-Forwarded-For for the back-off, and the proxy is not held
    to max_connections_per_address (docs/security.md#behind-a-reverse-proxy)."""


MAX_TIMEOUT_S = 3600.0


def check_http(http: HttpConfig) -> None:
    """Every limit positive and in range; trusted_proxies are IP addresses."""
    for name, value, low, high in (
        ("max_request_line_bytes", http.max_request_line_bytes, 64, 1 << 20),
        ("max_head_bytes", http.max_head_bytes, 1024, 1 << 22),
        ("max_headers", http.max_headers, 8, 10000),
        ("max_requests_per_connection", http.max_requests_per_connection, 1, 1 << 30),
        ("max_connections", http.max_connections, 1, 1 << 20),
        ("max_connections_per_address", http.max_connections_per_address, 1, 1 << 20),
        ("max_active_requests", http.max_active_requests, 1, 1 << 20),
        ("auth_free_failures", http.auth_free_failures, 0, 1000),
        ("refusal_free_count", http.refusal_free_count, 0, 1 << 20),
    ):
        if not low <= value <= high:
            raise ConfigError(f"http.{name} must be between {low} and {high}, got {value}")
    if http.max_request_line_bytes > http.max_head_bytes:
        raise ConfigError("http.max_request_line_bytes must not exceed http.max_head_bytes")
    for name, seconds in (
        ("header_timeout_s", http.header_timeout_s),
        ("idle_timeout_s", http.idle_timeout_s),
        ("auth_backoff_max_s", http.auth_backoff_max_s),
        ("refusal_backoff_max_s", http.refusal_backoff_max_s),
    ):
        if not (math.isfinite(seconds) and 0.1 <= seconds <= MAX_TIMEOUT_S):
            raise ConfigError(f"http.{name} must be in [0.1, {MAX_TIMEOUT_S:.0f}], got {seconds}")
    for address in http.trusted_proxies:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ConfigError(f"http.trusted_proxies: {address!r} is not an IP address") from None
