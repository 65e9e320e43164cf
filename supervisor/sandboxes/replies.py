"""Checks of what the agent returns. The agent runs as the same uid as the code in the sandbox,
so nothing it sends is trusted: every result is parsed with bounds (depth, finite numbers,
64-bit integers) and every field the supervisor uses is checked for type and size against the
configured caps. A failed check raises ReplyInvalid, saying what is wrong."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

MAX_DEPTH: Final = 16
"""The deepest legitimate result is 3 levels (list_files entries, process lists)."""
MAX_INT: Final = 2**63
MAX_ERROR_MESSAGE: Final = 64 * 1024
MAX_CHUNK_BYTES: Final = 1 << 20
"""Of one output or download chunk: the agent reads pipes in 256 KiB, files in 1 MiB."""
MAX_READ_CHARS: Final = 10 * 1024 * 1024
"""read_file returns at most 10 MiB (the agent's MAX_READ_BYTES)."""
MAX_PID: Final = 1 << 22
"""The kernel's PID_MAX_LIMIT."""
MAX_SIGNAL_NAME: Final = 32
_JSON_EXPANSION: Final = 6
"""The agent ASCII-escapes its JSON: one character of output is at most 6 bytes (\\uXXXX)."""
_HEADROOM: Final = 4 * 1024 * 1024
_AGENT_SEND_LIMIT: Final = 128 * 1024 * 1024


class ReplyInvalid(ValueError):
    """A reply of the agent that the protocol does not allow."""


@dataclass(frozen=True)
class ReplyLimits:
    """What a legitimate agent may send, from the configured caps."""

    max_output_bytes: int = 10 * 1024 * 1024
    process_log_bytes: int = 1 << 20

    @property
    def max_message_bytes(self) -> int:
        """The largest reply: exec's stdout and stderr at their caps, ASCII-escaped, or a
        file read at its cap; never more than the agent itself can send."""
        text = max(2 * self.max_output_bytes, MAX_READ_CHARS, self.process_log_bytes)
        return min(text * _JSON_EXPANSION + _HEADROOM, _AGENT_SEND_LIMIT)


def parse_result(text: str) -> dict[str, Any]:
    """A result_json as a dict: a JSON object of bounded depth, finite numbers and integers
    that fit 64 bits."""
    try:
        parsed = json.loads(text, parse_constant=_no_constant)
    except RecursionError as exc:
        raise ReplyInvalid("a result nested too deeply") from exc
    except ValueError as exc:
        raise ReplyInvalid(f"a result that is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ReplyInvalid(f"a result that is not a JSON object but {type(parsed).__name__}")
    _check_tree(parsed)
    return parsed


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _check_tree(root: dict[str, Any]) -> None:
    pending: list[tuple[Any, int]] = [(root, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise ReplyInvalid(f"a result nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            pending.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            pending.extend((v, depth + 1) for v in value)
        elif isinstance(value, float) and not math.isfinite(value):
            raise ReplyInvalid("a result with a number that is not finite")
        elif isinstance(value, int) and not -MAX_INT <= value < MAX_INT:
            raise ReplyInvalid("a result with an integer beyond 64 bits")


def check_result(tool: str, data: dict[str, Any], limits: ReplyLimits) -> None:
    """The fields of `tool`'s result that the supervisor reads, checked."""
    check = _CHECKS.get(tool)
    if check is not None:
        check(data, limits)


def _field(data: dict[str, Any], name: str, kinds: tuple[type, ...], *, required: bool) -> Any:
    if name not in data:
        if required:
            raise ReplyInvalid(f"a result without {name!r}")
        return None
    value = data[name]
    bad_bool = isinstance(value, bool) and bool not in kinds
    if bad_bool or not isinstance(value, kinds):
        raise ReplyInvalid(f"{name!r} of type {type(value).__name__}")
    return value


def _count(data: dict[str, Any], name: str, *, upto: int = MAX_INT, required: bool = False) -> None:
    value = _field(data, name, (int,), required=required)
    if value is not None and not 0 <= value <= upto:
        raise ReplyInvalid(f"{name!r} out of range: {value}")


def _text(data: dict[str, Any], name: str, upto: int, *, required: bool = False) -> None:
    value = _field(data, name, (str,), required=required)
    if value is not None and len(value) > upto:
        raise ReplyInvalid(f"{name!r} of {len(value)} characters, over the cap of {upto}")


def _flags(data: dict[str, Any], *names: str) -> None:
    for name in names:
        _field(data, name, (bool,), required=False)


def _exit(data: dict[str, Any]) -> None:
    code = _field(data, "exit_code", (int, type(None)), required=False)
    if code is not None and not -(2**31) <= code < 2**31:
        raise ReplyInvalid(f"'exit_code' out of range: {code}")
    signal = _field(data, "signal", (str, type(None)), required=False)
    if signal is not None and len(signal) > MAX_SIGNAL_NAME:
        raise ReplyInvalid("'signal' is not a signal name")


def _exec(data: dict[str, Any], limits: ReplyLimits) -> None:
    for stream in ("stdout", "stderr"):
        _text(data, stream, limits.max_output_bytes)
        _count(data, f"{stream}_bytes")
        _flags(data, f"{stream}_truncated")
    _exit(data)
    _flags(data, "timed_out", "oom_killed", "pids_crowded")
    _count(data, "duration_ms")
    session = _field(data, "session", (dict,), required=False)
    if session is not None:
        _text(session, "name", 64, required=True)
        _text(session, "cwd", MAX_SESSION_FOLDER)
        _flags(session, "kept")


MAX_SESSION_FOLDER = 4096
"""The longest folder the agent tells for a session (its shells.MAX_FOLDER)."""


def _process(data: dict[str, Any], limits: ReplyLimits) -> None:
    _field(data, "id", (str,), required=False)
    _field(data, "state", (str,), required=False)
    _field(data, "processes", (list,), required=False)
    _text(data, "data", limits.process_log_bytes)
    _count(data, "pid", upto=MAX_PID)
    for name in ("pending_stdin", "next_offset", "output_bytes", "dropped", "written"):
        _count(data, name)
    _exit(data)


def _read_file(data: dict[str, Any], limits: ReplyLimits) -> None:
    _text(data, "content", MAX_READ_CHARS)


def _transfer(data: dict[str, Any], limits: ReplyLimits) -> None:
    _text(data, "path", 64 * 1024)
    _text(data, "sha256", 64)
    _count(data, "size")
    _count(data, "files")
    _flags(data, "tar")


def _session(data: dict[str, Any], limits: ReplyLimits) -> None:
    _flags(data, "ended")
    sessions = _field(data, "sessions", (list,), required=False)
    if sessions is None:
        return
    if len(sessions) > MAX_SESSIONS:
        raise ReplyInvalid(f"'sessions' lists {len(sessions)}, over {MAX_SESSIONS}")
    for session in sessions:
        if not isinstance(session, dict):
            raise ReplyInvalid("a session that is not an object")
        _text(session, "name", 64, required=True)
        _text(session, "cwd", MAX_SESSION_FOLDER)
        _count(session, "calls")
        _flags(session, "busy")


MAX_SESSIONS = 1024
"""The most sessions an agent may list (it keeps 32)."""


_CHECKS: dict[str, Callable[[dict[str, Any], ReplyLimits], None]] = {
    "exec": _exec,
    "process": _process,
    "read_file": _read_file,
    "transfer": _transfer,
    "session": _session,
}
