"""Writing a snapshot into a fresh folder, by descriptors: every folder made with mkdir and
opened with O_NOFOLLOW|O_DIRECTORY relative to its parent, every file created with
O_CREAT|O_EXCL|O_NOFOLLOW, so nothing already there (the target must be empty) nor anything
the snapshot holds (links are made as links, never followed) can steer a write elsewhere.
File contents are copied from the store (FICLONE, else copy_file_range): never hard-linked.
A file's or folder's user.e2b.* attributes (E2B's file metadata) are set on its descriptor;
a target file system that keeps none leaves them out.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from stockade.supervisor.errors import InvalidRequest
from stockade.supervisor.sandboxes.snapshots.capture import DIR_FLAGS, XATTR_PREFIX, Entry

_FICLONE: Final = 0x40049409
_NEW_FILE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class TargetNotEmpty(InvalidRequest):
    pass


def restore(
    target: Path | Callable[[], int],
    root: tuple[int, int],
    entries: list[Entry],
    objects: Path,
    ids: tuple[int, int],
) -> None:
    """Fill the empty folder `target` (made if missing) with `entries`, owned by `ids`. A
    target given as an opener (a descriptor of an existing folder, e.g. a container's /tmp)
    keeps its owner and mode."""
    if isinstance(target, Path):
        with contextlib.suppress(FileExistsError):
            os.mkdir(target, 0o700)
        root_fd = os.open(target, DIR_FLAGS)
    else:
        root_fd = target()
        root = (-1, root[1])
    # folders still open: (fd, mode, mtime_ns), finished (mode, mtime) when left
    stack: list[tuple[int, int, int]] = [(root_fd, *root)]
    try:
        if os.listdir(root_fd):
            raise TargetNotEmpty(f"{target} is not empty: a snapshot is restored into a new folder")
        if root[0] >= 0:
            os.fchown(root_fd, *ids)
        for entry in entries:
            if (
                not 1 <= entry.depth <= len(stack)
                or entry.name in ("", ".", "..")
                or ("/" in entry.name or "\0" in entry.name)
            ):
                raise ValueError(f"snapshot entry {entry.name!r}: damaged manifest")
            while len(stack) > entry.depth:
                _finish(*stack.pop())
            fd = stack[-1][0]
            if entry.kind == "d":
                os.mkdir(entry.name, 0o700, dir_fd=fd)
                child = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
                os.fchown(child, *ids)
                _set_xattrs(child, entry)
                stack.append((child, entry.mode, entry.mtime_ns))
            elif entry.kind == "l":
                os.symlink(entry.target, entry.name, dir_fd=fd)
                os.chown(entry.name, *ids, dir_fd=fd, follow_symlinks=False)
                times = (entry.mtime_ns, entry.mtime_ns)
                os.utime(entry.name, ns=times, dir_fd=fd, follow_symlinks=False)
            else:
                _file(fd, entry, objects, ids)
        while stack:
            _finish(*stack.pop())
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _finish(fd: int, mode: int, mtime_ns: int) -> None:
    try:
        if mode >= 0:
            os.fchmod(fd, mode)
        os.utime(fd, ns=(mtime_ns, mtime_ns))
    finally:
        os.close(fd)


def _file(dir_fd: int, entry: Entry, objects: Path, ids: tuple[int, int]) -> None:
    src = os.open(objects / entry.digest[:2] / entry.digest, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst = os.open(entry.name, _NEW_FILE, 0o600, dir_fd=dir_fd)
        try:
            _copy(src, dst, entry.size)
            os.fchown(dst, *ids)
            _set_xattrs(dst, entry)
            os.fchmod(dst, entry.mode)
            os.utime(dst, ns=(entry.mtime_ns, entry.mtime_ns))
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _set_xattrs(fd: int, entry: Entry) -> None:
    for name, value in entry.xattrs:
        if not name.startswith(XATTR_PREFIX):
            raise ValueError(f"snapshot entry {entry.name!r}: damaged manifest")
        try:
            os.setxattr(fd, name, value.encode("utf-8", "surrogateescape"))
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
            return


def _copy(src: int, dst: int, size: int) -> None:
    if size == 0:
        return
    try:
        fcntl.ioctl(dst, _FICLONE, src)
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY):
            raise
    done = 0
    cross = False  # copy_file_range refuses two file systems (EXDEV): sendfile does not
    while done < size:
        if cross:
            n = os.sendfile(dst, src, done, size - done)
        else:
            try:
                n = os.copy_file_range(src, dst, size - done, done, done)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                cross = True
                continue
        if n == 0:
            raise OSError(errno.EIO, "a stored snapshot file is shorter than its record")
        done += n
