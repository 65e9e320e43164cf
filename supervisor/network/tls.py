"""Just enough TLS to read the server name a client asks for (SNI) from its ClientHello."""

from __future__ import annotations

import asyncio

MAX_HELLO = 64 * 1024
HANDSHAKE = 0x16
CLIENT_HELLO = 0x01
SERVER_NAME = 0x0000


class NotTLS(ValueError):
    """The bytes are not a TLS ClientHello."""


async def read_client_hello(reader: asyncio.StreamReader) -> bytes:
    """The raw TLS records that carry a whole ClientHello (which may span records)."""
    raw = bytearray()
    handshake = bytearray()
    while True:
        header = await reader.readexactly(5)
        if header[0] != HANDSHAKE or header[1] != 0x03:
            raise NotTLS("not a TLS handshake record")
        length = int.from_bytes(header[3:5], "big")
        body = await reader.readexactly(length)
        raw += header + body
        handshake += body
        if len(raw) > MAX_HELLO:
            raise NotTLS("ClientHello too large")
        if len(handshake) >= 4:
            if handshake[0] != CLIENT_HELLO:
                raise NotTLS("the first handshake message is not a ClientHello")
            if len(handshake) >= 4 + int.from_bytes(handshake[1:4], "big"):
                return bytes(raw)


def server_name(records: bytes) -> str | None:
    """The host_name in a ClientHello's server_name extension, or None when it has none."""
    body = bytearray()
    at = 0
    while at + 5 <= len(records):
        length = int.from_bytes(records[at + 3 : at + 5], "big")
        body += records[at + 5 : at + 5 + length]
        at += 5 + length
    try:
        return _parse_hello(bytes(body))
    except (IndexError, UnicodeDecodeError) as exc:
        raise NotTLS(f"malformed ClientHello: {exc}") from exc


def _parse_hello(hello: bytes) -> str | None:
    if hello[0] != CLIENT_HELLO:
        raise NotTLS("not a ClientHello")
    end = 4 + int.from_bytes(hello[1:4], "big")
    at = 4 + 2 + 32  # type+length, client_version, random
    at += 1 + hello[at]  # session id
    at += 2 + int.from_bytes(hello[at : at + 2], "big")  # cipher suites
    at += 1 + hello[at]  # compression methods
    if at >= end:
        return None  # no extensions
    ext_end = at + 2 + int.from_bytes(hello[at : at + 2], "big")
    at += 2
    if ext_end > end:
        raise NotTLS("extensions overrun the ClientHello")
    while at + 4 <= ext_end:
        kind = int.from_bytes(hello[at : at + 2], "big")
        size = int.from_bytes(hello[at + 2 : at + 4], "big")
        data = hello[at + 4 : at + 4 + size]
        if len(data) != size:
            raise NotTLS("an extension overruns the ClientHello")
        if kind == SERVER_NAME:
            return _host_name(data)
        at += 4 + size
    return None


def _host_name(data: bytes) -> str | None:
    at = 2  # list length
    while at + 3 <= len(data):
        kind, size = data[at], int.from_bytes(data[at + 1 : at + 3], "big")
        name = data[at + 3 : at + 3 + size]
        if len(name) != size:
            raise NotTLS("a server name overruns its extension")
        if kind == 0:
            return name.decode("ascii")
        at += 3 + size
    return None
