"""Healing: telling a sandbox that can no longer do its job from one that merely failed a call.

A sandbox is wedged when its container runs but cannot serve calls any more, and would stay
so: its agent does not answer, its init (PID 1, tini) is stopped and reaps no orphan (zombies
then fill the pids limit), every pid is taken by processes the agent cannot end, or the
agent's own resource limits were lowered from outside. The sandbox manager marks such a
sandbox and the next call re-creates its container with the workspace kept (a heal).

The facts come from the agent's Inspect (raw file reads, parsed here, trusted no further than
the sandbox they describe: a lying agent can only get its own sandbox re-created); a frozen
agent reports nothing, and then the supervisor decides from its silence while the engine says
the container runs. Pure functions only: no gRPC, no engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final

INIT_STAT: Final = "/proc/1/stat"
AGENT_LIMITS: Final = "/proc/self/limits"
"""Read by the agent itself (Inspect runs in its process): its own limits."""
PIDS_FILES: Final = (
    ("/sys/fs/cgroup/pids.current", "/sys/fs/cgroup/pids.max"),
    ("/sys/fs/cgroup/pids/pids.current", "/sys/fs/cgroup/pids/pids.max"),
)
FACT_FILES: Final = (INIT_STAT, AGENT_LIMITS, *(f for pair in PIDS_FILES for f in pair))
"""What the supervisor asks the agent to read for a health check."""

SPAWN_FAILED: Final = "could not start the command"
"""How the agent's exec and process tools begin the message of a command that never started
(after sweeping strays once): such a call is safe to run again on a fresh container."""
CHECKED_CODES: Final = frozenset({"EXECUTION_FAILED"})
"""Failed replies after which the supervisor reads the facts (the agent's INTERNAL errors,
e.g. a MemoryError under a lowered address-space limit, arrive as EXECUTION_FAILED too)."""
CROWDED: Final = "pids_crowded"
"""Set in an exec result when more than half the pids limit is still in use after the agent's
stray sweep: the supervisor then reads the facts (a stopped init shows first this way)."""
PIDS_FULL: Final = 0.9
"""After a command could not start: this share of the pids limit in use means the pids are
held by what the agent could not end (its stray sweep has just run)."""
OUT_OF_FILES: Final = frozenset({"EMFILE", "ENFILE"})
RUNNING_STATES: Final = frozenset({"R", "S", "D", "I"})
"""Process states of an init that still works (running, sleeping, in I/O, idle)."""

INIT_STOPPED: Final = "init_stopped"
PIDS_EXHAUSTED: Final = "pids_exhausted"
AGENT_LIMITED: Final = "agent_limits_lowered"
AGENT_UNRESPONSIVE: Final = "agent_unresponsive"
AGENT_MISBEHAVED: Final = "agent_misbehaved"
CONTAINER_EXITED: Final = "container_exited"
KINDS: Final = (
    INIT_STOPPED, PIDS_EXHAUSTED, AGENT_LIMITED, AGENT_UNRESPONSIVE, AGENT_MISBEHAVED,
    CONTAINER_EXITED,
)  # fmt: skip
"""Why a sandbox was re-created: the label values of the heal counter."""


@dataclass(frozen=True)
class Trouble:
    """Why a sandbox cannot serve calls: `kind` one of KINDS, `detail` for people."""

    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


@dataclass(frozen=True)
class Heal:
    """The last time a sandbox's container was re-created because it could not serve."""

    trouble: Trouble
    at: datetime
    count: int
    """Heals of this key since the supervisor started."""


@dataclass(frozen=True)
class Expected:
    """The agent's soft limits as the container was made with them (None: unlimited)."""

    nofile: int
    nproc: int
    fsize: int | None

    def table(self) -> dict[str, int | None]:
        """/proc/PID/limits row name -> the lowest soft value that is not a lowering."""
        return {
            "Max open files": self.nofile,
            "Max processes": self.nproc,
            "Max file size": self.fsize,
            "Max address space": None,
            "Max data size": None,
            "Max cpu time": None,
        }


def spawn_failed(code: str, message: str) -> bool:
    """Whether a failed reply says the command never started."""
    return code == "EXECUTION_FAILED" and message.startswith(SPAWN_FAILED)


def diagnose(
    facts: Mapping[str, bytes | str], expected: Expected | None, *, after_sweep: bool
) -> Trouble | None:
    """The trouble the facts show, or None. `after_sweep`: the agent has just swept strays
    (a command could not start, or the pids limit stayed crowded after one ended); only then
    is a nearly full pids cgroup a wedge: what holds the pids is nothing the agent can end.
    `expected` None: the sandbox's limits are not the supervisor's to set (a pod's are its
    node runtime's), so no soft limit below some value proves a lowering."""
    return (
        _init_trouble(facts.get(INIT_STAT))
        or _descriptors_trouble(facts)
        or (_limits_trouble(facts.get(AGENT_LIMITS), expected) if expected else None)
        or (_pids_trouble(facts) if after_sweep else None)
    )


def _init_trouble(stat: bytes | str | None) -> Trouble | None:
    if not isinstance(stat, bytes) or b")" not in stat:
        return None  # unreadable: no proof either way
    fields = stat.rsplit(b")", 1)[1].split()
    state = fields[0].decode(errors="replace") if fields else "?"
    if state in RUNNING_STATES:
        return None
    return Trouble(
        INIT_STOPPED,
        f"the container's init (PID 1) is in state {state!r}, not running: orphans are no "
        "longer reaped and their zombies fill the pids limit",
    )


def _descriptors_trouble(facts: Mapping[str, bytes | str]) -> Trouble | None:
    """The agent could not open the files it was asked for: out of descriptors (its limit
    lowered under the count it holds: the limits file itself then cannot be read)."""
    if any(facts.get(path) in OUT_OF_FILES for path in FACT_FILES):
        return Trouble(
            AGENT_LIMITED,
            "the agent cannot open a file (out of file descriptors: its limit was lowered)",
        )
    return None


def _limits_trouble(text: bytes | str | None, expected: Expected) -> Trouble | None:
    if not isinstance(text, bytes):
        return None
    found = _soft_limits(text.decode(errors="replace"))
    for name, floor in expected.table().items():
        soft = found.get(name, "unlimited")
        if soft == "unlimited" or not soft.isdigit():
            continue
        if floor is None or int(soft) < floor:
            wanted = "unlimited" if floor is None else str(floor)
            return Trouble(
                AGENT_LIMITED,
                f"the agent's {name.lower()} limit was lowered to {soft} (made with {wanted}) "
                "by a process in the sandbox",
            )
    return None


def _soft_limits(text: str) -> dict[str, str]:
    """/proc/PID/limits: a header, then `Name (may hold spaces)  soft  hard  [units]` rows,
    the name cut from the values by two or more spaces."""
    found = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition("  ")
        values = rest.split()
        if name.strip() and values:
            found[name.strip()] = values[0]
    return found


def _pids_trouble(facts: Mapping[str, bytes | str]) -> Trouble | None:
    for current_file, max_file in PIDS_FILES:
        current, cap = facts.get(current_file), facts.get(max_file)
        if not (isinstance(current, bytes) and isinstance(cap, bytes)):
            continue
        used, limit = current.strip(), cap.strip()
        if used.isdigit() and limit.isdigit() and int(used) >= PIDS_FULL * int(limit):
            return Trouble(
                PIDS_EXHAUSTED,
                f"{int(used)} of {int(limit)} pids are held by processes the agent cannot "
                "end (zombies, or processes of another user), and no command can start",
            )
    return None
