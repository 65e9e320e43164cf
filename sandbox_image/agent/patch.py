"""The apply_patch tool: OpenAI's `*** Begin Patch` format, applied all or nothing.

    *** Begin Patch
    *** Add File: PATH          then '+' lines: the new file's content
    *** Update File: PATH
    *** Move to: PATH           optional, right after Update File
    @@ ANCHOR                   optional; several in a row narrow down step by step
     context / -removed / +added lines
    *** End of File             optional: the hunk sits at the end of the file
    *** Delete File: PATH
    *** End Patch

`parse` turns the text into operations, `_plan` computes every new file content in
memory and checks every path, and only then `_commit` writes: all new contents
go to fsynced temporary files first, then are renamed into place; moves and
deletes come last. Anything that fails before the renames changes nothing.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from . import paths
from .argcheck import Args, encoded, expect_only, req_str
from .errors import ToolError, from_os_error
from .files import _mode_at, _read_bytes, stage_in

MAX_PATCH_BYTES: Final = 10 * 1024 * 1024
_QUOTE_CHARS: Final = 200
_DIAGNOSE_BUDGET: Final = 1_000_000
_BEGIN, _END, _EOF = "*** Begin Patch", "*** End Patch", "*** End of File"
_ADD, _UPDATE, _DELETE, _MOVE = (
    "*** Add File: ",
    "*** Update File: ",
    "*** Delete File: ",
    "*** Move to: ",
)


async def apply_patch(root: Path, args: dict[str, Any]) -> dict[str, Any]:
    """Apply a patch in OpenAI's `*** Begin Patch` format to the workspace, all or nothing."""
    return await asyncio.to_thread(_apply_patch, root, args)


def _apply_patch(root: Path, args: Args) -> dict[str, Any]:
    expect_only(args, ("input",))
    text = req_str(args, "input")
    try:
        _check_size(text)
        plan = _plan(root, parse(text))
        _commit(root, plan)
    except ToolError as exc:
        raise ToolError(exc.code, f"apply_patch: {exc.message}") from None
    return plan.result


def _check_size(text: str) -> None:
    size = len(text) if len(text) > MAX_PATCH_BYTES else len(encoded(text, "input"))
    if size > MAX_PATCH_BYTES:
        raise ToolError("INVALID_ARGS", "the patch is larger than 10 MiB")


# parsing


@dataclass(frozen=True)
class Hunk:
    anchors: tuple[str, ...]
    """The `@@ TEXT` lines before the hunk, searched for in order."""
    lines: tuple[tuple[str, str], ...]
    """(' ' | '-' | '+', text) in patch order."""
    at_eof: bool

    @property
    def old(self) -> list[str]:
        return [text for op, text in self.lines if op != "+"]


@dataclass(frozen=True)
class FileOp:
    kind: Literal["add", "update", "delete"]
    path: str
    line: int
    """The directive's line number in the patch."""
    content: str = ""
    move_to: str | None = None
    hunks: tuple[Hunk, ...] = ()


Line = tuple[int, str]  # (1-based line number in the patch, text without line ending)


def parse(text: str) -> list[FileOp]:
    """The file operations of a patch; ToolError INVALID_ARGS naming the line when malformed."""
    body = _body([(n, line.removesuffix("\r")) for n, line in enumerate(text.split("\n"), 1)])
    ops = [_parse_section(head, rest) for head, rest in _sections(body)]
    if not ops:
        raise ToolError("INVALID_ARGS", "the patch changes no file")
    return ops


def _syntax(number: int, message: str) -> ToolError:
    return ToolError("INVALID_ARGS", f"line {number} of the patch: {message}")


def _body(lines: list[Line]) -> list[Line]:
    """The lines between '*** Begin Patch' and '*** End Patch' (blank lines around are fine)."""
    lines = _trim(lines, both=True)
    if not lines:
        raise ToolError("INVALID_ARGS", "the patch is empty")
    (first, head), (last, tail) = lines[0], lines[-1]
    if head.strip() != _BEGIN:
        raise _syntax(first, f"a patch starts with '{_BEGIN}', got {_quote(head)}")
    if len(lines) == 1 or tail.strip() != _END:
        raise _syntax(last, f"a patch ends with '{_END}', got {_quote(tail)}")
    return lines[1:-1]


def _trim(lines: list[Line], *, both: bool = False) -> list[Line]:
    """Without blank lines at the end, and at the start; `both` also drops lines of
    whitespace at both ends (elsewhere, ' ' is an empty context line)."""
    end, start = len(lines), 0
    while end and not (lines[end - 1][1].strip() if both else lines[end - 1][1]):
        end -= 1
    while both and start < end and not lines[start][1].strip():
        start += 1
    return lines[start:end]


def _sections(body: list[Line]) -> list[tuple[Line, list[Line]]]:
    """Each file directive with the lines up to the next one."""
    sections: list[tuple[Line, list[Line]]] = []
    for number, text in body:
        if text.startswith((_ADD, _UPDATE, _DELETE)):
            sections.append(((number, text), []))
        elif sections:
            sections[-1][1].append((number, text))
        elif text.strip():
            raise _syntax(
                number, f"expected a file operation ({_ADD.strip()} ...), got {_quote(text)}"
            )
    return [(head, _trim(rest)) for head, rest in sections]


def _parse_section(head: Line, rest: list[Line]) -> FileOp:
    number, text = head
    prefix = next(p for p in (_ADD, _UPDATE, _DELETE) if text.startswith(p))
    path = text.removeprefix(prefix).strip()
    if not path:
        raise _syntax(number, "the file path is missing")
    if prefix == _ADD:
        return FileOp("add", path, number, content=_added_content(rest))
    if prefix == _DELETE:
        if rest:
            raise _syntax(
                rest[0][0], f"unexpected line after '{_DELETE.strip()}': {_quote(rest[0][1])}"
            )
        return FileOp("delete", path, number)
    return _parse_update(path, number, rest)


def _added_content(rest: list[Line]) -> str:
    for number, text in rest:
        if not text.startswith("+"):
            raise _syntax(
                number, f"every line of an added file starts with '+', got {_quote(text)}"
            )
    return "".join(text[1:] + "\n" for _, text in rest)


def _parse_update(path: str, number: int, rest: list[Line]) -> FileOp:
    move_to = None
    if rest and rest[0][1].startswith(_MOVE):
        move_to = rest[0][1].removeprefix(_MOVE).strip()
        if not move_to:
            raise _syntax(rest[0][0], "the path to move to is missing")
        rest = rest[1:]
    hunks = _parse_hunks(rest)
    if not hunks and move_to is None:
        raise _syntax(number, f"'{_UPDATE.strip()} {path}' has no hunks")
    return FileOp("update", path, number, move_to=move_to, hunks=tuple(hunks))


def _parse_hunks(rest: list[Line]) -> list[Hunk]:
    hunks: list[Hunk] = []
    anchors: list[str] = []
    changes: list[tuple[str, str]] = []
    for index, (number, text) in enumerate(rest):
        if text.startswith("@@"):
            if changes:
                hunks.append(Hunk(tuple(anchors), tuple(changes), at_eof=False))
                anchors, changes = [], []
            anchor = text.removeprefix("@@").removeprefix(" ")
            anchors += [anchor] if anchor.strip() else []
        elif text.strip() == _EOF:
            if not changes or index != len(rest) - 1:
                raise _syntax(number, f"'{_EOF}' must close the last hunk of a file")
            return [*hunks, Hunk(tuple(anchors), tuple(changes), at_eof=True)]
        else:
            changes.append(_change(number, text))
    if anchors and not changes:
        raise _syntax(rest[-1][0], "a '@@' line must be followed by hunk lines")
    return [*hunks, Hunk(tuple(anchors), tuple(changes), at_eof=False)] if changes else hunks


def _change(number: int, text: str) -> tuple[str, str]:
    if not text:
        return " ", ""  # an empty context line whose leading space was lost
    if text[0] in " -+":
        return text[0], text[1:]
    if text.startswith(_MOVE):
        raise _syntax(number, f"'{_MOVE.strip()}' must come right after '{_UPDATE.strip()}'")
    if text.startswith("***"):
        raise _syntax(number, f"unknown directive {_quote(text)}")
    raise _syntax(number, f"hunk lines start with ' ', '-' or '+', got {_quote(text)}")


def _quote(text: str) -> str:
    return f"'{text[:_QUOTE_CHARS]}{' [...]' if len(text) > _QUOTE_CHARS else ''}'"


# applying hunks to a text

FileLine = tuple[str, str]  # (text, ending: '\n', '\r\n' or '' for a new line / the last one)


def patched(text: str, hunks: tuple[Hunk, ...], shown: str) -> str:
    """`text` with `hunks` applied in order; ToolError INVALID_ARGS naming the hunk that fails.

    Lines the patch does not change keep their bytes; new lines take the file's line
    ending (that of its first line); a missing final newline stays missing.
    """
    lines = _split(text)
    eol = lines[0][1] if lines and lines[0][1] else "\n"
    index = _Index(lines)
    out: list[FileLine] = []
    cursor = 0
    for number, hunk in enumerate(hunks, 1):
        start = _locate(index, hunk, cursor, _Where(number, shown))
        end = start + len(hunk.old)
        out += lines[cursor:start] + _replacement(lines[start:end], hunk)
        cursor = end
    out += lines[cursor:]
    return _join(out, eol, final_newline=not text or text.endswith("\n"))


def _split(text: str) -> list[FileLine]:
    parts = text.split("\n")
    lines = [(p[:-1], "\r\n") if p.endswith("\r") else (p, "\n") for p in parts[:-1]]
    return [*lines, (parts[-1], "")] if parts[-1] else lines


def _join(lines: list[FileLine], eol: str, *, final_newline: bool) -> str:
    fixed = [(text, ending or eol) for text, ending in lines]
    if fixed and not final_newline:
        fixed[-1] = (fixed[-1][0], "")
    return "".join(text + ending for text, ending in fixed)


def _replacement(matched: list[FileLine], hunk: Hunk) -> list[FileLine]:
    """The hunk's new lines; context lines keep the file's own version of the line."""
    old = iter(matched)
    out: list[FileLine] = []
    for op, text in hunk.lines:
        if op == " ":
            out.append(next(old))
        elif op == "-":
            next(old)
        else:
            out.append((text, ""))
    return out


@dataclass(frozen=True)
class _Where:
    hunk: int
    shown: str

    def mismatch(self, reason: str) -> ToolError:
        message = f"hunk {self.hunk} of '{self.shown}' does not match: {reason}"
        return ToolError("INVALID_ARGS", message)


def _locate(index: _Index, hunk: Hunk, cursor: int, where: _Where) -> int:
    """Where the hunk's old lines start, searching from `cursor` (after its anchors)."""
    lines, start, anchored = index.lines, cursor, False
    for anchor in hunk.anchors:
        found = _find_line(lines, anchor, start)
        if found is None:
            raise where.mismatch(f"'@@ {anchor[:_QUOTE_CHARS]}' not found{_after(start)}")
        start, anchored = found + 1, True
    old = hunk.old
    if not old:
        return len(lines) if hunk.at_eof or not anchored else start
    if anchored:
        start -= 1  # the anchor line may also be the hunk's first context line
    at_end = len(lines) - len(old)
    if hunk.at_eof and at_end >= start and index.seek(old, at_end) == at_end:
        return at_end
    found = index.seek(old, start)
    if found is None:
        raise where.mismatch(_diagnose(lines, old, start))
    return found


def _after(start: int) -> str:
    return f" after line {start}" if start else ""


def _find_line(lines: list[FileLine], wanted: str, start: int) -> int | None:
    """The first line from `start` equal to `wanted`, else equal once both are stripped."""
    for same in (str.__eq__, lambda a, b: a.strip() == b.strip()):
        for index in range(start, len(lines)):
            if same(lines[index][0], wanted):
                return index
    return None


class _Index:
    """Finds a run of lines by a string search over the joined lines, so that each search
    stays linear in the file's size; built once per file."""

    def __init__(self, lines: list[FileLine]) -> None:
        self.lines = lines
        self._joined: dict[bool, tuple[str, list[int]]] = {}

    def seek(self, old: list[str], start: int) -> int | None:
        """The first index >= `start` where `old` matches exactly, else ignoring
        trailing whitespace."""
        for loose in (False, True):
            haystack, offsets = self._join(loose)
            needle = "".join((s.rstrip() if loose else s) + "\n" for s in old)
            found = haystack.find("\n" + needle, offsets[start])
            if found >= 0:
                return bisect.bisect_left(offsets, found)
        return None

    def _join(self, loose: bool) -> tuple[str, list[int]]:
        """'\\n' + each line + '\\n', and the offset of the '\\n' before each line."""
        if loose not in self._joined:
            texts = [text.rstrip() if loose else text for text, _ in self.lines]
            offsets = list(itertools.accumulate((len(t) + 1 for t in texts), initial=0))
            self._joined[loose] = ("\n" + "".join(t + "\n" for t in texts), offsets)
        return self._joined[loose]


def _diagnose(lines: list[FileLine], old: list[str], start: int) -> str:
    """Why `old` matches nowhere from `start`: the longest partial match and its first
    wrong line (bounded work, so a pathological file cannot stall the agent)."""
    best, best_at, budget = 0, start, _DIAGNOSE_BUDGET
    for at in range(start, len(lines)):
        count = 0
        while count < len(old) and at + count < len(lines) and budget > 0:
            if lines[at + count][0].rstrip() != old[count].rstrip():
                break
            count, budget = count + 1, budget - 1
        if count > best:
            best, best_at = count, at
        budget -= 1
        if budget <= 0:
            break
    if best == 0:
        return f"line {_quote(old[0])} not found{_after(start)}"
    index = best_at + best
    found = _quote(lines[index][0]) if index < len(lines) else "the end of the file"
    return f"expected line {_quote(old[best])} near line {index + 1}; found {found}"


# planning: every check and every new content, before anything is written


@dataclass
class _Plan:
    writes: list[tuple[Path, bytes, int | None, str]] = field(default_factory=list)
    """(final path, content, mode to keep or None for a new file, path as written)."""
    renames: list[tuple[Path, Path, str]] = field(default_factory=list)
    removals: list[tuple[Path, str]] = field(default_factory=list)
    claimed: dict[Path, int] = field(default_factory=dict)
    """Each real path the patch touches, with the line of the operation that touches it."""
    result: dict[str, Any] = field(
        default_factory=lambda: {"added": [], "updated": [], "deleted": [], "moved": []}
    )


def _plan(root: Path, ops: list[FileOp]) -> _Plan:
    plan = _Plan()
    for op in ops:
        if op.kind == "add":
            _plan_add(root, op, plan)
        elif op.kind == "delete":
            _plan_delete(root, op, plan)
        else:
            _plan_update(root, op, plan)
    return plan


def _claim(root: Path, user_path: str, op: FileOp, plan: _Plan) -> Path:
    """The real path of `user_path`, which no earlier operation of the patch may touch."""
    path = paths.resolve(root, user_path, must_exist=False, kind="file")
    if path in plan.claimed:
        raise _syntax(op.line, f"'{user_path}' is already changed on line {plan.claimed[path]}")
    plan.claimed[path] = op.line
    return path


def _plan_add(root: Path, op: FileOp, plan: _Plan) -> None:
    path = _claim(root, op.path, op, plan)
    if paths.exists_in(root, path, op.path):
        raise ToolError("INVALID_ARGS", f"cannot add '{op.path}': it already exists")
    plan.writes.append((path, encoded(op.content, "input"), None, op.path))
    plan.result["added"].append(paths.display(root, path))


def _plan_delete(root: Path, op: FileOp, plan: _Plan) -> None:
    path = _existing(root, op, plan, "delete")
    _check_dir_writable(root, path.parent, op.path)
    plan.removals.append((path, op.path))
    plan.result["deleted"].append(paths.display(root, path))


def _plan_update(root: Path, op: FileOp, plan: _Plan) -> None:
    source = _existing(root, op, plan, "update")
    target = source if op.move_to is None else _move_target(root, op, plan, source)
    if op.hunks:
        data = _patched_file(root, source, op)
        mode = _mode_in(root, source, op.path)
        plan.writes.append((target, data, mode, op.move_to or op.path))
    if target == source:
        plan.result["updated"].append(paths.display(root, source))
        return
    _check_dir_writable(root, source.parent, op.path)
    if op.hunks:
        plan.removals.append((source, op.path))
    else:
        plan.renames.append((source, target, op.path))
    moved = {"from": paths.display(root, source), "to": paths.display(root, target)}
    plan.result["moved"].append(moved)


def _patched_file(root: Path, path: Path, op: FileOp) -> bytes:
    data, truncated = _read_bytes(path, op.path, root)
    if truncated:
        raise ToolError("INVALID_ARGS", f"'{op.path}' is too large to patch (over 10 MiB)")
    # surrogateescape round-trips bytes that are not UTF-8 unchanged.
    text = data.decode("utf-8", errors="surrogateescape")
    return encoded(patched(text, op.hunks, op.path), "input")


def _mode_in(root: Path, path: Path, shown: str) -> int | None:
    with paths.folder(root, path.parent, shown) as dir_fd:
        return _mode_at(dir_fd, path.name, shown)


def _existing(root: Path, op: FileOp, plan: _Plan, verb: str) -> Path:
    path = _claim(root, op.path, op, plan)
    if not paths.exists_in(root, path, op.path):
        raise ToolError("FILE_NOT_FOUND", f"cannot {verb} '{op.path}': no such file")
    return path


def _move_target(root: Path, op: FileOp, plan: _Plan, source: Path) -> Path:
    assert op.move_to is not None
    target = paths.resolve(root, op.move_to, must_exist=False, kind="file")
    if target == source:
        return source
    target = _claim(root, op.move_to, op, plan)
    if paths.exists_in(root, target, op.move_to):
        raise ToolError("INVALID_ARGS", f"cannot move '{op.path}' to '{op.move_to}': it exists")
    return target


def _check_dir_writable(root: Path, directory: Path, shown: str) -> None:
    with paths.folder(root, directory, shown) as dir_fd:
        writable = os.access(".", os.W_OK | os.X_OK, dir_fd=dir_fd, effective_ids=True)
    if not writable:
        raise ToolError("PERMISSION_DENIED", f"the directory of '{shown}' is not writable")


# committing: every step acts in a folder opened and checked inside the workspace
# (paths.folder), with the last component never followed if it is a link.

_Staged = tuple[str, Path, str]
"""(temporary name in the final path's folder, final path, path as written)."""


def _commit(root: Path, plan: _Plan) -> None:
    """Stage every new content in an fsynced temporary file, then rename them all into
    place, then move and delete. A failure while staging undoes the staging."""
    created: list[Path] = []
    staged: list[_Staged] = []
    try:
        for path, data, mode, shown in plan.writes:
            paths.make_folders(root, path.parent, shown, created)
            staged.append((_stage(root, path, data, mode, shown), path, shown))
        for _, target, shown in plan.renames:
            paths.make_folders(root, target.parent, shown, created)
            _check_dir_writable(root, target.parent, shown)
    except BaseException:
        _undo(root, staged, created)
        raise
    _finish(root, plan, staged, created)


def _finish(root: Path, plan: _Plan, staged: list[_Staged], created: list[Path]) -> None:
    touched = {directory.parent for directory in created}
    steps = [(path.parent, temp, path, shown) for temp, path, shown in staged]
    steps += [(source.parent, source.name, target, shown) for source, target, shown in plan.renames]
    for source_dir, name, target, shown in steps:
        _rename(root, source_dir, name, target, shown)
        touched |= {source_dir, target.parent}
    for path, shown in plan.removals:
        with paths.folder(root, path.parent, shown) as dir_fd:
            try:
                os.unlink(path.name, dir_fd=dir_fd)
            except OSError as exc:
                raise from_os_error(exc, shown) from None
        touched.add(path.parent)
    for directory in sorted(touched):
        with contextlib.suppress(OSError, ToolError), paths.folder(root, directory, "") as fd:
            os.fsync(fd)


def _rename(root: Path, source_dir: Path, name: str, target: Path, shown: str) -> None:
    """Rename `name` in `source_dir` to `target` (replacing a file there)."""
    with (
        paths.folder(root, source_dir, shown) as source_fd,
        paths.folder(root, target.parent, shown) as target_fd,
    ):
        try:
            os.rename(name, target.name, src_dir_fd=source_fd, dst_dir_fd=target_fd)
        except OSError as exc:
            raise from_os_error(exc, shown) from None


def _stage(root: Path, path: Path, data: bytes, mode: int | None, shown: str) -> str:
    with paths.folder(root, path.parent, shown) as dir_fd:
        try:
            return stage_in(dir_fd, data, mode)
        except OSError as exc:
            raise from_os_error(exc, shown) from None


def _undo(root: Path, staged: list[_Staged], created: list[Path]) -> None:
    for temp, path, shown in staged:
        with contextlib.suppress(OSError, ToolError), paths.folder(root, path.parent, shown) as fd:
            os.unlink(temp, dir_fd=fd)
    for directory in reversed(created):
        with (
            contextlib.suppress(OSError, ToolError),
            paths.folder(root, directory.parent, "") as fd,
        ):
            os.rmdir(directory.name, dir_fd=fd)
