"""The printed table of another tenant's latency under attack (bench/front_abuse.py), its
verdicts against 2x and its place among the bench's choices: no engine, no supervisor."""

from __future__ import annotations

from typing import Any

from bench.__main__ import parse_args
from bench.front_abuse import ATTACKS, ratios, section


def timed(grpc_ms: float, e2b_ms: float) -> dict[str, Any]:
    return {"grpc": {"n": 3, "median_ms": grpc_ms}, "e2b": {"n": 3, "median_ms": e2b_ms}}


def test_each_side_is_met_or_not_against_twice_its_idle_median() -> None:
    alone = timed(2.0, 5.0)
    attacked = ratios(alone, {**timed(4.0, 10.5), "answers": {"413": 7}})
    assert (attacked["grpc"]["ratio"], attacked["grpc"]["met"]) == (2.0, True)
    assert (attacked["e2b"]["ratio"], attacked["e2b"]["met"]) == (2.1, False)
    text = section("podman", {"alone": alone, "attacks": {"gzip bomb": attacked}})
    head, _columns, idle, row, *answers = text.splitlines()
    assert head.startswith("== podman: another tenant's warm calls while one attacks")
    assert "target: within 2x" in head
    assert idle.split() == ["idle", "2.00", "5.00"]
    assert row.split()[2:] == ["4.00", "2.00x", "met", "10.50", "2.10x", "NOT", "met"]
    assert answers == ["  what the attacker's requests got:", "    gzip bomb: 413 x7"]


def test_a_failed_measurement_says_why() -> None:
    assert section("docker", {"error": "boom"}).endswith("n/a: boom")


def test_front_abuse_is_a_choice_and_every_attack_has_a_round() -> None:
    assert parse_args(["--only", "front-abuse"]).only == "front-abuse"
    assert len(ATTACKS) == 10
    assert all(callable(a.round) and a.threads >= 1 for a in ATTACKS.values())
