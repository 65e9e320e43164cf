"""Small kernel files (/proc, /sys/fs/cgroup) read and written with bare system calls.

The agent reads and writes a few of them around every command; Python's buffered text files
take about three times as long for each (fstat, ioctl, lseek and the wrapper objects), and
opening a cgroup file again each time costs as much as reading it."""

from __future__ import annotations

import errno
import os
from typing import Final

MAX_BYTES: Final = 64 * 1024


def write(path: str, text: str) -> None:
    """Write `text` to an existing file; OSError when it cannot be written."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class Kept:
    """A kernel file read after every command (a cgroup counter): opened once, then re-read
    with pread at offset 0, which makes the kernel render it afresh. A file missing at first
    stays missing (a container's cgroup files do not come and go)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._missing = False

    def read(self) -> str:
        """The file's current text (at most MAX_BYTES); OSError when it cannot be read."""
        if self._missing:
            raise FileNotFoundError(errno.ENOENT, "no such file", self.path)
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                self._missing = True
                raise
        return os.pread(self._fd, MAX_BYTES, 0).decode(errors="replace")
