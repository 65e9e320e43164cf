"""Raw facts for the supervisor's isolation report: file contents, link targets and whether
the root file system takes a write. Nothing is interpreted here; the supervisor parses."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

MAX_ITEMS = 256
MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class Read:
    path: str
    content: bytes
    error: str


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, f"errno {exc.errno}")


def read_file(path: str, limit: int) -> Read:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return Read(path, b"", _errno_name(exc))
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, min(65536, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return Read(path, b"".join(chunks), "")
    except OSError as exc:
        return Read(path, b"", _errno_name(exc))
    finally:
        os.close(fd)


def read_link(path: str) -> Read:
    try:
        return Read(path, os.readlink(path).encode(errors="surrogateescape"), "")
    except OSError as exc:
        return Read(path, b"", _errno_name(exc))


def root_read_only() -> bool:
    return bool(os.statvfs("/").f_flag & os.ST_RDONLY)


def write_probe(path: str) -> str:
    """errno name of creating `path` (a new file), "" when it could be created (then removed)."""
    if not path:
        return ""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        return _errno_name(exc)
    os.close(fd)
    os.unlink(path)
    return ""


def limits(count: int, max_file_bytes: int) -> int:
    """The per-file cap to use; raises ValueError when too many items are asked for."""
    if count > MAX_ITEMS:
        raise ValueError(f"at most {MAX_ITEMS} files and links per request")
    return min(max_file_bytes or MAX_FILE_BYTES, MAX_FILE_BYTES)
