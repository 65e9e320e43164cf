"""Compressed reflections through the intercepting proxy (network/intercept.py over
policy/compression.py): an upstream that reflects the real value in every encoding and sends
it gzip-, deflate- or br-compressed (though the proxy asked for identity), sized, chunked or
until it closes, has it decoded, masked and passed on uncompressed with its framing written
afresh; a bomb, a coding the proxy cannot decode and a broken stream are a 502, recorded, or
(past DECODED_HOLD) a response cut short; and the shared decoder itself (br added to the
fronts' gzip and deflate)."""

from __future__ import annotations

import asyncio
import base64
import gzip
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import brotli
import pytest
import pytest_asyncio

from stockade.supervisor.network.intercept import DECODED_HOLD
from stockade.supervisor.policy.compression import (
    CHUNK,
    RATIO_SLACK,
    Inflater,
    Undecodable,
)
from tests.unit.intercept_harness import GH_PH, GH_REAL, Harness, Response, get, make_harness, once
from tests.upstream import ReflectingUpstream, reflections

CODINGS = ["gzip", "deflate", "br"]
TEXT = b"".join(b"line %d of a body that compresses well\n" % i for i in range(20000))


@pytest_asyncio.fixture
async def r(tmp_path: Path) -> AsyncIterator[Harness]:
    h = await make_harness(tmp_path, up=ReflectingUpstream(tmp_path / "reflecting"))
    yield h
    await h.proxy.close()
    await h.up.close()


def reflect(query: str) -> bytes:
    return get(f"/reflect?{query}", f"Authorization: Bearer {GH_PH}")


def assert_masked(reply: Response, repeat: int = 1) -> None:
    """The body is the reflections, each masked in place (same length), none of the value's
    forms left; no Content-Encoding, and framing that matches what came."""
    assert reply.status == 200, reply.head
    sent = reflections(f"Bearer {GH_REAL}".encode()) * repeat
    got = [line for line in reply.body.split(b"\n")[:-1] if not line.startswith(b"#")]
    assert len(got) == len(sent)
    for line, clear in zip(got, sent, strict=True):
        assert len(line) == len(clear)
        assert line != clear, clear
    for form in (GH_REAL.encode(), GH_REAL.encode().hex().encode()):
        assert form[4:-4] not in reply.body.lower()
    assert base64.b64encode(GH_REAL.encode())[4:-4] not in reply.body


@pytest.mark.parametrize("framing", ["", "chunked&", "close&"], ids=["length", "chunked", "close"])
@pytest.mark.parametrize("coding", CODINGS)
async def test_a_compressed_reflection_is_decoded_masked_and_sent_plain(
    r: Harness, coding: str, framing: str
) -> None:
    reply = await once(r, reflect(f"{framing}coding={coding}"))
    assert_masked(reply)
    assert b"content-encoding" not in reply.head.lower()
    assert f"content-length: {len(reply.body)}".encode() in reply.head.lower()
    assert r.up.requests[0].header("accept-encoding") == "identity"
    assert not any(d.allowed is False for d in r.decisions)


@pytest.mark.parametrize("coding", ["gzip", "br"])
async def test_a_long_compressed_reflection_streams_chunked(r: Harness, coding: str) -> None:
    """Past DECODED_HOLD decoded bytes the head goes before the end: chunked, masked all the
    way (the reflections repeated so the value sits at every offset of the stream)."""
    repeat = DECODED_HOLD // len(b"\n".join(reflections(b"Bearer " + GH_REAL.encode()))) + 40
    reply = await once(r, reflect(f"coding={coding}&repeat={repeat}"))
    assert len(reply.body) > DECODED_HOLD
    assert b"transfer-encoding: chunked" in reply.head.lower()
    assert b"content-encoding" not in reply.head.lower()
    assert_masked(reply, repeat)


@pytest.mark.parametrize("coding", CODINGS)
async def test_a_bomb_is_a_502_recorded(r: Harness, coding: str) -> None:
    reply = await once(r, get(f"/bomb?coding={coding}", f"Authorization: Bearer {GH_PH}"))
    assert reply.status == 502, reply.head
    assert b"100-fold" in reply.body
    (refused,) = [d for d in r.decisions if not d.allowed]
    assert "refused as a bomb" in refused.reason


@pytest.mark.parametrize("coding", ["zstd", "compress", "gzip,br", "bogus"])
async def test_a_coding_the_proxy_cannot_decode_is_refused(r: Harness, coding: str) -> None:
    reply = await once(r, reflect(f"coding={coding}"))
    assert reply.status == 502
    assert b"cannot decode" in reply.body
    assert GH_REAL.encode() not in reply.head + reply.body
    assert [d.allowed for d in r.decisions][-1] is False


@pytest.mark.parametrize("coding", CODINGS)
async def test_a_truncated_stream_is_a_502(r: Harness, coding: str) -> None:
    reply = await once(r, reflect(f"coding={coding}&cut=3"))
    assert reply.status == 502
    assert b"truncated" in reply.body or b"not valid" in reply.body
    assert GH_REAL.encode() not in reply.body


async def test_a_fault_past_the_hold_cuts_the_response(r: Harness) -> None:
    repeat = DECODED_HOLD // len(b"\n".join(reflections(b"Bearer " + GH_REAL.encode()))) + 40
    with pytest.raises(asyncio.IncompleteReadError):  # the chunked body never ends
        await once(r, reflect(f"coding=gzip&repeat={repeat}&cut=3"))
    (refused,) = [d for d in r.decisions if not d.allowed]
    assert "truncated" in refused.reason


async def test_an_identity_response_is_left_as_it_was(r: Harness) -> None:
    reply = await once(r, reflect("coding=identity"))
    assert_masked(reply)
    assert b"content-encoding: identity" in reply.head.lower()


# the shared decoder


def split(data: bytes, n: int) -> Iterator[bytes]:
    return (data[i : i + n] for i in range(0, len(data), n))


def decode(coding: str, data: bytes, step: int, limit: int | None = None) -> bytes:
    inflater = Inflater(coding, limit)
    out = b"".join(piece for chunk in split(data, step) for piece in inflater.feed(chunk))
    inflater.finish()
    return out


def why(coding: str, data: bytes, step: int = 4096, limit: int | None = None) -> str:
    with pytest.raises(Undecodable) as caught:
        decode(coding, data, step, limit)
    return caught.value.why


@pytest.mark.parametrize("step", [1, 3, 1000, 1 << 20])
def test_br_decodes_however_cut(step: int) -> None:
    data = brotli.compress(TEXT, quality=5)
    assert decode("br", data, step) == TEXT
    assert decode("gzip", gzip.compress(TEXT), step) == TEXT
    assert decode("deflate", zlib.compress(TEXT), step) == TEXT


def test_a_br_bomb_is_refused_after_bounded_work() -> None:
    data = brotli.compress(bytes(512 << 20), quality=1)  # 512 MiB of zeros in a few KB
    inflater = Inflater("br", None)
    sizes: list[int] = []

    def feed() -> None:
        for chunk in split(data, 1 << 10):
            sizes.extend(len(p) for p in inflater.feed(chunk))

    with pytest.raises(Undecodable) as caught:
        feed()
    assert caught.value.why == "bomb"
    assert max(sizes) <= 4 * CHUNK
    assert inflater.decoded <= RATIO_SLACK + 4 * CHUNK


def test_br_truncated_invalid_trailing_and_too_large() -> None:
    whole = brotli.compress(TEXT, quality=5)
    assert why("br", whole[: len(whole) // 2]) == "truncated"
    assert why("br", b"\xff" * 64) == "invalid"
    assert why("br", whole + b"junk") == "invalid"
    assert why("br", whole + b"junk", step=len(whole)) == "invalid"
    assert why("br", whole, limit=len(TEXT) - 1) == "too large"
    assert why("gzip", gzip.compress(TEXT), limit=len(TEXT) - 1) == "too large"


def test_codings_not_taken_are_named() -> None:
    for coding in ("zstd", "gzip, br", "compress"):
        with pytest.raises(Undecodable) as caught:
            Inflater(coding, None)
        assert (caught.value.why, repr(coding) in caught.value.message) == ("unknown", True)
    with pytest.raises(Undecodable):
        Inflater("br", None, taken=("gzip", "identity"))
