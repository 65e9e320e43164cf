"""Processes nobody owns, and their sweep when they crowd the sandbox's pids limit.

Every command the agent starts leads a process group of its own (an exec call; a background
process leads a session); when it ends, its group is killed. What left the group on purpose
(setsid, a daemon, job control) lives on, reparented to tini: harmless, until such strays fill
the pids cgroup and no command can start any more, which would leave the sandbox stuck for good
(a thousand `setsid sleep 300 &` is enough). So, when more than half of the pids limit is in use
after a command ends, or when a command cannot start, every process that no live command owns
is killed. Below that mark daemons are left alone.

A process is owned when it descends from the agent (a command's shell and whatever it runs
while it runs, the agent's helpers such as ripgrep), or when it is in the process group or
session of a live command (what the group's leader left behind as it exited). Membership of the
agent's own process group proves nothing: exec commands share the agent's session, so they
could join it.

Only the agent's entry point turns this on (`enable()`): tests that run the tools on a host
must never kill the host's processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from typing import Final

from . import kernfiles

LIVE: Final[set[int]] = set()
"""Leader pids of the commands that run now: the process group of an exec call, the session of
a background process. Their members are never swept."""

_PIDS_FILES: Final = tuple(
    (kernfiles.Kept(f"{folder}/pids.current"), kernfiles.Kept(f"{folder}/pids.max"))
    for folder in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")
)
_ROUNDS: Final = 5
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


async def sweep_if_crowded() -> int:
    """sweep(), in a thread, when the pids limit is crowded; how many processes were killed.
    The check itself reads two small cgroup files and stays on the event loop: it runs after
    every command, the sweep only when needed."""
    if not (_enabled and crowded()):
        return 0
    return await asyncio.to_thread(sweep)


def sweep() -> int:
    """SIGKILL every process no live command owns (not tini, not the agent), in rounds, as
    strays may be forking; how many signals were sent."""
    if not _enabled:
        return 0
    killed = 0
    for _ in range(_ROUNDS):
        round_killed = _sweep_once(set(LIVE))
        killed += round_killed
        if not round_killed:
            break
    return killed


@dataclass(frozen=True)
class _Stat:
    ppid: int
    group: int
    session: int
    zombie: bool


def _sweep_once(live: set[int]) -> int:
    me = os.getpid()
    stats = {pid: stat for pid in _pids() if (stat := _stat(pid)) is not None}
    killed = 0
    for pid, stat in stats.items():
        if pid in (1, me) or stat.zombie or _owned(pid, stats, live, me):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # gone meanwhile
            continue
        killed += 1
    return killed


def _owned(pid: int, stats: dict[int, _Stat], live: set[int], agent: int) -> bool:
    stat = stats[pid]
    if stat.group in live or stat.session in live:
        return True
    for _ in range(len(stats)):  # up the parents; bounded, in case the table is inconsistent
        if stat.ppid == agent:
            return True
        parent = stats.get(stat.ppid)
        if parent is None:
            return False
        stat = parent
    return False


def _pids() -> list[int]:
    with os.scandir("/proc") as entries:
        return [int(entry.name) for entry in entries if entry.name.isdigit()]


def _stat(pid: int) -> _Stat | None:
    """State, parent, process group and session from /proc/PID/stat; None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return None
    # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
    fields = stat[stat.rfind(b")") + 1 :].split()
    if len(fields) < 4:
        return None
    return _Stat(int(fields[1]), int(fields[2]), int(fields[3]), fields[0] in (b"Z", b"X"))
