"""A workspace made from a snapshot beside the one in use, then switched in: the copy (the
long part) happens while the old container still runs, and a restore that fails there (the
snapshot does not fit the workspace's size cap, the disk is full) leaves the sandbox as it
was.

    uncapped  STATE/sandboxes/<id>/workspace.restoring/ is filled, then swapped with
              workspace/ in one step (renameat2's exchange), and the old one removed
    capped    a new file system image (workspace.img.restoring) is made, mounted at
              workspace.restoring/ and filled, unmounted, then renamed over workspace.img;
              the next container start mounts it at workspace/

A restore into the sandbox the snapshot was taken of (stage(..., link=True), uncapped)
copies only the files changed since: the others are left out of the staged folder, and
switch() hard-links them from the workspace it replaces first (snapshots/restore.py says
when a file may be linked). A crash before the switch leaves the staged folder with links
to the live files, which the next stage() removes (removing a link changes no content); a
crash after the exchange leaves the old folder there, removed the same way.

Blocking (copies, mkfs, mount): the caller runs these through asyncio.to_thread, with the
key's lock held; switch() only while no container uses the workspace.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from dataclasses import dataclass
from pathlib import Path

from stockade.supervisor.errors import InvalidRequest
from stockade.supervisor.sandboxes import hostfs, workspaces
from stockade.supervisor.sandboxes.layout import Paths
from stockade.supervisor.sandboxes.snapshots.repository import SnapshotStore
from stockade.supervisor.sandboxes.snapshots.restore import Reuse

MiB = 1 << 20


class SnapshotTooBig(InvalidRequest):
    """The snapshot's files do not fit in the workspace's size cap (or the disk)."""


@dataclass(frozen=True)
class Staged:
    paths: Paths
    folder: Path
    image: Path | None
    store: SnapshotStore | None = None
    owner: str = ""
    name: str = ""
    ids: tuple[int, int] = (-1, -1)
    reuse: Reuse | None = None
    """The files left for switch() to link (stage with link=True), and how many were."""

    def switch(self, *, remove: bool = True) -> None:
        """Put the staged workspace in place of the current one (no container may use it:
        the files left out are linked from it first). remove=False: the old one is left in
        the staged folder's place for remove_old() (a new container may start meanwhile)."""
        paths = self.paths
        if self.reuse is not None and self.store is not None:
            self.store.relink(self.owner, self.name, self.folder, self.ids, self.reuse)
        if self.image is not None:
            workspaces.unmount(paths.workspace)
            os.replace(self.image, paths.image)
            with contextlib.suppress(OSError):
                self.folder.rmdir()
            return
        _exchange(self.folder, paths.workspace)  # atomic: a crash leaves one or the other
        if remove:
            self.remove_old()

    def remove_old(self) -> None:
        """Remove the workspace a switch replaced (what a crash leaves, the next stage does)."""
        if self.image is None:
            _remove(self.folder)

    def discard(self) -> None:
        discard(self.paths)


def stage(
    store: SnapshotStore,
    owner: str,
    name: str,
    paths: Paths,
    ids: tuple[int, int],
    cap_mb: int,
    *,
    link: bool = False,
) -> Staged:
    """Fill a new workspace from the snapshot, owned by `ids`; with cap_mb, in a new file
    system of that size. `link`: the snapshot is of this sandbox (its lineage), whose
    unchanged files switch() may link rather than copy (never with cap_mb: a link cannot
    cross file systems). Anything that fails removes what was made and raises."""
    discard(paths)  # what a crash left
    folder = paths.root / "workspace.restoring"
    image = paths.root / "workspace.img.restoring" if cap_mb else None
    reuse = Reuse(paths.workspace) if link and image is None else None
    try:
        if image is not None:
            folder.mkdir(mode=0o700)
            workspaces.make_image(image, cap_mb, *ids)
            workspaces.mount_image(image, folder)
        store.restore(owner, name, folder, ids, reuse=reuse)
        if image is not None:
            workspaces.unmount(folder)
    except BaseException as exc:
        discard(paths)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f"the workspace's size cap ({cap_mb} MiB)" if cap_mb else "the disk"
            raise SnapshotTooBig(f"snapshot {name!r} does not fit in {where}") from None
        raise
    return Staged(paths, folder, image, store, owner, name, ids, reuse)


def discard(paths: Paths) -> None:
    """Remove a staged workspace (mounted or not) and its image, if any."""
    folder = paths.root / "workspace.restoring"
    workspaces.unmount(folder)
    _remove(folder)
    (paths.root / "workspace.img.restoring").unlink(missing_ok=True)


def cap_of(paths: Paths, configured_mb: int) -> int:
    """The size cap a restored workspace gets: the configured one, else the size of the
    image it had (capped before), else none."""
    if configured_mb:
        return configured_mb
    try:
        return max(1, os.stat(paths.image).st_size // MiB)
    except FileNotFoundError:
        return 0


_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> None:
    """Swap two folders in one step (renameat2 RENAME_EXCHANGE, Linux 3.15)."""
    done = _libc.renameat2(_AT_FDCWD, bytes(a), _AT_FDCWD, bytes(b), _RENAME_EXCHANGE)
    if done != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"cannot switch {a} and {b}: {os.strerror(code)}")


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        hostfs.remove_tree(path)
