"""Brokered credentials as the egress proxy sees them: for one sandbox, which secrets it may
have sent on its behalf, to which hosts, placed where. The sandbox holds only placeholders;
the proxy puts the real value in the configured place of a request to an allowed host and
refuses a placeholder anywhere else. Built by the supervisor from `[secrets.NAME]`; pure
data here (no I/O), so the proxy and its tests share it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Injection:
    kind: Literal["header", "basic"]
    header: str = "Authorization"
    """The header the secret goes in (kind header)."""
    template: str = "{secret}"
    """The header's value, `{secret}` standing for the secret (kind header): "Bearer {secret}",
    "token {secret}"."""
    username: str = ""
    """HTTP basic auth's user name (kind basic); the secret is the password."""


@dataclass(frozen=True)
class BrokeredSecret:
    name: str
    value: str = field(repr=False)
    """The real secret: never logged, never in an error, never in the sandbox."""
    placeholder: str
    """What the sandbox holds instead: unique per sandbox and secret (stk_ph_...)."""
    hosts: tuple[str, ...]
    """Exact names and wildcards ("*.example.com": any name under it, not itself)."""
    injection: Injection

    def allows(self, host: str) -> bool:
        """Whether the secret may be sent to this (canonical, lower-case) host name."""
        for pattern in self.hosts:
            if pattern.startswith("*."):
                if host.endswith(pattern[1:]) and host != pattern[2:]:
                    return True
            elif host == pattern:
                return True
        return False


@dataclass(frozen=True)
class Broker:
    """What one sandbox's proxy needs: its brokered secrets (none: nothing intercepted)."""

    secrets: tuple[BrokeredSecret, ...] = ()

    def intercepts(self, host: str) -> bool:
        """Whether the proxy terminates TLS for this host (some secret may go there)."""
        return any(s.allows(host) for s in self.secrets)


@dataclass(frozen=True)
class Injected:
    """One injection, for the audit log: which secret went where (never its value)."""

    sandbox_key: str
    secret: str
    host: str
    method: str
    path: str


InjectionRecorder = Callable[[Injected], None]


def no_record(event: Injected) -> None:
    """The default InjectionRecorder: nothing kept."""
