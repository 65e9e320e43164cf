"""A sandbox's folder on the host: its workspace, the agent's socket folder, the size-capped
file systems mounted there, and the hand-over of the workspace to the ids the sandbox user has
on the host.

    STATE/sandboxes/<sandbox id>/
    ├── key             the (tenant-scoped) key the folder serves
    ├── workspace/      /workspace in the container (a file system of its own when capped)
    ├── workspace.img   that file system's sparse image (sandbox.workspace_size_mb)
    ├── layers/         a layered workspace's layers, mounted at workspace/ (layers.py)
    ├── run/            /run/stockade: the agent's framed socket (agent.sock.frames; an
    │                   agent of protocol 3 or older: agent.sock too); root's once it listens
    ├── tmp/            /tmp's tmpfs when the supervisor mounts it (an inode cap)
    ├── owner           the host uid:gid the workspace was last handed to
    ├── retired-at      written when the container is removed: starts the retention
    └── pool-id         the warm-pool container the folder began with
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from stockade.supervisor.config import Config
from stockade.supervisor.engines import userns
from stockade.supervisor.engines.backends.base import ContainerInfo
from stockade.supervisor.errors import ConfigError, SandboxBroken
from stockade.supervisor.keys import sandbox_id
from stockade.supervisor.sandboxes import hostfs, layers, workspaces
from stockade.supervisor.sandboxes.agent_frames import FRAMES_SUFFIX

log = logging.getLogger("stockade")

POOL_PREFIX = "pool-"
"""Folders of warm-pool containers under STATE/sandboxes (sandbox ids are hex: no clash)."""
RETIRED = "retired-at"
POOL_ID = "pool-id"
PAUSED = "paused-at"


@dataclass(frozen=True)
class Paths:
    root: Path
    workspace: Path
    run: Path
    socket: Path
    key_file: Path
    image: Path
    """The workspace's file system when it is size-capped (sandbox.workspace_size_mb)."""
    tmp: Path
    """/tmp's tmpfs when the supervisor mounts it (an inode cap the engine cannot set)."""
    owners: Path
    """The host uid:gid the workspace was last handed to, one per line (two while a hand-over
    to new ids is under way): the ids the sandbox user had, to be translated."""

    @property
    def layers(self) -> Path:
        """A layered workspace's layers (layers.py): its folder's presence makes it one."""
        return self.root / "layers"

    @property
    def retired(self) -> Path:
        return self.root / RETIRED

    @property
    def pool_id(self) -> Path:
        return self.root / POOL_ID

    @property
    def paused(self) -> Path:
        """Stamped when the sandbox is paused (its mtime: since when), for a restart's
        adoption: the engine says a container is paused, not since when."""
        return self.root / PAUSED


def paths_at(root: Path) -> Paths:
    run = root / "run"
    return Paths(
        root, root / "workspace", run, run / "agent.sock", root / "key",
        root / "workspace.img", root / "tmp", root / "owner",
    )  # fmt: skip


def write_key(path: Path, key: str) -> None:
    """A key file: the key's UTF-8 bytes and nothing else. Written and read as bytes, so a
    key is read back byte for byte: text mode would read a CR (or CR LF) as LF, and the
    folder of `a\rb` would name the key `a\nb` (a phantom sandbox, a workspace never
    expired)."""
    path.write_bytes(key.encode("utf-8", "surrogatepass"))


def read_key(path: Path) -> str:
    """The key a key file names (write_key)."""
    return path.read_bytes().decode("utf-8", "surrogatepass")


class Layout:
    """The folders of every sandbox of one supervisor, under STATE/sandboxes."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self.root = config.state_dir / "sandboxes"
        uid, _, gid = config.sandbox.user.partition(":")
        self.uid, self.gid = int(uid), int(gid or uid)
        self.host_tmp = False
        """Whether /tmp is a tmpfs the supervisor mounts (decided at start, see manager)."""
        self.layered = False
        """Whether workspaces made from snapshots are layered (decided at start: layers.py)."""

    def of(self, key: str) -> Paths:
        return paths_at(self.root / sandbox_id(key))

    def prepare(self, key: str) -> Paths:
        """The key's folder, ready for a new container of its own."""
        paths = self.of(key)
        paths.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_key(paths.key_file, key)
        paths.retired.unlink(missing_ok=True)
        paths.pool_id.unlink(missing_ok=True)  # a container of its own now, not the pool's
        self.prepare_subdirs(paths)
        return paths

    def prepare_pool(self, pool_id: str) -> Paths:
        paths = paths_at(self.root / f"{POOL_PREFIX}{pool_id}")
        paths.root.mkdir(mode=0o700)
        paths.pool_id.write_text(pool_id + "\n")
        self.prepare_subdirs(paths)
        return paths

    def prepare_subdirs(self, paths: Paths) -> None:
        """A new workspace, and the agent's folder, for the sandbox user; an existing
        workspace keeps its owner until hand_over (which reads it) gives it over."""
        for directory in (paths.workspace, paths.run):
            try:
                directory.mkdir()
            except FileExistsError:
                if directory == paths.workspace:
                    continue
            os.chown(directory, self.uid, self.gid, follow_symlinks=False)
        os.chmod(paths.run, 0o700)
        for socket in _sockets(paths):
            socket.unlink(missing_ok=True)

    def mount(self, paths: Paths) -> None:
        """The file systems the supervisor makes for a new container: the size-capped
        workspace when configured (or capped before: its files live in the image), and /tmp
        when the engine cannot cap its inodes (a fresh tmpfs per container). A layered
        workspace is mounted by hand_over, once its layers have the container's ids."""
        sb = self._config.sandbox
        if self.capped(paths):
            if paths.layers.is_dir() and not paths.image.exists():
                _layers_into_image(paths, sb.workspace_size_mb, (self.uid, self.gid))
            workspaces.mount(paths.image, paths.workspace, sb.workspace_size_mb, self.uid, self.gid)
        if self.host_tmp:
            workspaces.mount_tmp(paths.tmp, sb.tmp_size_mb * 1024 * 1024, sb.tmp_inodes)

    def mount_existing(self, paths: Paths) -> bool:
        """Mount the workspace's own file system or layers when it has one and it is not
        mounted (a capture of a sandbox without a container); whether this mounted it."""
        if paths.workspace.is_mount():
            return False
        if self.capped(paths) and paths.image.exists():
            workspaces.mount_image(paths.image, paths.workspace, fresh=False)
            return True
        if not self.capped(paths) and paths.layers.is_dir():
            layers.mount(paths.layers, paths.workspace)
            return True
        return False

    def needs_mount(self, paths: Paths) -> bool:
        """Whether the workspace should be a mount point (capped, or layered)."""
        return self.capped(paths) or paths.layers.is_dir()

    def capped(self, paths: Paths) -> bool:
        """Whether the workspace is a file system of its own: capped now, or before."""
        return bool(self._config.sandbox.workspace_size_mb) or paths.image.exists()

    def hand_over(self, paths: Paths, handed: list[tuple[int, int]], maps: userns.IdMaps) -> None:
        """Before the container starts: give its workspace and agent directory to the host
        ids its user has (itself without a user namespace). A workspace made for other ids
        (an earlier container had another range, or none) is walked, and what the sandbox
        user owned there changes hands; with unchanged ids nothing is walked. A layered
        workspace's layers change hands where they lie, and are then mounted."""
        try:
            ids = maps.host_ids(self.uid, self.gid)
        except ConfigError as exc:
            raise SandboxBroken(str(exc)) from None
        handed.append(ids)
        layered = not self.capped(paths) and paths.layers.is_dir()
        root = paths.layers / layers.UPPER if layered else paths.workspace  # its root's owner
        previous = _read_owners(paths.owners) or [_owner_of(root, ids)]
        try:
            if previous != [ids]:
                _write_owners(paths.owners, [*previous, ids])
                uids, gids = {u for u, _ in previous}, {g for _, g in previous}
                if layered:
                    changed = _chown_layers(paths, ids, uids, gids)
                else:
                    changed = hostfs.chown_tree(paths.workspace, ids, uids, gids)
                _write_owners(paths.owners, [ids])
                log.info(
                    "workspace %s handed to %s:%s (%d entries)", paths.workspace, *ids, changed
                )
            if layered:
                layers.mount(paths.layers, paths.workspace)
            os.chown(paths.workspace, *ids, follow_symlinks=False)
            os.chown(paths.run, *ids, follow_symlinks=False)
        except OSError as exc:
            raise SandboxBroken(f"cannot hand the workspace to the sandbox's ids: {exc}") from exc

    def workspace_ids(self, paths: Paths) -> tuple[int, int]:
        """The host ids the workspace was last handed to (the sandbox user's there), or the
        sandbox user's own ids for a workspace never handed over (hand_over moves them)."""
        owners = _read_owners(paths.owners)
        return owners[-1] if owners else (self.uid, self.gid)

    def check_mapped(self, info: ContainerInfo, ids: tuple[int, int]) -> None:
        """The running container's own uid map (from the kernel) must give the sandbox user
        the host uid its workspace was handed to; else the agent could not use it."""
        try:
            text = Path(f"/proc/{info.pid}/uid_map").read_text()
        except OSError:  # not on this host's /proc (or already gone): the agent's start tells
            return
        host = userns.to_host(userns.parse_proc_map(text), self.uid)
        if host != ids[0]:
            raise SandboxBroken(
                f"the container maps uid {self.uid} to host uid {host}, not {ids[0]} as its "
                "engine said; its workspace was handed to the wrong ids"
            )

    def pool_folders(self) -> dict[str, Path]:
        """pool id -> the folder holding it (pool-ID while unassigned, else a key's)."""
        found = {}
        for marker in self.root.glob(f"*/{POOL_ID}"):
            try:
                found[marker.read_text().strip()] = marker.parent
            except OSError:
                continue
        return found

    def drop_pool_folders(self) -> None:
        """Delete the folders of unassigned pool containers, at start (their containers
        were just removed). They never held a caller's files."""
        for folder in self.root.glob(f"{POOL_PREFIX}*"):
            unmount(paths_at(folder))
            hostfs.remove_tree(folder)

    def folders(self) -> list[tuple[str, Paths]]:
        """(key, paths) of every folder that names a key."""
        found = []
        for key_file in sorted(self.root.glob("*/key")):
            key = read_key(key_file)
            found.append((key, paths_at(key_file.parent)))
        return found


def seal_run_dir(paths: Paths) -> None:
    """Once the agent listens, hand its socket directory to root, so that code in the sandbox
    cannot replace the socket with a symlink that would steer the supervisor to another
    socket on the host."""
    os.chown(paths.run, 0, 0, follow_symlinks=False)
    os.chmod(paths.run, 0o755)


def run_dir_is_sealed(paths: Paths) -> bool:
    """The folder is root's and holds the agent's socket, framed or (protocol 3 or older)
    gRPC, as a socket."""
    try:
        run = os.lstat(paths.run)
    except OSError:
        return False
    if run.st_uid != 0 or not stat.S_ISDIR(run.st_mode):
        return False
    for socket in _sockets(paths):
        try:
            if stat.S_ISSOCK(os.lstat(socket).st_mode):
                return True
        except OSError:
            continue
    return False


def _sockets(paths: Paths) -> tuple[Path, Path]:
    """The agent's sockets: gRPC (protocol 3 or older) and framed."""
    return paths.socket, paths.socket.with_name(paths.socket.name + FRAMES_SUFFIX)


def unmount(paths: Paths, *, workspace: bool = True) -> None:
    """Undo Layout.mount once the container is gone (no error when nothing is mounted); the
    workspace's file system stays mounted when a new container follows at once."""
    if workspace:
        workspaces.unmount(paths.workspace)
    workspaces.unmount(paths.tmp)


def _chown_layers(paths: Paths, ids: tuple[int, int], uids: set[int], gids: set[int]) -> int:
    """A layered workspace handed to new ids: its metadata and upper layers, each changed
    where it lies, unmounted (through the mount, overlayfs would copy every file's metadata
    up into the upper layer first); what the mount shows is the same."""
    workspaces.unmount(paths.workspace)  # mounted only when kept for a container made again
    return sum(
        hostfs.chown_tree(paths.layers / name, ids, uids, gids)
        for name in (layers.META, layers.UPPER)
    )


def _layers_into_image(paths: Paths, size_mb: int, ids: tuple[int, int]) -> None:
    """A layered workspace about to be capped: its merged files become the content of the
    new file system, and the layers then go."""
    workspaces.unmount(paths.workspace)
    layers.mount(paths.layers, paths.workspace)
    try:
        workspaces.make_image_from(paths.image, paths.workspace, size_mb, *ids)
    finally:
        workspaces.unmount(paths.workspace)
    drop_layers(paths)


def drop_layers(paths: Paths) -> None:
    """Remove a layered workspace's layers (renamed away first: one step unmarks it)."""
    if not paths.layers.is_dir():
        return
    old = paths.root / layers.OLD
    if old.exists():
        hostfs.remove_tree(old)
    os.rename(paths.layers, old)
    hostfs.remove_tree(old)


def stamp(path: Path) -> None:
    """Write the time into `path` (its mtime is what counts)."""
    path.write_text(f"{time.time():.0f}\n")


def _owner_of(folder: Path, default: tuple[int, int]) -> tuple[int, int]:
    """Who owns `folder` now: a workspace made before its owners file was kept (or by a
    version with another default sandbox user) is handed over from them; never from root
    (whatever root owns in a workspace stays root's)."""
    try:
        info = os.lstat(folder)
    except OSError:
        return default
    ok = stat.S_ISDIR(info.st_mode) and info.st_uid != 0 and info.st_gid != 0
    return (info.st_uid, info.st_gid) if ok else default


def _read_owners(path: Path) -> list[tuple[int, int]]:
    try:
        lines = path.read_text().split("\n")
    except FileNotFoundError:
        return []
    pairs = [line.split(":") for line in lines if line]
    return [(int(u), int(g)) for u, g in pairs]


def _write_owners(path: Path, owners: list[tuple[int, int]]) -> None:
    partial_file = path.with_name(path.name + ".partial")
    partial_file.write_text("".join(f"{u}:{g}\n" for u, g in owners))
    partial_file.rename(path)
