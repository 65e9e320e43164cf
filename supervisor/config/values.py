"""Checks of one value that several sections (and the fronts that listen) share: a number of
seconds, a host:port, a loopback listen address. The bottom of the config package: it imports
only errors.py, so every section module and checks.py may import it."""

from __future__ import annotations

import ipaddress
import math

from stockade.supervisor.errors import ConfigError

MAX_SECONDS = 10 * 365 * 86400.0
"""Longest timer accepted (ten years): beyond it a value is a mistake, and an infinite or
NaN one would never compare as intended."""


def check_seconds(name: str, value: float) -> None:
    """A positive, finite number (of seconds, or per second) up to MAX_SECONDS."""
    if not math.isfinite(value) or value > MAX_SECONDS:
        raise ConfigError(f"{name} must be a finite number up to {MAX_SECONDS:.0f}, got {value}")


def split_host_port(value: str, name: str) -> tuple[str, int]:
    """("127.0.0.1", 9464) from "127.0.0.1:9464" ("[::1]:9464" for IPv6)."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{name} must be host:port, got {value!r}")
    return host, int(port)


def check_loopback(listen: str, name: str, front: str) -> None:
    """A plain-HTTP front listens on a loopback address only: bearer tokens must not cross
    a network in clear text."""
    host, _port = split_host_port(listen, name)
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(
            f"{name} must be a loopback address (127.0.0.1, [::1] or localhost): the "
            f"{front} front speaks plain HTTP, got {listen!r}"
        )
