"""A smoke run of bench/front_abuse.py (`make bench`'s "another tenant's warm calls while one
attacks the HTTP fronts") on one engine, with a few calls and one attack, so that the section
cannot break unseen: the real supervisor with its four fronts and two tenants comes up, both
of the quiet tenant's callers are timed alone and under the attack, the attacker's requests
are refused as the front refuses them, and the table prints. No figure is asserted: speed
belongs to the bench."""

from __future__ import annotations

import pytest

from bench.front_abuse import measure_engine, section

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.parametrize("engine", ["podman"], indirect=True),  # a smoke run: one engine
]
ATTACK = "JSON nested 100,000 deep"


def test_the_section_runs_one_attack(engine: str) -> None:
    result = measure_engine(engine, n=3, warmup=1, attacks=[ATTACK])
    assert {side: result["alone"][side]["n"] for side in ("grpc", "e2b")} == {"grpc": 3, "e2b": 3}
    [(name, attacked)] = result["attacks"].items()
    assert name == ATTACK
    assert attacked["grpc"]["n"] == attacked["e2b"]["n"] == 3
    assert isinstance(attacked["e2b"]["met"], bool)
    assert set(attacked["answers"]) == {"400/400"}  # the envd call and the control plane's
    text = section(engine, result)
    assert f"  {ATTACK}" in text
    assert "another tenant's warm calls while one attacks the HTTP fronts" in text
