"""The tool catalog: names, groups and profiles follow GoClaw's tables; arguments follow
GoClaw and clawft, so agents written for those systems find what they expect."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class ToolSpec:
    name: str
    group: str
    description: str
    parameters: Mapping[str, Any]
    """JSON Schema of the arguments object."""
    profiles: tuple[str, ...]


def _obj(required: list[str], **props: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


_STR = {"type": "string"}
_PATH = {"type": "string", "description": "Path relative to /workspace."}
_CODING = ("coding", "full")

_TOOLS = [
    ToolSpec(
        "exec",
        "runtime",
        "Run a shell command (sh -c) in /workspace inside the sandbox; returns exit code, "
        "stdout and stderr. The whole process group is killed on timeout.",
        _obj(
            ["command"],
            command={**_STR, "description": "Shell command line."},
            timeout={
                "type": "number",
                "description": "Seconds (default 30, max 300).",
                "exclusiveMinimum": 0,
            },
            workdir={**_PATH, "description": "Working directory, relative to /workspace."},
            env={
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "Extra environment variables.",
            },
        ),
        _CODING,
    ),
    ToolSpec(
        "read_file",
        "fs",
        "Read a text file, optionally a range of lines (1-based, inclusive).",
        _obj(
            ["path"],
            path=_PATH,
            start_line={"type": "integer", "minimum": 1},
            end_line={"type": "integer", "minimum": 1},
        ),
        _CODING,
    ),
    ToolSpec(
        "write_file",
        "fs",
        "Write a file, creating parent directories; overwrites an existing file.",
        _obj(["path", "content"], path=_PATH, content=_STR),
        _CODING,
    ),
    ToolSpec(
        "edit_file",
        "fs",
        "Replace old_text with new_text in a file; old_text must occur exactly once.",
        _obj(["path", "old_text", "new_text"], path=_PATH, old_text=_STR, new_text=_STR),
        _CODING,
    ),
    ToolSpec(
        "list_files",
        "fs",
        "List a directory's entries (name, is_dir, size), sorted by name.",
        _obj([], path={**_PATH, "description": "Directory, relative to /workspace (default .)."}),
        _CODING,
    ),
    ToolSpec(
        "glob",
        "fs",
        "Find files whose path matches a glob pattern (** spans directories).",
        _obj(["pattern"], pattern={**_STR, "description": "e.g. **/*.py"}, path=_PATH),
        _CODING,
    ),
    ToolSpec(
        "search",
        "fs",
        "Search file contents with a regular expression; returns file, line number and text.",
        _obj(
            ["pattern"],
            pattern={**_STR, "description": "Regular expression (Rust regex syntax)."},
            path=_PATH,
            glob={**_STR, "description": "Only files matching this glob, e.g. *.py"},
            max_results={"type": "integer", "minimum": 1, "maximum": 1000},
        ),
        _CODING,
    ),
]

TOOLS: Mapping[str, ToolSpec] = MappingProxyType({t.name: t for t in _TOOLS})


def get_tool(name: str) -> ToolSpec | None:
    return TOOLS.get(name)
