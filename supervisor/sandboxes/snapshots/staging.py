"""A workspace made from a snapshot beside the one in use, then switched in: the copy (the
long part) happens while the old container still runs, and a restore that fails there (the
snapshot does not fit the workspace's size cap, the disk is full) leaves the sandbox as it
was.

    uncapped  STATE/sandboxes/<id>/workspace.restoring/ is filled, then swapped with
              workspace/ in one step (renameat2's exchange), and the old one removed
    capped    a new file system image (workspace.img.restoring) is made, mounted at
              workspace.restoring/ and filled, unmounted, then renamed over workspace.img;
              the next container start mounts it at workspace/
    layered   layers.restoring/ is filled (layers.py: the files' metadata, their content
              linked from the store), put in place of layers/ in one step (renamed, or
              exchanged with the old layers), then an empty workspace.restoring/ swapped
              with workspace/; the next container start mounts the layers there

Switching to a layered workspace is the step that puts its layers in place: a crash after
it finds the new layers (whatever workspace/ holds below the mount point is never seen, and
the next restore removes it). Switching away from one, its layers are renamed away after the
folders are exchanged: a crash between finds the old layers, the restore not done.

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
from stockade.supervisor.sandboxes import hostfs, layers, workspaces
from stockade.supervisor.sandboxes.layout import Paths
from stockade.supervisor.sandboxes.snapshots.repository import Layer, SnapshotStore
from stockade.supervisor.sandboxes.snapshots.restore import Reuse, restore

MiB = 1 << 20
STAGED_FOLDER = "workspace.restoring"
STAGED_LAYERS = "layers.restoring"
OLD_LAYERS = layers.OLD


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
    layers: Path | None = None
    """The staged layers of a layered workspace (stage with layered=True)."""

    def switch(self, *, remove: bool = True) -> None:
        """Put the staged workspace in place of the current one (no container may use it:
        the files left out are linked from it first). remove=False: the old one is left in
        the staged folder's place for remove_old() (a new container may start meanwhile)."""
        paths = self.paths
        if self.reuse is not None and self.store is not None:
            self.store.relink(self.owner, self.name, self.folder, self.ids, self.reuse)
        workspaces.unmount(paths.workspace)  # layers or an image a new container mounts
        if self.layers is not None:
            if paths.layers.is_dir():
                _exchange(self.layers, paths.layers)  # the old ones: removed by remove_old
            else:
                os.rename(self.layers, paths.layers)
            _exchange(self.folder, paths.workspace)  # below the mount point: never seen
        elif self.image is not None:
            os.replace(self.image, paths.image)
            with contextlib.suppress(OSError):
                self.folder.rmdir()
        else:
            _exchange(self.folder, paths.workspace)  # atomic: a crash leaves one or the other
        if self.layers is None and paths.layers.is_dir():
            os.rename(paths.layers, paths.root / OLD_LAYERS)  # no longer layered
        if remove:
            self.remove_old()

    def remove_old(self) -> None:
        """Remove the workspace a switch replaced (what a crash leaves, the next stage does)."""
        if self.image is None:
            _remove(self.folder)
        _remove(self.paths.root / STAGED_LAYERS)
        _remove(self.paths.root / OLD_LAYERS)

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
    layered: bool = False,
) -> Staged:
    """Fill a new workspace from the snapshot, owned by `ids`; with cap_mb, in a new file
    system of that size. `link`: the snapshot is of this sandbox (its lineage), whose
    unchanged files switch() may link rather than copy (never with cap_mb: a link cannot
    cross file systems). `layered` (never with cap_mb or link): a layered workspace
    (layers.py). Anything that fails removes what was made and raises."""
    if layered:
        if cap_mb or link:
            raise ValueError("a layered workspace is neither capped nor linked")
        return stage_meta(stage_data(store, owner, name, paths), ids)
    discard(paths)  # what a crash left
    folder = paths.root / STAGED_FOLDER
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


@dataclass(frozen=True)
class Planned:
    """A layered workspace half staged (stage_data): its data layer made, with the store."""

    paths: Paths
    layer: Layer
    store: SnapshotStore
    owner: str
    name: str


def stage_data(store: SnapshotStore, owner: str, name: str, paths: Paths) -> Planned:
    """The first half of a layered stage: the staged layers' folders, and the data layer's
    links to the store's objects, which need the owner's store held (a restore's, a fork's
    caller holds it for this half only: see stage_meta)."""
    discard(paths)  # what a crash left
    try:
        (paths.root / STAGED_FOLDER).mkdir(mode=0o700)
        _, data = layers.make(paths.root / STAGED_LAYERS)
        layer = store.layer_data(owner, name, data)
    except BaseException:
        discard(paths)
        raise
    return Planned(paths, layer, store, owner, name)


def stage_meta(planned: Planned, ids: tuple[int, int]) -> Staged:
    """The second half: the metadata layer, owned by `ids`, made from the entries alone
    (without the store: forks of one call make theirs side by side)."""
    paths, staged = planned.paths, planned.paths.root / STAGED_LAYERS
    layer = planned.layer
    try:
        meta = staged / layers.META
        restore(meta, layer.root, layer.entries, layer.data.objects, ids, data=layer.data)
        layers.finish(staged)
    except BaseException:
        discard(paths)
        raise
    folder = paths.root / STAGED_FOLDER
    return Staged(
        paths, folder, None, planned.store, planned.owner, planned.name, ids, layers=staged
    )


def discard(paths: Paths) -> None:
    """Remove a staged workspace (mounted or not) and its image, if any."""
    folder = paths.root / STAGED_FOLDER
    workspaces.unmount(folder)
    _remove(folder)
    (paths.root / "workspace.img.restoring").unlink(missing_ok=True)
    _remove(paths.root / STAGED_LAYERS)
    _remove(paths.root / OLD_LAYERS)


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
