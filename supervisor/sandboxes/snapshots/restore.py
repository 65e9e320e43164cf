"""Writing a snapshot into a fresh folder, by descriptors: every folder made with mkdir and
opened with O_NOFOLLOW|O_DIRECTORY relative to its parent, every file created with
O_CREAT|O_EXCL|O_NOFOLLOW, so nothing already there (the target must be empty) nor anything
the snapshot holds (links are made as links, never followed) can steer a write elsewhere.
File contents are copied from the store (FICLONE, else copy_file_range): never hard-linked
to the store. A file's or folder's user.e2b.* attributes (E2B's file metadata) are set on its
descriptor; a target file system that keeps none leaves them out.

A restore into the sandbox the snapshot was taken of (`Reuse`; never a fork: two live
sandboxes must not share an inode) hard-links instead, from the live workspace, each file
the manifest still describes exactly, so that it copies only what changed since:

1. `restore` (the old container still runs): a file whose live twin at the same path has the
   manifest's (device, inode, ctime, size, mtime), the new ids as owner, the snapshot's
   mode and no extended attribute at all (a file with any, E2B's metadata too, is copied and
   its user.e2b.* set from the manifest) is left out (deferred), and every other file copied;
2. `relink` (the old container stopped: nothing can write the live files any more) looks
   at each deferred file again and links it if its key still matches, else copies it;
   then sets the folders' mtimes again.

What makes the match trustworthy: ctime cannot be set back by the sandbox, and a file whose
recorded ctime is within a second of the capture's walk (`Snapshot.walked_ns`) is never
linked: a write in the same tick of the kernel's coarse clock as the capture could leave
ctime, size and mtime unchanged. Any later change to the file (content, mode, owner,
extended attributes, links) moves its ctime past the recorded one, so a key that still
matches after the stop means nothing changed since the capture; the check before the stop
only spares the stop the copies. Each inode is linked once: a hard-linked pair in the
manifest comes back as two files, as a copy would give. A link never crosses file systems:
a size-capped workspace (a file system of its own, new for each restore) copies everything.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from stockade.supervisor.errors import InvalidRequest
from stockade.supervisor.sandboxes import layers
from stockade.supervisor.sandboxes.snapshots.capture import DIR_FLAGS, XATTR_PREFIX, Entry

_FICLONE: Final = 0x40049409
_NEW_FILE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
RACY_NS: Final = 1_000_000_000
"""A file whose ctime is this close to the capture's walk (or after it) is never linked."""
_NOT_LINKABLE: Final = (errno.EXDEV, errno.EMLINK, errno.EPERM, errno.ENOENT, errno.EEXIST)


class TargetNotEmpty(InvalidRequest):
    pass


@dataclass
class Folder:
    """A folder's deferred files (below the root by `path`) and the mtime it gets back."""

    mtime_ns: int
    files: list[Entry] = field(default_factory=list)


@dataclass
class Reuse:
    """The live workspace `source` a restore into its own sandbox links unchanged files from,
    and what it did (module doc)."""

    source: Path
    trusted_before_ns: int = 0
    """Files whose recorded ctime is at or after this are copied (0: every file)."""
    pending: dict[tuple[str, ...], Folder] = field(default_factory=dict)
    claimed: set[tuple[int, int]] = field(default_factory=set)
    """(device, inode) of each live file deferred: each is linked once."""
    linked: int = 0
    copied: int = 0


def restore(
    target: Path | Callable[[], int],
    root: tuple[int, int],
    entries: list[Entry],
    objects: Path,
    ids: tuple[int, int],
    reuse: Reuse | None = None,
    data: layers.DataLayer | None = None,
) -> None:
    """Fill the empty folder `target` (made if missing) with `entries`, owned by `ids`. A
    target given as an opener (a descriptor of an existing folder, e.g. a container's /tmp)
    keeps its owner and mode. With `reuse`, files that may be linked are left for relink.
    With `data` (a layered workspace's data layer, its objects linked: layers.py), `target`
    becomes its metadata layer: each file with content an empty file of its size naming its
    object in `data`; `objects` is then not read."""
    if isinstance(target, Path):
        with contextlib.suppress(FileExistsError):
            os.mkdir(target, 0o700)
        root_fd = os.open(target, DIR_FLAGS)
    else:
        root_fd = target()
        root = (-1, root[1])
    # folders still open: (fd, mode, mtime_ns), finished (mode, mtime) when left
    stack: list[tuple[int, int, int]] = [(root_fd, *root)]
    live = _Live(reuse, ids, root[1]) if reuse is not None else None
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
                if live is not None:
                    live.leave()
            fd = stack[-1][0]
            if entry.kind == "d":
                os.mkdir(entry.name, 0o700, dir_fd=fd)
                child = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
                os.fchown(child, *ids)
                _set_xattrs(child, entry)
                stack.append((child, entry.mode, entry.mtime_ns))
                if live is not None:
                    live.enter(entry)
            elif entry.kind == "l":
                os.symlink(entry.target, entry.name, dir_fd=fd)
                os.chown(entry.name, *ids, dir_fd=fd, follow_symlinks=False)
                times = (entry.mtime_ns, entry.mtime_ns)
                os.utime(entry.name, ns=times, dir_fd=fd, follow_symlinks=False)
            elif data is not None:
                _layered_file(fd, entry, data, ids)
            elif live is None or not live.defer(entry):
                _file(fd, entry, objects, ids)
                if reuse is not None:
                    reuse.copied += 1
        while stack:
            _finish(*stack.pop())
    finally:
        for fd, _, _ in stack:
            os.close(fd)
        if live is not None:
            live.close()


def relink(target: Path, objects: Path, ids: tuple[int, int], reuse: Reuse) -> None:
    """Put the files `restore` deferred into `target`: each linked from the live workspace if
    it still matches, else copied from `objects`; then the folders' mtimes again. Only while
    nothing can write the live workspace (its container stopped)."""
    root_fd = os.open(target, DIR_FLAGS)
    try:
        source_fd = _open_dir(-1, str(reuse.source))
        try:
            for path, folder in reuse.pending.items():
                _relink_folder(root_fd, source_fd, path, folder, objects, ids, reuse)
        finally:
            _close(source_fd)
    finally:
        os.close(root_fd)
    reuse.pending.clear()


def _relink_folder(
    root_fd: int,
    source_fd: int,
    path: tuple[str, ...],
    folder: Folder,
    objects: Path,
    ids: tuple[int, int],
    reuse: Reuse,
) -> None:
    dst = _open_path(root_fd, path)
    src = _open_path(source_fd, path)
    try:
        if dst < 0:
            raise OSError(errno.ENOENT, f"the staged folder {'/'.join(path)!r} is gone")
        for entry in folder.files:
            if src >= 0 and _link(src, dst, entry, ids):
                reuse.linked += 1
            else:
                _file(dst, entry, objects, ids)
                reuse.copied += 1
        os.utime(dst, ns=(folder.mtime_ns, folder.mtime_ns))  # the links moved it
    finally:
        _close(dst)
        _close(src)


def _link(src: int, dst: int, entry: Entry, ids: tuple[int, int]) -> bool:
    """Link the live file `entry.name` of `src` into `dst` if it is still the one the
    manifest describes; False (nothing done) otherwise."""
    try:
        info = os.stat(entry.name, dir_fd=src, follow_symlinks=False)
    except OSError:
        return False
    if not _same(info, entry, ids):  # the extended attributes were looked at before
        return False
    try:
        os.link(entry.name, entry.name, src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)
    except OSError as exc:  # another file system (a capped workspace), too many links
        if exc.errno not in _NOT_LINKABLE:
            raise
        return False
    return True


def _same(info: os.stat_result, entry: Entry, ids: tuple[int, int]) -> bool:
    """Whether the live file `info` is the snapshot's `entry` as a copy would make it: the
    same inode unchanged since (the key), owned by `ids`, with exactly the entry's mode (a
    set-user-ID bit, which a snapshot drops, makes it differ)."""
    return (
        stat.S_ISREG(info.st_mode)
        and (info.st_dev, info.st_ino, info.st_ctime_ns, info.st_size, info.st_mtime_ns)
        == entry.key
        and (info.st_size, info.st_mtime_ns) == (entry.size, entry.mtime_ns)
        and (info.st_uid, info.st_gid) == ids
        and stat.S_IMODE(info.st_mode) == entry.mode
    )


def _has_xattrs(dir_fd: int, name: str) -> bool:
    try:
        return bool(os.listxattr(f"/proc/self/fd/{dir_fd}/{name}", follow_symlinks=False))
    except OSError as exc:  # none on this file system; else cannot tell: copied
        return exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP)


class _Live:
    """Phase 1's view of the live workspace, folder by folder beside the staged one."""

    def __init__(self, reuse: Reuse, ids: tuple[int, int], root_mtime_ns: int) -> None:
        self.reuse, self.ids = reuse, ids
        self.fds = [_open_dir(-1, str(reuse.source)) if reuse.trusted_before_ns else -1]
        self.names: list[str] = []
        self.mtimes = [root_mtime_ns]

    def enter(self, folder: Entry) -> None:
        self.fds.append(_open_dir(self.fds[-1], folder.name))
        self.names.append(folder.name)
        self.mtimes.append(folder.mtime_ns)

    def leave(self) -> None:
        _close(self.fds.pop())
        self.names.pop()
        self.mtimes.pop()

    def defer(self, entry: Entry) -> bool:
        """Leave the file for relink when its live twin matches now (claimed: linked once)."""
        reuse, fd = self.reuse, self.fds[-1]
        if fd < 0 or len(entry.key) != 5 or entry.key[2] >= reuse.trusted_before_ns:
            return False
        try:
            info = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return False
        inode = (info.st_dev, info.st_ino)
        if (
            not _same(info, entry, self.ids)
            or inode in reuse.claimed
            or _has_xattrs(fd, entry.name)
        ):
            return False
        reuse.claimed.add(inode)
        path = tuple(self.names)
        folder = reuse.pending.get(path)
        if folder is None:
            folder = reuse.pending[path] = Folder(self.mtimes[-1])
        folder.files.append(entry)
        return True

    def close(self) -> None:
        for fd in self.fds:
            _close(fd)
        self.fds.clear()


def _open_dir(parent: int, name: str) -> int:
    """A folder opened without following a link (relative to `parent` unless it is -1 and
    `name` absolute); -1 when there is none."""
    if parent < 0 and not os.path.isabs(name):
        return -1
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent if parent >= 0 else None)
    except OSError:
        return -1


def _open_path(root: int, path: tuple[str, ...]) -> int:
    """The folder `path` below `root`, one level at a time; -1 when it is not there."""
    if root < 0:
        return -1
    fd = os.dup(root)
    for name in path:
        child = _open_dir(fd, name)
        os.close(fd)
        if child < 0:
            return -1
        fd = child
    return fd


def _close(fd: int) -> None:
    if fd >= 0:
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


def _layered_file(dir_fd: int, entry: Entry, data: layers.DataLayer, ids: tuple[int, int]) -> None:
    """The file as overlayfs's metacopy: its attributes here, its content the object in
    `data` its redirect names (layers.py)."""
    redirect = data.redirect(entry.digest) if entry.size else b""
    dst = os.open(entry.name, _NEW_FILE, 0o600, dir_fd=dir_fd)
    try:
        os.ftruncate(dst, entry.size)  # sparse: no block is written
        os.fchown(dst, *ids)
        _set_xattrs(dst, entry)
        if redirect:  # an empty file is itself
            layers.name_object(dst, redirect)
        os.fchmod(dst, entry.mode)
        os.utime(dst, ns=(entry.mtime_ns, entry.mtime_ns))
    finally:
        os.close(dst)


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
