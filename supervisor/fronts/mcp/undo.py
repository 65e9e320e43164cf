"""The `undo` tool of the MCP endpoint, listed only when `[mcp] undo` says so ("show": the diff
an undo would take back; "apply": that, and the undo itself when the call asks). It goes
through the one RollbackSandbox path (sandboxes/snapshots/checkpoints.py Checkpoints.undo):
the same checks, and an applied undo is one audit record naming the MCP caller. It is not a
catalog tool: the stdio bridge (`stockade mcp`), which lists the catalog over gRPC, has none."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, Final, Protocol

import mcp_types as types

from stockade.supervisor import errors
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.sandboxes.snapshots.checkpoints import Undo
from stockade.supervisor.text import wire_text
from stockade.supervisor.tools.render import cap_text

UNDO_TOOL: Final = "undo"
MAX_CALL_ID: Final = 128

SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "to_call_id": {
            "type": "string",
            "maxLength": MAX_CALL_ID,
            "description": "The call whose checkpoint to go back to (its request id); "
            "empty or absent: the newest checkpoint.",
        },
        "apply": {
            "type": "boolean",
            "description": "false (the default): only show what the undo would take back. "
            "true: undo (the sandbox's processes end; files only come back).",
        },
    },
    "additionalProperties": False,
}


class Undoing(Protocol):
    def __call__(
        self, key: str, to_call: str, *, apply: bool, reason: str = ""
    ) -> Awaitable[Undo]: ...


def undo_tool(mode: str) -> types.Tool:
    can = "show what an undo takes back, or undo" if mode == "apply" else "show what an undo"
    return types.Tool(
        name=UNDO_TOOL,
        description=(
            f"Puts this sandbox's workspace back as it was before a call that took a "
            f"checkpoint ({can} would take back: files added, removed, changed, as a unified "
            "diff). Process state is not rolled back."
        ),
        input_schema=dict(SCHEMA),
        annotations=types.ToolAnnotations(
            read_only_hint=mode != "apply",
            destructive_hint=mode == "apply",
            idempotent_hint=False,
            open_world_hint=False,
        ),
    )


def arguments_of(arguments: Mapping[str, Any] | None, mode: str) -> tuple[str, bool]:
    """The call id and whether to apply; InvalidRequest or PolicyDenied otherwise."""
    arguments = arguments or {}
    unknown = sorted(set(arguments) - {"to_call_id", "apply"})
    if unknown:
        raise errors.InvalidRequest(f"undo takes to_call_id and apply only, not {unknown[:5]}")
    to_call = arguments.get("to_call_id", "")
    if not isinstance(to_call, str) or len(to_call) > MAX_CALL_ID:
        raise errors.InvalidRequest(f"to_call_id must be a string of at most {MAX_CALL_ID}")
    apply = arguments.get("apply", False)
    if not isinstance(apply, bool):
        raise errors.InvalidRequest("apply must be true or false")
    if apply and mode != "apply":
        raise errors.PolicyDenied(
            '[mcp] undo = "show": this endpoint shows what an undo takes back, it does not undo'
        )
    return to_call, apply


async def undo_call(
    undo: Undoing,
    key: str,
    arguments: Mapping[str, Any] | None,
    mode: str,
    peer: str,
    scrubber: Scrubber | None,
    max_bytes: int,
) -> types.CallToolResult:
    """The tool's result: a line saying what is (or would be) taken back, then the diff,
    scrubbed and capped as any tool's text for the model."""
    to_call, apply = arguments_of(arguments, mode)
    done = await undo(key, to_call, apply=apply, reason=f"from MCP ({peer or 'local'})")
    point, diff = done.checkpoint, done.diff
    added, removed, changed = diff.counts
    head = (
        f"{'undone' if done.applied else 'not applied (apply: true undoes)'}: to before call "
        f"{point.call_id} ({point.tool}): {added} added, {removed} removed, {changed} changed "
        f"{'taken back' if done.applied else 'to take back'}\n"
    )
    text = diff.text if scrubber is None else scrubber.scrub(diff.text)[0]
    shown, _ = cap_text(head + text, max_bytes)
    structured = {
        "call_id": point.call_id, "tool": point.tool, "applied": done.applied,
        "added": added, "removed": removed, "changed": changed,
    }  # fmt: skip
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=wire_text(shown))],
        structured_content=structured,
        is_error=False,
    )
