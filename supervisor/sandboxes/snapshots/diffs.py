"""What changed between two captures of a tree: files added, removed and changed (content,
mode, kind, a link's target), with a unified diff of text files. Pure but for reading the
store's content (through `read`).

Bounds: a file is shown as text when both sides are at most MAX_TEXT_BYTES, UTF-8 and free
of NUL (else "binary files differ"); the whole diff text stops at MAX_DIFF_BYTES with a line
saying so; at most MAX_PATHS paths are listed per kind (the counts stay exact).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from stockade.supervisor.sandboxes.snapshots.capture import Entry

MAX_TEXT_BYTES: Final = 256 * 1024
MAX_DIFF_BYTES: Final = 1 << 20
MAX_PATHS: Final = 10_000

Read = Callable[[str, int], bytes | None]
"""A stored file's content by digest, at most the given bytes."""


@dataclass
class TreeDiff:
    """From `before` to `after`: what an undo to `before` takes back."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    counts: tuple[int, int, int] = (0, 0, 0)
    """(added, removed, changed), exact even when the lists are cut at MAX_PATHS."""
    text: str = ""
    """The unified diff (a/ before, b/ after), cut at MAX_DIFF_BYTES."""

    @property
    def empty(self) -> bool:
        return self.counts == (0, 0, 0)


def diff_trees(before: dict[str, Entry], after: dict[str, Entry], read: Read) -> TreeDiff:
    added = sorted(p for p in after if p not in before)
    removed = sorted(p for p in before if p not in after)
    changed = sorted(p for p in before if p in after and _differs(before[p], after[p]))
    out = TreeDiff(
        added[:MAX_PATHS], removed[:MAX_PATHS], changed[:MAX_PATHS],
        (len(added), len(removed), len(changed)),
    )  # fmt: skip
    chunks: list[str] = []
    size = 0
    for path in sorted({*added, *removed, *changed}):
        piece = _file_diff(path, before.get(path), after.get(path), read)
        if size + len(piece) > MAX_DIFF_BYTES:
            chunks.append(f"... the diff is cut at {MAX_DIFF_BYTES} bytes\n")
            break
        chunks.append(piece)
        size += len(piece)
    out.text = "".join(chunks)
    return out


def _differs(a: Entry, b: Entry) -> bool:
    if a.kind != b.kind or a.mode != b.mode:
        return True
    if a.kind == "f":
        return a.digest != b.digest
    if a.kind == "l":
        return a.target != b.target
    return False  # a folder: its entries say what changed


def _describe(entry: Entry) -> str:
    kind = {"d": "folder", "f": "file", "l": "link"}[entry.kind]
    tail = f" -> {entry.target}" if entry.kind == "l" else ""
    return f"{kind} {entry.mode:04o}{tail}"


def _file_diff(path: str, old: Entry | None, new: Entry | None, read: Read) -> str:
    head = []
    if old is None and new is not None:
        head.append(f"added {path} ({_describe(new)})\n")
    elif new is None and old is not None:
        head.append(f"removed {path} ({_describe(old)})\n")
    elif old is not None and new is not None and (old.kind, old.mode) != (new.kind, new.mode):
        head.append(f"changed {path}: {_describe(old)} -> {_describe(new)}\n")
    elif old is not None and new is not None and old.kind == "l":
        head.append(f"changed {path}: link -> {old.target} became -> {new.target}\n")
    old_text = _text(old, read)
    new_text = _text(new, read)
    if old_text is None or new_text is None:
        files = (old is not None and old.kind == "f") or (new is not None and new.kind == "f")
        if files and (old is None or new is None or old.digest != new.digest):
            head.append(f"Binary files a/{path} and b/{path} differ (or too long to show)\n")
        return "".join(head)
    if old is not None and new is not None and old.digest == new.digest:
        return "".join(head)
    lines = difflib.unified_diff(
        old_text.splitlines(keepends=True),
        new_text.splitlines(keepends=True),
        f"a/{path}" if old is not None and old.kind == "f" else "/dev/null",
        f"b/{path}" if new is not None and new.kind == "f" else "/dev/null",
    )
    body = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)  # fmt: skip
    return "".join(head) + body


def _text(entry: Entry | None, read: Read) -> str | None:
    """The file's text; "" for no file (or not a file); None when it is not shown as text."""
    if entry is None or entry.kind != "f":
        return ""
    if entry.size > MAX_TEXT_BYTES:
        return None
    data = read(entry.digest, MAX_TEXT_BYTES + 1)
    if data is None or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
