"""The agent's identity: its own user, with the sandbox user's ids as effective ones.

The container starts tini and the agent as stockade-agent, with CAP_SETUID, CAP_SETGID and
CAP_SETPCAP passed on as ambient capabilities (the image's entry point). `take()` uses them
once:

- real and saved ids stay stockade-agent's, the effective ones become the sandbox user's.
  Files the agent writes belong to the sandbox user (the file system uses effective ids),
  while the kernel lets a process signal or trace another only when the sender's real or
  effective uid is the target's real or saved one, or (to trace) all three match: the
  sandbox user, whose processes have it as every id, can do neither to the agent, nor to
  tini, nor read their memory or environment through /proc.
- every capability is then dropped, from the bounding set too, so no command can get one
  back; the agent needs none afterwards. A command still gets the sandbox user as all three
  ids through stockade-drop (spawn.py), since setresuid needs no privilege to set ids to the
  effective one.

Under gVisor, which has no ambient capabilities, the agent starts as root (gVisor's) with
those three capabilities. gVisor also resets a program's effective ids to its real ones on
exec (under no_new_privs), so stockade-drop would start as the agent's user: there the agent
becomes the sandbox user altogether (`--agent-user` = `--user`). tini stays gVisor's root,
out of reach; the agent then is not out of reach of signals (it stays non-dumpable).
Started any other way (as the sandbox user itself, on a host in tests), the agent runs as
it was started and commands start directly.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path
from typing import Final

from . import spawn

PR_SET_DUMPABLE: Final = 4
PR_CAPBSET_DROP: Final = 24
PR_CAP_AMBIENT: Final = 47
PR_CAP_AMBIENT_CLEAR_ALL: Final = 4
_LINUX_CAPABILITY_VERSION_3: Final = 0x20080522
CAP_SETGID, CAP_SETUID, CAP_SETPCAP = 6, 7, 8
AGENT_UID: Final = 65533
"""The image's stockade-agent (uid and gid), which setpriv makes tini and the agent."""


class _Header(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _Data(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def parse(user: str) -> tuple[int, int]:
    """'UID:GID' (or 'UID') -> (uid, gid); ValueError naming the value otherwise."""
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or not (gid or uid).isdigit():
        raise ValueError(f"--user must be UID:GID in digits, not {user!r}")
    return int(uid), int(gid or uid)


def take(uid: int, gid: int, agent: tuple[int, int] = (AGENT_UID, AGENT_UID)) -> bool:
    """Become the sandbox user in effective ids only, with the agent's own user (`agent`
    when started as root, else the user it was started as) as real and saved ids; drop every
    capability; make the commands start through stockade-drop. `agent` equal to the sandbox
    user makes the agent that user altogether (gVisor). False (nothing changed) when the
    agent already runs as that user or cannot change ids (started without the
    capabilities)."""
    if os.getuid() == uid:
        _not_dumpable()
        return False
    from_root = os.getuid() == 0  # gVisor: no ambient capabilities, so no setpriv in front
    if from_root:
        own_uid, own_gid = agent
    elif _has_setuid():
        own_uid, own_gid = os.getuid(), os.getgid()
    else:
        _not_dumpable()
        return False
    libc = _libc()
    if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 and not from_root:
        _check(-1, "clear ambient")  # they brought the capabilities: clearing them must work
    os.setgroups([])
    _drop_bounding_set(libc)
    os.setresgid(own_gid, gid, own_gid)
    os.setresuid(own_uid, uid, own_uid)
    header, data = _Header(_LINUX_CAPABILITY_VERSION_3, 0), (_Data * 2)()
    _check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
    _not_dumpable()
    if (own_uid, own_gid) != (uid, gid):
        spawn.start_as(uid, gid)
    return True


def _drop_bounding_set(libc: ctypes.CDLL) -> None:
    """Every capability out of the bounding set, up to the kernel's last (EINVAL past it)."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == errno.EINVAL and cap > CAP_SETPCAP:
                return
            _check(-1, f"drop capability {cap}")


def _has_setuid() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SETUID & 1)
    return False


def _not_dumpable() -> None:
    """Not dumpable: only a process with CAP_SYS_PTRACE may trace the agent or open its
    /proc files of memory, environment and descriptors, whatever its ids. Changing the
    effective uid already does this; started as the sandbox user, this is the only guard
    against ptrace (not against signals). Commands the agent starts are dumpable again
    (execve resets the flag), so their own tools (gdb, strace) still work."""
    _check(_libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE, 0)")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what} failed: {os.strerror(errno)}")
