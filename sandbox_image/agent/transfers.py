"""Moving files in and out of the workspace, inside the container.

Uploads land atomically (a temporary file in the same directory, fsync, rename: a watch sees
that as one write, see UPLOAD_PREFIX) or, for a tar
stream, are unpacked by GNU tar (which refuses `..` members and delays symlinks, and runs as
the sandbox user). Downloads stream a file, or a directory packed by tar. Paths follow the file
tools' rules: nothing outside the workspace, also not through a symlink."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from . import paths
from .errors import ToolError, from_os_error
from .execute import with_file_size_errors

CHUNK = 1 << 20
TAR = "/bin/tar"
UPLOAD_PREFIX = ".stockade-upload-"
"""An upload's temporary file: `.stockade-upload-<hex>-w` where it replaces a file, `-c` where
it makes one. A watch (watch.py) hides these files and reports their rename into place as
envd reports an in-place write: `write` of the replaced file, `create` and `write` of a new
one."""


def upload_name(replaces: bool) -> str:
    return f"{UPLOAD_PREFIX}{secrets.token_hex(8)}-{'w' if replaces else 'c'}"


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


async def receive(
    root: Path, path: str, *, tar: bool, mode: int, chunks: AsyncIterator[bytes]
) -> dict[str, Any]:
    """Write the uploaded bytes at `path` (or unpack them there with tar)."""
    if tar:
        return await _untar(root, path, chunks)
    target = await asyncio.to_thread(paths.resolve, root, path, must_exist=False, kind="file")
    shown = paths.display(root, target)
    await asyncio.to_thread(paths.make_folders, root, target.parent, shown)
    dir_fd = await asyncio.to_thread(paths.open_dir, root, target.parent, shown)
    try:
        return await _receive_in(dir_fd, target.name, shown, mode, chunks)
    finally:
        os.close(dir_fd)


async def _receive_in(
    dir_fd: int, name: str, shown: str, mode: int, chunks: AsyncIterator[bytes]
) -> dict[str, Any]:
    """Write the chunks to a temporary file in the folder `dir_fd`, then rename it to name.

    Every step on a descriptor runs in a worker thread through `_in_thread`: a cancelled upload
    (the supervisor refused its body, or its caller left) closes its file only once the step
    under way has returned. Closing it under a running thread let that thread write into, or
    a second close end, the descriptor another upload had been given the same number for
    (seen as "Bad file descriptor" in a concurrent upload)."""
    temp = upload_name(replaces=_exists(name, dir_fd))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(temp, flags, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        raise from_os_error(exc, shown) from None
    digest, size, closed = hashlib.sha256(), 0, False
    try:
        async for data in chunks:
            await _in_thread(_write_all, fd, data, digest)
            size += len(data)
        await _in_thread(_seal, fd, mode or 0o644)
        closed = True
        os.close(fd)
        await _in_thread(_rename, dir_fd, temp, name)
    except BaseException as exc:
        if not closed:
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        if isinstance(exc, OSError):  # a full disk, a file past the size cap
            raise from_os_error(exc, shown) from None
        raise
    return {"path": shown, "size": size, "sha256": digest.hexdigest(), "tar": False}


async def _in_thread(fn: Callable[..., None], *args: Any) -> None:
    """fn(*args) in a worker thread; when the caller is cancelled meanwhile, it still waits
    for fn to return before the cancellation goes on (so no descriptor fn uses is closed
    under it)."""
    step = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        await asyncio.shield(step)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await step
        raise


def _write_all(fd: int, data: bytes, digest: Any) -> None:
    digest.update(data)
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _seal(fd: int, mode: int) -> None:
    os.fchmod(fd, mode & 0o777)
    os.fsync(fd)


def _rename(dir_fd: int, temp: str, name: str) -> None:
    os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)


async def _untar(root: Path, path: str, chunks: AsyncIterator[bytes]) -> dict[str, Any]:
    target = await asyncio.to_thread(paths.resolve, root, path, must_exist=False, kind="dir")
    shown = paths.display(root, target)
    await asyncio.to_thread(paths.make_folders, root, target, shown)
    dir_fd = await asyncio.to_thread(paths.open_dir, root, target, shown)
    try:
        return await _untar_in(dir_fd, shown, chunks)
    finally:
        os.close(dir_fd)


async def _untar_in(dir_fd: int, shown: str, chunks: AsyncIterator[bytes]) -> dict[str, Any]:
    """tar unpacks in the checked folder `dir_fd` (passed to it, reached as /proc/self/fd/N)."""
    proc = await asyncio.create_subprocess_exec(
        *with_file_size_errors(
            TAR, "-x", "-v", "-f", "-", "-C", f"/proc/self/fd/{dir_fd}", "--no-same-owner",
            "--no-same-permissions", "--delay-directory-restore",
        ),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, pass_fds=(dir_fd,),
    )  # fmt: skip
    if proc.stdin is None or proc.stdout is None or proc.stderr is None:
        raise ToolError("EXECUTION_FAILED", "could not start tar")
    digest, size = hashlib.sha256(), 0
    out_task = asyncio.ensure_future(proc.stdout.read())
    err_task = asyncio.ensure_future(proc.stderr.read())
    try:
        async for data in chunks:
            digest.update(data)
            size += len(data)
            proc.stdin.write(data)
            await proc.stdin.drain()
        proc.stdin.close()
        code = await proc.wait()
    except (BrokenPipeError, ConnectionResetError):
        code = await proc.wait()
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    names, problems = await out_task, await err_task
    if code != 0:
        message = problems.decode(errors="replace").strip()[-2000:] or f"tar exited with {code}"
        raise ToolError("INVALID_ARGS", f"could not unpack into '{shown}': {message}")
    count = len([n for n in names.splitlines() if n.strip()])
    return {"path": shown, "size": size, "sha256": digest.hexdigest(), "tar": True, "files": count}


async def send(root: Path, path: str, *, tar: bool) -> AsyncIterator[bytes | dict[str, Any]]:
    """The bytes of `path` (or of a tar of the directory), then a dict with size and sha256."""
    if tar:
        source = await asyncio.to_thread(paths.resolve, root, path, kind="dir")
    else:
        source = await asyncio.to_thread(paths.resolve, root, path, kind="file")
    shown = paths.display(root, source)
    digest, size = hashlib.sha256(), 0
    stream = _pack(root, source, shown) if tar else _read(root, source, shown)
    files = 0
    async for data in stream:
        if isinstance(data, int):
            files = data
            continue
        digest.update(data)
        size += len(data)
        yield data
    yield {"path": shown, "size": size, "sha256": digest.hexdigest(), "tar": tar, "files": files}


async def _read(root: Path, source: Path, shown: str) -> AsyncIterator[bytes | int]:
    """The file's bytes; opened without blocking and without following a link, so that a
    FIFO or link swapped in since `resolve` is refused instead of hanging or leading out."""
    flags = os.O_RDONLY | os.O_NONBLOCK
    fd = await asyncio.to_thread(paths.open_in, root, source, flags, shown)
    file = os.fdopen(fd, "rb")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ToolError("INVALID_PATH", f"path '{shown}' is not a regular file")
        while data := await asyncio.to_thread(file.read, CHUNK):
            yield data
    finally:
        file.close()


async def _pack(root: Path, source: Path, shown: str) -> AsyncIterator[bytes | int]:
    """tar of the checked folder `source` (passed to tar, reached as /proc/self/fd/N)."""
    dir_fd = await asyncio.to_thread(paths.open_dir, root, source, shown)
    try:
        proc = await asyncio.create_subprocess_exec(
            TAR, "-c", "-v", "-f", "-", "-C", f"/proc/self/fd/{dir_fd}", ".",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, pass_fds=(dir_fd,),
        )  # fmt: skip
    finally:
        os.close(dir_fd)
    if proc.stdout is None or proc.stderr is None:
        raise ToolError("EXECUTION_FAILED", "could not start tar")
    listing = asyncio.ensure_future(proc.stderr.read())
    try:
        while data := await proc.stdout.read(CHUNK):
            yield data
        code = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    names = (await listing).decode(errors="replace").splitlines()
    if code != 0:
        raise ToolError("EXECUTION_FAILED", f"tar failed: {' '.join(names[-5:])}")
    yield len([n for n in names if n and n != "./"])
