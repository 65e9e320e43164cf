"""Key material without its BEGIN and END lines (partial views) is redacted, whole and in
streams; base64 and hex that are not secrets stay."""

from __future__ import annotations

import base64
import hashlib
import json
import random

import pytest

from stockade.supervisor.policy.scrub.scrubber import REDACTED, Scrubber
from stockade.supervisor.policy.scrub.stream import StreamScrubber
from tests.corpora.generate import fake_key_body, fake_openssh_body, leaked

SCRUBBER = Scrubber()
RNG = random.Random(7)
RSA = fake_key_body(RNG, 1170)  # its last line has 32 characters: too short alone
OPENSSH = fake_openssh_body(RNG, 1200)


def views(body: list[str]) -> dict[str, tuple[str, list[str]]]:
    return {
        "sed-n-5,9p": ("\n".join(body[4:9]) + "\n", body[4:9]),
        "head-without-begin": ("\n".join(body[:6]), body[:6]),
        "tail": ("\n".join(body[-3:]) + "\n-----END RSA PRIVATE KEY-----\n", body[-3:]),
        "grep-v-begin": ("\n".join(body) + "\n-----END RSA PRIVATE KEY-----\n", body),
        "grep-n": ("".join(f"k.pem:{i}:{line}\n" for i, line in enumerate(body[3:7])), body[3:7]),
        "cat-n": ("".join(f"{i:>6}\t{line}\n" for i, line in enumerate(body[:4])), body[:4]),
        "search-render": (f"id_rsa:7: {body[6]}", [body[6]]),
        "one-line": (body[9], [body[9]]),
        "crlf": ("\r\n".join(body[2:5]) + "\r\n", body[2:5]),
        "indented": ("".join(f"    {line}\n" for line in body[2:5]), body[2:5]),
    }


@pytest.mark.parametrize("body", [RSA, OPENSSH], ids=["rsa", "openssh"])
@pytest.mark.parametrize("view", sorted(views(RSA)))
def test_partial_view_is_redacted(body: list[str], view: str) -> None:
    text, shown = views(body)[view]
    cleaned, count = SCRUBBER.scrub(text)
    assert count >= 1
    assert [line for line in shown if leaked(line, cleaned)] == []


def test_each_line_is_its_own_redaction_and_prefixes_stay() -> None:
    text = "".join(f"k.pem:{i}:{line}\n" for i, line in enumerate(RSA[3:6]))
    expected = "".join(f"k.pem:{i}:{REDACTED}\n" for i in range(3))
    assert SCRUBBER.scrub(text) == (expected, 3)


def test_a_whole_pem_block_is_still_one_redaction() -> None:
    text = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(RSA) + "\n-----END RSA PRIVATE KEY-----"
    assert SCRUBBER.scrub(text) == (REDACTED, 1)


def test_a_random_token_alone_on_its_line() -> None:
    token = base64.urlsafe_b64encode(random.Random(3).randbytes(32)).decode().rstrip("=")
    assert SCRUBBER.scrub(f"$ cat token\n{token}\n$ ") == (f"$ cat token\n{REDACTED}\n$ ", 1)


def _fixture_lines() -> list[str]:
    rng = random.Random(11)
    blob = base64.b64encode(rng.randbytes(300)).decode()
    cert = base64.b64encode(b"0\x82\x03" + rng.randbytes(700)).decode()
    return [
        hashlib.sha1(b"x").hexdigest(),  # git SHA
        hashlib.sha256(b"x").hexdigest(),
        hashlib.sha512(b"x").hexdigest(),
        f"sha256:{hashlib.sha256(b'y').hexdigest()}",
        f"  integrity sha512-{base64.b64encode(hashlib.sha512(b'z').digest()).decode()}",
        f"sha512-{base64.b64encode(hashlib.sha512(b'w').digest()).decode()}",
        "0f8fad5b-d9cb-469f-a165-70867728950e",
        base64.b64encode(b"Hello, this is ordinary text, encoded for a test fixture.").decode(),
        base64.b64encode(json.dumps({"apiVersion": "v1", "kind": "ConfigMap"}).encode()).decode(),
        "\n".join(blob[i : i + 76] for i in range(0, len(blob), 76)),  # `base64` output
        "-----BEGIN CERTIFICATE-----\n"
        + "\n".join(cert[i : i + 64] for i in range(0, len(cert), 64))
        + "\n-----END CERTIFICATE-----",
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
        "/home/dev/projects/stockade/src/stockade/supervisor/policy/x",
        "ThisIsAVeryLongCamelCaseIdentifierWithoutAnyRandomness1",
        ("QUFBQUFBQUFB" * 4),
    ]


@pytest.mark.parametrize("text", _fixture_lines())
def test_non_secret_base64_and_hex_stay(text: str) -> None:
    assert SCRUBBER.scrub(text + "\n") == (text + "\n", 0)


def test_stream_sees_a_key_body_released_line_by_line() -> None:
    """`tail` of a key through a stream whose lines arrive apart: the short last line is
    redacted with the line before it, although they are scrubbed in separate releases."""
    assert len(RSA[-1]) < 40
    stream = StreamScrubber(SCRUBBER)
    out = "".join(stream.feed(line + "\n") for line in RSA[-3:])
    out += stream.feed("-----END RSA PRIVATE KEY-----\n") + stream.flush()
    assert [line for line in RSA[-3:] if leaked(line, out)] == []
    assert out.endswith("-----END RSA PRIVATE KEY-----\n")


def test_stream_one_character_at_a_time() -> None:
    stream = StreamScrubber(SCRUBBER)
    text = "\n".join(RSA[2:6]) + "\n"
    out = "".join(stream.feed(c) for c in text) + stream.flush()
    assert out == f"{REDACTED}\n" * 4


def test_search_matches_one_by_one_hide_the_short_last_line() -> None:
    """`search` data: each matched line is its own string; the last line of the body is too
    short to tell alone, but follows lines of key material in the same value."""
    matches = [{"file": "k.pem", "line": i, "text": line} for i, line in enumerate(RSA[-3:])]
    cleaned, count = SCRUBBER.scrub_value({"matches": matches})
    assert count == 3
    assert json.dumps(cleaned).count(REDACTED) == 3
    assert [line for line in RSA[-3:] if leaked(line, json.dumps(cleaned))] == []


def test_short_base64_values_stay_without_key_material_before_them() -> None:
    value = {"ids": ["aB3dE5gH7jK9mN1pQ2rS4tU6vW8xY0zC", "c2hvcnQgdmFsdWU="]}
    assert SCRUBBER.scrub_value(value) == (value, 0)


def test_a_long_base64_blob_on_one_line_stays() -> None:
    """`base64 -w0 file` of a binary file: a blob, not a key's line or a token."""
    blob = base64.b64encode(random.Random(5).randbytes(3000)).decode()
    assert SCRUBBER.scrub(blob + "\n") == (blob + "\n", 0)
