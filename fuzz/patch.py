"""The agent's apply_patch (sandbox_image/agent/patch.py): any patch text, against a fresh
workspace of a few files. Clean refusal: ToolError (a bad patch, a path outside, a hunk
that does not match). Nothing may be written outside the workspace."""

from __future__ import annotations

from fuzz import Workspace
from stockade.agent.errors import ToolError
from stockade.agent.patch import _apply_patch

INSTRUMENT = ("stockade",)
REFUSALS: tuple[type[BaseException], ...] = (ToolError,)
WORKSPACE = Workspace()


def one(data: bytes) -> None:
    root = WORKSPACE.fresh()
    try:
        _apply_patch(root, {"input": data.decode("utf-8", "surrogateescape")})
    finally:
        WORKSPACE.check_outside()
