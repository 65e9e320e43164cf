"""Who owns a container, and the proof that an owner is gone (the orphan reaper's rule).

Every supervisor holds an exclusive flock on STATE/instance.lock while it runs (a second
supervisor on the same state directory is refused). Each container records its creator's
state directory and process: boot id, pid and mount namespace inodes, pid, start time in
clock ticks since boot, and the lock file's device and inode. Another supervisor may remove
it only when all of these hold:

- the labels are there and parse (older supervisors' containers carry no proof: kept);
- same boot and same pid and mount namespaces as the reaper (otherwise the pid, the path and
  the lock mean something else: kept);
- no process with that pid and start time runs (pid reuse is told apart by start time);
- no process holds a lock on that inode (/proc/locks; the lock of the supervisor that adopted
  the container after a restart shows there even when the file was deleted under it);
- the state directory does not hold that instance's id any more (a stopped supervisor whose
  state is intact will start again and adopt its containers: kept).

So a live supervisor's containers are never reaped, even when its state directory was
deleted under it, and a cleanly stopped one's wait for its next start. A false sign of life
(an inode reused by another locked file) only keeps a container longer.
"""

from __future__ import annotations

import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path

from stockade.supervisor.engines.backends.base import LABEL_INSTANCE, LABEL_OWNER, LABEL_STATE_DIR
from stockade.supervisor.errors import ConfigError

LOCK_FILE = "instance.lock"
_LOCK_ID = re.compile(r"^([0-9a-f]+):([0-9a-f]+):(\d+)$")


@dataclass(frozen=True)
class Owner:
    boot_id: str
    pid_ns: int
    mnt_ns: int
    pid: int
    start_ticks: int
    lock_dev: int
    lock_ino: int

    def label(self) -> str:
        fields = (self.pid_ns, self.mnt_ns, self.pid, self.start_ticks, self.lock_dev)
        return "/".join((self.boot_id, *map(str, fields), str(self.lock_ino)))

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        parts = text.split("/")
        if len(parts) != 7 or not parts[0]:
            return None
        try:
            pid_ns, mnt_ns, pid, start, dev, ino = (int(p) for p in parts[1:])
        except ValueError:
            return None
        return cls(parts[0], pid_ns, mnt_ns, pid, start, dev, ino) if pid > 0 else None


class InstanceLock:
    """The flock this supervisor holds on STATE/instance.lock for as long as it runs."""

    def __init__(self, state_dir: Path) -> None:
        path = state_dir / LOCK_FILE
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise ConfigError(
                f"another supervisor is running on the state directory {state_dir}"
            ) from None
        info = os.fstat(self._fd)
        self.dev, self.ino = info.st_dev, info.st_ino

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = -1


def this_process(lock: InstanceLock) -> Owner:
    pid = os.getpid()
    start = start_ticks(pid)
    if start is None:  # our own /proc entry: always there
        raise RuntimeError("cannot read this process's start time")
    return Owner(boot_id(), _ns("pid"), _ns("mnt"), pid, start, lock.dev, lock.ino)


def locked_inodes() -> set[tuple[int, int]]:
    """(st_dev, st_ino) of every file some process holds a lock on (/proc/locks)."""
    found: set[tuple[int, int]] = set()
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        for token in line.split():
            if m := _LOCK_ID.match(token):
                found.add((os.makedev(int(m[1], 16), int(m[2], 16)), int(m[3])))
    return found


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _ns(kind: str) -> int:
    return os.stat(f"/proc/self/ns/{kind}").st_ino


def start_ticks(pid: int) -> int | None:
    """The process's start time (field 22 of /proc/PID/stat); None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the name may hold spaces and parentheses
    return int(fields[19])


def gone_because(labels: dict[str, str], me: Owner, locked: set[tuple[int, int]]) -> str | None:
    """Why the instance that owns a container with these labels has provably ended, or
    None when that cannot be proven (then the container must be left alone). `locked`:
    locked_inodes(), read once per sweep."""
    owner = Owner.parse(labels.get(LABEL_OWNER, ""))
    state_dir = labels.get(LABEL_STATE_DIR, "")
    instance = labels.get(LABEL_INSTANCE, "")
    if owner is None or not state_dir.startswith("/") or not instance:
        return None
    if (owner.boot_id, owner.pid_ns, owner.mnt_ns) != (me.boot_id, me.pid_ns, me.mnt_ns):
        return None
    if start_ticks(owner.pid) == owner.start_ticks:
        return None
    if (owner.lock_dev, owner.lock_ino) in locked:
        return None
    try:
        if (Path(state_dir) / "instance-id").read_text().strip() == instance:
            return None  # stopped, not gone: its next start adopts
    except FileNotFoundError:
        pass
    except OSError:
        return None
    return (
        f"its supervisor (pid {owner.pid}) has ended and its state directory {state_dir} "
        f"no longer holds instance {instance}"
    )
