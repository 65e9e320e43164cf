"""The agent's tool table and its one entry point, `run`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from . import files, patch, shells
from .argcheck import json_type
from .errors import ToolError
from .execute import StreamSink, exec_command
from .processes import ProcessTable

Handler = Callable[[Path, dict[str, Any]], Awaitable[dict[str, Any]]]

TOOLS: Final[dict[str, Handler]] = {
    "exec": exec_command,
    "read_file": files.read_file,
    "write_file": files.write_file,
    "edit_file": files.edit_file,
    "apply_patch": patch.apply_patch,
    "list_files": files.list_files,
    "glob": files.glob,
    "search": files.search,
    "process": lambda root, args: _no_table(),
    "session": shells.session_tool,
}


async def _no_table() -> dict[str, Any]:
    raise ToolError("EXECUTION_FAILED", "this agent keeps no process table")


async def run(
    name: str,
    args: object,
    *,
    root: Path,
    max_output_bytes: int,
    sink: StreamSink | None = None,
    processes: ProcessTable | None = None,
) -> dict[str, Any]:
    """Run tool `name` with `args` (a decoded JSON object) in workspace `root`;
    `processes` is the agent's table of background processes (the process tool).

    Raises ToolError: UNKNOWN_TOOL, INVALID_ARGS when `args` is not an object,
    or whatever the tool raises.
    """
    handler = TOOLS.get(name)
    if handler is None:
        raise ToolError("UNKNOWN_TOOL", f"unknown tool '{name}'; known: {', '.join(sorted(TOOLS))}")
    if not isinstance(args, dict):
        raise ToolError("INVALID_ARGS", f"arguments must be an object, got {json_type(args)}")
    if handler is exec_command:
        return await exec_command(root, args, max_output_bytes=max_output_bytes, sink=sink)
    if name == "process" and processes is not None:
        return await processes.handle(args)
    return await handler(root, args)
