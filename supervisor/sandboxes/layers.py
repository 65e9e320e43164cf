"""Layered workspaces: a workspace made from a snapshot (a fork's, a restore's into another
key) as an overlay over the snapshot instead of a copy of it, so that making one costs a
metadata entry per file, not its bytes (issue 30).

    STATE/sandboxes/<sandbox id>/layers/
    ├── meta/    the snapshot's tree: folders, links, and each file with content as an empty
    │            sparse file of its size, mode, owner, mtime and E2B attributes, whose
    │            trusted.overlay.metacopy and .redirect attributes name its object in data/
    ├── data/    the snapshot's objects, each once under a short name (hex, in the order
    │            first met), hard links to the store's (a copy where a link cannot be made:
    │            another file system, too many links to one object)
    ├── upper/   what the sandbox wrote since: overlayfs copies a file up on its first write
    └── work/    overlayfs's own

mounted at workspace/ as `overlay -o lowerdir=meta::data,upperdir=upper,workdir=work,
metacopy=on` (data/ a data-only layer, Linux 6.5 or later), nosuid and nodev. Layout's
hand_over mounts it before each container starts, once the layers have the container's ids
(a host's restart unmounts it), and it is unmounted when the container goes, as a
size-capped workspace's file system is.

What keeps it sound:
- **The store is never written through it.** overlayfs never writes a lower layer: a write
  copies the file up into upper/ first. The links in data/ keep each object alive after the
  store collects it (a deleted snapshot), so nothing pins the store; the store's own
  objects are never renamed or rewritten (content-addressed).
- **A sandbox cannot steer a redirect.** The metacopy and redirect attributes are
  `trusted.overlay.*`: through the mount, overlayfs keeps such a name set on a file escaped
  (`trusted.overlay.overlay.*`), where it means nothing, and setting any `trusted.*`
  attribute needs CAP_SYS_ADMIN in the host's user namespace, which no sandbox has. A
  redirect reaches only data/, which holds this workspace's snapshot's own objects (the
  tenant's, never another's).
- **The workspace is marked by layers/ itself**, a root-owned folder beside workspace/ that
  sandbox code never sees. A switch to or from a layered workspace renames it in one step
  (staging.py); workspace/ below the mount point is then an empty folder.

Blocking (mount, file system calls): callers run these through asyncio.to_thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Final

from stockade.supervisor.errors import SandboxBroken
from stockade.supervisor.sandboxes import workspaces

META, DATA, UPPER, WORK = "meta", "data", "upper", "work"
OLD: Final = "layers.old"
"""Where a sandbox's layers are renamed to, in one step, before they are removed."""
METACOPY: Final = "trusted.overlay.metacopy"
REDIRECT: Final = "trusted.overlay.redirect"
OPTIONS: Final = "metacopy=on,redirect_dir=on,nosuid,nodev,noatime"
_UNSAFE: Final = frozenset(",:\\=\n")
"""Characters that would change the meaning of overlayfs's option string."""
_NOT_LINKED: Final = (errno.EXDEV, errno.EMLINK, errno.EPERM)


class DataLayer:
    """A layered workspace's data layer as it is filled: each object of the store linked
    into it once, under a short name (a redirect of a few bytes fits in the metadata file's
    inode, where a 64-digit one would take a block of its own per file)."""

    def __init__(self, objects: Path, folder: Path) -> None:
        self.objects, self.folder = objects, folder
        self._names: dict[str, str] = {}

    def link(self, digest: str) -> None:
        """Link the store's object `digest` into the layer (once: a second file of the same
        content finds it there). Only with the store held."""
        if digest in self._names:
            return
        if len(digest) != 64 or digest.strip("0123456789abcdef"):
            raise ValueError(f"object {digest!r}: damaged manifest")
        name = f"{len(self._names):x}"
        _link_or_copy(self.objects / digest[:2] / digest, self.folder / name)
        self._names[digest] = name

    def redirect(self, digest: str) -> bytes:
        """The redirect naming the object `digest`, linked before (KeyError otherwise: the
        metadata layer is made without the store)."""
        return f"/{self._names[digest]}".encode("ascii")


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as exc:  # another file system, too many links to the object
        if exc.errno not in _NOT_LINKED:
            raise
        partial = dst.with_name(dst.name + ".partial")
        shutil.copyfile(src, partial, follow_symlinks=False)
        os.chmod(partial, 0o600)
        os.replace(partial, dst)


def name_object(fd: int, redirect: bytes) -> None:
    """Mark the open metadata-layer file as overlayfs's metacopy of the data layer's
    `redirect`."""
    os.setxattr(fd, METACOPY, b"")
    os.setxattr(fd, REDIRECT, redirect)


def make(folder: Path) -> tuple[Path, Path]:
    """An empty layers folder: (its metadata layer, its data layer) to fill."""
    folder.mkdir(mode=0o700)
    for name in (META, DATA, UPPER, WORK):
        (folder / name).mkdir(mode=0o700)
    return folder / META, folder / DATA


def finish(folder: Path) -> None:
    """Once the metadata layer is filled: the workspace's root (overlayfs takes it from the
    upper layer) gets the snapshot root's owner, mode and mtime."""
    root = os.lstat(folder / META)
    upper = folder / UPPER
    os.chown(upper, root.st_uid, root.st_gid, follow_symlinks=False)
    os.chmod(upper, root.st_mode & 0o7777)
    os.utime(upper, ns=(root.st_mtime_ns, root.st_mtime_ns), follow_symlinks=False)


def options(folder: Path) -> str:
    """overlayfs's option string for the layers in `folder` (module doc)."""
    text = str(folder.resolve())
    if _UNSAFE & set(text):
        raise SandboxBroken(f"{text}: a layered workspace's path may not hold any of , : \\ =")
    meta, data, upper, work = (f"{text}/{name}" for name in (META, DATA, UPPER, WORK))
    return f"lowerdir={meta}::{data},upperdir={upper},workdir={work},{OPTIONS}"


def mount(folder: Path, target: Path) -> None:
    """Mount the layers in `folder` at `target` (already a mount point: nothing)."""
    if target.is_mount():
        return
    workspaces.run_tool(
        "mount", "-t", "overlay", "-o", options(folder), "stockade-layers", str(target)
    )


def usable(path: Path) -> bool:
    """Whether `path` (the sandboxes' folder) can hold layered workspaces."""
    return not _UNSAFE & set(str(path.resolve()))


def probe(under: Path) -> str:
    """Why layered workspaces cannot be made under `under` on this host ("" when they can):
    one file is made, mounted and read back, as a workspace's would be."""
    if os.geteuid() != 0:
        return "the supervisor does not run as root"
    if not usable(under):
        return f"{under} holds one of , : \\ = (overlayfs's option separators)"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount or umount not found (Debian: apt-get install mount)"
    under.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".layers-probe-", dir=under))
    target = scratch / "mounted"
    try:
        meta, data = make(scratch / "layers")
        (data / "0").write_bytes(b"layered\n")
        fd = os.open(meta / "file", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, 8)
            os.setxattr(fd, METACOPY, b"")
            os.setxattr(fd, REDIRECT, b"/0")
        finally:
            os.close(fd)
        target.mkdir()
        mount(scratch / "layers", target)
        try:
            if (target / "file").read_bytes() != b"layered\n":
                return "overlayfs did not read a metacopy file's content from its data layer"
        finally:
            workspaces.run_tool("umount", str(target))
        return ""
    except (OSError, SandboxBroken) as exc:
        return f"overlayfs with a data-only layer and metacopy (Linux 6.5 or later): {exc}"
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(scratch)
