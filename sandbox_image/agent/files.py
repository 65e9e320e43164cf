"""File tools: read_file, write_file, edit_file, list_files, glob, search.

Each tool is `async def NAME(root, args) -> dict`; blocking file-system work
runs in a worker thread. Every path goes through `paths.resolve`, and every
path in a result is relative to the workspace root.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import heapq
import json
import os
import secrets
import stat
from asyncio.subprocess import PIPE
from collections.abc import AsyncGenerator
from pathlib import Path, PurePosixPath
from typing import Any, Final

from . import paths
from .argcheck import Args, expect_only, opt_int, opt_str, req_str
from .errors import ToolError, from_os_error

MAX_READ_BYTES: Final = 10 * 1024 * 1024
MAX_LIST_ENTRIES: Final = 10_000
MAX_GLOB_MATCHES: Final = 1000
MAX_SEARCH_RESULTS: Final = 1000
DEFAULT_SEARCH_RESULTS: Final = 100
SEARCH_TIMEOUT: Final = 30.0
MAX_LINE_CHARS: Final = 500
_RG_LINE_BYTES: Final = 8 * 1024 * 1024
_RG_STDERR_BYTES: Final = 64 * 1024
_CHUNK_BYTES: Final = 64 * 1024


async def read_file(root: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Read a text file, or lines `start_line`..`end_line` of it (1-based, inclusive)."""
    return await asyncio.to_thread(_read_file, root, args)


async def write_file(root: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Replace or create a file atomically, creating its parent directories."""
    return await asyncio.to_thread(_write_file, root, args)


async def edit_file(root: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Replace the one occurrence of `old_text` with `new_text`."""
    return await asyncio.to_thread(_edit_file, root, args)


async def list_files(root: Path, args: dict[str, Any]) -> dict[str, Any]:
    """List a directory's entries, sorted by name."""
    return await asyncio.to_thread(_list_files, root, args)


async def glob(root: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Paths matching a relative glob pattern (`**` spans directories)."""
    return await asyncio.to_thread(_glob, root, args)


# read_file


def _read_file(root: Path, args: Args) -> dict[str, Any]:
    expect_only(args, ("path", "start_line", "end_line"))
    user_path = req_str(args, "path")
    start, end = _line_range(args)
    path = paths.resolve(root, user_path, kind="file")
    data, truncated = _read_bytes(path, user_path, root)
    lines = _split_lines(data.decode("utf-8", errors="replace"))
    if start > max(len(lines), 1):
        raise ToolError(
            "INVALID_ARGS",
            f"start_line {start} is past the end of '{user_path}' ({len(lines)} lines)",
        )
    end = len(lines) if end is None else min(end, len(lines))
    return {
        "path": paths.display(root, path),
        "content": "".join(lines[start - 1 : end]),
        "start_line": start,
        "end_line": end,
        "total_lines": len(lines),
        "truncated": truncated,
        "binary": b"\0" in data,
    }


def _line_range(args: Args) -> tuple[int, int | None]:
    start = opt_int(args, "start_line", 1)
    end = opt_int(args, "end_line", None)
    if start < 1:
        raise ToolError("INVALID_ARGS", f"argument 'start_line' must be at least 1, got {start}")
    if end is not None and end < start:
        raise ToolError(
            "INVALID_ARGS",
            f"argument 'end_line' ({end}) must not be less than start_line ({start})",
        )
    return start, end


def _read_bytes(path: Path, user_path: str, root: Path | None = None) -> tuple[bytes, bool]:
    """At most MAX_READ_BYTES of a regular file, and whether there was more. With `root`,
    the file is opened relative to its folder checked to be inside it (paths.open_in)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags) if root is None else paths.open_in(root, path, flags, user_path)
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ToolError("INVALID_PATH", f"path '{user_path}' is not a regular file")
            data = file.read(MAX_READ_BYTES + 1)
    except OSError as exc:
        raise from_os_error(exc, user_path) from None
    return data[:MAX_READ_BYTES], len(data) > MAX_READ_BYTES


def _split_lines(text: str) -> list[str]:
    """Lines split at '\\n' only, each keeping its newline; ''.join() gives `text` back."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    return [*lines, parts[-1]] if parts[-1] else lines


# write_file and edit_file


def _write_file(root: Path, args: Args) -> dict[str, Any]:
    expect_only(args, ("path", "content"))
    user_path = req_str(args, "path")
    data = _encode(req_str(args, "content"), "content")
    path = paths.resolve(root, user_path, must_exist=False, kind="file")
    created = not path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise from_os_error(exc, user_path) from None
    _atomic_write(root, path, data, user_path)
    return {"path": paths.display(root, path), "bytes_written": len(data), "created": created}


def _edit_file(root: Path, args: Args) -> dict[str, Any]:
    expect_only(args, ("path", "old_text", "new_text"))
    user_path = req_str(args, "path")
    old, new = req_str(args, "old_text"), req_str(args, "new_text")
    if not old:
        raise ToolError("INVALID_ARGS", "argument 'old_text' must not be empty")
    path = paths.resolve(root, user_path, kind="file")
    data, truncated = _read_bytes(path, user_path, root)
    if truncated:
        raise ToolError("INVALID_ARGS", f"'{user_path}' is too large to edit (over 10 MiB)")
    # surrogateescape round-trips bytes that are not UTF-8 unchanged.
    text = data.decode("utf-8", errors="surrogateescape")
    count = text.count(old)
    if count != 1:
        raise ToolError("INVALID_ARGS", _edit_miss(count, user_path))
    _atomic_write(root, path, _encode(text.replace(old, new, 1), "new_text"), user_path)
    return {"path": paths.display(root, path), "replacements": 1}


def _edit_miss(count: int, user_path: str) -> str:
    if count == 0:
        return f"old_text not found in '{user_path}'"
    return f"old_text found {count} times in '{user_path}'; add context to make it unique"


def _encode(text: str, arg: str) -> bytes:
    try:
        return text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError as exc:
        raise ToolError(
            "INVALID_ARGS", f"argument '{arg}' holds a lone surrogate at index {exc.start}"
        ) from None


def _atomic_write(root: Path, path: Path, data: bytes, user_path: str) -> None:
    """Write via a temporary file in the same directory, fsync, rename, fsync the dir; all
    relative to the folder's descriptor, checked to be inside `root` (paths.open_dir).

    An existing file keeps its mode; a new one gets 0o666 minus the umask.
    """
    temp = f".{secrets.token_hex(8)}.stockade-tmp"
    dir_fd = paths.open_dir(root, path.parent, user_path)
    try:
        mode = _mode_at(dir_fd, path.name, user_path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o666, dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            if mode is not None:
                os.fchmod(file.fileno(), mode)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise from_os_error(exc, user_path) from None
    finally:
        os.close(dir_fd)


def _mode_at(dir_fd: int, name: str, user_path: str) -> int | None:
    """The permission bits of `name` in `dir_fd` (None: it does not exist); refuses a file
    that is not writable, or that became a link or a special file since it was resolved."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise ToolError("INVALID_PATH", f"path '{user_path}' is no longer a regular file")
    if not os.access(name, os.W_OK, dir_fd=dir_fd):
        raise ToolError("PERMISSION_DENIED", f"path '{user_path}' is not writable")
    return stat.S_IMODE(info.st_mode)


def _existing_mode(path: Path, user_path: str) -> int | None:
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None
    if not os.access(path, os.W_OK):
        raise ToolError("PERMISSION_DENIED", f"path '{user_path}' is not writable")
    return mode


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# list_files


def _list_files(root: Path, args: Args) -> dict[str, Any]:
    expect_only(args, ("path",))
    user_path = opt_str(args, "path", ".")
    directory = paths.resolve(root, user_path, kind="dir")
    root_real = Path(os.path.realpath(root))
    try:
        with os.scandir(directory) as scan:
            first = heapq.nsmallest(MAX_LIST_ENTRIES + 1, scan, key=lambda entry: entry.name)
    except OSError as exc:
        raise from_os_error(exc, user_path) from None
    entries = [_entry(root_real, entry) for entry in first[:MAX_LIST_ENTRIES]]
    return {
        "path": paths.display(root, directory),
        "entries": [entry for entry in entries if entry is not None],
        "truncated": len(first) > MAX_LIST_ENTRIES,
    }


def _entry(root_real: Path, entry: os.DirEntry[str]) -> dict[str, Any] | None:
    """Describe one entry; a symlink is followed only if it stays inside the root."""
    try:
        info = entry.stat(follow_symlinks=False)
        is_link = entry.is_symlink()
    except OSError:
        return None  # removed while listing
    if is_link and paths.is_real_inside(root_real, entry.path):
        with contextlib.suppress(OSError):
            info = entry.stat()
    return {
        "name": entry.name,
        "is_dir": stat.S_ISDIR(info.st_mode),
        "size": info.st_size,
        "is_symlink": is_link,
    }


# glob


def _glob(root: Path, args: Args) -> dict[str, Any]:
    expect_only(args, ("pattern", "path"))
    pattern = _checked_pattern(req_str(args, "pattern"))
    user_path = opt_str(args, "path", ".")
    base = paths.resolve(root, user_path, kind="dir")
    root_real = Path(os.path.realpath(root))
    found: list[str] = []
    try:
        for match in base.glob(pattern):
            if not paths.is_real_inside(root_real, match):
                continue
            if len(found) == MAX_GLOB_MATCHES:
                return {"matches": sorted(found), "truncated": True}
            found.append(paths.display(root, match))
    except OSError as exc:
        raise from_os_error(exc, user_path) from None
    except ValueError as exc:  # pathlib's "Invalid pattern: '**' can only be ..."
        raise ToolError("INVALID_ARGS", f"argument 'pattern': {exc}") from None
    except RecursionError:  # pathlib recurses per pattern part and per level under '**'
        raise ToolError(
            "INVALID_PATH",
            f"glob under '{user_path}' nests deeper than it can follow "
            f"(pattern of {pattern.count('/') + 1} parts); narrow 'path' or the pattern",
        ) from None
    return {"matches": sorted(found), "truncated": False}


def _checked_pattern(pattern: str) -> str:
    if not pattern:
        raise ToolError("INVALID_ARGS", "argument 'pattern' must not be empty")
    if "\0" in pattern:
        raise ToolError("INVALID_ARGS", "argument 'pattern' contains a NUL byte")
    if len(pattern.encode("utf-8", "surrogatepass")) > paths.MAX_PATH_BYTES:
        raise ToolError(
            "INVALID_PATH", f"argument 'pattern' is longer than {paths.MAX_PATH_BYTES} bytes"
        )
    if pattern.startswith("/"):
        raise ToolError("INVALID_PATH", f"pattern '{pattern}' must be relative to the workspace")
    if ".." in PurePosixPath(pattern).parts:
        raise ToolError("INVALID_PATH", f"pattern '{pattern}' must not contain '..'")
    return pattern


# search


async def search(
    root: Path, args: dict[str, Any], *, rg: str = "rg", timeout: float = SEARCH_TIMEOUT
) -> dict[str, Any]:
    """Lines matching a regex, found by ripgrep (a linear-time engine, so hostile
    patterns cannot hang the agent); symlinks are not followed, nothing is ignored
    but `.git`. `rg` and `timeout` are injectable for tests.
    """
    expect_only(args, ("pattern", "path", "glob", "max_results"))
    pattern = req_str(args, "pattern")
    file_glob = opt_str(args, "glob", None)
    limit = _max_results(args)
    target = await asyncio.to_thread(paths.resolve, root, opt_str(args, "path", "."))
    found, truncated = await _run_rg(_rg_argv(rg, pattern, file_glob, target), limit, timeout)
    return {"matches": [_hit(root, data) for data in found], "truncated": truncated}


def _max_results(args: Args) -> int:
    limit = opt_int(args, "max_results", DEFAULT_SEARCH_RESULTS)
    if limit < 1:
        raise ToolError("INVALID_ARGS", f"argument 'max_results' must be at least 1, got {limit}")
    return min(limit, MAX_SEARCH_RESULTS)


def _rg_argv(rg: str, pattern: str, file_glob: str | None, target: Path) -> list[str]:
    for name, value in (("pattern", pattern), ("glob", file_glob or "")):
        if "\0" in value:
            raise ToolError("INVALID_ARGS", f"argument '{name}' contains a NUL byte")
    argv = [rg, "--json", "--no-config", "--hidden", "--no-ignore", "--no-messages"]
    argv += ["--sort", "path", "--glob", "!.git"]
    if file_glob is not None:
        argv += ["--glob", file_glob]
    return [*argv, "--regexp", pattern, "--", str(target)]


async def _run_rg(argv: list[str], limit: int, timeout: float) -> tuple[list[Any], bool]:
    """Up to `limit` match records, and whether there were more (or some were dropped)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=PIPE, stderr=PIPE
        )
    except OSError as exc:
        raise ToolError("EXECUTION_FAILED", f"cannot run ripgrep: {exc.strerror or exc}") from None
    assert proc.stdout is not None
    assert proc.stderr is not None
    errors = asyncio.create_task(_read_capped(proc.stderr, _RG_STDERR_BYTES))
    try:
        async with asyncio.timeout(timeout):
            found, dropped = await _read_matches(proc.stdout, limit + 1)
            if len(found) > limit:
                proc.kill()
            await proc.stdout.read()  # to EOF, so that wait() can return
            message, returncode = await errors, await proc.wait()
    except TimeoutError:
        raise ToolError(
            "TIMEOUT", f"search took longer than {timeout:g} s; narrow 'path' or 'glob'"
        ) from None
    finally:
        await _stop(proc, errors)
    if returncode == 2 and not found and message.strip():
        raise ToolError(
            "INVALID_ARGS",
            f"ripgrep refused the search: {message.decode(errors='replace').strip()}",
        )
    return found[:limit], dropped or len(found) > limit


async def _stop(proc: asyncio.subprocess.Process, errors: asyncio.Task[bytes]) -> None:
    """Kill ripgrep if it still runs, drain its pipes and reap it."""
    errors.cancel()
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.communicate()


async def _read_matches(stream: asyncio.StreamReader, wanted: int) -> tuple[list[Any], bool]:
    """The data of up to `wanted` rg `match` messages, and whether a line was dropped."""
    found: list[Any] = []
    dropped = False
    async with contextlib.aclosing(_bounded_lines(stream, _RG_LINE_BYTES)) as lines:
        async for line in lines:
            message = json.loads(line) if line is not None else None
            dropped = dropped or message is None
            if message is not None and message.get("type") == "match":
                found.append(message["data"])
                if len(found) == wanted:
                    break
    return found, dropped


async def _bounded_lines(
    stream: asyncio.StreamReader, cap: int
) -> AsyncGenerator[bytes | None, None]:
    """The lines of `stream`; None in place of a line longer than `cap` bytes."""
    pending, overflow = bytearray(), False
    while chunk := await stream.read(_CHUNK_BYTES):
        *complete, rest = chunk.split(b"\n")
        for part in complete:
            too_long = overflow or len(pending) + len(part) > cap
            yield None if too_long else bytes(pending + part)
            pending.clear()
            overflow = False
        pending += b"" if overflow else rest
        if len(pending) > cap:
            pending.clear()
            overflow = True


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> bytes:
    data = bytearray()
    while chunk := await stream.read(_CHUNK_BYTES):
        data += chunk[: cap - len(data)]
    return bytes(data)


def _hit(root: Path, data: dict[str, Any]) -> dict[str, Any]:
    text = _rg_text(data["lines"], as_path=False).rstrip("\r\n")
    if len(text) > MAX_LINE_CHARS:
        text = text[:MAX_LINE_CHARS] + " [...]"
    file = paths.display(root, _rg_text(data["path"], as_path=True))
    return {"file": file, "line": data["line_number"], "text": text}


def _rg_text(field: dict[str, str], *, as_path: bool) -> str:
    """rg's {"text": ...} or, for bytes that are not UTF-8, {"bytes": base64}."""
    if "text" in field:
        return field["text"]
    raw = base64.b64decode(field["bytes"])
    return os.fsdecode(raw) if as_path else raw.decode("utf-8", errors="replace")
