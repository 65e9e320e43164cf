"""The format table: every row redacts a fake example of itself wherever it sits (also next to
non-ASCII text and lone surrogates, which Hyperscan sees as NUL bytes), leaves its
look-alike alone, and its Hyperscan prefilter finds every match of its regex."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from stockade.supervisor.policy.scrub import formats as scrub_formats
from stockade.supervisor.policy.scrub.formats import FORMATS, Format, example
from stockade.supervisor.policy.scrub.scrubber import REDACTED, Scrubber

SCRUBBER = Scrubber()
BY_NAME = {fmt.name: fmt for fmt in FORMATS}


def sample(fmt: Format, number: int = 0) -> tuple[str, str]:
    """A fake example and the part of it that must be redacted."""
    value = example(fmt, random.Random(f"{fmt.name}/{number}"))
    match = re.search(fmt.regex(), value)
    assert match is not None
    return value, match["s"]


def test_the_table_has_120_formats_or_more_each_with_service_and_doc() -> None:
    assert len(FORMATS) >= 120
    assert len(BY_NAME) == len(FORMATS)
    assert all(fmt.service and fmt.doc and "http" not in fmt.doc for fmt in FORMATS)
    assert len({fmt.service for fmt in FORMATS}) >= 80


@pytest.mark.parametrize("name", sorted(BY_NAME))
@pytest.mark.parametrize("number", [0, 1])
def test_format_is_redacted(name: str, number: int) -> None:
    value, secret = sample(BY_NAME[name], number)
    expected = f"found {value.replace(secret, REDACTED)} here"
    assert SCRUBBER.scrub(f"found {value} here") == (expected, 1)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_format_next_to_non_ascii_and_surrogates(name: str) -> None:
    value, secret = sample(BY_NAME[name])
    text = f"naïve Grüße 😀 \ud800 {value}\n\udfff ünïcode"
    cleaned, count = SCRUBBER.scrub(text)
    assert cleaned == text.replace(secret, REDACTED)
    assert count == 1


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_prefilter_finds_every_match_on_its_line(name: str) -> None:
    fmt = BY_NAME[name]
    value, _ = sample(fmt, 2)
    match = re.search(fmt.regex(), f"x {value} y")
    assert match is not None
    assert re.search(fmt.prefilter(), f"x {value} y"[: match.end()]) is not None


NEGATIVES = sorted(fmt.name for fmt in FORMATS if fmt.negative)


@pytest.mark.parametrize("name", NEGATIVES)
def test_look_alike_stays(name: str) -> None:
    text = f"see {BY_NAME[name].negative} there"
    assert SCRUBBER.scrub(text) == (text, 0)


@pytest.mark.parametrize(
    "text",
    [
        "sk-learn and task-list-desk-lamp",
        "npm_config_cache=/home/dev/.npm",
        "SK" + "0" * 31 + " is too short for a Twilio key",
        "pk_live_" + "a1B2c3D4" * 3,  # Stripe publishable: public
        "AC" + "0123456789abcdef" * 2,  # Twilio account SID: public
        "key-value store, key-" + "0" * 20,
        "access-token-refresh-flow",
        "live_reload=true live_preview=false live_stream_settings_for_the_production_cluster",
        "pat.rb and pat.md and pattern.py",
        "secret_sauce = compute()",
        "The quick brown fox: dt0c01 docs",
        "API-VERSION-2026-11-25",
        "postgres://localhost:5432/app and redis://cache:6379/0",
        "hooks.slack.com/services is the webhook host",
    ],
)
def test_ordinary_text_near_formats_stays(text: str) -> None:
    assert SCRUBBER.scrub(text) == (text, 0)


def test_overlapping_formats_become_one_redaction() -> None:
    jwt = sample(BY_NAME["jwt"])[0]
    text = f"postgres://app:{jwt}@db/x"
    assert SCRUBBER.scrub(text) == (f"postgres://app:{REDACTED}@db/x", 1)


def test_the_format_table_document_is_current() -> None:
    """formats.md is what `python -m stockade.supervisor.policy.scrub.formats` prints."""
    document = Path(scrub_formats.__file__).with_name("formats.md")
    assert document.read_text() == scrub_formats.table()


DOPPLER_BODY = "".join(random.Random("doppler").choices("ABCdef0123456789xyzQRS", k=43))


@pytest.mark.parametrize(
    "token",
    [
        f"dp.pt.{DOPPLER_BODY}",  # personal
        f"dp.ct.{DOPPLER_BODY}",  # CLI
        f"dp.st.{DOPPLER_BODY}",  # service, without its config
        f"dp.st.prd.{DOPPLER_BODY}",  # service, naming its config (Doppler's own example)
        f"dp.st.dev_personal.{DOPPLER_BODY}",
        f"dp.st.stg-eu-2.{DOPPLER_BODY}",
        f"dp.sa.{DOPPLER_BODY}",  # service account
        f"dp.scim.{DOPPLER_BODY}",
        f"dp.audit.{DOPPLER_BODY}",
    ],
)
def test_every_documented_doppler_token_shape_is_redacted_whole(token: str) -> None:
    assert SCRUBBER.scrub(f"rotate {token} today\n") == (f"rotate {REDACTED} today\n", 1)


def test_a_doppler_like_config_name_without_a_token_stays() -> None:
    text = "doppler setup --project app --config dp.st.prd.short\n"
    assert SCRUBBER.scrub(text) == (text, 0)
