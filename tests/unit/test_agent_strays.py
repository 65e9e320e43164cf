"""Which processes a sweep spares (strays._owned), on process tables made up here: the sweep
itself only runs in a sandbox (tests/security/test_resource_abuse.py floods real ones)."""

from __future__ import annotations

import pytest

from stockade.agent import strays
from stockade.agent.strays import _Stat

AGENT, AGENT_GROUP = 10, 10
TABLE = {
    1: _Stat(ppid=0, group=1, session=1, zombie=False),  # tini
    10: _Stat(ppid=1, group=10, session=1, zombie=False),  # the agent
    20: _Stat(ppid=10, group=20, session=1, zombie=False),  # a live exec call's shell
    21: _Stat(ppid=20, group=20, session=1, zombie=False),  # its child
    22: _Stat(ppid=20, group=22, session=1, zombie=False),  # its job-control child
    23: _Stat(ppid=22, group=22, session=1, zombie=False),  # and that one's child
    30: _Stat(ppid=1, group=20, session=1, zombie=False),  # left behind in a live group
    40: _Stat(ppid=10, group=40, session=40, zombie=False),  # a background process (session)
    41: _Stat(ppid=1, group=42, session=40, zombie=False),  # reparented, in its live session
    50: _Stat(ppid=10, group=10, session=1, zombie=False),  # the agent's helper (ripgrep)
    51: _Stat(ppid=50, group=10, session=1, zombie=False),  # a helper's child (gzip of tar)
    60: _Stat(ppid=1, group=60, session=60, zombie=False),  # a setsid daemon
    70: _Stat(ppid=1, group=70, session=1, zombie=False),  # a finished call's job-control child
    80: _Stat(ppid=1, group=AGENT_GROUP, session=1, zombie=False),  # joined the agent's group
    81: _Stat(ppid=80, group=AGENT_GROUP, session=1, zombie=False),  # and forked
    90: _Stat(ppid=91, group=90, session=1, zombie=False),  # a made-up parent loop
    91: _Stat(ppid=90, group=90, session=1, zombie=False),
}
LIVE = {20, 40}


OWNED = {20, 21, 22, 23, 30, 40, 41, 50, 51}


@pytest.mark.parametrize("pid", sorted(set(TABLE) - {1, AGENT}))
def test_a_sweep_spares_exactly_what_live_commands_and_the_agent_own(pid: int) -> None:
    assert strays._owned(pid, TABLE, LIVE, AGENT) is (pid in OWNED)


def test_a_finished_call_owns_nothing_any_more() -> None:
    assert not strays._owned(30, TABLE, {40}, AGENT)
    assert strays._owned(21, TABLE, set(), AGENT), "a descendant of the agent all the same"
