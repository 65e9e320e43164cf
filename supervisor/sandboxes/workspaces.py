"""Size-capped workspaces: an ext4 file system per sandbox in a sparse image file beside the
workspace directory, loop-mounted at it on the host (the supervisor runs as root).

The engine bind-mounts the directory into the container, so the container sees the file
system. The mount outlives the container and the supervisor (a restart finds it mounted);
destroying the sandbox unmounts it; deleting the workspace deletes the image too. Only the
kernel reads the image; nothing here walks files that sandbox code wrote, except mkfs's copy
of a directory that held files before the cap was set (made while no container runs).

Blocking (subprocesses): the sandbox manager calls these through asyncio.to_thread.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from stockade.supervisor.errors import ConfigError, SandboxBroken

MOUNT_OPTIONS = "loop,nosuid,nodev,noatime"
_TIMEOUT_S = 120.0


def check_support() -> None:
    """Raise ConfigError saying why this machine cannot loop-mount workspaces."""
    missing = [tool for tool in ("mkfs.ext4", "mount", "umount") if shutil.which(tool) is None]
    if os.geteuid() != 0:
        why = "the supervisor does not run as root"
    elif missing:
        why = f"{', '.join(missing)} not found (Debian: apt-get install e2fsprogs mount)"
    elif not Path("/dev/loop-control").exists():
        why = "this machine has no loop devices (/dev/loop-control; modprobe loop)"
    elif not _has_ext4():
        why = "the kernel has no ext4 file system"
    else:
        return
    raise ConfigError(
        f"sandbox.workspace_size_mb needs a loop-mounted file system per sandbox, but {why}; "
        "set it to 0 for workspaces without a size cap"
    )


def _has_ext4() -> bool:
    try:
        return "ext4" in Path("/proc/filesystems").read_text().split()
    except OSError:
        return False


def mount(image: Path, target: Path, size_mb: int, uid: int, gid: int) -> None:
    """Mount `image` at `target`, first making it (size_mb, root owned by uid:gid) when it does
    not exist; files already in `target` move into the new file system. Mounted: nothing."""
    if target.is_mount():
        return
    made = not image.exists()
    if made:
        _make(image, target, size_mb, uid, gid)
    run_tool("mount", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(target))
    if made:
        (target / "lost+found").rmdir()  # e2fsck makes it again should it need one


def _make(image: Path, target: Path, size_mb: int, uid: int, gid: int) -> None:
    has_files = any(target.iterdir())
    make_image_from(image, target if has_files else None, size_mb, uid, gid)
    if has_files:  # now in the image; the mount would only hide them
        for child in list(target.iterdir()):
            _remove(child)


def make_image_from(image: Path, source: Path | None, size_mb: int, uid: int, gid: int) -> None:
    """A file system image of size_mb at `image` holding a copy of what `source` holds."""
    partial = image.with_name(image.name + ".partial")
    partial.unlink(missing_ok=True)
    with partial.open("wb") as file:
        file.truncate(size_mb * 1024 * 1024)
    populate = ("-d", str(source)) if source is not None else ()
    try:
        run_tool(
            "mkfs.ext4", "-q", "-F", "-m", "0", "-E", f"root_owner={uid}:{gid}",
            *populate, str(partial),
        )  # fmt: skip
    except SandboxBroken as exc:
        partial.unlink(missing_ok=True)
        raise SandboxBroken(f"cannot make the workspace's file system: {exc}") from None
    os.chmod(partial, 0o600)
    partial.rename(image)


def make_image(image: Path, size_mb: int, uid: int, gid: int) -> None:
    """An empty file system image of size_mb at `image` (its root owned by uid:gid)."""
    with image.open("wb") as file:
        file.truncate(size_mb * 1024 * 1024)
    os.chmod(image, 0o600)
    try:
        run_tool("mkfs.ext4", "-q", "-F", "-m", "0", "-E", f"root_owner={uid}:{gid}", str(image))
    except SandboxBroken as exc:
        image.unlink(missing_ok=True)
        raise SandboxBroken(f"cannot make a workspace file system: {exc}") from None


def mount_image(image: Path, target: Path, *, fresh: bool = True) -> None:
    """Mount an image at `target`; a fresh one (make_image's) is left empty (no lost+found)."""
    run_tool("mount", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(target))
    if fresh:
        (target / "lost+found").rmdir()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def mount_tmp(target: Path, size_bytes: int, inodes: int) -> None:
    """Mount a fresh tmpfs at `target` (any earlier one unmounted first: its files belonged
    to an earlier container), capped in bytes and inodes: /tmp of a sandbox on an engine
    whose tmpfs mounts take no inode cap. Its pages are charged to the memory cgroup of the
    process that writes them, as an engine's tmpfs's are."""
    unmount(target)
    target.mkdir(mode=0o700, exist_ok=True)
    options = f"size={size_bytes},nr_inodes={inodes},mode=1777,nosuid,nodev,noatime"
    run_tool("mount", "-t", "tmpfs", "-o", options, "stockade-tmp", str(target))


def unmount(target: Path) -> None:
    """Unmount `target` when it is a mount point; lazily when something still holds it."""
    if not target.is_mount():
        return
    try:
        run_tool("umount", str(target))
    except SandboxBroken:
        run_tool("umount", "-l", str(target))


def unmount_all(under: Path) -> int:
    """Unmount every mount point below `under` (cleanup of a whole state directory)."""
    prefix = str(under.resolve()).rstrip("/") + "/"
    targets = [t for t in _mount_points() if t.startswith(prefix)]
    for target in sorted(targets, reverse=True):
        unmount(Path(target))
    return len(targets)


def _mount_points() -> list[str]:
    with open("/proc/self/mounts") as mounts:
        return [_unescape(line.split()[1]) for line in mounts if line.strip()]


def _unescape(field: str) -> str:
    """/proc/self/mounts writes space, tab, newline and backslash as octal escapes."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def run_tool(*argv: str) -> None:
    """Run a mount or file system tool; SandboxBroken with what it said when it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxBroken(f"{argv[0]} failed: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise SandboxBroken(f"{argv[0]} failed (exit {done.returncode}): {said}")
