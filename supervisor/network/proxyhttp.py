"""The plain HTTP the egress proxy speaks with the sandbox before any tunnel: header lines,
CONNECT and URL authorities, and the short refusals it answers with."""

from __future__ import annotations

import asyncio
import contextlib

from stockade.supervisor.config.allowlist import AllowlistError, canonical_host


class Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def header_fields(lines: list[str]) -> list[tuple[str, str]]:
    out = []
    for line in lines:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip() or name != name.strip():
            raise Refused(400, f"malformed header line {line[:80]!r}")
        out.append((name, value.strip()))
    return out


def split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    if "@" in authority:
        raise Refused(400, "credentials in the proxy target are not allowed")
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, sep, port_text = authority.rpartition(":")
        if not sep:
            host, port_text = authority, ""
    if not port_text:
        if default_port is None:
            raise Refused(400, f"CONNECT target {authority[:100]!r} needs host:port")
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise Refused(400, f"bad port in {authority[:100]!r}")
    return host, int(port_text)


def same_authority(header: str, host: str, port: int) -> bool:
    try:
        given_host, given_port = split_authority(header.strip(), default_port=80)
    except Refused:
        return False
    try:
        return canonical_host(given_host) == canonical_host(host) and given_port == port
    except AllowlistError:
        return given_host.lower() == host.lower() and given_port == port


async def reply(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    phrases = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large",
               502: "Bad Gateway", 503: "Service Unavailable"}  # fmt: skip
    body = f"stockade egress proxy: {reason}\n".encode()
    head = (
        f"HTTP/1.1 {status} {phrases.get(status, 'Error')}\r\n"
        f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(ConnectionError):
        writer.write(head.encode() + body)
        await writer.drain()
