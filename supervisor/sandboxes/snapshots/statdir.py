"""One folder's entries with their lstat, read in C (statdir.c) without the interpreter's lock:
the stat loop of a capture's walk (capture.py), ~1 µs an entry where Python's os.stat costs
~2 (docs/undo.md, "What it costs").

The library is `_statdir.so` beside this file, built from statdir.c by scripts/setup.sh
(`make statdir`). Where it is missing or does not load (an install without a compiler, the
supervisor image), `available()` is False and the walk stats each entry in Python: the same
entries, only slower.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from pathlib import Path
from typing import Any, Final

log = logging.getLogger("stockade.snapshots")
LIBRARY: Final = Path(__file__).with_name("_statdir.so")
FIRST_CAP: Final = 1 << 16
MAX_CAP: Final = 1 << 28
"""A folder whose records pass this is read in Python (where Limits.max_entries stops it)."""


def _load(path: Path) -> Any:  # a ctypes function, or None
    try:
        lib = ctypes.CDLL(str(path))  # CDLL: the call lets go of the interpreter's lock
    except OSError as exc:
        if path.exists():
            log.warning("%s did not load (%s): captures stat each entry in Python", path, exc)
        return None
    func = lib.stockade_statdir
    func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    func.restype = ctypes.c_long
    return func


_func = _load(LIBRARY)


def available() -> bool:
    return _func is not None


class Reader:
    """statdir for one walk (one thread): its buffer grows to the largest folder's records."""

    def __init__(self) -> None:
        self._buffer = ctypes.create_string_buffer(FIRST_CAP)

    def __call__(self, fd: int, depth: int) -> list[bytes] | None:
        """The records of the folder `fd` (statdir.c's format, sorted by name), or None when
        the C side failed (the caller reads the folder itself, and meets the error there)."""
        func = _func
        if func is None:
            return None
        while True:
            buffer = self._buffer
            got = func(fd, depth, buffer, len(buffer))
            if got >= 0:
                return buffer.raw[:got].split(b"\0")[:-1] if got else []
            if got != -errno.ERANGE or len(buffer) >= MAX_CAP:
                return None
            self._buffer = ctypes.create_string_buffer(len(buffer) * 4)


def parse(record: bytes) -> tuple[str, tuple[int, ...]]:
    """(name, (mode, dev, ino, ctime_ns, size, mtime_ns)) of one record."""
    head, _, name = record.partition(b"/")
    _, mode, dev, ino, ctime, size, mtime = head.split(b" ")
    return os.fsdecode(name), (int(mode), int(dev), int(ino), int(ctime), int(size), int(mtime))


def record(depth: int, info: os.stat_result, name: bytes) -> bytes:
    """The record statdir.c writes for an entry of that lstat (its fallback, and tests')."""
    head = (
        f"{depth} {info.st_mode} {info.st_dev} {info.st_ino} {info.st_ctime_ns} {info.st_size} "
        f"{info.st_mtime_ns}/"
    )
    return head.encode() + name
