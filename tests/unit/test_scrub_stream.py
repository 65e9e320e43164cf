"""A credential split across chunks is still scrubbed; ordinary text flows unchanged."""

from __future__ import annotations

import base64

import pytest

from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.policy.scrub.stream import MAX_HOLD, TAIL, StreamScrubber

SECRET = "Zq7-hunter2-s3cr3t-9fX"
TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
KEY = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA0Z3VS5JJcds3\nxHn/ygWep4\n"
    "-----END RSA PRIVATE KEY-----\n"
)


def stream(text: str, size: int) -> tuple[str, int]:
    s = StreamScrubber(Scrubber([SECRET]))
    out = "".join(s.feed(text[i : i + size]) for i in range(0, len(text), size)) + s.flush()
    return out, s.redactions


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16, 1000])
@pytest.mark.parametrize(
    "text",
    [
        f"token: {TOKEN}\n",
        f"the value is {SECRET} here\nnext line\n",
        f"password={SECRET}",
        f"log line\n{KEY}after\n",
        f"GITHUB_TOKEN={TOKEN}\nAPI={SECRET}\n",
    ],
)
def test_secret_split_anywhere_is_scrubbed(text: str, size: int) -> None:
    out, count = stream(text, size)
    assert SECRET not in out
    assert TOKEN not in out
    assert "MIIEpAIBAAKCAQEA0Z3VS5JJcds3" not in out
    assert "[REDACTED]" in out
    assert count >= 1


def test_ordinary_text_flows_unchanged_and_lines_are_released_at_once() -> None:
    s = StreamScrubber(Scrubber([SECRET]))
    assert s.feed("line one\nline t") == "line one\n"
    assert s.holding
    assert s.feed("wo\n") == "line two\n"
    assert not s.holding
    assert s.feed("prompt> ") == ""
    assert s.flush() == "prompt> "
    assert s.redactions == 0


def test_a_very_long_line_is_released_but_for_a_tail() -> None:
    s = StreamScrubber(Scrubber([SECRET]))
    out = s.feed("x" * (MAX_HOLD + 10_000))
    assert len(out) > MAX_HOLD - 10_000
    assert s.holding
    assert len(out) + len(s.flush()) == MAX_HOLD + 10_000


def test_without_a_scrubber_text_passes() -> None:
    s = StreamScrubber(None)
    assert s.feed(f"{SECRET}\n") == f"{SECRET}\n"


def test_a_pause_releases_prompts_but_not_half_a_token() -> None:
    s = StreamScrubber(Scrubber([SECRET]))
    assert s.feed("Password: ") == ""
    assert s.flush_prompt() == "Password: "
    assert s.feed(f"tok: {TOKEN[:14]}") == ""
    assert s.flush_prompt() == "", "half a token must wait for the rest"
    out = s.feed(f"{TOKEN[14:]}\n")
    assert TOKEN[:14] not in out
    assert "[REDACTED]" in out


def feed_all(s: StreamScrubber, chunks: list[str]) -> str:
    return "".join(s.feed(chunk) for chunk in chunks) + s.flush()


@pytest.mark.parametrize("offset", [-1, 0, 1, 10, 20])
@pytest.mark.parametrize("secret", [SECRET, TOKEN], ids=["configured", "format"])
def test_a_long_line_is_not_cut_inside_a_credential(secret: str, offset: int) -> None:
    """A line longer than MAX_HOLD is released but for a tail: the cut must not fall inside
    a credential, whose halves would then each be scrubbed alone."""
    head = "x " * ((MAX_HOLD - TAIL) // 2)
    text = head + secret + " " + "y" * (TAIL - offset - 1)  # no newline: one open line
    assert len(text) > MAX_HOLD
    out = feed_all(StreamScrubber(Scrubber([SECRET])), [text])
    assert secret[:12] not in out
    assert secret[-8:] not in out
    assert out.count("[REDACTED]") == 1


B64_SECRET = "Zq7-hunter2-s3cr3t-9fX-and-more"


@pytest.mark.parametrize("size", [1, 7, 76, 77, 200])
@pytest.mark.parametrize("prefix", ["", "X" * 40, "X" * 41, "X" * 42, "X" * 55])
def test_a_configured_secret_in_wrapped_base64_split_across_chunks(prefix: str, size: int) -> None:
    """`env | base64`: the secret's base64 may straddle a line break (76 columns: a prefix of
    28 to 56 bytes puts it across the first), and the stream may be split at that break."""
    encoded = base64.encodebytes(f"{prefix}{B64_SECRET}\nPATH=/usr/bin\n".encode()).decode()
    chunks = [encoded[i : i + size] for i in range(0, len(encoded), size)]
    s = StreamScrubber(Scrubber([B64_SECRET]))
    out = feed_all(s, chunks)
    assert s.redactions >= 1
    flat = out.replace("\n", "")
    for shift in range(3):
        alone = base64.b64encode(b"\0" * shift + B64_SECRET.encode()).decode()
        inner = alone[(8 * shift + 5) // 6 : (8 * (shift + len(B64_SECRET))) // 6]
        assert all(inner[i : i + 8] not in flat for i in range(len(inner) - 7))


SSH2 = (
    "---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: x\nP2/56wAAAgIAAAAmZGwtbW9kcAAAAAA\n"
    "AAAAABAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n---- END SSH2 ENCRYPTED PRIVATE KEY ----\n"
)
PUTTY = (
    "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nPublic-Lines: 1\nAAAAC3NzaC1lZDI1\n"
    "Private-Lines: 1\nAAAAIFdWpTkqP8xLr2mNq9Vw3Zc\nPrivate-MAC: 0123456789abcdef\n"
)
NETRC = "machine api.example.com\n  login me\n  password Zq7hunter2s3cr3t\n"


@pytest.mark.parametrize("size", [1, 5, 16, 40])
@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        (SSH2, "P2/56wAAAgIAAAAmZGwtbW9kcAAAAAA"),
        (PUTTY, "AAAAIFdWpTkqP8xLr2mNq9Vw3Zc"),
        (NETRC, "Zq7hunter2s3cr3t"),
    ],
    ids=["ssh2", "putty", "netrc"],
)
def test_multi_line_credentials_split_across_chunks(text: str, hidden: str, size: int) -> None:
    s = StreamScrubber(Scrubber())
    out = feed_all(s, [text[i : i + size] for i in range(0, len(text), size)])
    assert hidden not in out
    assert "[REDACTED]" in out


def test_a_prompt_then_an_empty_chunk_is_still_released_on_a_pause() -> None:
    s = StreamScrubber(Scrubber([SECRET]))
    assert s.feed("Password: ") == ""
    assert s.feed("") == ""
    assert s.flush_prompt() == "Password: "
    assert not s.holding
