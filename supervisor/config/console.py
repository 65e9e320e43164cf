"""The operator's console ([console]): a web page served by the supervisor, off unless
`listen` is set (see docs/console.md)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_SESSION_S = 7 * 86400.0


@dataclass(frozen=True)
class ConsoleConfig:
    listen: str = ""
    """host:port of the console (e.g. "127.0.0.1:8470"); empty: no console. Plain HTTP: a
    loopback address only (port 0 picks a free port); put a TLS proxy in front to reach it
    from elsewhere, and set secure_cookies."""
    operators: tuple[str, ...] = ()
    """Tenants whose tokens sign in as operators: they see and act on every tenant's
    sandboxes, approvals and audit records, and the overview. Any other tenant's token signs
    in as a tenant user, who sees its own tenant only."""
    session_ttl_s: float = 8 * 3600.0
    """A session ends this long after its sign-in (and at every restart of the supervisor:
    the key that signs sessions is made at start)."""
    secure_cookies: bool = False
    """Mark the session cookie Secure (sent over HTTPS only): set it when a TLS proxy serves
    the console; a browser on plain http://127.0.0.1 would not send it back."""
    refresh_s: float = 2.0
    """How often an open page's live parts (sandbox list, overview) are refreshed."""
