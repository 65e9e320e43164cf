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
import itertools
import json
import os
import secrets
import stat
from asyncio.subprocess import PIPE
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Final

from . import paths, spawn
from .argcheck import Args, encoded, expect_only, opt_int, opt_str, req_str
from .errors import ToolError, from_os_error

MAX_READ_BYTES: Final = 10 * 1024 * 1024
MAX_LIST_ENTRIES: Final = 10_000
MAX_GLOB_MATCHES: Final = 1000
MAX_SEARCH_RESULTS: Final = 1000
DEFAULT_SEARCH_RESULTS: Final = 100
SEARCH_TIMEOUT: Final = 30.0
MAX_LINE_CHARS: Final = 500
MAX_SEARCH_ARGUMENT_BYTES: Final = 64 * 1024
"""A search pattern or glob (Linux takes at most 128 KiB in one argument of a command)."""
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
    with _regular_file(path, user_path, root) as file:
        lines = _read_lines(file, start, end)
    if start > max(lines.total, 1):
        raise ToolError(
            "INVALID_ARGS",
            f"start_line {start} is past the end of '{user_path}' ({lines.total} lines)",
        )
    last = lines.total if end is None else min(end, lines.total)
    return {
        "path": paths.display(root, path),
        "content": lines.data.decode("utf-8", errors="replace"),
        "start_line": start,
        "end_line": lines.last if lines.cut else last,
        "total_lines": lines.total,
        "truncated": lines.cut,
        "binary": b"\0" in lines.data,
    }


@dataclass
class _Lines:
    first: int
    data: bytearray
    """Lines from `first` on, at most MAX_READ_BYTES of them."""
    total: int
    cut: bool

    @property
    def last(self) -> int:
        """The number of the last line `data` holds, in part when cut."""
        return self.first + self.data.count(b"\n") - self.data.endswith(b"\n")


def _read_lines(file: BinaryIO, start: int, end: int | None) -> _Lines:
    """Lines `start` to `end` (1-based, inclusive; None: to the end) of `file`, and how many
    lines it has. Read in chunks: a line range deep in a file of any size is found, while
    memory stays bounded (the lines before and after the range are only counted)."""
    kept, line, cut, final = bytearray(), 1, False, b""
    while chunk := file.read(_CHUNK_BYTES):
        final, newlines = chunk[-1:], chunk.count(b"\n")
        if not cut and line + newlines >= start and (end is None or line <= end):
            begin = _after_newlines(chunk, start - line)
            stop = len(chunk)
            if end is not None and line + newlines > end:  # line `end` ends in this chunk
                stop = _after_newlines(chunk, end - line + 1)
            room = MAX_READ_BYTES - len(kept)
            kept += chunk[begin : min(stop, begin + room)]
            cut = stop - begin > room
        line += newlines
    total = line - 1 if final in (b"", b"\n") else line
    return _Lines(start, kept, total, cut)


def _after_newlines(chunk: bytes, count: int) -> int:
    """The offset in `chunk` just after its `count`th newline (0 for count <= 0)."""
    offset = 0
    for _ in range(count):
        offset = chunk.index(b"\n", offset) + 1
    return offset


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
    """At most MAX_READ_BYTES of a regular file, and whether there was more."""
    with _regular_file(path, user_path, root) as file:
        data = file.read(MAX_READ_BYTES + 1)
    return data[:MAX_READ_BYTES], len(data) > MAX_READ_BYTES


@contextlib.contextmanager
def _regular_file(path: Path, user_path: str, root: Path | None) -> Iterator[BinaryIO]:
    """The regular file at `path`, opened without following a link at its end (with `root`:
    relative to its folder checked to be inside it, paths.open_in); an OSError while it is
    open becomes a ToolError about `user_path`."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags) if root is None else paths.open_in(root, path, flags, user_path)
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ToolError("INVALID_PATH", f"path '{user_path}' is not a regular file")
            yield file
    except OSError as exc:
        raise from_os_error(exc, user_path) from None


# write_file and edit_file


def _write_file(root: Path, args: Args) -> dict[str, Any]:
    expect_only(args, ("path", "content"))
    user_path = req_str(args, "path")
    data = encoded(req_str(args, "content"), "content")
    path = paths.resolve(root, user_path, must_exist=False, kind="file")
    created = not paths.exists_in(root, path, user_path)
    paths.make_folders(root, path.parent, user_path)
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
    _atomic_write(root, path, encoded(text.replace(old, new, 1), "new_text"), user_path)
    return {"path": paths.display(root, path), "replacements": 1}


def _edit_miss(count: int, user_path: str) -> str:
    if count == 0:
        return f"old_text not found in '{user_path}'"
    return f"old_text found {count} times in '{user_path}'; add context to make it unique"


def _atomic_write(root: Path, path: Path, data: bytes, user_path: str) -> None:
    """Write via a temporary file in the same directory, fsync, rename, fsync the dir; all
    relative to the folder's descriptor, checked to be inside `root` (paths.open_dir).

    An existing file keeps its mode; a new one gets 0o666 minus the umask.
    """
    dir_fd = paths.open_dir(root, path.parent, user_path)
    try:
        temp = stage_in(dir_fd, data, _mode_at(dir_fd, path.name, user_path))
        try:
            os.replace(temp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    except OSError as exc:
        raise from_os_error(exc, user_path) from None
    finally:
        os.close(dir_fd)


def stage_in(dir_fd: int, data: bytes, mode: int | None) -> str:
    """A new temporary file in the folder `dir_fd` holding `data` (synced; `mode` set when
    given); its name. Raises OSError with nothing left behind."""
    temp = f".{secrets.token_hex(8)}.stockade-tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o666, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            if mode is not None:
                os.fchmod(file.fileno(), mode)
            file.flush()
            os.fsync(file.fileno())
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
    return temp


def _mode_at(dir_fd: int, name: str, user_path: str) -> int | None:
    """The permission bits of `name` in `dir_fd` (None: it does not exist); refuses a file
    that is not writable, or that became a link or a special file since it was resolved."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise ToolError("INVALID_PATH", f"path '{user_path}' is no longer a regular file")
    if not os.access(name, os.W_OK, dir_fd=dir_fd, effective_ids=True):
        raise ToolError("PERMISSION_DENIED", f"path '{user_path}' is not writable")
    return stat.S_IMODE(info.st_mode)


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
    found: set[str] = set()
    # a last `**` means everything below, as in bash's globstar and glob.glob (pathlib before
    # Python 3.13 gives only the folders)
    wanted = [pattern, f"{pattern}/*"] if PurePosixPath(pattern).name == "**" else [pattern]
    try:
        for match in itertools.chain.from_iterable(base.glob(p) for p in wanted):
            if not paths.is_real_inside(root_real, match):
                continue
            shown = paths.display(root, match)
            if shown not in found and len(found) == MAX_GLOB_MATCHES:
                return {"matches": sorted(found), "truncated": True}
            found.add(shown)
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

    ripgrep only lists the files (`--files`: its walk, glob rules and order); the agent
    opens each one relative to its folder checked inside the workspace, without
    following a link (paths.open_in), and ripgrep searches those descriptors
    (/proc/self/fd/N). A folder swapped for a link while ripgrep walks can only make it
    list names: a name that no longer opens inside the workspace is skipped, so no
    content from elsewhere is ever searched. A file in which ripgrep finds a NUL byte is
    binary and gives no matches, as in ripgrep's own walk.
    """
    expect_only(args, ("pattern", "path", "glob", "max_results"))
    pattern = req_str(args, "pattern")
    file_glob = opt_str(args, "glob", None)
    limit = _max_results(args)
    target = await asyncio.to_thread(paths.resolve, root, opt_str(args, "path", "."))
    _check_search_arguments(pattern, file_glob)
    try:
        async with asyncio.timeout(timeout):
            found, truncated = await _search(root, rg, pattern, file_glob, target, limit)
    except TimeoutError:
        raise ToolError(
            "TIMEOUT", f"search took longer than {timeout:g} s; narrow 'path' or 'glob'"
        ) from None
    return {"matches": found, "truncated": truncated}


def _max_results(args: Args) -> int:
    limit = opt_int(args, "max_results", DEFAULT_SEARCH_RESULTS)
    if limit < 1:
        raise ToolError("INVALID_ARGS", f"argument 'max_results' must be at least 1, got {limit}")
    return min(limit, MAX_SEARCH_RESULTS)


def _check_search_arguments(pattern: str, file_glob: str | None) -> None:
    """No NUL, and short enough to be one argument of ripgrep's command line."""
    for name, value in (("pattern", pattern), ("glob", file_glob or "")):
        if "\0" in value:
            raise ToolError("INVALID_ARGS", f"argument '{name}' contains a NUL byte")
        size = len(encoded(value, name))
        if size > MAX_SEARCH_ARGUMENT_BYTES:
            raise ToolError(
                "INVALID_ARGS",
                f"argument '{name}' is {size} bytes; the limit is {MAX_SEARCH_ARGUMENT_BYTES}",
            )


_RG_COMMON: Final = ("--no-config", "--no-messages")
_SEARCH_BATCH: Final = 128
"""Files opened and handed to one ripgrep at a time (the sandbox's open-file limit is low)."""


def _list_argv(rg: str, file_glob: str | None, target: Path) -> list[str]:
    argv = [rg, "--files", "--null", *_RG_COMMON, "--hidden", "--no-ignore", "--sort", "path"]
    argv += ["--glob", "!.git"]
    if file_glob is not None:
        argv += ["--glob", file_glob]
    return [*argv, "--", str(target)]


async def _search(
    root: Path, rg: str, pattern: str, file_glob: str | None, target: Path, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """Up to `limit` hits, and whether there were more (or some lines were dropped)."""
    found: list[dict[str, Any]] = []
    dropped = searched = False
    async with (
        _spawn(_list_argv(rg, file_glob, target)) as lister,
        contextlib.aclosing(_batches(lister.stdout, _SEARCH_BATCH)) as batches,
    ):
        async for batch in batches:
            hits, lost = await _search_batch(root, rg, pattern, batch, limit + 1 - len(found))
            found, dropped, searched = found + hits, dropped or lost, True
            if len(found) > limit:
                return found[:limit], True
        _refused(*await lister.finish())
    if not searched:  # nothing to search: ripgrep still judges the pattern
        await _search_batch(root, rg, pattern, [], 1)
    return found, dropped


async def _batches(stream: asyncio.StreamReader, size: int) -> AsyncGenerator[list[bytes], None]:
    """The NUL-separated names ripgrep lists, `size` at a time."""
    batch: list[bytes] = []
    pending = b""
    while chunk := await stream.read(_CHUNK_BYTES):
        *names, pending = (pending + chunk).split(b"\0")
        batch += [name for name in names if name]
        while len(batch) >= size:
            yield batch[:size]
            batch = batch[size:]
    batch += [pending] if pending else []
    if batch:
        yield batch


async def _search_batch(
    root: Path, rg: str, pattern: str, names: list[bytes], wanted: int
) -> tuple[list[dict[str, Any]], bool]:
    """Search the files `names` through checked descriptors: up to `wanted` hits."""
    opened = await _open_batch(root, names)
    try:
        shown = {f"/proc/self/fd/{fd}": name for fd, name in opened}
        argv = [rg, "--json", *_RG_COMMON, "--threads", "1", "--max-count", str(wanted)]
        argv += ["--regexp", pattern, "--", *(shown or ["/dev/null"])]
        async with _spawn(argv, pass_fds=[fd for fd, _ in opened]) as searcher:
            hits, dropped = await _read_matches(searcher.stdout, wanted)
            if len(hits) >= wanted:
                searcher.proc.kill()
            message, returncode = await searcher.finish()
        if not hits:
            _refused(message, returncode)
    finally:
        for fd, _ in opened:
            os.close(fd)
    return [_hit(shown, data) for data in hits], dropped


async def _open_batch(root: Path, names: list[bytes]) -> list[tuple[int, str]]:
    """`_open_all` in a worker thread; if the search is cancelled (its timeout) meanwhile,
    the descriptors are closed once the thread is done instead of leaking."""
    opening = asyncio.ensure_future(asyncio.to_thread(_open_all, root, names))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_opened)
        raise


def _close_opened(opening: asyncio.Future[list[tuple[int, str]]]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        for fd, _ in opening.result():
            os.close(fd)


def _open_all(root: Path, names: list[bytes]) -> list[tuple[int, str]]:
    """(descriptor, name shown) of each listed regular file that opens inside the workspace;
    the others (gone, swapped for a link, a FIFO, unreadable) are skipped, as ripgrep would."""
    opened: list[tuple[int, str]] = []
    flags = os.O_RDONLY | os.O_NONBLOCK
    for name in names:
        path = Path(os.fsdecode(name))
        shown = paths.display(root, path)
        try:
            fd = paths.open_in(root, path, flags, shown)
        except ToolError:
            continue
        if stat.S_ISREG(os.fstat(fd).st_mode):
            # the name where the file really is: a folder swapped for a link inside the
            # workspace would otherwise show it under an alias (d/workspace/x for x)
            opened.append((fd, _shown_at(root, fd, shown)))
        else:
            os.close(fd)
    return opened


def _shown_at(root: Path, fd: int, listed: str) -> str:
    try:
        return paths.display(root, os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return listed


@dataclass
class _Rg:
    proc: asyncio.subprocess.Process
    stdout: asyncio.StreamReader
    errors: asyncio.Task[bytes]

    async def finish(self) -> tuple[bytes, int]:
        """ripgrep's messages and exit status, once its output is read to the end."""
        await self.stdout.read()  # to EOF, so that wait() can return
        return await self.errors, await self.proc.wait()


@contextlib.asynccontextmanager
async def _spawn(argv: list[str], pass_fds: list[int] | None = None) -> AsyncIterator[_Rg]:
    """ripgrep with its pipes, as the sandbox user; killed, drained and reaped however the
    block ends."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *spawn.command_argv(argv), stdin=asyncio.subprocess.DEVNULL, stdout=PIPE, stderr=PIPE,
            pass_fds=pass_fds or (),
        )  # fmt: skip
    except OSError as exc:
        raise ToolError("EXECUTION_FAILED", f"cannot run ripgrep: {exc.strerror or exc}") from None
    assert proc.stdout is not None
    assert proc.stderr is not None
    errors = asyncio.create_task(_read_capped(proc.stderr, _RG_STDERR_BYTES))
    try:
        yield _Rg(proc, proc.stdout, errors)
    finally:
        await _stop(proc, errors)


def _refused(message: bytes, returncode: int) -> None:
    """ripgrep's exit 2 with a message: it refused the arguments; 126 or 127: it could not
    be started at all (its launcher says why)."""
    text = message.decode(errors="replace").strip()
    if returncode == 2 and text:
        raise ToolError("INVALID_ARGS", f"ripgrep refused the search: {text}")
    if returncode in (126, 127):
        raise ToolError("EXECUTION_FAILED", f"cannot run ripgrep: {text or returncode}")


async def _stop(proc: asyncio.subprocess.Process, errors: asyncio.Task[bytes]) -> None:
    """Kill ripgrep if it still runs, drain its pipes and reap it."""
    errors.cancel()
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.communicate()


async def _read_matches(stream: asyncio.StreamReader, wanted: int) -> tuple[list[Any], bool]:
    """The data of up to `wanted` rg `match` messages, and whether a line was dropped.
    A file's matches count once its `end` message says it is not binary."""
    found: list[Any] = []
    pending: list[Any] = []
    dropped = False
    async with contextlib.aclosing(_bounded_lines(stream, _RG_LINE_BYTES)) as lines:
        async for line in lines:
            message: dict[str, Any] = json.loads(line) if line is not None else {}
            dropped = dropped or line is None
            if message.get("type") == "match":
                pending.append(message["data"])
            elif message.get("type") == "end":
                binary = message["data"].get("binary_offset") is not None
                found += [] if binary else pending[: wanted - len(found)]
                pending = []
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


def _hit(shown: dict[str, str], data: dict[str, Any]) -> dict[str, Any]:
    """A match record, its /proc/self/fd/N path replaced by the workspace path it stands for."""
    text = _rg_text(data["lines"], as_path=False).rstrip("\r\n")
    if len(text) > MAX_LINE_CHARS:
        text = text[:MAX_LINE_CHARS] + " [...]"
    file = shown[_rg_text(data["path"], as_path=True)]
    return {"file": file, "line": data["line_number"], "text": text}


def _rg_text(field: dict[str, str], *, as_path: bool) -> str:
    """rg's {"text": ...} or, for bytes that are not UTF-8, {"bytes": base64}."""
    if "text" in field:
        return field["text"]
    raw = base64.b64decode(field["bytes"])
    return os.fsdecode(raw) if as_path else raw.decode("utf-8", errors="replace")
