"""The guard's verdict cache (policy/guard/checker.py): a remembered verdict is the one a
fresh check gives, for the same command in every other folder, environment and shell too;
the cache is bounded; long commands and unparsed verdicts are never remembered."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from stockade.supervisor.policy.guard import Guard
from stockade.supervisor.policy.guard.checker import CACHE_ENTRIES, CACHE_MAX_CHARS

CASES = [
    # (command, keyword arguments): each pair differs from its neighbour in one input only
    ("rm -rf *", {"workdir": "sub"}),
    ("rm -rf *", {"workdir": "."}),
    ("rm -rf build", {"workdir": None}),
    ("rm -rf build", {}),
    ("rm -rf ~/x", {"env": {"HOME": "/"}}),
    ("rm -rf ~/x", {}),
    ("cd sub && rm -rf *", {"env": {"CDPATH": "/"}}),
    ("cd sub && rm -rf *", {}),
    ("echo $((", {"shell": "sh"}),
    ("rm -rf /", {"shell": "sh"}),
]


def test_a_remembered_verdict_is_a_fresh_one_in_every_folder_environment_and_shell() -> None:
    cached, fresh = Guard(), Guard(cache_entries=0)
    for _ in range(3):  # the first round fills the cache, the others read it
        for command, where in CASES:
            assert cached.check(command, **where) == fresh.check(command, **where), (
                command,
                where,
            )
    assert {fresh.check(c, **w).action for c, w in CASES} >= {"allow", "deny"}
    assert fresh.cached == 0


def test_the_cache_is_bounded_and_forgets_the_least_recently_used() -> None:
    guard = Guard()
    guard.check("echo first")
    for i in range(CACHE_ENTRIES + 100):
        guard.check(f"echo {i}")
        if i % 1000 == 0:
            guard.check("echo first")  # kept in use: stays
    assert guard.cached == CACHE_ENTRIES
    assert guard.check("echo first").action == "allow"


def test_a_long_command_is_never_remembered() -> None:
    guard = Guard()
    command = "echo " + "a" * CACHE_MAX_CHARS
    assert guard.check(command).action == "allow"
    assert guard.check("rm -rf / ; " + command).action == "deny"
    assert guard.cached == 0


@pytest.mark.parametrize("command", ["echo $((", "if then fi", "a" * 10 + "|" * 500])
def test_an_unparsed_verdict_is_redone_every_time(command: str) -> None:
    guard = Guard(on_parse_error="ask")
    first = guard.check(command)
    assert first.unparsed
    assert guard.check(command) == first
    assert guard.cached == 0


def test_an_environment_does_not_leak_into_another_call() -> None:
    guard = Guard()
    env = {"HOME": "/"}
    assert guard.check("rm -rf ~/x", env=env).action == "deny"
    env["HOME"] = "/workspace"  # the caller's dict changes: the remembered verdict does not
    assert guard.check("rm -rf ~/x", env=env) == Guard(cache_entries=0).check(
        "rm -rf ~/x", env={"HOME": "/workspace"}
    )


def test_threads_share_one_cache_safely() -> None:
    guard, fresh = Guard(), Guard(cache_entries=0)
    commands = [f"rm -rf {name}" for name in ("/", "build", "*", "~", "../x")] * 200

    with ThreadPoolExecutor(8) as pool:
        verdicts = list(pool.map(guard.check, commands))
    assert verdicts == [fresh.check(c) for c in commands]
    assert guard.cached == 5


@pytest.mark.parametrize("entries", [-1, True, 1.5])
def test_a_bad_cache_size_fails_at_construction(entries: object) -> None:
    from stockade.supervisor.policy.guard import GuardConfigError

    with pytest.raises(GuardConfigError):
        Guard(cache_entries=entries)  # type: ignore[arg-type]  # a wrong type on purpose
