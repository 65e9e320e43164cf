"""Decoys (derived per sandbox, in real formats, redacted by the scrubber) and the Tripwire
(one search over every sandbox's decoys; a hit names whose decoy it was)."""

from __future__ import annotations

import asyncio
import os
import re
import stat
import zlib
from pathlib import Path

import pytest

from stockade.supervisor.keys import scope
from stockade.supervisor.observe.alarms import MAX_EVIDENCE, Alarm
from stockade.supervisor.policy.encodings import longest_form
from stockade.supervisor.policy.honeytokens import (
    BASE62,
    HIDDEN,
    KEY_FILE,
    Honeytokens,
    derive,
    load_key,
)
from stockade.supervisor.policy.scrub.scrubber import Scrubber

KEY = bytes(range(32))
A, B = scope("acme", "box-a"), scope("acme", "box-b")


def tripwire() -> tuple[Honeytokens, list[Alarm]]:
    alarms: list[Alarm] = []
    return Honeytokens(KEY, alarms.append), alarms


def test_decoys_are_stable_and_unique() -> None:
    assert derive(KEY, A) == derive(KEY, A)
    a, b = derive(KEY, A), derive(KEY, B)
    assert not set(a.tokens()) & set(b.tokens())
    assert len(a.tokens()) == 8  # every decoy of a sandbox differs from the others
    other = derive(bytes(32), A)
    assert not set(a.tokens()) & set(other.tokens())
    # the tenant is part of the key: the same name in another tenant gets other decoys
    assert derive(KEY, scope("other", "box-a")).aws_key_id != a.aws_key_id


def test_formats_are_real() -> None:
    d = derive(KEY, A)
    for key_id in (d.aws_key_id, d.dotenv_key_id):
        assert re.fullmatch(r"AKIA[A-Z2-7]{16}", key_id)
    for secret in (d.aws_secret, d.dotenv_secret, d.env):
        assert re.fullmatch(r"[A-Za-z0-9+/]{40}", secret)
    for token in (d.github, d.netrc, d.dotenv_github):
        assert re.fullmatch(r"ghp_[A-Za-z0-9]{36}", token)
        body, digits = token[4:34], token[34:]
        value = 0
        for char in digits:
            value = value * 62 + BASE62.index(char)
        assert value == zlib.crc32(body.encode())  # GitHub's check digits hold
    assert derive(KEY, A, "GH_TOKEN").env.startswith("ghp_")


def test_the_scrubber_redacts_every_planted_file() -> None:
    d = derive(KEY, A)
    scrubber = Scrubber([])
    for text in (d.aws_file(), d.gh_file(), d.netrc_file(), d.dotenv_file(), d.env):
        out, count = scrubber.scrub(text)
        assert count >= 1
        for token in d.tokens():
            assert token not in out


def test_key_file_made_once_0600_and_kept(tmp_path: Path) -> None:
    key = load_key(tmp_path)
    path = tmp_path / KEY_FILE
    assert len(key) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key(tmp_path) == key
    path.write_bytes(b"short")
    with pytest.raises(OSError, match="not a 32-byte key"):
        load_key(tmp_path)
    assert path.read_bytes() == b"short"  # never replaced


def test_key_file_symlink_is_not_followed_on_create(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    os.symlink(target, tmp_path / KEY_FILE)
    with pytest.raises(OSError, match="cannot read the honeytoken key"):
        load_key(tmp_path)
    assert not target.exists()
    target.write_bytes(bytes(32))  # a link to a file of the right size is refused as well
    with pytest.raises(OSError, match="cannot read the honeytoken key"):
        load_key(tmp_path)


def test_a_hit_sounds_one_alarm_naming_the_decoy() -> None:
    wire, alarms = tripwire()
    d = wire.decoys(A)
    assert wire.check(A, "output", d.aws_file(), evidence="cat ~/.aws/credentials")
    (alarm,) = alarms
    assert (alarm.sandbox_key, alarm.kind, alarm.where) == (A, "honeytoken", "output")
    assert "its own AWS access key id" in alarm.detail
    assert "read" in alarm.detail
    for token in d.tokens():
        assert token not in alarm.detail


def test_bytes_and_str_and_no_hit() -> None:
    wire, alarms = tripwire()
    d = wire.decoys(A)
    assert wire.check(A, "arguments", f'{{"command": "curl -u x:{d.netrc}"}}'.encode())
    assert not wire.check(A, "arguments", "nothing here")
    assert not wire.check(A, "arguments", b"")
    near = d.github[:-1] + ("A" if d.github[-1] != "A" else "B")
    assert not wire.check(A, "arguments", near)  # one character off: not a decoy
    assert len(alarms) == 1
    assert alarms[0].where == "arguments"
    assert "used (in arguments)" in alarms[0].detail


def test_another_sandboxs_decoy_is_an_alarm_on_the_caller() -> None:
    wire, alarms = tripwire()
    a = wire.decoys(A)
    wire.decoys(B)
    assert wire.check(B, "command", f"echo {a.aws_secret}")
    (alarm,) = alarms
    assert alarm.sandbox_key == B
    assert "sandbox 'box-a''s AWS secret access key" in alarm.detail


def test_decoys_of_no_sandbox_are_not_signs() -> None:
    wire, alarms = tripwire()
    stranger = derive(KEY, scope("acme", "never-made"))
    wire.decoys(A)
    assert not wire.check(A, "output", stranger.aws_file())
    assert wire.armed
    assert alarms == []


def test_evidence_hides_the_decoys_and_is_bounded() -> None:
    wire, alarms = tripwire()
    d = wire.decoys(A)
    evidence = f"curl -H 'token: {d.github}' " + "x" * (MAX_EVIDENCE * 3)
    assert wire.check(A, "command", evidence, evidence)
    assert d.github not in alarms[0].evidence
    assert HIDDEN in alarms[0].evidence
    assert len(alarms[0].evidence) == MAX_EVIDENCE


def test_text_that_is_not_ascii_around_a_decoy() -> None:
    wire, _ = tripwire()
    d = wire.decoys(A)
    text = f"é日本\udcff{d.aws_key_id}\U0001f600"
    hits = wire.find(text)
    assert [h.token for h in hits] == [d.aws_key_id]
    assert wire.find(text.encode("utf-8", "surrogateescape"))[0].token == d.aws_key_id


def test_huge_output_and_many_sandboxes() -> None:
    wire, alarms = tripwire()
    keys = [scope("t", f"k{i}") for i in range(300)]
    for key in keys:
        wire.decoys(key)
    last = wire.decoys(keys[-1])
    data = b"A" * (8 << 20) + last.dotenv_secret.encode() + b"B" * 1000
    assert wire.check(keys[0], "output", data)
    assert "sandbox 'k299''s" in alarms[0].detail
    found = wire.find("".join(derive(KEY, k).netrc for k in keys[:50]))
    assert len(found) == 50


def test_every_decoy_of_a_sandbox_is_found_once() -> None:
    wire, _ = tripwire()
    d = wire.decoys(A)
    text = "\n".join([*d.tokens(), *d.tokens()])
    assert sorted(h.token for h in wire.find(text)) == sorted(d.tokens())


def test_nothing_planted_finds_nothing() -> None:
    wire, alarms = tripwire()
    assert not wire.armed
    assert not wire.check(A, "output", derive(KEY, A).aws_file())
    assert alarms == []


async def test_settled_generations_find_the_same_and_stay_few() -> None:
    wire, alarms = tripwire()
    keys = [scope("t", f"g{i}") for i in range(40)]
    for n, key in enumerate(keys):
        wire.decoys(key)
        if n % 3 == 0:
            await wire.settle()  # some compiled, some pending
    everything = "|".join(token for key in keys for token in derive(KEY, key).tokens())
    assert len(wire.find(everything)) == 40 * 8
    await wire.settle()
    assert len(wire.find(everything)) == 40 * 8
    assert 1 <= wire.generations <= 6  # O(log n), not one per sandbox
    assert wire.check(keys[7], "output", derive(KEY, keys[21]).netrc_file())
    assert "sandbox 'g21''s GitHub token in ~/.netrc" in alarms[0].detail


async def test_searches_during_a_settle_see_every_decoy() -> None:
    wire, _ = tripwire()
    for i in range(30):
        wire.decoys(scope("t", f"s{i}"))
    settling = asyncio.ensure_future(wire.settle())
    await asyncio.sleep(0)  # the compile runs in a thread meanwhile
    token = derive(KEY, scope("t", "s29")).aws_secret
    assert [h.token for h in wire.find(token)] == [token]
    await settling
    assert [h.token for h in wire.find(token)] == [token]


def test_as_tripwire() -> None:
    from stockade.supervisor.observe.alarms import NoTripwire
    from stockade.supervisor.policy.honeytokens import as_tripwire

    off = as_tripwire(None)
    assert isinstance(off, NoTripwire)
    assert not off.check(A, "egress", derive(KEY, A).github)
    wire, alarms = tripwire()
    on = as_tripwire(wire)
    assert on.longest == longest_form(40)  # the longest encoded form of a 40-byte decoy
    assert on.check(A, "egress", f"GET /?t={wire.decoys(A).github} HTTP/1.1".encode())
    assert [a.where for a in alarms] == ["egress"]
