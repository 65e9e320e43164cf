"""Encoders as reflecting servers and encoding sandboxes use them, each written the way its
ecosystem writes it (test_encodings.py, test_honeytokens_encoded.py): what masking and the
tripwire must see through."""

from __future__ import annotations

import base64
import html
import json
import quopri
from collections.abc import Callable
from urllib.parse import quote

Encoder = Callable[[bytes], bytes]


def _b64(encode: Encoder, pad: bool) -> Encoder:
    return lambda data: encode(data) if pad else encode(data).rstrip(b"=")


def _every_byte_percent(data: bytes) -> bytes:
    return "".join(f"%{b:02X}" for b in data).encode()


def _json(slashes: bool) -> Encoder:
    def encode(data: bytes) -> bytes:
        text = json.dumps(data.decode())
        return (text.replace("/", "\\/") if slashes else text).encode()

    return encode


def _json_go(data: bytes) -> bytes:
    text = json.dumps(data.decode())
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()


def _json_every_char(data: bytes) -> bytes:
    return "".join(f"\\u{ord(c):04x}" for c in data.decode()).encode()


def _html_decimal(data: bytes) -> bytes:
    return "".join(f"&#{b};" for b in data).encode()


def _html_hex(data: bytes) -> bytes:
    return "".join(f"&#X{b:X};" for b in data).encode()


# name -> (encoder of the whole reflected text, whether the value's bytes stand apart in it)
ENCODINGS: dict[str, Encoder] = {
    "literal": lambda data: data,
    "base64": _b64(base64.b64encode, True),
    "base64-unpadded": _b64(base64.b64encode, False),
    "base64url": _b64(base64.urlsafe_b64encode, True),
    "base64url-unpadded": _b64(base64.urlsafe_b64encode, False),
    "base64-in-a-query": lambda data: quote(base64.b64encode(data), safe="").encode(),
    "hex": lambda data: data.hex().encode(),
    "HEX": lambda data: data.hex().upper().encode(),
    "percent-every-byte": _every_byte_percent,
    "percent-every-byte-lower": lambda data: _every_byte_percent(data).lower(),
    "percent-reserved": lambda data: quote(data, safe="").encode(),
    "percent-reserved-path": lambda data: quote(data, safe="/").encode(),
    "percent-java-php": lambda data: quote(data, safe="*").replace("~", "%7E").encode(),
    "percent-encodeURIComponent": lambda data: quote(data, safe="!'()*").encode(),
    "json": _json(False),
    "json-escaped-slashes": _json(True),
    "json-go-html-safe": _json_go,
    "json-every-char": _json_every_char,
    "html-named": lambda data: html.escape(data.decode()).encode(),
    "html-decimal": _html_decimal,
    "html-hex": _html_hex,
    "quoted-printable": lambda data: quopri.encodestring(data),
}
BASE64 = {name for name in ENCODINGS if "base64" in name}
