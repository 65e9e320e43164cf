"""Resolve a path the model wrote to a real path inside the workspace.

Rules, in order:
- the path is a non-empty string of at most MAX_PATH_BYTES bytes, without NUL;
- it is relative to the workspace root, or absolute and lexically inside it;
- it has no '..' component (even one that would stay inside);
- its realpath (symlinks followed; for a path that does not exist yet, the
  deepest existing ancestor's) stays inside the root's realpath;
- if it exists it is a regular file or a directory, of the wanted kind:
  FIFOs, sockets and devices are never a valid target.

The returned path is that realpath, so callers never act through a symlink.

With CONTAINER as the root (the E2B front's file calls: the container is the boundary, as on
E2B), a path may lead anywhere the sandbox's user can reach, except into the kernel's file
systems (KERNEL_FILES: /proc, /sys, /dev), also not through a symlink: their files are not
files (endless, or the agent's own state).
A running command may still swap a folder on that path for a symlink after the
check: `open_dir` and `open_in` close that race for the file tools and transfers.
They open the folder, check where the descriptor really points (its
/proc/self/fd link) and then act relative to it, the last component with
O_NOFOLLOW. Whatever wins a race stays inside the container anyway: the agent
runs there, as the sandbox's user, so no path can lead it to the host.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Final, Literal

from .errors import ToolError, from_os_error

Kind = Literal["file", "dir", "any"]
MAX_PATH_BYTES: Final = 4096
CONTAINER: Final = Path("/")
KERNEL_FILES: Final = (Path("/proc"), Path("/sys"), Path("/dev"))


def resolve(
    root: Path,
    user_path: str,
    *,
    must_exist: bool = True,
    kind: Kind = "any",
    arg: str = "path",
) -> Path:
    """Return the realpath of `user_path` inside `root`, or raise ToolError.

    `arg` names the argument in messages ("workdir '..' leaves the workspace").
    `kind` 'any' means a regular file or a directory.
    """
    root_real = Path(os.path.realpath(root))
    label = f"{arg} '{user_path}'"
    relative = _relative(root, _checked(user_path, arg), label)
    if kind == "file" and user_path.endswith("/"):  # realpath would drop the slash
        raise ToolError("INVALID_PATH", f"{label} ends in '/', which names a directory")
    try:
        real = Path(os.path.realpath(root_real / relative))
    except OSError:  # a link swapped for something else while realpath read it: a race
        raise ToolError("INVALID_PATH", f"{label} changed while it was checked") from None
    if not _within(root_real, real):
        raise ToolError("INVALID_PATH", _outside(root_real, label))
    mode = _mode(real, user_path, arg)
    if mode is None:
        if must_exist:
            raise ToolError("FILE_NOT_FOUND", f"{label} does not exist")
        return real
    _check_kind(mode, kind, label)
    return real


_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def open_dir(root: Path, directory: Path, shown: str) -> int:
    """A descriptor of `directory` (a path from `resolve`), checked once open to be inside
    `root`: a folder swapped for a link since `resolve` is refused, not followed."""
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        raise from_os_error(exc, shown) from None
    return _checked_dir(root, fd, shown)


def _checked_dir(root: Path, fd: int, shown: str) -> int:
    """`fd` if it points inside `root`; else it is closed and ToolError raised."""
    try:
        opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        os.close(fd)
        raise ToolError("EXECUTION_FAILED", "cannot check an open folder: no /proc") from None
    root_real = Path(os.path.realpath(root))
    if not _within(root_real, opened):
        os.close(fd)
        message = _outside(root_real, f"path '{shown}'")
        raise ToolError("INVALID_PATH", f"{message} (a folder on it became a link)")
    return fd


def _within(root_real: Path, path: Path) -> bool:
    """Whether `path` (real) is inside `root_real`, and not in a kernel file system when the
    root is the whole container."""
    if root_real == CONTAINER:
        return not any(is_inside(kernel, path) for kernel in KERNEL_FILES)
    return is_inside(root_real, path)


def _outside(root_real: Path, label: str) -> str:
    if root_real == CONTAINER:
        return f"{label} is in /proc, /sys or /dev, which file calls do not reach"
    return f"{label} leaves the workspace"


@contextlib.contextmanager
def folder(root: Path, directory: Path, shown: str) -> Iterator[int]:
    """`open_dir` for the length of a block."""
    fd = open_dir(root, directory, shown)
    try:
        yield fd
    finally:
        os.close(fd)


def exists_in(root: Path, path: Path, shown: str) -> bool:
    """Whether `path` (from `resolve`) exists, looked up in its checked folder without
    following a link at its end; a missing folder, or a file in its place, means no."""
    if path == Path(os.path.realpath(root)):
        return True
    try:
        fd = _checked_dir(root, os.open(path.parent, _DIR_FLAGS), shown)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise from_os_error(exc, shown) from None
    try:
        os.stat(path.name, dir_fd=fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise from_os_error(exc, shown) from None
    finally:
        os.close(fd)
    return True


def make_folders(
    root: Path, directory: Path, shown: str, created: list[Path] | None = None
) -> None:
    """Create `directory` (from `resolve`) and its missing parents one level at a time, each
    in its checked parent: a folder swapped for a link meanwhile never leads outside the
    workspace (as mkdir(parents=True) would follow it). `created` gets each folder made here,
    in order, also when a later level fails."""
    missing: list[Path] = []
    while not exists_in(root, directory, shown):
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        with folder(root, path.parent, shown) as dir_fd:
            try:
                os.mkdir(path.name, dir_fd=dir_fd)
            except FileExistsError:
                continue  # made meanwhile: the next level's open checks what it is
            except OSError as exc:
                raise from_os_error(exc, shown) from None
        if created is not None:
            created.append(path)


def open_in(root: Path, path: Path, flags: int, shown: str) -> int:
    """Open `path` (from `resolve`) relative to its checked folder, never through a link."""
    dir_fd = open_dir(root, path.parent, shown)
    try:
        return os.open(path.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise from_os_error(exc, shown) from None
    finally:
        os.close(dir_fd)


def display(root: Path, path: Path | str) -> str:
    """`path` relative to the workspace root ('.' for the root itself); absolute with the
    container as the root."""
    path = Path(path)
    if Path(root) == CONTAINER:
        return str(path)
    for base in (Path(os.path.realpath(root)), Path(os.path.abspath(root))):
        if is_inside(base, path):
            return str(path.relative_to(base))
    return str(path)


def is_inside(root: Path, path: Path) -> bool:
    """Whether `path` is `root` or below it, comparing whole components."""
    return path == root or path.is_relative_to(root)


def is_real_inside(root_real: Path, path: Path | str) -> bool:
    """Whether `path`, with every symlink followed, stays inside `root_real`; False when a
    link on the way cannot be read (/proc/1/root of a process of another user: EACCES)."""
    try:
        return is_inside(root_real, Path(os.path.realpath(path)))
    except OSError:
        return False


def _checked(user_path: str, arg: str) -> PurePosixPath:
    if not user_path:
        raise ToolError("INVALID_ARGS", f"argument '{arg}' must not be empty")
    if "\0" in user_path:
        raise ToolError("INVALID_PATH", f"argument '{arg}' contains a NUL byte")
    try:
        size = len(os.fsencode(user_path))
    except UnicodeEncodeError:
        raise ToolError(
            "INVALID_PATH", f"argument '{arg}' holds characters no file name can have"
        ) from None
    if size > MAX_PATH_BYTES:
        raise ToolError(
            "INVALID_PATH", f"argument '{arg}' is {size} bytes long; the limit is {MAX_PATH_BYTES}"
        )
    return PurePosixPath(user_path)


def _relative(root: Path, path: PurePosixPath, label: str) -> PurePosixPath:
    if path.is_absolute():
        path = _below_root(root, path, label)
    if ".." in path.parts:
        if PurePosixPath(os.path.normpath(path)).parts[:1] == ("..",):
            raise ToolError("INVALID_PATH", f"{label} leaves the workspace")
        raise ToolError("INVALID_PATH", f"{label} must not contain '..'")
    return path


def _below_root(root: Path, path: PurePosixPath, label: str) -> PurePosixPath:
    for base in (PurePosixPath(os.path.realpath(root)), PurePosixPath(os.path.abspath(root))):
        if path == base or path.is_relative_to(base):
            return path.relative_to(base)
    raise ToolError("INVALID_PATH", f"{label} leaves the workspace")


def _mode(real: Path, user_path: str, arg: str) -> int | None:
    try:
        return os.stat(real).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise from_os_error(exc, user_path, arg=arg) from None


def _check_kind(mode: int, kind: Kind, label: str) -> None:
    is_dir, is_file = stat.S_ISDIR(mode), stat.S_ISREG(mode)
    if not (is_dir or is_file):
        raise ToolError("INVALID_PATH", f"{label} is a {_special(mode)}, not a file or directory")
    if kind == "file" and is_dir:
        raise ToolError("INVALID_PATH", f"{label} is a directory, not a file")
    if kind == "dir" and is_file:
        raise ToolError("INVALID_PATH", f"{label} is a file, not a directory")


_SPECIAL_KINDS: Final = (
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)


def _special(mode: int) -> str:
    return next((name for test, name in _SPECIAL_KINDS if test(mode)), "special file")
