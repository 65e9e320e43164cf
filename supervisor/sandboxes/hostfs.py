"""The supervisor's file operations inside a tree that sandbox code shaped: deleting it, and
handing it to another owner (a sandbox re-created with a user namespace gets new host ids).

`remove_tree` runs as root on the host over a workspace whose links, permissions and depth
the sandbox chose. It never follows a symbolic link (every directory is opened with
O_NOFOLLOW relative to its parent's descriptor, links are unlinked as entries), works at any
depth without recursion and holds two descriptors at a time (shutil.rmtree recurses: a tree
2000 levels deep raised RecursionError, and it keeps a descriptor open per level).
`chown_tree` walks the same way and changes owners with lchown semantics (never through a
link)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Final

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: Path) -> None:
    """Delete `path` and everything below it; a link at `path` itself is unlinked."""
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        os.unlink(path)
        return
    fd = os.open(path, _DIR_FLAGS)
    names: list[str] = []  # the folders descended into, from `path` down
    ids = [_identity(fd)]  # (st_dev, st_ino) of `path` and of each folder in `names`
    pending = [_clear(fd)]  # per level: subfolders still to remove there
    try:
        while pending:
            if pending[-1]:
                name = pending[-1].pop()
                child = _open_child(fd, name)
                if child is None:
                    continue
                os.close(fd)
                fd = child
                names.append(name)
                ids.append(_identity(fd))
                pending.append(_clear(fd))
                continue
            pending.pop()
            ids.pop()
            if not names:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            if _identity(fd) != ids[-1]:
                raise OSError(f"{path}: a folder moved while it was being removed")
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)


def chown_tree(
    path: Path, owner: tuple[int, int], uids: Collection[int], gids: Collection[int]
) -> int:
    """Hand the folder `path` to `owner` (uid, gid), and every entry below it whose uid is in
    `uids` (gid in `gids`) too; other owners stay. Links are changed themselves, never
    followed. Returns how many entries changed (run it while no container uses the tree: it
    visits every entry)."""
    fd = os.open(path, _DIR_FLAGS)
    os.chown(fd, *owner)
    change = _Change(owner, frozenset(uids), frozenset(gids))
    changed = 1
    names: list[str] = []
    ids = [_identity(fd)]
    pending: list[list[str]] = []
    try:
        folders, count = _chown_entries(fd, change)
        pending.append(folders)
        changed += count
        while pending:
            if pending[-1]:
                name = pending[-1].pop()
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:  # gone, or no longer a folder
                    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        continue
                    raise
                os.close(fd)
                fd = child
                names.append(name)
                ids.append(_identity(fd))
                folders, count = _chown_entries(fd, change)
                pending.append(folders)
                changed += count
                continue
            pending.pop()
            ids.pop()
            if not names:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            names.pop()
            if _identity(fd) != ids[-1]:
                raise OSError(f"{path}: a folder moved while its owner was being changed")
    finally:
        os.close(fd)
    return changed


@dataclass(frozen=True)
class _Change:
    owner: tuple[int, int]
    uids: frozenset[int]
    gids: frozenset[int]


def _chown_entries(fd: int, change: _Change) -> tuple[list[str], int]:
    """Change the owners of the folder `fd`'s entries; return its subfolders and the count."""
    folders, changed = [], 0
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            uid = change.owner[0] if info.st_uid in change.uids else -1
            gid = change.owner[1] if info.st_gid in change.gids else -1
            if uid != -1 or gid != -1:
                os.chown(entry.name, uid, gid, dir_fd=fd, follow_symlinks=False)
                changed += 1
            if stat.S_ISDIR(info.st_mode):
                folders.append(entry.name)
    return folders, changed


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _clear(fd: int) -> list[str]:
    """Unlink every entry of the folder `fd` that is not a folder; return the folders."""
    folders = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                folders.append(entry.name)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=fd)
    return folders


def _open_child(fd: int, name: str) -> int | None:
    """The folder `name` in `fd`, opened without following a link; an entry that is no
    longer a folder is unlinked instead (None)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):  # not a folder any more
            raise
    os.unlink(name, dir_fd=fd)
    return None
