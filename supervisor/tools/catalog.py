"""The tool catalog: names, groups and profiles follow GoClaw's tables; arguments follow
GoClaw and clawft, so agents written for those systems find what they expect."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from stockade.supervisor.config import CustomToolConfig, check_seconds
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.tools.schema_tree import reference_problems


@dataclass(frozen=True)
class ToolSpec:
    name: str
    group: str
    description: str
    parameters: Mapping[str, Any]
    """JSON Schema of the arguments object."""
    profiles: tuple[str, ...]
    custom: CustomToolConfig | None = None
    """For custom tools: the command template and how to run it."""


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
_PROCESS_ACTIONS = (
    "start", "list", "poll", "log", "write", "kill", "remove", "attach", "resize",
)  # fmt: skip
_WINDOW = {"type": "integer", "minimum": 1, "maximum": 1000}
_SESSION = {
    "type": "string",
    "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
    "description": "A shell session's name: its folder, exported environment, shell options "
    "and aliases carry over from one call to the next (bash).",
}
_SIGNALS = ("TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2")

_TOOLS = [
    ToolSpec(
        "exec",
        "runtime",
        "Run a shell command (bash -c) in /workspace inside the sandbox; returns exit code, "
        "stdout and stderr. The whole process group is killed on timeout. With `session`, "
        "cd, export, source and set -o carry over to the next call of that session.",
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
            stdin={**_STR, "description": "Text for the command's standard input (then closed)."},
            session=_SESSION,
        ),
        _CODING,
    ),
    ToolSpec(
        "process",
        "runtime",
        "Background processes (dev servers, watchers) that outlive the call. Actions: "
        "start (command, workdir, env, name, pty, cols, rows, session) runs bash -c in /workspace "
        "(in a session's folder and environment with session) and "
        "returns an id (pty: on a terminal, for programs that need one); "
        "list; poll (id); log (id, offset, limit) reads the combined stdout and stderr from a "
        "byte offset (continue from next_offset); write (id, data, eof) feeds stdin, eof "
        "closes it; kill (id, signal: TERM by default, KILL, INT, HUP) signals its process "
        "group; resize (id, cols, rows) sets a terminal's size; remove (id) forgets an exited "
        "one. A few may run at once (5 by default).",
        _obj(
            ["action"],
            action={"type": "string", "enum": list(_PROCESS_ACTIONS)},
            command={**_STR, "description": "start: shell command line."},
            workdir={**_PATH, "description": "start: working directory, relative to /workspace."},
            env={
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "start: extra environment variables.",
            },
            name={
                **_STR,
                "maxLength": 64,
                "description": "start: a name to use instead of the id.",
            },
            pty={"type": "boolean", "description": "start: run on a pseudo-terminal."},
            session={**_SESSION, "description": "start: run in this shell session's state."},
            stdin={"type": "boolean", "description": "start: false gives it no input (EOF)."},
            separate_stderr={
                "type": "boolean",
                "description": "start: keep stderr apart from stdout (streamed output tells).",
            },
            follow={
                "type": "boolean",
                "description": "start, streamed calls only: stream its output until it exits.",
            },
            cols={**_WINDOW, "description": "start, resize: terminal columns (default 80)."},
            rows={**_WINDOW, "description": "start, resize: terminal rows (default 24)."},
            id={**_STR, "description": "The process id (p1, p2, ...) or name."},
            offset={"type": "integer", "minimum": 0, "description": "log: first byte (default 0)."},
            limit={
                "type": "integer",
                "minimum": 1,
                "maximum": 1 << 20,
                "description": "log: at most this many bytes (default 65536).",
            },
            data={**_STR, "description": "write: text for the process's stdin."},
            eof={"type": "boolean", "description": "write: close stdin afterwards."},
            signal={"type": "string", "enum": [*_SIGNALS, *(f"SIG{s}" for s in _SIGNALS)]},
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
        "apply_patch",
        "fs",
        "Add, update, move and delete files with one patch in the OpenAI apply_patch format: "
        "'*** Begin Patch', then per file '*** Add File: PATH' (lines starting with +), "
        "'*** Update File: PATH' (optional '*** Move to: PATH', then hunks: optional "
        "'@@ context line', lines starting with space, - or +) or '*** Delete File: PATH', "
        "then '*** End Patch'. All or nothing: if one hunk does not match, no file changes.",
        _obj(
            ["input"],
            input={
                "type": "string",
                "description": "The patch, from *** Begin Patch to *** End Patch.",
            },
        ),
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

ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "read": "read_file",
        "write": "write_file",
        "edit": "edit_file",
        "ls": "list_files",
        "list_directory": "list_files",
        "grep": "search",
        "find": "glob",
        "exec_shell": "exec",
    }
)
"""Names that agents written for OpenClaw and clawft use."""

PROFILES = ("minimal", "coding", "messaging", "full")
KNOWN_GROUPS = frozenset(
    {"fs", "runtime", "custom", "web", "memory", "sessions", "ui", "automation", "messaging"}
    | {"nodes", "agents", "media"}
)
"""Groups of the reference tables (GoClaw's, then OpenClaw's); those Stockade has no tools
in are empty, not errors."""
NATIVE_GROUPS = frozenset({"goclaw", "openclaw"})
"""GoClaw's and OpenClaw's composite groups: every built-in tool, no custom one."""


class Catalog:
    """The built-in tools plus the custom tools of the config."""

    def __init__(self, custom: Sequence[CustomToolConfig] = ()) -> None:
        tools = dict(TOOLS)
        for item in custom:
            _check_custom(item, tools)
            profiles = tuple(dict.fromkeys([*item.profiles, "full"]))  # full: every tool
            tools[item.name] = ToolSpec(
                item.name, "custom", item.description, item.parameters, profiles, item
            )
        self.tools: Mapping[str, ToolSpec] = MappingProxyType(tools)

    def resolve(self, name: str) -> ToolSpec | None:
        return self.tools.get(ALIASES.get(name, name))

    def aliases_of(self, name: str) -> tuple[str, ...]:
        return tuple(alias for alias, target in ALIASES.items() if target == name)

    def expand(self, entry: str, where: str) -> frozenset[str]:
        """The tool names an allow/deny entry stands for; ConfigError when it is unknown."""
        if entry.startswith("group:"):
            group = entry.removeprefix("group:")
            if group in NATIVE_GROUPS:
                return frozenset(t.name for t in self.tools.values() if t.custom is None)
            if group not in KNOWN_GROUPS:
                raise ConfigError(f"{where}: unknown group {entry!r}")
            return frozenset(t.name for t in self.tools.values() if t.group == group)
        spec = self.resolve(entry)
        if spec is None:
            raise ConfigError(f"{where}: {entry!r} is neither a tool, an alias nor a group:NAME")
        return frozenset({spec.name})

    def expand_all(self, entries: Sequence[str], where: str) -> frozenset[str]:
        return frozenset().union(*(self.expand(e, where) for e in entries))

    def profile(self, name: str, where: str) -> frozenset[str]:
        if name not in PROFILES:
            raise ConfigError(f"{where}: unknown profile {name!r}; one of {', '.join(PROFILES)}")
        return frozenset(t.name for t in self.tools.values() if name in t.profiles)


MAX_DESCRIPTION = 1024
"""Longest tool description OpenAI accepts; ListTools must be able to give every tool in
every format."""
MAX_SCHEMA_NESTING = 64
"""Nesting of a custom tool's JSON Schema (objects and lists): deeper ones made the schema
check overflow Python's stack at load, a crash instead of a ConfigError."""


def nesting_depth(value: object) -> int:
    """How deeply lists and objects nest in `value` (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, Mapping):
            item = list(item.values())
        if isinstance(item, list | tuple):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in item)
    return deepest


_PLACEHOLDER = re.compile(r"\{\{\s*\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_-]{0,63}$")


def placeholders(template: str) -> list[str]:
    return _PLACEHOLDER.findall(template)


def render_command(template: str, arguments: Mapping[str, Any]) -> str:
    """Fill {{.name}} with the shell-quoted argument (JSON for lists and objects; '' if absent)."""

    def value(match: re.Match[str]) -> str:
        item = arguments.get(match.group(1))
        if item is None:
            return "''"
        if isinstance(item, bool):
            text = "true" if item else "false"
        elif isinstance(item, (dict, list)):
            text = json.dumps(item)
        else:
            text = str(item)
        return shlex.quote(text)

    return _PLACEHOLDER.sub(value, template)


def _check_custom(item: CustomToolConfig, tools: Mapping[str, ToolSpec]) -> None:
    where = f"custom_tools.{item.name}"
    if not _NAME.match(item.name):
        raise ConfigError(f"{where}: a tool name is letters, digits, _ and -, up to 64")
    if len(item.description) > MAX_DESCRIPTION:
        raise ConfigError(
            f"{where}.description is {len(item.description)} characters long; OpenAI takes "
            f"at most {MAX_DESCRIPTION} (answering 400 string_above_max_length)"
        )
    if item.name in tools or item.name in ALIASES:
        raise ConfigError(f"{where}: the name is taken by a built-in tool or alias")
    if nesting_depth(item.parameters) > MAX_SCHEMA_NESTING:
        raise ConfigError(f"{where}.parameters nests deeper than {MAX_SCHEMA_NESTING} levels")
    if item.parameters.get("type") != "object":
        raise ConfigError(f'{where}.parameters must be an object schema (type = "object")')
    try:
        Draft202012Validator.check_schema(dict(item.parameters))
    except SchemaError as exc:
        raise ConfigError(f"{where}.parameters is not a valid JSON Schema: {exc.message}") from exc
    problems = reference_problems(item.parameters)
    if problems:
        raise ConfigError(f"{where}.parameters: {'; '.join(problems)}")
    declared = set(item.parameters.get("properties", {}))
    unknown = sorted(set(placeholders(item.command)) - declared)
    if unknown:
        raise ConfigError(f"{where}.command uses undeclared parameter(s): {', '.join(unknown)}")
    for profile in item.profiles:
        if profile not in PROFILES:
            raise ConfigError(f"{where}.profiles: unknown profile {profile!r}")
    check_seconds(f"{where}.timeout_s", item.timeout_s)
    if item.timeout_s <= 0:
        raise ConfigError(f"{where}.timeout_s must be positive")
