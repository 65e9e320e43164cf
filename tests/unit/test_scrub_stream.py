"""A credential split across chunks is still scrubbed; ordinary text flows unchanged."""

from __future__ import annotations

import pytest

from stockade.supervisor.policy.scrub import Scrubber
from stockade.supervisor.policy.scrub_stream import MAX_HOLD, StreamScrubber

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
