"""Processes nobody owns, and their sweep when they crowd the sandbox's pids limit.

Every command the agent starts leads a session of its own (an exec call, a background
process); when it ends, its process group is killed. What left the group on purpose (setsid,
a daemon, job control) lives on, reparented to tini: harmless, until such strays fill the pids
cgroup and no command can start any more, which would leave the sandbox stuck for good (a
thousand `setsid sleep 300 &` is enough). So, when more than half of the pids limit is in use
after a command ends, or when a command cannot start, every process outside the agent's own
session and the sessions of live commands is killed. Below that mark daemons are left alone.

Only the agent's entry point turns this on (`enable()`): tests that run the tools on a host
must never kill the host's processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Final

from . import kernfiles

LIVE: Final[set[int]] = set()
"""Session ids (= leader pids) of the commands that run now: exec calls and background
processes. Their members are never swept."""

_PIDS_FILES: Final = tuple(
    (kernfiles.Kept(f"{folder}/pids.current"), kernfiles.Kept(f"{folder}/pids.max"))
    for folder in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")
)
_ROUNDS: Final = 5
_STOP_ROUNDS: Final = 50
"""Rounds of stopping a fork bomb's strays; each stops what the last one's listing missed."""
SWEEP_S: Final = 3.0
"""How long one sweep may go on stopping and killing (a fork bomb that outruns it is left to
the supervisor, which sees the pids still crowded)."""
REAP_WAIT_S: Final = 2.0
_enabled = False


def enable() -> None:
    global _enabled
    _enabled = True


def crowded() -> bool:
    """Whether more than half of the pids cgroup's limit is in use (False when unknown)."""
    for current, limit in _PIDS_FILES:
        try:
            used, cap = current.read().strip(), limit.read().strip()
        except OSError:
            continue
        if used.isdigit() and cap.isdigit():
            return int(used) * 2 > int(cap)
    return False


async def sweep_if_crowded() -> bool:
    """sweep(), in a thread, when the pids limit is crowded; whether it is still crowded
    after: what is left is not the agent's to end (live commands, zombies nobody reaps,
    another user's processes), and a command's result then says so, for the supervisor to
    look at the sandbox's health. The check itself reads two small cgroup files and stays on
    the event loop: it runs after every command, the sweep only when needed."""
    if not (_enabled and crowded()):
        return False
    await asyncio.to_thread(sweep)
    return crowded()


def sweep() -> int:
    """Stop, then SIGKILL, every process outside the agent's session and the live sessions
    (not tini); how many signals were sent. A stray fork bomb outruns killing in rounds (each
    round's listing misses the children born meanwhile): stopped, a process forks no more, so
    strays are stopped in rounds until a round finds none left running, then killed. What a
    round's listing missed and was born meanwhile is caught by the next pass, until a pass
    finds nothing left to end or SWEEP_S has gone by."""
    if not _enabled:
        return 0
    keep = {os.getsid(0), *LIVE}
    killed: set[int] = set()
    sent = 0
    deadline = time.monotonic() + SWEEP_S
    while True:
        for _ in range(_STOP_ROUNDS):
            stopped = _signal_strays(keep, signal.SIGSTOP, skip=(b"T", b"t"))
            sent += len(stopped)
            if not stopped or time.monotonic() > deadline:
                break
        fresh = False
        for _ in range(_ROUNDS):
            round_killed = _signal_strays(keep, signal.SIGKILL)
            sent += len(round_killed)
            fresh |= not round_killed <= killed
            killed |= round_killed
            if not round_killed:
                break
        if not fresh or time.monotonic() > deadline:
            break
    _wait_reaped(keep)
    return sent


def _wait_reaped(keep: set[int]) -> None:
    """Until tini has reaped what was killed (a killed process holds its pid until then), at
    most REAP_WAIT_S: the next command finds the pids free."""
    deadline = time.monotonic() + REAP_WAIT_S
    while time.monotonic() < deadline and any(
        state == b"Z" or _may_signal(pid) for pid, state in _strays(keep)
    ):
        time.sleep(0.01)


def _may_signal(pid: int) -> bool:
    """Whether `pid` lives and is the sandbox user's (another user's, a sweep cannot end)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _signal_strays(keep: set[int], number: int, skip: tuple[bytes, ...] = ()) -> set[int]:
    """Send `number` to every stray but zombies and those in a state of `skip`; the pids it
    was sent to."""
    sent: set[int] = set()
    for pid, state in _strays(keep):
        if state in (b"Z", b"X", *skip):
            continue
        try:
            os.kill(pid, number)
        except OSError:  # gone meanwhile, or not the sandbox user's
            continue
        sent.add(pid)
    return sent


def _strays(keep: set[int]) -> Iterator[tuple[int, bytes]]:
    """(pid, state) of every process outside the sessions in `keep`, zombies too; not tini,
    not the agent."""
    me = os.getpid()
    with os.scandir("/proc") as entries:
        pids = [int(entry.name) for entry in entries if entry.name.isdigit()]
    for pid in pids:
        if pid in (1, me):
            continue
        try:
            if os.getsid(pid) in keep:
                continue
        except OSError:  # gone meanwhile
            continue
        yield pid, _state(pid)


def _state(pid: int) -> bytes:
    """The process's state letter; b"X" (dead) when it cannot be read."""
    with contextlib.suppress(OSError, IndexError), open(f"/proc/{pid}/stat", "rb") as file:
        return bytes(file.read().rsplit(b")", 1)[1].split()[0])
    return b"X"
