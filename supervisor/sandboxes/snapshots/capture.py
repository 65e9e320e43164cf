"""Reading a tree that sandbox code shaped into the store's entries, by descriptors only.

Every folder is opened with O_NOFOLLOW|O_DIRECTORY relative to its parent's descriptor and
every file with O_NOFOLLOW|O_NONBLOCK (a fifo swapped in for a file does not block the
open; what the descriptor turns out to be is checked with fstat, never the name again). A
link is read with readlink and stored as its target text; it is never followed. A file
that the cache says is unchanged (its lstat key: the same inode, ctime, size and mtime as
when it was stored) is not opened at all. An entry that changes kind between listing and
opening (a folder replaced by a link to /etc, say) is looked at again once and stored as
what it is then; a second change is an error. The walk holds one descriptor per level, and
the depth is bounded (`Limits.max_depth`).

A file's or folder's extended attributes in the `user.e2b.` namespace (E2B's file metadata,
fronts/e2b/file_metadata.py) are kept with its entry, read from its open descriptor, at most
XATTR_BYTES of them (names and values, in name order); no other attribute is kept.
"""

from __future__ import annotations

import errno
import hashlib
import json.encoder
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from stat import S_ISREG
from typing import Any, Final, TypeVar

from stockade.supervisor.errors import InvalidRequest, StockadeError
from stockade.supervisor.sandboxes.snapshots import statdir

DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CHUNK: Final = 1 << 20
XATTR_PREFIX: Final = "user.e2b."
"""The extended attributes a snapshot keeps (E2B's file metadata)."""
XATTR_BYTES: Final = 4096
"""The most of them kept per entry (names and values): what an E2B upload may give a file."""
MODE_BITS: Final = 0o1777
"""The mode bits a snapshot keeps: permissions and the sticky bit. Set-user-ID and
set-group-ID are dropped: a restore never makes a setuid file."""


class SnapshotTooLarge(InvalidRequest):
    """The tree passes one of the capture's bounds."""


class TreeChanged(StockadeError):
    """An entry kept changing kind while it was being captured (the sandbox was not frozen)."""

    reason = "SANDBOX_STATE_CONFLICT"


@dataclass(frozen=True)
class Limits:
    max_entries: int = 1_000_000
    max_depth: int = 256
    max_name_bytes: int = 255
    max_link_bytes: int = 4096
    max_bytes: int = 64 << 30


@dataclass(slots=True)
class Entry:
    """One entry below the root, in depth-first preorder; `depth` 1 is a child of the root."""

    depth: int
    name: str  # os.fsdecode'd (surrogateescape): names that are not UTF-8 survive exactly
    kind: str  # "d", "f", "l"
    mode: int = 0
    mtime_ns: int = 0
    digest: str = ""
    size: int = 0
    target: str = ""
    key: tuple[int, ...] = ()  # (dev, ino, ctime_ns, size, mtime_ns): the next capture's cache
    xattrs: tuple[tuple[str, str], ...] = ()
    """(name, value) of its user.e2b.* attributes; a value's bytes decoded with
    surrogateescape (they survive exactly)."""
    text: str = field(default="", compare=False, repr=False)
    """json_text once made: an entry the next capture takes over unchanged is not written
    again (entries are not changed once made, except by capture before it returns)."""

    def to_json(self) -> list[Any]:
        tail: list[Any] = []
        if self.kind == "f":
            tail = [self.digest, self.size, list(self.key)]
        elif self.kind == "l":
            tail = [self.target]
        if self.xattrs and self.kind != "l":
            tail.append([list(pair) for pair in self.xattrs])
        return [self.depth, self.name, self.kind, self.mode, self.mtime_ns, *tail]

    def json_text(self) -> str:
        """json.dumps(self.to_json(), ensure_ascii=True, separators=(",", ":")), the same
        text at about a fifth of the cost (a manifest writes one per entry), kept."""
        if not self.text:
            self.text = self._json_text()
        return self.text

    def _json_text(self) -> str:
        head = f'[{self.depth},{json_quoted(self.name)},"{self.kind}",{self.mode},{self.mtime_ns}'
        if self.kind == "l":
            return f"{head},{json_quoted(self.target)}]"
        extra = ""
        if self.xattrs:
            pairs = ",".join(f"[{json_quoted(n)},{json_quoted(v)}]" for n, v in self.xattrs)
            extra = f",[{pairs}]"
        if self.kind == "f":
            key = ",".join(map(str, self.key))
            return f'{head},"{self.digest}",{self.size},[{key}]{extra}]'
        return f"{head}{extra}]"

    @classmethod
    def from_json(cls, raw: list[Any]) -> Entry:
        depth, name, kind, mode, mtime_ns, *tail = raw
        entry = cls(int(depth), str(name), str(kind), int(mode), int(mtime_ns))
        if kind == "f":
            entry.digest, entry.size, entry.key = str(tail[0]), int(tail[1]), tuple(tail[2])
            tail = tail[3:]
        elif kind == "l":
            entry.target = str(tail[0])
            tail = []
        elif kind != "d":
            raise ValueError(f"unknown entry kind {kind!r}")
        if tail:  # user.e2b.* attributes (manifests before them have none)
            entry.xattrs = tuple((str(n), str(v)) for n, v in tail[0])
            if any(not n.startswith(XATTR_PREFIX) for n, _ in entry.xattrs):
                raise ValueError("an attribute outside user.e2b.: damaged manifest")
        return entry


_Items = TypeVar("_Items")

json_quoted: Final = json.encoder.encode_basestring_ascii
"""A string as json.dumps(ensure_ascii=True) writes it (the C function it calls)."""


@dataclass
class Captured:
    root_mode: int
    root_mtime_ns: int
    entries: list[Entry]
    skipped: list[str] = field(default_factory=list)  # paths of fifos, sockets, devices
    files_read: int = 0
    bytes_read: int = 0
    walked_ns: int = 0  # when the walk that recorded it began (time.time_ns)
    files: int = 0
    bytes: int = 0
    """Its files and their bytes (counted by the walk: a snapshot's description sums no list)."""
    known: Known = field(default_factory=dict)
    """With statdir: this walk's records (statdir.c) and their entries, the next walk's
    `known`."""


Cache = dict[tuple[int, ...], Entry]
"""File keys (Entry.key) of an earlier capture and their entries: a file whose key is there
is not read again, and its entry is taken over as it is when its depth and name are the same."""

Known = dict[bytes, Entry]
"""A walk's lstat records (statdir.c: depth, mode, dev, ino, ctime, size, mtime and name) and
the entries made of them: a record the next walk finds again, byte for byte, is that entry
again with no Python per field. Only files with a key (clean, not racy) and folders whose
entry is their record's are in it; a link never is (its target is read each time)."""

Store = Callable[[int], tuple[str, int]]
"""Given an open regular file, copy it into the store and return (digest, size)."""


def capture(
    root_fd: int,
    limits: Limits,
    cached: Cache,
    store: Store,
    racy_after_ns: int = 0,
    known: Known | None = None,
    native: bool = True,
) -> Captured:
    """Walk the folder `root_fd`. A file whose (dev, ino, ctime, size, mtime) is in `cached`
    is not read again (its ctime cannot be set back by the sandbox); others go to `store`.
    With racy_after_ns, a file whose ctime is at or after it gets no key (it may be written
    while it is read, within one tick of the kernel's clock: it is never taken from a cache).
    `known`: an earlier walk's `Captured.known` of the same tree; with statdir's library
    (and `native`), each folder's lstats are taken in C, and an entry whose record is known
    is taken over without a field looked at in Python."""
    info = os.fstat(root_fd)
    out = Captured(stat.S_IMODE(info.st_mode) & MODE_BITS, info.st_mtime_ns, [])
    if native and statdir.available():
        _walk_native(root_fd, limits, cached, store, racy_after_ns, known or {}, out)
        return out
    stack: list[tuple[int, Iterator[str], str]] = [(root_fd, iter(_names(root_fd)), "")]
    total = files = 0
    entries = out.entries
    max_entries, max_name = limits.max_entries, limits.max_name_bytes
    short_name = max_name // 4  # a name of this many characters or fewer fits in any case
    max_bytes, stat_of, get = limits.max_bytes, os.stat, cached.get
    try:
        while stack:
            fd, names, path = stack[-1]
            depth = len(stack)
            for name in names:  # left for a folder's (its iterator goes on when it is done)
                if len(name) > short_name and len(os.fsencode(name)) > max_name:
                    raise SnapshotTooLarge(f"{_join(path, name)!r}: a name longer than the limit")
                if len(entries) >= max_entries:
                    raise SnapshotTooLarge(f"more than {max_entries} entries")
                # The common case first, in line: a regular file the cache knows (one lstat).
                try:
                    info = stat_of(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                child = None
                key = (info.st_dev, info.st_ino, info.st_ctime_ns, info.st_size, info.st_mtime_ns)
                hit = get(key) if S_ISREG(info.st_mode) else None
                if hit is not None:  # unchanged since it was stored: not even opened
                    if hit.depth != depth or hit.name != name:  # moved with its folder
                        hit = _hit(depth, name, info, hit.digest, key, hit.xattrs)
                    entry = hit
                else:  # a folder, a link, a file to read, or what a snapshot skips
                    found, child = _one(fd, name, depth, cached, store, out, path, limits, info)
                    if found is None:
                        continue
                    entry = found
                if racy_after_ns and entry.key and entry.key[2] >= racy_after_ns:
                    entry = replace(entry, key=(), text="")  # a copy: it may be the cache's
                entries.append(entry)
                if entry.kind == "f":
                    files += 1
                    total += entry.size
                    if total > max_bytes:
                        raise SnapshotTooLarge(f"more than {max_bytes} bytes of files")
                if child is not None:
                    entry_path = _deeper(child, path, name, depth, limits)
                    stack.append((child, iter(_names(child)), entry_path))
                    break
            else:  # this folder is done
                _done(stack)
    finally:
        _done(stack, all_of_it=True)
    out.files, out.bytes = files, total
    return out


def _walk_native(
    root_fd: int,
    limits: Limits,
    cached: Cache,
    store: Store,
    racy_after_ns: int,
    known: Known,
    out: Captured,
) -> None:
    """capture's walk with each folder's lstats taken by statdir (the same entries as the
    walk by names). A record (an entry's lstat, name and depth) in `known` is that entry
    again: a file with the same inode, ctime, size and mtime as when it was stored, or a
    folder, opened and checked by fstat to be the one listed. Anything else goes the way
    of the walk by names (`_one`: looked at again, read, retried once on a change of kind)."""
    read = statdir.Reader()
    stack: list[tuple[int, Iterator[bytes], str]] = [
        (root_fd, iter(_records(read, root_fd, 1)), "")
    ]
    total = files = 0
    entries, seen = out.entries, out.known
    max_entries, max_bytes, get_known = limits.max_entries, limits.max_bytes, known.get
    if not racy_after_ns:  # its entries could be racy: none is kept as known
        seen = {}
    try:
        while stack:
            fd, records, path = stack[-1]
            depth = len(stack)
            for record in records:  # left for a folder's (its iterator goes on when it is done)
                if len(entries) >= max_entries:
                    raise SnapshotTooLarge(f"more than {max_entries} entries")
                entry = get_known(record)
                child = None
                if entry is None or entry.kind == "d":
                    name, (mode, *key) = statdir.parse(record)
                    if entry is not None:  # a folder as listed last time: the same one?
                        child = _open_dir(fd, name, key)
                        if child is None:
                            entry = None
                    if entry is None:
                        if len(os.fsencode(name)) > limits.max_name_bytes:
                            raise SnapshotTooLarge(
                                f"{_join(path, name)!r}: a name longer than the limit"
                            )
                        entry, child = _new(
                            fd, name, depth, cached, store, out, path, limits, mode, key
                        )
                        if entry is None:
                            continue
                        if racy_after_ns and entry.key and entry.key[2] >= racy_after_ns:
                            entry = replace(entry, key=(), text="")
                        if _clean(entry, mode, key):
                            seen[record] = entry
                    else:
                        seen[record] = entry
                else:
                    seen[record] = entry
                entries.append(entry)
                if entry.kind == "f":
                    files += 1
                    total += entry.size
                    if total > max_bytes:
                        raise SnapshotTooLarge(f"more than {max_bytes} bytes of files")
                if child is not None:
                    entry_path = _deeper(child, path, entry.name, depth, limits)
                    stack.append((child, iter(_records(read, child, depth + 1)), entry_path))
                    break
            else:  # this folder is done
                _done(stack)
    finally:
        _done(stack, all_of_it=True)
    out.files, out.bytes = files, total


def _deeper(child: int, parent: str, name: str, depth: int, limits: Limits) -> str:
    """The path of the folder `child` (opened, a child of `parent` at `depth`); too deep, it
    is closed and SnapshotTooLarge raised."""
    path = _join(parent, name)
    if depth >= limits.max_depth:
        os.close(child)
        raise SnapshotTooLarge(f"{path!r}: deeper than {limits.max_depth}")
    return path


def _done(stack: list[tuple[int, _Items, str]], all_of_it: bool = False) -> None:
    """The innermost folder of a walk's `stack` is done: it leaves, closed (the root's
    descriptor is the caller's); all_of_it: every folder still open is closed (the walk ended
    or failed)."""
    if all_of_it:
        for fd, _, _ in stack[1:]:
            os.close(fd)
        stack.clear()
        return
    fd = stack.pop()[0]
    if stack:
        os.close(fd)


def _records(read: statdir.Reader, fd: int, depth: int) -> list[bytes]:
    """The folder's records by statdir, or made here the same way when the C side failed
    (the error it met, if it lasts, is then raised here)."""
    got = read(fd, depth)
    if got is not None:
        return got
    made = []
    for name in os.listdir(fd):
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        made.append(statdir.record(depth, info, os.fsencode(name)))
    return sorted(made, key=lambda r: r.partition(b"/")[2])


def _open_dir(fd: int, name: str, key: list[int]) -> int | None:
    """The folder `name`, opened, when it is still the one listed (same inode, ctime, mtime);
    None (nothing left open) otherwise."""
    try:
        child = os.open(name, DIR_FLAGS, dir_fd=fd)
    except OSError:
        return None
    got = os.fstat(child)
    if [got.st_dev, got.st_ino, got.st_ctime_ns, got.st_mtime_ns] != [
        key[0],
        key[1],
        key[2],
        key[4],
    ]:
        os.close(child)
        return None
    return child


def _new(
    fd: int,
    name: str,
    depth: int,
    cached: Cache,
    store: Store,
    out: Captured,
    path: str,
    limits: Limits,
    mode: int,
    key: list[int],
) -> tuple[Entry | None, int | None]:
    """An entry whose record no earlier walk made: from the cache by its file key, or by _one."""
    if S_ISREG(mode):
        file_key = tuple(key)
        known = cached.get(file_key)
        if known is not None:
            if known.depth == depth and known.name == name:
                return known, None
            return Entry(
                depth,
                name,
                "f",
                stat.S_IMODE(mode) & MODE_BITS,
                key[4],
                known.digest,
                key[3],
                key=file_key,
            ), None
    return _one(fd, name, depth, cached, store, out, path, limits)


def _clean(entry: Entry, mode: int, key: list[int]) -> bool:
    """Whether `entry` is what its record says (so that the record alone may stand for it
    next time): a file with its key (read whole, not racy) equal to the record's, or a folder
    with the record's mode and mtime. Never a link."""
    if entry.kind == "f":
        return S_ISREG(mode) and list(entry.key) == key
    if entry.kind == "d":
        return (
            stat.S_ISDIR(mode)
            and entry.mode == stat.S_IMODE(mode) & MODE_BITS
            and entry.mtime_ns == key[4]
        )
    return False


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def _names(fd: int) -> list[str]:
    return sorted(os.listdir(fd))


def _one(
    fd: int,
    name: str,
    depth: int,
    cached: Cache,
    store: Store,
    out: Captured,
    parent: str,
    limits: Limits,
    first: os.stat_result | None = None,
) -> tuple[Entry | None, int | None]:
    """The entry `name` of `fd` in the folder `parent` (and, for a folder, its open
    descriptor); None if it is gone or is a kind a snapshot skips. Kind changes between
    lstat and open are retried once. `first`: the entry's lstat, already taken."""
    path = _join(parent, name)
    for _attempt in range(2):
        try:
            info = first or os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None, None
        first = None
        mode = info.st_mode
        try:
            if stat.S_ISDIR(mode):
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
                got = os.fstat(child)
                entry = Entry(depth, name, "d", stat.S_IMODE(got.st_mode) & MODE_BITS)
                entry.mtime_ns = got.st_mtime_ns  # folders' mtimes: finalised by restore
                entry.xattrs = xattrs_of(child)
                return entry, child
            if stat.S_ISLNK(mode):
                target = os.readlink(name, dir_fd=fd)
                if len(os.fsencode(target)) > limits.max_link_bytes:
                    raise SnapshotTooLarge(f"{path!r}: a link target longer than the limit")
                again = os.stat(name, dir_fd=fd, follow_symlinks=False)
                return Entry(depth, name, "l", 0o777, again.st_mtime_ns, target=target), None
            if stat.S_ISREG(mode):
                key = _key(info)
                known = cached.get(key)
                if known is not None:  # unchanged since it was stored: not even opened
                    return _hit(depth, name, info, known.digest, key, known.xattrs), None
                return _file(fd, name, depth, store, out), None
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None, None
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP, errno.EINVAL, _WRONG_KIND):
                raise
            continue  # it changed kind between the lstat and the open: look again
        out.skipped.append(path)
        return None, None
    raise TreeChanged(f"{path!r} kept changing while the snapshot was taken")


def _hit(
    depth: int,
    name: str,
    info: os.stat_result,
    digest: str,
    key: tuple[int, ...],
    xattrs: tuple[tuple[str, str], ...],
) -> Entry:
    """The entry of a file the cache knows (by `info`'s key, which an attribute's change
    changes too: its ctime), with `key` and its attributes kept."""
    mode = stat.S_IMODE(info.st_mode) & MODE_BITS
    entry = Entry(depth, name, "f", mode, info.st_mtime_ns, digest, info.st_size, key=key)
    entry.xattrs = xattrs
    return entry


def xattrs_of(fd: int) -> tuple[tuple[str, str], ...]:
    """The user.e2b.* attributes of an open file or folder, in name order, at most
    XATTR_BYTES of them; none where the file system keeps none."""
    try:
        names = sorted(n for n in os.listxattr(fd) if n.startswith(XATTR_PREFIX))
    except OSError:
        return ()
    found: list[tuple[str, str]] = []
    used = 0
    for name in names:
        try:
            value = os.getxattr(fd, name)
        except OSError:
            continue
        used += len(name) + len(value)
        if used > XATTR_BYTES:
            break
        found.append((name, value.decode("utf-8", "surrogateescape")))
    return tuple(found)


_WRONG_KIND: Final = -1  # raised by _file when the descriptor is not a regular file


def _file(fd: int, name: str, depth: int, store: Store, out: Captured) -> Entry:
    """Read a file the cache does not know (by its lstat key, checked in _one) into the store."""
    file_fd = os.open(name, FILE_FLAGS, dir_fd=fd)
    try:
        info = os.fstat(file_fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(_WRONG_KIND, "not a regular file any more")
        key = _key(info)
        digest, size = store(file_fd)
        out.files_read += 1
        out.bytes_read += size
        after = os.fstat(file_fd)
        if (after.st_ctime_ns, after.st_size) != (info.st_ctime_ns, size):
            key = ()  # changed while read: what was read is stored, never cached
        mode = stat.S_IMODE(info.st_mode) & MODE_BITS
        entry = Entry(depth, name, "f", mode, info.st_mtime_ns, digest, size, key=key)
        entry.xattrs = xattrs_of(file_fd)
        return entry
    finally:
        os.close(file_fd)


def _key(info: os.stat_result) -> tuple[int, ...]:
    """What says a file is unchanged: the same inode with the same ctime (which sandbox code
    cannot set back), size and mtime."""
    return (info.st_dev, info.st_ino, info.st_ctime_ns, info.st_size, info.st_mtime_ns)


def hash_copy(src_fd: int, dst_fd: int) -> tuple[str, int]:
    """Copy `src_fd` from its start to `dst_fd`, returning (sha256 hex, bytes)."""
    digest = hashlib.sha256()
    size = 0
    while True:
        data = os.pread(src_fd, CHUNK, size)
        if not data:
            return digest.hexdigest(), size
        digest.update(data)
        view = memoryview(data)
        while view:
            view = view[os.write(dst_fd, view) :]
        size += len(data)
