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


def stream(text: str, size: int, whole_reads: bool = False) -> tuple[str, int]:
    s = StreamScrubber(Scrubber([SECRET]), whole_reads)
    out = "".join(s.feed(text[i : i + size]) for i in range(0, len(text), size)) + s.flush()
    return out, s.redactions


@pytest.mark.parametrize("whole_reads", [False, True])
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
def test_secret_split_anywhere_is_scrubbed(text: str, size: int, whole_reads: bool) -> None:
    out, count = stream(text, size, whole_reads)
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
    assert s.flush_open() == "Password: "
    assert s.feed(f"\ntok: {TOKEN[:14]}") == "\n"
    assert s.flush_open() == "tok: ", "half a token must wait for the rest"
    out = s.feed(f"{TOKEN[14:]}\n")
    assert TOKEN[:14] not in out
    assert "[REDACTED]" in out


def feed_all(s: StreamScrubber, chunks: list[str]) -> str:
    return "".join(s.feed(chunk) for chunk in chunks) + s.flush()


@pytest.mark.parametrize("whole_reads", [False, True])
@pytest.mark.parametrize("offset", [-1, 0, 1, 10, 20])
@pytest.mark.parametrize("secret", [SECRET, TOKEN], ids=["configured", "format"])
def test_a_long_line_is_not_cut_inside_a_credential(
    secret: str, offset: int, whole_reads: bool
) -> None:
    """A line longer than MAX_HOLD is released but for a tail: the cut must not fall inside
    a credential, whose halves would then each be scrubbed alone."""
    head = "x " * ((MAX_HOLD - TAIL) // 2)
    text = head + secret + " " + "y" * (TAIL - offset - 1)  # no newline: one open line
    assert len(text) > MAX_HOLD
    out = feed_all(StreamScrubber(Scrubber([SECRET]), whole_reads), [text])
    assert secret[:12] not in out
    assert secret[-8:] not in out
    assert out.count("[REDACTED]") == 1


B64_SECRET = "Zq7-hunter2-s3cr3t-9fX-and-more"


@pytest.mark.parametrize("whole_reads", [False, True])
@pytest.mark.parametrize("size", [1, 7, 76, 77, 200])
@pytest.mark.parametrize("prefix", ["", "X" * 40, "X" * 41, "X" * 42, "X" * 55])
def test_a_configured_secret_in_wrapped_base64_split_across_chunks(
    prefix: str, size: int, whole_reads: bool
) -> None:
    """`env | base64`: the secret's base64 may straddle a line break (76 columns: a prefix of
    28 to 56 bytes puts it across the first), and the stream may be split at that break."""
    encoded = base64.encodebytes(f"{prefix}{B64_SECRET}\nPATH=/usr/bin\n".encode()).decode()
    chunks = [encoded[i : i + size] for i in range(0, len(encoded), size)]
    s = StreamScrubber(Scrubber([B64_SECRET]), whole_reads)
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


@pytest.mark.parametrize("whole_reads", [False, True])
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
def test_multi_line_credentials_split_across_chunks(
    text: str, hidden: str, size: int, whole_reads: bool
) -> None:
    s = StreamScrubber(Scrubber(), whole_reads)
    out = feed_all(s, [text[i : i + size] for i in range(0, len(text), size)])
    assert hidden not in out
    assert "[REDACTED]" in out


def test_a_prompt_then_an_empty_chunk_is_still_released_on_a_pause() -> None:
    s = StreamScrubber(Scrubber([SECRET]))
    assert s.feed("Password: ") == ""
    assert s.feed("") == ""
    assert s.flush_open() == "Password: "
    assert not s.holding


# ---- a pause releases the open line but for what may still begin a credential ----


@pytest.mark.parametrize(
    "text",
    ["abc", "name? ", "Downloading 45%", "12345", "x", "ls -la /tmp", "through", ">>> ",
     "Continue? [Y/n] ", "Enter password: ", "user@host:~/src$ ", "ÄÖÜ ok", "a\tb"],
)  # fmt: skip
def test_a_pause_releases_a_partial_line_that_cannot_begin_a_credential(text: str) -> None:
    s = StreamScrubber(Scrubber())
    assert s.feed(f"first line\n{text}") == "first line\n"
    assert s.flush_open() == text
    assert not s.holding


@pytest.mark.parametrize(
    ("text", "held"),
    [
        (f"token: {TOKEN[:9]}", TOKEN[:9]),
        ("xyz gh", "gh"),
        ("AKIA12", "AKIA12"),
        ("sk-proj-abc", "sk-proj-abc"),
        ("postgres://u:pa", "postgres://u:pa"),
        ("password: hun", "hun"),
        ("Authorization: Bearer abc", "abc"),
        ("export API_KEY=abc", "abc"),
        ("mysql -u root -psec", "sec"),
        ("a" * 40, "a" * 40),
        (f"value {SECRET[:4]}", SECRET[:4]),
        (f"b64 {base64.b64encode(SECRET.encode()).decode()[:6]}",
         base64.b64encode(SECRET.encode()).decode()[:6]),
    ],
)  # fmt: skip
def test_a_pause_keeps_back_what_may_begin_a_credential(text: str, held: str) -> None:
    s = StreamScrubber(Scrubber([SECRET]))
    assert s.feed(text) == ""
    assert s.flush_open() == text[: -len(held)]
    assert s.holding
    # at the end it is scrubbed with the line it ends: a keyword's value, or text
    assert s.flush() in (held, "[REDACTED]")


def test_without_a_scrubber_a_pause_releases_everything() -> None:
    s = StreamScrubber(None)
    s.feed(f"tok: {TOKEN[:9]}")
    assert s.flush_open() == f"tok: {TOKEN[:9]}"


def _split_with_a_pause(scrubber: Scrubber, before: str, secret: str, at: int) -> str:
    s = StreamScrubber(scrubber)
    out = s.feed(before + secret[:at])
    out += s.flush_open()
    out += s.feed(secret[at:] + " after\n")
    return out + s.flush()


def _lead_examples() -> list[str]:
    import random

    from stockade.supervisor.policy.scrub.format_parts import example
    from stockade.supervisor.policy.scrub.formats import FORMATS

    rng = random.Random(7)
    return [example(f, rng) for f in FORMATS if isinstance(f.parts[0], str)]


def test_a_token_of_every_lead_format_split_by_a_pause_anywhere_is_redacted() -> None:
    """Every format with a literal lead, its example cut at every point from MIN_LEAD on with
    a quiet spell between the two writes: the token never leaves whole and is redacted as it
    is when written at once (Done when 3 of issue 28)."""
    from stockade.supervisor.policy.scrub.partial import MIN_LEAD

    scrubber = Scrubber()
    missed = []
    for token in _lead_examples():
        whole = _split_with_a_pause(scrubber, "out: ", token, len(token))
        if token in whole:  # the scrubber's own limits (context a format needs): not ours
            continue
        for at in range(MIN_LEAD, len(token)):
            out = _split_with_a_pause(scrubber, "out: ", token, at)
            # at most a lone first character of a lead may have gone before the rest
            if token in out or "[REDACTED]" not in out or len(out) - len(whole) >= MIN_LEAD:
                missed.append((token, at, out))
    assert not missed, missed[:3]


@pytest.mark.parametrize(
    ("before", "secret"),
    [
        ("password: ", "hunter2-correct-horse"),
        ("Authorization: Bearer ", "abcdefghijklmnop0123456789"),
        ("export API_KEY=", "Zq7hunter2s3cr3t9fXabc"),
        ("curl -u user:", "pa55word-value"),
        ("value ", SECRET),
        ("b64 ", base64.b64encode(SECRET.encode()).decode()),
    ],
)
def test_keyword_values_and_configured_secrets_split_by_a_pause_are_redacted(
    before: str, secret: str
) -> None:
    scrubber = Scrubber([SECRET])
    for at in range(1, len(secret)):
        out = _split_with_a_pause(scrubber, before, secret, at)
        assert secret not in out, (at, out)
        assert "[REDACTED]" in out, (at, out)


# ---- whole_reads (a command's output): one write of the process is one chunk ----


def test_a_read_that_ends_mid_line_is_held_whole_until_a_pause() -> None:
    s = StreamScrubber(Scrubber([SECRET]), whole_reads=True)
    assert s.feed("Hello,\nWorld!") == ""  # E2B's send_stdin test: `cat` echoes one write
    assert s.flush_open() == "Hello,\nWorld!"
    assert not s.holding


def test_a_read_that_ends_a_line_is_released_at_once_with_what_was_held() -> None:
    s = StreamScrubber(Scrubber([SECRET]), whole_reads=True)
    assert s.feed("one\ntwo\n") == "one\ntwo\n"
    assert not s.holding
    assert s.feed("Hello,\nWor") == ""
    assert s.feed("ld!\n") == "Hello,\nWorld!\n"
    assert not s.holding


def test_the_next_read_that_ends_mid_line_releases_the_lines_held_before_it() -> None:
    s = StreamScrubber(Scrubber([SECRET]), whole_reads=True)
    assert s.feed("one\ntw") == ""
    assert s.feed("o\nthr") == "one\n"  # this read is held whole in turn
    assert s.feed("ee") == "two\n"
    assert s.flush_open() == "three"
    assert s.feed("a prompt? ") == ""  # no line held: nothing to release, no rescan
    assert s.flush() == "a prompt? "


def test_a_block_buffered_flood_of_lines_is_held_one_read_at_most() -> None:
    """A program whose output is a pipe writes 4 KiB blocks that end mid-line: each block
    releases the lines of the one before; nothing is held past the read after it."""
    text = "".join(f"line {n} of a long build log\n" for n in range(20_000))
    s = StreamScrubber(Scrubber([SECRET]), whole_reads=True)
    out, fed, most = [], 0, 0
    for i in range(0, len(text), 4096):
        out.append(s.feed(text[i : i + 4096]))
        fed += len(text[i : i + 4096])
        most = max(most, fed - sum(map(len, out)))
        assert not out[-1] or out[-1].endswith("\n")
    assert most <= 2 * 4096
    assert "".join(out) + s.flush() == text


@pytest.mark.parametrize("read", [1, 4096, MAX_HOLD + 1])
def test_a_flood_without_line_ends_is_released_in_bounded_pieces(read: int) -> None:
    text = "progress 45% ......\r" * (4 * MAX_HOLD // 20)
    s = StreamScrubber(Scrubber([SECRET]), whole_reads=True)
    released, fed, most = 0, 0, 0
    for i in range(0, len(text), read):
        piece = s.feed(text[i : i + read])
        released += len(piece)
        fed += len(text[i : i + read])
        most = max(most, fed - released)
        assert len(piece) <= MAX_HOLD + read
    assert most <= MAX_HOLD + read
    assert released > len(text) - MAX_HOLD - read
    assert released + len(s.flush()) == len(text)


def _two_reads(text: str, at: int, pause: bool) -> str:
    s = StreamScrubber(Scrubber([SECRET]), whole_reads=True)
    out = s.feed(text[:at])
    if pause:
        out += s.flush_open()
    out += s.feed(text[at:])
    return out + s.flush_open() + s.flush()


@pytest.mark.parametrize("pause", [False, True], ids=["no-pause", "pause"])
@pytest.mark.parametrize("end", ["\n", " and on"], ids=["line-end", "mid-line"])
def test_a_credential_straddling_a_held_read_and_the_next_is_redacted(
    pause: bool, end: str
) -> None:
    """A read held whole (it ends mid-line), cut at every point of the credentials in it,
    the next read ending a line or not, a quiet spell between the two or none."""
    text = f"build ok\nGITHUB_TOKEN={TOKEN} and {SECRET} x\nnext{end}"
    for at in range(1, len(text)):
        out = _two_reads(text, at, pause)
        assert TOKEN not in out, (at, out)
        assert SECRET not in out, (at, out)
        assert out.startswith("build ok\n"), (at, out)
        assert out.endswith(f" x\nnext{end}"), (at, out)
        assert out.count("[REDACTED]") == 2, (at, out)


class CountingCuts(StreamScrubber):
    """Counts the rescans of what is held."""

    def __init__(self, scrubber: Scrubber) -> None:
        super().__init__(scrubber, whole_reads=True)
        self.cuts = 0

    def _safe_cut(self, text: str, limit: int | None = None) -> int:
        self.cuts += 1
        return super()._safe_cut(text, limit)


def test_lines_the_scrubber_holds_back_cost_no_rescan_per_read() -> None:
    """An open key block is held whatever comes; reads that end mid-line after it (a key
    written a character at a time) do not rescan it each time."""
    s = CountingCuts(Scrubber())
    assert s.feed("-----BEGIN RSA PRIVATE KEY-----\n") == ""
    assert s.feed("MIIEpAIBAAKCAQEA0Z3VS5JJcds3\nxHn") == ""
    assert s.feed("/ygWep4\n") == ""
    cuts = s.cuts
    for char in "MIIEpAIBAAKCAQEA0Z3VS5JJcds3" * 40:
        assert s.feed(char) == ""
    assert s.cuts == cuts
    out = s.feed("\n-----END RSA PRIVATE KEY-----\nafter\n")
    assert out.endswith("after\n")
    assert "MIIEpAIBAAKCAQEA0Z3VS5JJcds3" not in out


def test_warm_compiles_what_the_first_quiet_stream_needs() -> None:
    """`serve` warms the scrubber at start: the formats with a lead are compiled before the
    first stream goes quiet mid-line (a prompt of the first streamed call came ~40 ms late)."""
    from stockade.supervisor.policy.scrub import partial

    partial._lead_formats.cache_clear()
    Scrubber(secrets=["hunter2-very-secret"]).warm()
    assert partial._lead_formats.cache_info().currsize == 1
    stream = StreamScrubber(Scrubber())
    assert stream.feed("name? ") == ""
    assert stream.flush_open() == "name? "
    assert partial._lead_formats.cache_info().misses == 1  # compiled once, by warm()
