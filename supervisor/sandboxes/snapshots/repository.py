"""The snapshot store: trees captured under a name per owner (tenant), listed, deleted with
their unreferenced content collected, restored into a fresh folder; bytes and count per
owner for quotas.

Layout, under the state directory (root-owned, 0700; no sandbox can reach it)::

    snapshots/<owner>/
        lock                      flock: one writer per owner at a time
        objects/<ab>/<sha256>     a file's content, once per owner however many snapshots
        manifests/<name>.json.gz  a snapshot: its entries, depth-first (capture.Entry)

Dedup: content-addressed whole files, per owner (content is never shared between tenants:
a shared pool would tell one tenant, through its quota, what another stored). Measured with
bench/snapshots.py on this machine's ext4 (no reflinks; 2 shared cores): 10,000 files, 1 GiB,
ten snapshots each rewriting 1% of the files: the store is 1.096x one copy (the changed files'
content plus each snapshot's compressed manifest), within the 1.2x target; the first capture
took 1.57 s, the next ones 0.10 s (median), a restore 5.5 s. Chunking would only win for
large files changed in place by a little (an appended log), which the target does not ask
for and which costs a chunk index per file: not done (a whole changed file is stored again).

The store's copy is always a copy, never a hard link to the workspace's file: the sandbox
could change the stored content through the link afterwards. A hard link in the workspace to
a file elsewhere is stored by its content, as the sandbox's file: sandbox code cannot make one
to a host file, since link(2) across mounts fails with EXDEV (checked: a bind mount refuses
a link to a file outside it, though both are on one file system) and the workspace is a bind
mount (a loop-mounted file system of its own when size-capped); it could only link a file it
can already read. A capture reads only files whose (device, inode, ctime, size, mtime) differ
from the same lineage's newest snapshot: ctime cannot be set back by the sandbox, so a file
it changed is always read again; the sandbox is frozen for the walk plus the changed files'
copy (0.10 s above).

Restore copies each file out of the store (FICLONE where the file system has reflinks,
else copy_file_range): never a hard link to the store, so nothing the sandbox does to its
files reaches the store. A restore into the sandbox the snapshot was taken of (`reuse`, then
`relink`) links instead the files its live workspace still holds unchanged (restore.py).
Restored entries belong to the ids the caller gives; modes keep permissions and the sticky
bit (never set-user-ID or set-group-ID); mtimes are restored (atime = mtime); links keep
their target text. Hard links inside the tree come back as separate files.
Fifos, sockets and devices are skipped and reported (`Snapshot.skipped`).

Blocking: the manager calls these through asyncio.to_thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from stockade.supervisor.errors import AlreadyExists, InvalidRequest, NotFound, QuotaExceeded
from stockade.supervisor.sandboxes import layers
from stockade.supervisor.sandboxes.snapshots import restore as _restore
from stockade.supervisor.sandboxes.snapshots.capture import (
    DIR_FLAGS,
    Cache,
    Captured,
    Entry,
    Known,
    Limits,
    capture,
    hash_copy,
    json_quoted,
)

log = logging.getLogger("stockade")

_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
_TRANSIENT: Final = re.compile(r"~[a-z]{1,16}-[0-9a-f]{1,32}")
"""Names of captures the supervisor makes for itself (a fork's) and deletes at once: never
listed nor counted; callers cannot make or name them."""
MiB: Final = 1 << 20
MAIN: Final = "workspace"
DEFER_BYTES: Final = 64 << 20
"""What a deferred walk (CaptureSession.defer) keeps in memory at most; past it, files are
stored as they are read."""
DEFER_FILE_BYTES: Final = 1 << 20
"""A file larger than this is stored as it is read, never kept in memory."""


def _coarse_tick_ns() -> int:
    """The step of the kernel's coarse clock (CLOCK_REALTIME_COARSE, 5 on Linux), which files'
    ctimes are taken from: 4 ms at HZ=250; 10 ms when it cannot be read."""
    try:
        return max(int(time.clock_getres(5) * 1e9), 1_000_000)
    except OSError:
        return 10_000_000


RACY_NS: Final = 2 * _coarse_tick_ns()
"""A file whose ctime is within this of a frozen walk's start gets no key: a write just after
the thaw could leave its ctime, size and mtime as the walk saw them."""
"""The part every snapshot has; others (e.g. "tmp") are optional."""
_FORMAT: Final = 2


class SnapshotNotFound(NotFound):
    pass


class SnapshotExists(AlreadyExists):
    pass


@dataclass(frozen=True)
class Snapshot:
    owner: str
    name: str
    lineage: str  # what it was taken of (the sandbox key): later captures reuse its hashes
    created: float
    files: int
    entries: int
    bytes: int  # the files' total size, before dedup
    skipped: tuple[str, ...] = ()
    source: str = ""  # what the caller calls the tree (the key, as its tenant sees it)
    parts: tuple[str, ...] = (MAIN,)
    walked_ns: int = 0
    """When the walk that recorded it began (0: not recorded, a manifest made before this
    was): a restore links no file whose ctime is within a second of it (restore.py)."""

    @property
    def transient(self) -> bool:
        return self.name.startswith("~")


HOLD_SUFFIX: Final = ".held"
"""A held capture's lock file: manifests/NAME.held (SnapshotStore.hold_transient)."""
FORK_PREFIX: Final = "~fork-"
"""The names of forks' captures (operations.py), held while in use."""
NOW_PREFIX: Final = "~now-"
"""The names of a checkpoint diff's capture of now (checkpoints.py), held while in use."""
HELD_PREFIXES: Final = (FORK_PREFIX, NOW_PREFIX)
"""The transient captures that live only while a call uses them, held meanwhile: one nobody
holds was left by a process that died. Never a checkpoint's (`~ckpt-`), which is kept for
undo with no process holding it."""


class TransientHold:
    """A transient capture held in use (SnapshotStore.hold_transient): release() once its
    manifest is deleted, or when it was never written."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd

    def __enter__(self) -> TransientHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self._fd < 0:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # before the lock goes: nobody finds it unheld meanwhile
        os.close(self._fd)
        self._fd = -1


def _drop_unheld_transients(base: Path) -> bool:
    """Remove the held kinds of transient captures (HELD_PREFIXES: a fork's, an undo
    diff's) that nobody holds (a lock file that can be locked, or none beside the manifest:
    a process that died mid-fork or mid-diff), and lock files left without a manifest;
    whether a manifest was removed (its content then wants a collection). Called with the
    owner's store lock held."""
    manifests = base / "manifests"
    dropped = False
    with os.scandir(manifests) as found:  # one pass: every store operation comes here
        names = {
            e.name.removesuffix(".json.gz").removesuffix(HOLD_SUFFIX)
            for e in found
            if e.name.startswith(HELD_PREFIXES)
        }
    for name in names:
        hold = manifests / f"{name}{HOLD_SUFFIX}"
        try:
            fd = os.open(hold, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            fd = -1
        except OSError as exc:  # a link in its place: no lock, never followed
            if exc.errno != errno.ELOOP:
                raise
            fd = -1
        try:
            if fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live fork's or diff's
            with contextlib.suppress(FileNotFoundError):
                (manifests / f"{name}.json.gz").unlink()
                dropped = True
                log.warning("snapshot store: removed %s, a transient capture left unheld", name)
            with contextlib.suppress(FileNotFoundError):
                hold.unlink()
        finally:
            if fd >= 0:
                os.close(fd)
    return dropped


@dataclass(frozen=True)
class Layer:
    """What SnapshotStore.layer_data gives: the snapshot's root (mode, mtime), its entries,
    and its data layer, every object linked."""

    root: tuple[int, int]
    entries: list[Entry]
    data: layers.DataLayer


@dataclass(frozen=True)
class Usage:
    """What an owner's snapshots take: `count` snapshots, `bytes` on disk after dedup."""

    count: int
    bytes: int


@dataclass(frozen=True)
class CaptureStats:
    files_read: int
    bytes_read: int
    seconds: float


Opener = Callable[[], int]
"""Opens a tree's root folder and returns its descriptor (the store closes it): the caller
checks there that the folder is the one it means (a container's /tmp through its process)."""


class SnapshotStore:
    def __init__(self, root: Path, limits: Limits | None = None, *, native: bool = True) -> None:
        """native=False: every walk stats in Python, never through statdir (tests)."""
        self.root = root
        self.limits = limits or Limits()
        self.native = native
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._head_cache: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}

    # --- capture ---------------------------------------------------------------------------

    def capture(
        self, owner: str, name: str, tree: Path, lineage: str = ""
    ) -> tuple[Snapshot, CaptureStats]:
        """Store the folder `tree` as `name` in one pass. Freeze whatever writes the tree
        around this call: the files are read while the call runs (only the changed ones)."""
        _check(name, "snapshot name")
        session = self.begin(owner)
        try:
            trees = {MAIN: _opener(tree)}
            return session.capture(name, trees, lineage, session.cache(lineage))
        finally:
            session.end()

    def begin(self, owner: str) -> CaptureSession:
        """Hold the owner's store for a capture in steps (precopy while the sandbox runs, the
        capture while it is frozen): nothing else writes or collects it until end(), which
        the caller must call (from any thread)."""
        _check(owner, "owner")
        with self._locks_lock:
            lock = self._locks.setdefault(owner, threading.Lock())
        lock.acquire()
        try:
            base, fd = self._open(owner)
        except BaseException:
            lock.release()
            raise
        return CaptureSession(self, base, fd, lock)

    def _cache(self, base: Path, lineage: str) -> Cache:
        """The newest snapshot of `lineage`'s file keys and digests."""
        if not lineage:
            return {}
        newest: tuple[float, Path] | None = None
        for path, head in self._heads(base):
            if head["lineage"] == lineage and (newest is None or head["created"] > newest[0]):
                newest = (head["created"], path)
        if newest is None:
            return {}
        _, parts = _read_manifest(newest[1])
        return {
            tuple(e.key): e
            for _, entries in parts.values()
            for e in entries
            if e.kind == "f" and e.key
        }

    # --- list, delete, usage ---------------------------------------------------------------

    def list(self, owner: str) -> list[Snapshot]:
        """The owner's snapshots, oldest first (transient ones, a fork's, are not listed)."""
        _check(owner, "owner")
        base = self.root / owner
        if not base.is_dir():
            return []
        found = (_snapshot(owner, head) for _, head in self._heads(base))
        return sorted((s for s in found if not s.transient), key=lambda s: s.created)

    def get(self, owner: str, name: str) -> Snapshot:
        _check(owner, "owner")
        _check(name, "snapshot name", transient=True)
        path = self.root / owner / "manifests" / f"{name}.json.gz"
        try:
            head, _ = _read_manifest(path)
        except FileNotFoundError:
            raise SnapshotNotFound(f"no snapshot {name!r}") from None
        return _snapshot(owner, head)

    def delete(self, owner: str, name: str, *, added: Collection[str] | None = None) -> int:
        """Delete the snapshot and the content no other snapshot of the owner uses; returns
        the bytes freed. `added`: the content the snapshot's own capture added to the store
        (CaptureSession.added, a fork's transient capture's): only that can have been left
        unused, and only a manifest written since can use it, so only those are read."""
        _check(owner, "owner")
        _check(name, "snapshot name", transient=True)
        with self._owner(owner) as base:
            if added is None:
                return _delete(base, name)
            return _delete_added(base, name, set(added))

    def usage(self, owner: str) -> Usage:
        """Snapshots listed, and bytes on disk (transient captures' included while held)."""
        _check(owner, "owner")
        base = self.root / owner
        if not base.is_dir():
            return Usage(0, 0)
        manifests = list((base / "manifests").glob("*.json.gz"))
        size = sum(p.stat().st_size for p in manifests)
        size += sum(p.stat().st_size for p in _objects(base / "objects"))
        return Usage(sum(not p.name.startswith("~") for p in manifests), size)

    # --- restore ---------------------------------------------------------------------------

    def restore(
        self,
        owner: str,
        name: str,
        target: Path | Opener,
        ids: tuple[int, int],
        part: str = MAIN,
        reuse: _restore.Reuse | None = None,
    ) -> Snapshot:
        """Make the empty folder `target` hold exactly the snapshot's files (its `part`),
        owned by `ids`; a folder given by an opener keeps its own owner (a /tmp). A restore
        that fails part way leaves `target` partly filled: the caller removes it. With
        `reuse` (a restore into the sandbox the snapshot is of), the files its live workspace
        still holds unchanged are left out, for relink to link them once nothing writes
        there any more."""
        _check(owner, "owner")
        _check(name, "snapshot name", transient=True)
        with self._owner(owner) as base:  # a delete's collection waits for the copy
            path = base / "manifests" / f"{name}.json.gz"
            try:
                head, parts = _read_manifest(path)
            except FileNotFoundError:
                raise SnapshotNotFound(f"no snapshot {name!r}") from None
            if part not in parts:
                raise SnapshotNotFound(f"snapshot {name!r} holds no {part}")
            root, entries = parts[part]
            if reuse is not None:
                walked = int(head.get("walked_ns", 0))
                reuse.trusted_before_ns = max(0, walked - _restore.RACY_NS) if walked else 0
            _restore.restore(target, root, entries, base / "objects", ids, reuse)
            return _snapshot(owner, head)

    def layer_data(self, owner: str, name: str, data: Path) -> Layer:
        """A layered workspace's data layer (layers.py) for snapshot `name`: each object its
        files name, hard-linked into the empty folder `data` with the store held (so that a
        collection cannot remove one meanwhile); then what makes its metadata layer, which
        needs the store no more (restore.restore with the Layer's `data`)."""
        _check(owner, "owner")
        _check(name, "snapshot name", transient=True)
        with self._owner(owner) as base:
            try:
                _, parts = _read_manifest(base / "manifests" / f"{name}.json.gz")
            except FileNotFoundError:
                raise SnapshotNotFound(f"no snapshot {name!r}") from None
            root, entries = parts[MAIN]
            layer = layers.DataLayer(base / "objects", data)
            for entry in entries:
                if entry.kind == "f" and entry.size:
                    layer.link(entry.digest)
            return Layer(root, entries, layer)

    def relink(
        self, owner: str, name: str, target: Path, ids: tuple[int, int], reuse: _restore.Reuse
    ) -> None:
        """The second step of a restore with `reuse` (restore.relink): the files left out
        linked, or copied if they changed since; with the store held, so that what is
        copied cannot be collected meanwhile (SnapshotNotFound if the snapshot was deleted
        since the first step)."""
        _check(owner, "owner")
        _check(name, "snapshot name", transient=True)
        with self._owner(owner) as base:
            if not (base / "manifests" / f"{name}.json.gz").exists():
                raise SnapshotNotFound(f"snapshot {name!r} was deleted while it was restored")
            _restore.relink(target, base / "objects", ids, reuse)

    def tree(self, owner: str, name: str, part: str = MAIN) -> dict[str, Entry]:
        """The snapshot's entries (its `part`) by path below the root, "a/b"."""
        _check(owner, "owner")
        _check(name, "snapshot name", transient=True)
        try:
            _, parts = _read_manifest(self.root / owner / "manifests" / f"{name}.json.gz")
        except FileNotFoundError:
            raise SnapshotNotFound(f"no snapshot {name!r}") from None
        if part not in parts:
            raise SnapshotNotFound(f"snapshot {name!r} holds no {part}")
        out: dict[str, Entry] = {}
        stack: list[str] = []
        for entry in parts[part][1]:
            del stack[entry.depth - 1 :]
            stack.append(entry.name)
            out["/".join(stack)] = entry
        return out

    def content(self, owner: str, digest: str, limit: int) -> bytes | None:
        """A stored file's first `limit` bytes (None: not in the store)."""
        _check(owner, "owner")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise InvalidRequest(f"not a content digest: {digest!r}")
        try:
            with open(self.root / owner / "objects" / digest[:2] / digest, "rb") as f:
                return f.read(limit)
        except FileNotFoundError:
            return None

    def hold_transient(self, owner: str, name: str) -> TransientHold:
        """Hold the transient capture `name` (a fork's or a checkpoint diff's: HELD_PREFIXES)
        for as long as it is in use: a lock file beside its manifest, locked (flock) until
        release(). The store removes such a capture that nobody holds (its process died
        mid-fork or mid-diff) with the content only it used, at the owner's next operation
        (_open)."""
        _check(owner, "owner")
        _check(name, "snapshot name", transient=True)
        if not name.startswith(HELD_PREFIXES):
            raise InvalidRequest(f"only a fork's or a diff's capture is held, not {name!r}")
        with self._owner(owner) as base:
            path = base / "manifests" / f"{name}{HOLD_SUFFIX}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            return TransientHold(path, fd)

    # --- helpers ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _owner(self, owner: str) -> Iterator[Path]:
        with self._locks_lock:
            lock = self._locks.setdefault(owner, threading.Lock())
        with lock:
            base, fd = self._open(owner)
            try:
                yield base
            finally:
                os.close(fd)

    def _open(self, owner: str) -> tuple[Path, int]:
        """The owner's folder, made when missing, and its lock file held (flock)."""
        base = self.root / owner
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for sub in ("objects", "manifests"):
            (base / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(base / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            for stale in (base / "objects").glob("tmp.*"):  # a capture that crashed
                stale.unlink()
            if _drop_unheld_transients(base):
                _collect(base)
        except BaseException:
            os.close(fd)
            raise
        return base, fd

    def _heads(self, base: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
        """Each manifest's head; kept in memory by (path, inode, mtime), so that listing and
        finding a lineage's newest snapshot do not read every manifest again."""
        paths = sorted((base / "manifests").glob("*.json.gz"))
        for gone in set(self._head_cache) - set(paths):
            if gone.parent == base / "manifests":
                del self._head_cache[gone]
        for path in paths:
            try:
                info = path.stat()
                mark = (info.st_ino, info.st_mtime_ns)
                known = self._head_cache.get(path)
                if known is None or known[0] != mark:
                    known = (mark, _read_manifest(path)[0])
                    self._head_cache[path] = known
            except FileNotFoundError:
                self._head_cache.pop(path, None)
                continue
            yield path, known[1]


class CaptureSession:
    """One capture of an owner's store in steps, holding its lock from begin() to end()."""

    def __init__(self, store: SnapshotStore, base: Path, fd: int, lock: threading.Lock) -> None:
        self._store = store
        self.base = base
        self._fd = fd
        self._lock = lock
        self.budget: tuple[int, str] | None = None
        """(bytes, why): new content this session may add to the store before it stops
        with QuotaExceeded(why) and removes what it added (a tenant's quota, the disk)."""
        self._added = 0
        self._new: set[str] = set()
        """Content this session added: what no manifest uses when it ends goes again."""
        self.defer = False
        """Whether new content a walk reads is kept in memory (up to DEFER_BYTES, files up
        to DEFER_FILE_BYTES) and written to the store by record(), before the manifest: a
        checkpoint's, whose call waits for the walk but not for record()."""
        self._deferred: dict[str, bytes] = {}
        self._deferred_bytes = 0
        self.added: set[str] = set()
        """Once recorded: the content the manifest names that this session added."""

    def _write(self, fd: int) -> tuple[str, int]:
        if self.defer:
            kept = self._keep(fd)
            if kept is not None:
                return kept
        digest, size, new = _store(self.base / "objects", fd)
        if new:
            self._added_new(digest, size)
        return digest, size

    def _added_new(self, digest: str, size: int) -> None:
        self._new.add(digest)
        self._added += size
        if self.budget is not None and self._added > self.budget[0]:
            raise QuotaExceeded(self.budget[1])

    def _keep(self, fd: int) -> tuple[str, int] | None:
        """Read a small file whole and keep it for flush() (its digest and size), or None
        (too large, or the memory's bound reached: it is stored now)."""
        size = os.fstat(fd).st_size
        if size > DEFER_FILE_BYTES or self._deferred_bytes + size > DEFER_BYTES:
            return None
        chunks, got = [], 0
        while chunk := os.pread(fd, DEFER_FILE_BYTES + 1 - got, got):
            chunks.append(chunk)
            got += len(chunk)
            if got > DEFER_FILE_BYTES:  # it grew: stored the usual way, from its start
                return None
        data = b"".join(chunks)
        digest = hashlib.sha256(data).hexdigest()
        if digest in self._deferred or (self.base / "objects" / digest[:2] / digest).exists():
            return digest, len(data)
        self._added_new(digest, len(data))
        self._deferred[digest] = data
        self._deferred_bytes += len(data)
        return digest, len(data)

    def flush(self) -> None:
        """Write the content kept by a deferred walk into the store (before a manifest names
        it)."""
        objects = self.base / "objects"
        for digest, data in self._deferred.items():
            _store_bytes(objects, digest, data)
        self._deferred.clear()
        self._deferred_bytes = 0

    def _walk(
        self, opener: Opener, cached: Cache, racy_after_ns: int, known: Known | None = None
    ) -> Captured:
        root_fd = opener()
        try:
            return capture(
                root_fd, self._store.limits, cached, self._write, racy_after_ns, known,
                native=self._store.native,
            )  # fmt: skip
        except QuotaExceeded:
            _collect(self.base)  # what this session added and no snapshot uses
            raise
        finally:
            os.close(root_fd)

    def cache(self, lineage: str) -> Cache:
        return self._store._cache(self.base, lineage)

    def holds(self, name: str) -> bool:
        """Whether the owner has a capture of that name (while the session holds the store,
        its content stays)."""
        return (self.base / "manifests" / f"{name}.json.gz").exists()

    def count(self) -> int:
        """The owner's listed snapshots (while the session holds the store, exact)."""
        return sum(not p.name.startswith("~") for p in (self.base / "manifests").glob("*.json.gz"))

    def precopy(self, trees: Mapping[str, Opener], lineage: str) -> tuple[Cache, Known]:
        """Copy the trees while they may still change (the sandbox runs): the cache of a
        capture that follows while they are frozen, which then reads only the files changed
        since, and MAIN's walk's records (capture.Known), which it takes over unread. A file
        whose ctime is within a second of this pass's start is left out of both: a write
        during the copy could leave its ctime unchanged (the kernel's coarse clock) while the
        content read is torn."""
        cached = self.cache(lineage)
        known: Known = {}
        racy_after = time.time_ns() - 1_000_000_000
        for part, opener in trees.items():
            got = self._walk(opener, cached, racy_after)
            cached.update(_keys(got.entries))
            if part == MAIN:
                known = got.known
        return cached, known

    def capture(
        self,
        name: str,
        trees: Mapping[str, Opener],
        lineage: str,
        cached: Cache,
        *,
        source: str = "",
        max_bytes: int = 0,
    ) -> tuple[Snapshot, CaptureStats]:
        """check_free, walk and record in one call."""
        self.check_free(name)
        got, stats = self.walk(trees, cached)
        return self.record(name, got, lineage, source=source, max_bytes=max_bytes), stats

    def check_free(self, name: str) -> None:
        """SnapshotExists when the owner has a snapshot of that name (checked before a walk:
        nothing else can take the name while the session holds the store)."""
        _check(name, "snapshot name", transient=True)
        if (self.base / "manifests" / f"{name}.json.gz").exists():
            raise SnapshotExists(f"snapshot {name!r} already exists")

    def walk(
        self, trees: Mapping[str, Opener], cached: Cache, known: Known | None = None
    ) -> tuple[dict[str, Captured], CaptureStats]:
        """Read `trees` (MAIN and optional other parts) into the store; files whose key is
        in `cached` are not read again; `known`: MAIN's last walk's records (capture.Known).
        This is all that needs the trees frozen. A file whose ctime is within RACY_NS of the
        walk's start gets no key: the kernel's coarse clock may give a write just after the
        thaw the same ctime (tests/unit/test_snapshot_walk.py)."""
        started = time.monotonic()
        walked_ns = time.time_ns()
        racy_after = walked_ns - RACY_NS
        got = {
            part: self._walk(opener, cached, racy_after, known if part == MAIN else None)
            for part, opener in trees.items()
        }
        for one in got.values():
            one.walked_ns = walked_ns
        seconds = time.monotonic() - started
        read = sum(c.files_read for c in got.values()), sum(c.bytes_read for c in got.values())
        return got, CaptureStats(*read, seconds)

    def record(
        self,
        name: str,
        got: Mapping[str, Captured],
        lineage: str,
        *,
        source: str = "",
        max_bytes: int = 0,
        compresslevel: int = 6,
    ) -> Snapshot:
        """Write the walk's manifest as `name` (gzip at `compresslevel`: a checkpoint's 1,
        quicker). With max_bytes, a snapshot after which the owner's store passes it is
        undone (QuotaExceeded)."""
        self.check_free(name)
        self.flush()
        snap = self.describe(name, got, lineage, source)
        _write_manifest(self.base / "manifests" / f"{name}.json.gz", snap, got, compresslevel)
        used = {e.digest for c in got.values() for e in c.entries if e.kind == "f"}
        self._drop(self._new - used)  # a pre-copy's copies of files changed since
        self.added = self._new & used
        self._new.clear()
        if max_bytes and self._store.usage(self.base.name).bytes > max_bytes:
            _delete(self.base, name)
            raise QuotaExceeded(
                f"the snapshot would take the tenant's snapshots past {max_bytes // MiB} MiB "
                "after deduplication; it was not kept (delete snapshots or ask for more)"
            )
        return snap

    def describe(
        self, name: str, got: Mapping[str, Captured], lineage: str, source: str = ""
    ) -> Snapshot:
        """The snapshot a walk makes, as record() writes it."""
        main = got[MAIN]
        return Snapshot(
            self.base.name, name, lineage, time.time(), main.files, len(main.entries),
            main.bytes, tuple(main.skipped), source, tuple(sorted(got)),
            min(c.walked_ns for c in got.values()),
        )  # fmt: skip

    def _drop(self, digests: set[str]) -> None:
        for digest in digests:
            with contextlib.suppress(FileNotFoundError):
                (self.base / "objects" / digest[:2] / digest).unlink()

    def end(self) -> None:
        """Give the store back; content added by a capture that was not recorded (it failed
        after its pre-copy) is removed."""
        try:
            self._drop(self._new)
        finally:
            try:
                os.close(self._fd)
            finally:
                self._lock.release()


def check_name(name: str) -> None:
    """A name a caller may give a snapshot (InvalidRequest otherwise)."""
    _check(name, "snapshot name")


def _check(value: str, what: str, *, transient: bool = False) -> None:
    if transient and _TRANSIENT.fullmatch(value):
        return
    if not _NAME.fullmatch(value):
        raise InvalidRequest(
            f"{what} {value!r}: 1 to 128 of A-Z a-z 0-9 . _ @ + -, starting with a letter or digit"
        )


def _store(objects: Path, src_fd: int) -> tuple[str, int, bool]:
    """Copy an open file into `objects` under its digest (kept once): (digest, size, whether
    the content is new to the store)."""
    tmp = objects / f"tmp.{os.getpid()}.{threading.get_ident()}"
    dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400)
    try:
        digest, size = hash_copy(src_fd, dst)
    finally:
        os.close(dst)
    final = objects / digest[:2] / digest
    if final.exists():
        tmp.unlink()
        return digest, size, False
    final.parent.mkdir(mode=0o700, exist_ok=True)
    os.replace(tmp, final)
    return digest, size, True


def _store_bytes(objects: Path, digest: str, data: bytes) -> None:
    """Put `data`, whose sha256 is `digest`, into `objects` (as _store does: a temporary
    file renamed into place, so a crash never leaves a partial object under its digest)."""
    final = objects / digest[:2] / digest
    if final.exists():
        return
    tmp = objects / f"tmp.{os.getpid()}.{threading.get_ident()}"
    dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(dst, view) :]
    finally:
        os.close(dst)
    final.parent.mkdir(mode=0o700, exist_ok=True)
    os.replace(tmp, final)


def _objects(objects: Path) -> Iterator[Path]:
    for sub in objects.iterdir():
        if sub.is_dir():
            yield from sub.iterdir()


def _opener(tree: Path) -> Opener:
    return lambda: os.open(tree, DIR_FLAGS)


def keys_of(entries: list[Entry]) -> Cache:
    """A capture's entries as the next capture's cache (file key to digest)."""
    return _keys(entries)


def _keys(entries: list[Entry]) -> Cache:
    return {e.key: e for e in entries if e.kind == "f" and e.key}


def _delete(base: Path, name: str) -> int:
    return _unlink_manifest(base, name).st_size + _collect(base)


def _unlink_manifest(base: Path, name: str) -> os.stat_result:
    """Remove the snapshot's manifest; what it was (SnapshotNotFound when there is none)."""
    manifest = base / "manifests" / f"{name}.json.gz"
    try:
        info = manifest.stat()
        manifest.unlink()
    except FileNotFoundError:
        raise SnapshotNotFound(f"no snapshot {name!r}") from None
    return info


def _delete_added(base: Path, name: str, added: set[str]) -> int:
    """_delete of a snapshot whose capture added `added` to the store: no manifest older than
    it can name content that was new then (a capture holds the store; a collection removes
    only what no manifest names), so only the manifests written since are read."""
    info = _unlink_manifest(base, name)
    for path in (base / "manifests").glob("*.json.gz"):
        if not added:
            break
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mtime_ns < info.st_mtime_ns:
                continue
            _, parts = _read_manifest(path)
            added.difference_update(e.digest for _, es in parts.values() for e in es)
    freed = info.st_size
    for digest in added:
        obj = base / "objects" / digest[:2] / digest
        with contextlib.suppress(FileNotFoundError):
            freed += obj.stat().st_size
            obj.unlink()
    return freed


def _collect(base: Path) -> int:
    """Remove the objects no manifest of the owner uses; the bytes freed."""
    used: set[str] = set()
    for path in sorted((base / "manifests").glob("*.json.gz")):
        with contextlib.suppress(FileNotFoundError):
            _, parts = _read_manifest(path)
            used.update(e.digest for _, es in parts.values() for e in es if e.kind == "f")
    freed = 0
    for obj in _objects(base / "objects"):
        if obj.name not in used:
            with contextlib.suppress(FileNotFoundError):
                freed += obj.stat().st_size
                obj.unlink()
    return freed


def _write_manifest(
    path: Path, snap: Snapshot, got: Mapping[str, Captured], compresslevel: int = 6
) -> None:
    head = {
        "format": _FORMAT, "name": snap.name, "lineage": snap.lineage, "created": snap.created,
        "files": snap.files, "entries": snap.entries, "bytes": snap.bytes,
        "skipped": list(snap.skipped), "source": snap.source, "parts": list(snap.parts),
        "walked_ns": snap.walked_ns,
    }  # fmt: skip
    # As json.dumps(ensure_ascii=True, separators=(",", ":")) writes it, each entry's text
    # made by Entry.json_text (json.dumps of 10,000 entries' lists took about 45 ms).
    parts = ",".join(
        f'{json_quoted(part)}:{{"root":[{one.root_mode},{one.root_mtime_ns}],"entries":['
        + ",".join([e.json_text() for e in one.entries])
        + "]}"
        for part, one in got.items()
    )
    head_text = json.dumps(head, ensure_ascii=True, separators=(",", ":"))
    text = f'{{"head":{head_text},"parts":{{{parts}}}}}'
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(gzip.compress(text.encode("ascii"), compresslevel=compresslevel))
    os.replace(tmp, path)


Part = tuple[tuple[int, int], list[Entry]]


def _read_manifest(path: Path) -> tuple[dict[str, Any], dict[str, Part]]:
    body = json.loads(gzip.decompress(path.read_bytes()))
    if body["head"].get("format") != _FORMAT:
        raise ValueError(f"{path}: unknown snapshot format")
    parts = {
        str(part): (
            (int(raw["root"][0]), int(raw["root"][1])),
            [Entry.from_json(e) for e in raw["entries"]],
        )
        for part, raw in body["parts"].items()
    }
    return body["head"], parts


def _snapshot(owner: str, head: dict[str, Any]) -> Snapshot:
    return Snapshot(
        owner, head["name"], head["lineage"], head["created"], head["files"],
        head["entries"], head["bytes"], tuple(head["skipped"]), head.get("source", ""),
        tuple(head.get("parts", [MAIN])), int(head.get("walked_ns", 0)),
    )  # fmt: skip
