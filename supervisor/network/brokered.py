"""Brokered credentials as the egress proxy sees them: for one sandbox, which secrets it may
have sent on its behalf, to which hosts, placed where. The sandbox holds only placeholders;
the proxy puts the real value in the configured place of a request to an allowed host and
refuses a placeholder anywhere else. Built by the supervisor from `[secrets.NAME]`; pure
data here (no I/O), so the proxy and its tests share it."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from stockade.supervisor.policy.encodings import Forms

PLACEHOLDER_PREFIX = "stk_ph_"
PLACEHOLDER_CHARS = 32
"""A placeholder is the prefix and 32 of a-z2-7 (sandboxes/brokering.py derives them)."""
_ANY_PLACEHOLDER = re.compile(rb"stk_ph_[a-z2-7]{32}")
"""Any sandbox's placeholder, in case-folded bytes: another sandbox's (a fork's source, a
sibling: found in files a snapshot carried over) is refused as surely as a misplaced own."""
NOT_OURS = "(not this sandbox's)"
"""The name a refusal gives a placeholder that is none of this sandbox's."""


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
    retired: bool = False
    """Removed from the configuration at a reload while the sandbox ran (its container still
    holds the placeholder): never injected, refused wherever the proxy sees it; `value` is
    empty."""

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
    everything: bool = False
    """[network] intercept = "all": every TLS connection of a sandbox with secrets is
    terminated, so its placeholders are seen whatever allowed host they go to."""

    def intercepts(self, host: str) -> bool:
        """Whether the proxy terminates TLS for this host (some secret may go there, or all
        of a sandbox that holds secrets are)."""
        if self.everything and self.secrets:
            return True
        return any(s.allows(host) for s in self.secrets)

    @cached_property
    def forms(self) -> Forms:
        """Every form of the real values an upstream may reflect (real_values, each also
        base64, hex, percent-, JSON- and HTML-escaped: policy/encodings.py), one Hyperscan
        database built once per sandbox's broker (a few ms: take it off the event loop)."""
        return Forms(real_values(self))


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


def find_placeholder(broker: Broker, data: bytes) -> BrokeredSecret | None:
    """The first secret whose placeholder is in data (case folded: an upper-cased placeholder
    is as much a sign as the original); for a sandbox that holds secrets, any other
    placeholder as well (another sandbox's, or one no configuration knows), as a secret named
    NOT_OURS that goes nowhere."""
    if not broker.secrets:
        return None
    folded = data.lower()
    for secret in broker.secrets:
        if secret.placeholder.encode() in folded:
            return secret
    other = _ANY_PLACEHOLDER.search(folded)
    if other is None:
        return None
    return BrokeredSecret(NOT_OURS, "", other[0].decode(), (), Injection("header"), retired=True)


def sent_nowhere(secret: BrokeredSecret) -> str:
    """Why a retired placeholder (another sandbox's, or its secret removed) is refused."""
    if secret.name == NOT_OURS:
        return "a placeholder that is not this sandbox's is sent nowhere"
    return (
        f"secret {secret.name!r} was removed from the configuration: its placeholder is sent "
        "nowhere"
    )


def inject(broker: Broker, header: str, value: str, host: str) -> tuple[str, BrokeredSecret] | None:
    """The header's value with the real secret in place of its placeholder, and the secret,
    when this header is the secret's configured place and the host may receive it; None when
    the header is not such a place (a placeholder in it is then misplaced)."""
    for secret in broker.secrets:
        if secret.retired or not secret.allows(host):
            continue
        placement = secret.injection
        if placement.kind == "header" and header.lower() == placement.header.lower():
            prefix, _, suffix = placement.template.partition("{secret}")
            expected = prefix + secret.placeholder + suffix
            if value.lower() == expected.lower():
                return prefix + secret.value + suffix, secret
        elif placement.kind == "basic" and header.lower() == "authorization":
            replaced = _basic(value, secret)
            if replaced is not None:
                return replaced, secret
    return None


def _basic(value: str, secret: BrokeredSecret) -> str | None:
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    pair = basic_decoded(token)
    if pair is None:
        return None
    user, sep, password = pair.partition(":")
    if not sep or secret.placeholder not in (user, password):
        return None
    user = secret.value if user == secret.placeholder else user
    password = secret.value if password == secret.placeholder else password
    if secret.placeholder.lower() in f"{user}:{password}".lower():
        return None  # the placeholder somewhere else as well: not the configured place
    joined = f"{user}:{password}".encode()
    return "Basic " + base64.b64encode(joined).decode("ascii")


def basic_decoded(token: str) -> str | None:
    """The user:password of a Basic credential, None when it is not valid base64 text."""
    try:
        return base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None


def real_values(broker: Broker) -> list[bytes]:
    """Every form of the real secrets an upstream may send back: the values, and for basic
    auth the base64 of user:value as a client sends it. Longest first."""
    found: set[bytes] = set()
    for secret in broker.secrets:
        if not secret.value:
            continue
        found.add(secret.value.encode())
        if secret.injection.kind == "basic":
            pair = f"{secret.injection.username}:{secret.value}".encode()
            found.add(base64.b64encode(pair))
    return sorted(found, key=len, reverse=True)
