"""What a file change will change, for its approval (approvals.files): the unified diff of the
file's contents now, read through the sandbox's agent, against the contents the call would
write; for apply_patch, the patch itself. Scrubbed like any output (a secret in the file
reaches the approver as `[REDACTED]`) and bounded: a side over MAX_SIDE_BYTES, or a binary
file, is named with its size instead of diffed; the whole text is cut at MAX_DIFF_BYTES at a
line's end with a line saying so. A file that cannot be read is said so; the approval is
asked all the same."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Protocol

from stockade.supervisor.calls.outcome import CALL_FAULTS
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.sandboxes.agent_link import AgentReply

MAX_SIDE_BYTES: Final = 256 * 1024
"""A side (the file now, or the new contents) larger than this is not diffed line by line."""
MAX_DIFF_BYTES: Final = 64 * 1024
"""What an approval carries at most (gRPC, the console, `approvals watch`)."""
MAX_CHANGE_CHARS: Final = 1024
"""The change's name (tool and paths: what allow-always keeps) at most."""
READ_TIMEOUT_S: Final = 10.0
PATCH_HEADS: Final = ("*** Add File: ", "*** Update File: ", "*** Delete File: ", "*** Move to: ")


class Reader(Protocol):
    """What the preview calls on a sandbox's lease (calls/pipeline.py CallLease)."""

    async def invoke(
        self, tool: str, arguments: dict[str, Any], timeout: float, request_id: str, /
    ) -> AgentReply: ...


Leases = Callable[[str], AbstractAsyncContextManager[Reader]]


def change_of(tool: str, args: dict[str, Any]) -> str:
    """The change as one line: the tool and the paths it writes (an approval's command)."""
    if tool == "apply_patch":
        patch = str(args.get("input", ""))
        paths = [line[len(h) :] for line in patch.splitlines() for h in PATCH_HEADS
                 if line.startswith(h)]  # fmt: skip
        named = f"apply_patch {' '.join(paths)}".rstrip()
    else:
        named = f"{tool} {args.get('path', '')}"
    if len(named) > MAX_CHANGE_CHARS:
        named = named[:MAX_CHANGE_CHARS] + "..."
    return named


async def preview(
    leases: Leases,
    key: str,
    request_id: str,
    tool: str,
    args: dict[str, Any],
    scrubber: Scrubber | None,
) -> str:
    """The diff an approver sees before `tool` with `args` runs in `key`'s sandbox."""
    if tool == "apply_patch":
        text = str(args.get("input", ""))
        note = "(the patch as given; it is applied all or nothing)\n"
        return _bounded(note + _cut(text, MAX_SIDE_BYTES), scrubber, len(text.encode()))
    path = str(args.get("path", ""))
    old, why = await _current(leases, key, request_id, path)
    if why:
        return _bounded(f"{path}: {why}; no diff is shown\n", scrubber)
    if tool == "edit_file":
        new, why = _edited(old, str(args.get("old_text", "")), str(args.get("new_text", "")))
        if why:
            return _bounded(f"{path}: {why}\n", scrubber)
    else:
        new = str(args.get("content", ""))
    return _bounded(diff_text(path, old, new), scrubber)


def diff_text(path: str, old: str | None, new: str) -> str:
    """The unified diff of `old` (None: no such file) against `new`, or a line saying why
    not when a side is too large."""
    sizes = (0 if old is None else len(old.encode()), len(new.encode()))
    if max(sizes) > MAX_SIDE_BYTES:
        return (
            f"{path}: {sizes[0]} bytes now, {sizes[1]} bytes after: too large to diff "
            f"(at most {MAX_SIDE_BYTES} bytes a side)\n"
        )
    if old == new:
        return f"{path}: no change (the contents are the same)\n"
    lines = difflib.unified_diff(
        (old or "").splitlines(keepends=True),
        new.splitlines(keepends=True),
        "/dev/null" if old is None else f"a/{path}",
        f"b/{path}",
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)  # fmt: skip


async def _current(leases: Leases, key: str, request_id: str, path: str) -> tuple[str | None, str]:
    """The file's text now (None: there is none), or "" and why it is not shown."""
    try:
        async with leases(key) as lease:
            reply = await lease.invoke("read_file", {"path": path}, READ_TIMEOUT_S, request_id)
    except CALL_FAULTS as exc:
        return None, f"the file could not be read ({type(exc).__name__})"
    if reply.error_code == "FILE_NOT_FOUND":
        return None, ""
    result = reply.result or {}
    if reply.error_code:
        return None, f"the file could not be read ({reply.error_code}: {reply.error_message})"
    if result.get("binary"):
        return None, "a binary file"
    content = result.get("content")
    if not isinstance(content, str):
        return None, "the agent gave no contents"
    if result.get("truncated"):
        return None, f"larger than the agent reads ({len(content.encode())} bytes read)"
    return content, ""


def _edited(old: str | None, old_text: str, new_text: str) -> tuple[str, str]:
    """edit_file's result on `old` as the agent makes it, or "" and why the edit will fail."""
    if old is None:
        return "", "no such file: the edit will fail"
    count = old.count(old_text) if old_text else 0
    if count != 1:
        return "", f"old_text is found {count} times: the edit will fail"
    return old.replace(old_text, new_text, 1), ""


def _cut(text: str, limit: int) -> str:
    """At most `limit` bytes of `text`, ended at a line's end when it is cut."""
    data = text.encode()
    if len(data) <= limit:
        return text
    head = data[:limit]
    end = head.rfind(b"\n")
    return head[: end + 1 if end >= 0 else limit].decode(errors="ignore")


def _bounded(text: str, scrubber: Scrubber | None, total: int = 0) -> str:
    """Scrubbed first (a secret is never cut in two before the scrubber saw it whole), then
    cut at MAX_DIFF_BYTES with a line saying so."""
    if scrubber is not None:
        text = scrubber.scrub(text)[0]
    size = max(total, len(text.encode()))
    if size <= MAX_DIFF_BYTES:
        return text
    shown = _cut(text, MAX_DIFF_BYTES)
    return shown + f"... the diff is cut at {len(shown.encode())} bytes of {size}\n"
