"""Which destinations an egress sandbox may reach: pure decisions over the configured
allowlist. Names are compared in a canonical form (lower case, no trailing dot, IDNA);
anything that is or looks like an IP address is refused, whatever the list says."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
MAX_NAME = 253


class AllowlistError(ValueError):
    """A pattern or a requested list that cannot be used."""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    """Why: the pattern that allowed it, or what refused it."""
    name: str = ""
    """The canonical host name ("" when the host is no valid name)."""


def shown(text: str) -> str:
    """A name as quoted in an error: at most 100 characters of it (errors travel in gRPC
    status metadata, which has a size limit)."""
    return repr(text if len(text) <= 100 else text[:100] + "...")


def canonical_host(host: str) -> str:
    """Lower case, no trailing dot, IDNA-encoded; AllowlistError when it is no valid name."""
    name = host.rstrip(".").lower()
    if not name:
        raise AllowlistError("empty host name")
    if looks_like_address(name):
        raise AllowlistError(f"{shown(host)} is an IP address, not a name")
    try:
        name = name.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise AllowlistError(f"{shown(host)} is not a valid host name") from exc
    if len(name) > MAX_NAME or not all(_LABEL.match(label) for label in name.split(".")):
        raise AllowlistError(f"{shown(host)} is not a valid host name")
    if name.replace(".", "").isdigit():
        raise AllowlistError(f"{shown(host)} is not a valid host name")
    return name


def looks_like_address(text: str) -> bool:
    """IPv4/IPv6 literals, bracketed IPv6 and the shorthand forms the C resolver still accepts
    ("127.1", "2130706433", "0x7f.1")."""
    candidate = text.strip("[]")
    try:
        ipaddress.ip_address(candidate)
        return True
    except ValueError:
        pass
    try:
        socket.inet_aton(candidate)
        return True
    except OSError:
        return False


def check_pattern(pattern: str) -> str:
    """The canonical form of an allowlist pattern ("name" or "*.name")."""
    wildcard = pattern.startswith("*.")
    base = canonical_host(pattern[2:] if wildcard else pattern)
    if "*" in base:
        raise AllowlistError(f"{shown(pattern)}: '*' is only allowed as the first label ('*.name')")
    return f"*.{base}" if wildcard else base


class Allowlist:
    def __init__(self, patterns: Iterable[str], ports: Iterable[int]) -> None:
        self.patterns = tuple(check_pattern(p) for p in patterns)
        self.ports = frozenset(ports)

    def match(self, name: str) -> str:
        """The pattern that allows a canonical name, or ""."""
        for pattern in self.patterns:
            if pattern.startswith("*."):
                if name.endswith(pattern[1:]):
                    return pattern
            elif name == pattern:
                return pattern
        return ""

    def decide(self, host: str, port: int) -> Decision:
        try:
            name = canonical_host(host)
        except AllowlistError as exc:
            return Decision(False, str(exc))
        if port not in self.ports:
            allowed = ", ".join(str(p) for p in sorted(self.ports))
            return Decision(False, f"port {port} is not allowed (allowed: {allowed})", name)
        pattern = self.match(name)
        if not pattern:
            return Decision(False, f"{name} is not on the allowlist", name)
        return Decision(True, f"allowed by {pattern}", name)

    def narrowed(self, requested: Iterable[str]) -> Allowlist:
        """A sub-list for one sandbox: every requested pattern must be covered by this list
        (a client may narrow what the operator allows, never widen it)."""
        chosen = []
        for pattern in requested:
            canonical = check_pattern(pattern)
            wildcard = canonical.startswith("*.")
            if not (self._covers_wildcard(canonical) if wildcard else self.match(canonical)):
                raise AllowlistError(f"{shown(pattern)} is not within the configured allowlist")
            chosen.append(canonical)
        return Allowlist(chosen, self.ports)

    def _covers_wildcard(self, wildcard: str) -> bool:
        suffix = wildcard[1:]  # ".example.com"
        return any(p.startswith("*.") and suffix.endswith(p[1:]) for p in self.patterns)


def is_global(address: str) -> bool:
    """Whether an address is an ordinary public one (not loopback, private, link-local,
    multicast, reserved or unspecified), including IPv4 mapped into IPv6."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast
