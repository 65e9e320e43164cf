"""Real values reflected in the encodings a server plausibly uses are masked (policy/encodings.py,
the relay's Masker in network/httpio.py): each encoding, at each base64 alignment, with the
response cut at every position into two reads and at a sample of positions into three; then
through the intercepting relay for real (an upstream on loopback reflecting the value encoded,
until close and chunked across the encoded value)."""

from __future__ import annotations

import base64
from urllib.parse import quote

import pytest

from stockade.supervisor.network.brokered import Broker
from stockade.supervisor.network.httpio import Masker
from stockade.supervisor.policy.encodings import MIN_ENCODED, Forms, forms, longest_form
from tests.unit.encoders import BASE64, ENCODINGS
from tests.unit.intercept_harness import GH_PH, GH_REAL, SECRETS, Harness, get, once

SECRET = b"sk_live/Zq+8x=Kd&<p>\"q'a~9-T_f.Lm0"
"""A value with every character class an encoder treats apart (/ + = & < > " ' ~ - _ .)."""

PREFIXES = [b"", b"A", b"AB"]  # the value at offset 0, 1 and 2 of a base64 group
SUFFIXES = [b"", b"!", b"!?"]


def reflection(name: str, prefix: bytes, suffix: bytes) -> tuple[bytes, list[tuple[int, int]]]:
    """The reflected text (`before <encoded> after`) and the spans in it that carry the value's
    bytes alone: what must be all asterisks once masked."""
    encode = ENCODINGS[name]
    whole = encode(prefix + SECRET + suffix)
    text = b"reflected: " + whole + b" end"
    at = len(b"reflected: ")
    if name in BASE64:
        raw = base64.b64encode(prefix + SECRET + suffix)
        first = -(-len(prefix) * 8 // 6)
        last = (len(prefix) + len(SECRET)) * 8 // 6
        if name == "base64-in-a-query":  # escapes before the value's run shift it
            start = len(quote(raw[:first], safe=""))
            stop = len(quote(raw[:last], safe=""))
            return text, [(at + start, at + stop)]
        return text, [(at + first, at + last)]
    inner = encode(SECRET)
    if name.startswith("json") and name != "json-every-char":
        inner = inner[1:-1]  # the quotes
    offset = whole.find(inner)
    assert offset >= 0, name
    return text, [(at + offset, at + offset + len(inner))]


def masked_through(masker: Masker, text: bytes, cuts: list[int]) -> bytes:
    out, last = b"", 0
    for cut in [*cuts, len(text)]:
        out += masker.feed(text[last:cut])
        last = cut
    return out + masker.flush()


FORMS = Forms([SECRET])


@pytest.mark.parametrize("name", sorted(ENCODINGS))
@pytest.mark.parametrize("prefix", PREFIXES, ids=["at0", "at1", "at2"])
@pytest.mark.parametrize("suffix", SUFFIXES, ids=["end", "then1", "then2"])
def test_each_encoding_is_masked_at_every_cut(name: str, prefix: bytes, suffix: bytes) -> None:
    text, spans = reflection(name, prefix, suffix)
    expected = bytearray(FORMS.mask(text))
    for start, stop in spans:
        assert set(expected[start:stop]) == {ord("*")}, (name, bytes(expected))
    assert len(expected) == len(text)  # same length: the framing holds
    assert expected.startswith(b"reflected: ")
    assert expected.endswith(b" end")
    for cut in range(len(text) + 1):
        assert masked_through(Masker(FORMS), text, [cut]) == expected
    for first in range(0, len(text), 7):
        for second in range(first, len(text), 13):
            assert masked_through(Masker(FORMS), text, [first, second]) == expected


@pytest.mark.parametrize("name", sorted(BASE64))
def test_base64_leaves_at_most_the_mixed_edge_characters(name: str) -> None:
    """Of a base64 reflection, only the characters that mix the value's bits with its
    neighbours' may stay: no 3 consecutive bytes of the value decode from what is left."""
    for prefix in PREFIXES:
        for suffix in SUFFIXES:
            text, _ = reflection(name, prefix, suffix)
            out = FORMS.mask(text)[len(b"reflected: ") : -len(b" end")].decode()
            out = out.replace("%2B", "+").replace("%2F", "/").replace("%3D", "=")
            kept = out.replace("*", "A").replace("-", "+").replace("_", "/").rstrip("=")
            decoded = base64.b64decode(kept[: len(kept) - len(kept) % 4])
            assert not any(SECRET[i : i + 3] in decoded for i in range(len(SECRET) - 2))


def test_forms_are_few_bounded_and_never_short() -> None:
    found = forms(SECRET)
    assert 20 <= len(found) <= 60
    assert found[0] == (SECRET, False)
    assert all(len(form) >= MIN_ENCODED for form, _ in found[1:])
    assert max(len(form) for form, _ in found) <= longest_form(len(SECRET))
    assert FORMS.longest <= longest_form(len(SECRET))


def test_a_short_value_keeps_its_literal_and_only_forms_long_enough() -> None:
    short = Forms([b"abc"])
    assert short.mask(b"x abc y") == b"x *** y"
    assert short.mask(b"x YWJj y") == b"x YWJj y"  # 4 characters of base64: too common to mask
    assert short.mask(b"x 616263616263 y") == b"x 616263616263 y"


def test_ordinary_text_is_left_alone() -> None:
    text = (
        b'{"token": "c2tfdGVzdA==", "id": "0123456789abcdef", "url": "https%3A%2F%2Fexample.test"}'
        b"&amp;&#60;&#x3c; \\u002f =3D"
    )
    assert FORMS.mask(text) == text


def test_the_broker_builds_its_forms_once() -> None:
    broker = Broker(SECRETS)
    assert broker.forms is broker.forms
    assert broker.forms.mask(base64.b64encode(GH_REAL.encode())).strip(b"*=") == b""


async def test_reflections_in_every_encoding_are_masked_by_the_relay(h: Harness) -> None:
    """An upstream that reflects the real value, encoded every way, in one body sent until
    it closes: none of it comes back."""
    real = GH_REAL.encode()
    bodies = [ENCODINGS[name](prefix + real) for name in sorted(ENCODINGS) for prefix in PREFIXES]
    h.up.body = b"\n".join(bodies)
    reply = await once(h, get("/close", f"Authorization: Bearer {GH_PH}"))
    assert reply.status == 200
    assert len(reply.body) == len(h.up.body)
    lines = reply.body.split(b"\n")
    assert len(lines) == len(bodies)
    for line, sent in zip(lines, bodies, strict=True):
        assert line != sent, line  # each reflection had something masked
        assert real not in line
        assert base64.b64encode(real)[2:-4] not in line
        assert real.hex().encode()[2:-2] not in line.lower()


@pytest.mark.parametrize("cut", [1, 5, 17, 31])
async def test_a_chunked_reflection_cut_inside_the_encoded_value_is_masked(
    h: Harness, cut: int
) -> None:
    encoded = [
        base64.urlsafe_b64encode(b"x" + GH_REAL.encode()).decode(),
        GH_REAL.encode().hex(),
        "".join(f"%{b:02X}" for b in GH_REAL.encode()),
    ]
    parts = ",".join(f"{e[:cut]},{e[cut:]}" for e in encoded) + ",tail"
    reply = await once(h, get(f"/chunked?parts={parts}", f"Authorization: Bearer {GH_PH}"))
    assert reply.status == 200
    body = reply.body
    assert body.endswith(b"tail")
    for e in encoded:
        assert e.encode()[4:-4] not in body
    assert body.count(b"*") >= sum(len(e) - 4 for e in encoded)
