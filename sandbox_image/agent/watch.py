"""File events under a folder of the workspace, by inotify, read inside the container.

Why inotify through ctypes: the image has Python's standard library and grpcio only, and
the events must come from inside the container (the host's view of a bind-mounted or
overlay workspace does not see what the container writes through its own mounts reliably).

What is reported mirrors E2B's envd (fsnotify), which E2B users expect:

    inotify                      kind
    IN_CREATE, IN_MOVED_TO       create   (a name moved in is created here)
    IN_MODIFY                    write    (each write(2); the kernel merges repeats in a row)
    IN_DELETE                    remove
    IN_MOVED_FROM                rename   (the old name; the new one comes as create)
    IN_ATTRIB                    chmod    (mode, owner, times, links)
    IN_Q_OVERFLOW                overflow (events were lost: the watch ends)
    watched folder deleted/moved gone     (the watch ends)

Names are relative to the watched folder. With `recursive`, every folder below gets a watch
of its own, also folders made or moved in later (what they already hold when their watch is
added is reported as create: a `mkdir -p a/b` is seen whole, at the price of a possible
repeat). The number of folders is capped (MAX_FOLDERS): past it the watch is refused, or
ends, with "too many folders".

An upload's temporary file (transfers.UPLOAD_PREFIX) is not reported, and its rename into
place is reported as envd reports an in-place write (envd writes uploads in place, Stockade
writes them whole to a temporary file first so that a failed upload leaves the old file as it
was): `write` of the file it replaces, or `create`, `chmod` and `write` of a new one (envd
creates it, gives it to the user, then writes; E2B's SDK tests count the three). A file of
the sandbox's own named `.stockade-upload-*` is not reported either.

Every folder is opened and checked to be inside the workspace (paths.open_dir) before its
watch is added through /proc/self/fd: a folder swapped for a symlink is never followed out.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import stat
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from . import paths
from .errors import ToolError
from .transfers import UPLOAD_PREFIX

Kind = Literal["create", "write", "remove", "rename", "chmod", "overflow", "gone"]
MAX_FOLDERS: Final = 10_000
MAX_WATCHES: Final = 32
"""Watches open at once in this agent: each holds an inotify instance, of which the kernel
grants a user 128 by default (fs.inotify.max_user_instances), shared with the sandbox's code."""

IN_MODIFY: Final = 0x2
IN_ATTRIB: Final = 0x4
IN_MOVED_FROM: Final = 0x40
IN_MOVED_TO: Final = 0x80
IN_CREATE: Final = 0x100
IN_DELETE: Final = 0x200
IN_DELETE_SELF: Final = 0x400
IN_MOVE_SELF: Final = 0x800
IN_UNMOUNT: Final = 0x2000
IN_Q_OVERFLOW: Final = 0x4000
IN_IGNORED: Final = 0x8000
IN_ONLYDIR: Final = 0x01000000
IN_ISDIR: Final = 0x40000000
_MASK: Final = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
_KINDS: Final[tuple[tuple[int, Kind], ...]] = (
    (IN_CREATE, "create"),
    (IN_MOVED_TO, "create"),
    (IN_MODIFY, "write"),
    (IN_DELETE, "remove"),
    (IN_MOVED_FROM, "rename"),
    (IN_ATTRIB, "chmod"),
)
_LANDINGS: Final = 64
"""Uploads' renames whose far end (IN_MOVED_TO) is awaited: the kernel queues both halves
together, so this bounds only a hostile stream of lone halves."""
_HEADER: Final = struct.Struct("iIII")
_READ_BYTES: Final = 64 * 1024
_active = 0
"""Watches open now (the MAX_WATCHES count; tests read it to see a watch end). Changed under
_count_lock: open() runs in a worker thread."""
_count_lock = threading.Lock()


@dataclass(frozen=True)
class Change:
    kind: Kind
    name: str
    """Relative to the watched folder ("" for overflow and gone)."""
    is_dir: bool = False


def active() -> int:
    return _active


class _Libc:
    """inotify_init1, inotify_add_watch and inotify_rm_watch from the C library."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.init1 = libc.inotify_init1
        self.init1.argtypes = [ctypes.c_int]
        self.add_watch = libc.inotify_add_watch
        self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.rm_watch = libc.inotify_rm_watch
        self.rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]


_libc: _Libc | None = None


def _lib() -> _Libc:
    global _libc
    if _libc is None:
        _libc = _Libc()
    return _libc


class Watch:
    """One watch: open() adds the watches, changes() yields events, close() frees the fd."""

    def __init__(self, root: Path, user_path: str, recursive: bool) -> None:
        self._root = root
        self._user_path = user_path
        self._recursive = recursive
        self._fd = -1
        self._top = -1
        self._dirs: dict[int, str] = {}
        """Watch descriptor -> its folder, relative to the watched one ("" for itself)."""
        self._counted = False
        self._landing: dict[int, bool] = {}
        """An upload's rename under way: its cookie -> whether it replaces a file."""
        self.folder = ""
        """The watched folder, relative to the workspace."""

    def open(self) -> None:
        """Resolve the path (the file tools' rules), add the watches; raise ToolError."""
        global _active
        real = paths.resolve(self._root, self._user_path, kind="dir")
        self.folder = paths.display(self._root, real)
        with _count_lock:
            if _active >= MAX_WATCHES:
                raise ToolError(
                    "EXECUTION_FAILED",
                    f"too many watches open in this sandbox (at most {MAX_WATCHES})",
                )
            _active += 1
            self._counted = True
        try:
            fd = _lib().init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                raise _inotify_error(ctypes.get_errno(), self._user_path)
            self._fd = fd
            self._top = self._add(real, "")
            if self._recursive:
                for _ in self._add_below(real, ""):
                    pass
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        global _active
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with _count_lock:
            if self._counted:
                self._counted = False
                _active -= 1

    async def changes(self) -> AsyncIterator[Change]:
        """Events until overflow or gone (the last one), or until the caller stops."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = os.read(self._fd, _READ_BYTES)
            except BlockingIOError:
                await _readable(loop, self._fd)
                continue
            for change in self._parse(data):
                yield change
                if change.kind in ("overflow", "gone"):
                    return

    def _parse(self, data: bytes) -> Iterator[Change]:
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, cookie, size = _HEADER.unpack_from(data, offset)
            raw = data[offset + _HEADER.size : offset + _HEADER.size + size]
            offset += _HEADER.size + size
            name = os.fsdecode(raw.split(b"\0", 1)[0])
            if mask & IN_Q_OVERFLOW:
                yield Change("overflow", "")
                return
            if wd == self._top and mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED):
                yield Change("gone", "")
                return
            folder = self._dirs.get(wd)
            if folder is None or not name:  # a dropped watch, or a subfolder's own event
                if mask & IN_IGNORED:
                    self._dirs.pop(wd, None)
                continue
            yield from self._named(folder, name, mask, cookie)

    def _named(self, folder: str, name: str, mask: int, cookie: int) -> Iterator[Change]:
        relative = f"{folder}/{name}" if folder else name
        is_dir = bool(mask & IN_ISDIR)
        if name.startswith(UPLOAD_PREFIX):
            if mask & IN_MOVED_FROM and not is_dir:
                self._await_landing(cookie, name.endswith("-w"))
            return
        if mask & IN_MOVED_TO and cookie in self._landing:
            if not self._landing.pop(cookie):  # envd: open(O_CREAT), chown, write
                yield Change("create", relative)
                yield Change("chmod", relative)
            yield Change("write", relative)
            return
        for bit, kind in _KINDS:
            if mask & bit:
                yield Change(kind, relative, is_dir)
        if not (self._recursive and is_dir):
            return
        if mask & IN_MOVED_FROM:
            self._drop_below(relative)
        elif mask & (IN_CREATE | IN_MOVED_TO):
            yield from self._added(relative)

    def _await_landing(self, cookie: int, replaces: bool) -> None:
        if len(self._landing) >= _LANDINGS:
            del self._landing[next(iter(self._landing))]
        self._landing[cookie] = replaces

    def _added(self, relative: str) -> Iterator[Change]:
        """A folder made or moved in: watch it and what is below; what is already there is
        reported as created."""
        real = Path(os.path.realpath(self._root)) / self.folder / relative
        try:
            self._add(real, relative)
            yield from self._add_below(real, relative)
        except ToolError as exc:
            if "too many folders" in exc.message:
                raise
            # gone again, or swapped for a link: nothing to watch there

    def _add_below(self, real: Path, relative: str) -> Iterator[Change]:
        """Watches for every folder below `real`; a create for each entry found."""
        try:
            entries = list(os.scandir(real))
        except OSError:
            return  # removed meanwhile: its parent reports that
        for entry in entries:
            name = f"{relative}/{entry.name}" if relative else entry.name
            try:
                is_dir = stat.S_ISDIR(entry.stat(follow_symlinks=False).st_mode)
            except OSError:
                continue
            yield Change("create", name, is_dir)  # open() drops these: they predate it
            if is_dir:
                try:
                    self._add(real / entry.name, name)
                except ToolError as exc:
                    if "too many folders" in exc.message:
                        raise
                    continue
                yield from self._add_below(real / entry.name, name)

    def _add(self, real: Path, relative: str) -> int:
        if len(self._dirs) >= MAX_FOLDERS:
            raise ToolError(
                "EXECUTION_FAILED",
                f"too many folders to watch under '{self.folder}' (at most {MAX_FOLDERS}): "
                "watch a smaller folder, or without recursive",
            )
        shown = f"{self.folder}/{relative}" if relative else self.folder
        dir_fd = paths.open_dir(self._root, real, shown)
        try:
            wd = _lib().add_watch(self._fd, f"/proc/self/fd/{dir_fd}".encode(), _MASK)
            if wd < 0:
                raise _inotify_error(ctypes.get_errno(), shown)
        finally:
            os.close(dir_fd)
        self._dirs[wd] = relative
        return int(wd)

    def _drop_below(self, relative: str) -> None:
        """A folder moved away: its watches (and those below it) end."""
        prefix = relative + "/"
        for wd, folder in list(self._dirs.items()):
            if folder == relative or folder.startswith(prefix):
                del self._dirs[wd]
                _lib().rm_watch(self._fd, wd)


async def watch(root: Path, user_path: str, recursive: bool) -> Watch:
    """An open Watch (the folder walk runs in a thread: it may be large). A caller that goes
    away meanwhile leaves nothing open: the thread runs on, and what it opened is closed."""
    w = Watch(root, user_path, recursive)
    opening = asyncio.ensure_future(asyncio.to_thread(w.open))
    try:
        await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(lambda _: w.close())
        raise
    return w


async def _readable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake(*_: Any) -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def _inotify_error(number: int, shown: str) -> ToolError:
    if number == errno.ENOSPC:
        return ToolError(
            "EXECUTION_FAILED",
            f"cannot watch '{shown}': the kernel's limit of inotify watches is reached "
            "(fs.inotify.max_user_watches)",
        )
    if number == errno.EMFILE:
        return ToolError(
            "EXECUTION_FAILED",
            "cannot watch: the kernel's limit of inotify instances is reached "
            "(fs.inotify.max_user_instances)",
        )
    if number == errno.ENOENT:
        return ToolError("FILE_NOT_FOUND", f"path '{shown}' does not exist")
    if number in (errno.EACCES, errno.EPERM):
        return ToolError("PERMISSION_DENIED", f"path '{shown}': {os.strerror(number)}")
    return ToolError("EXECUTION_FAILED", f"cannot watch '{shown}': {os.strerror(number)}")
