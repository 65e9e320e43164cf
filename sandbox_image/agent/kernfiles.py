"""Small kernel files (/proc, /sys/fs/cgroup) read and written with bare system calls.

The agent reads and writes a few of them around every command; Python's buffered text files
take about three times as long for each (fstat, ioctl, lseek and the wrapper objects)."""

from __future__ import annotations

import os
from typing import Final

MAX_BYTES: Final = 64 * 1024


def read(path: str) -> str:
    """The file's text (at most MAX_BYTES); OSError when it cannot be read."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, MAX_BYTES).decode(errors="replace")
    finally:
        os.close(fd)


def write(path: str, text: str) -> None:
    """Write `text` to an existing file; OSError when it cannot be written."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
