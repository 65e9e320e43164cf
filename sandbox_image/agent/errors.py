"""The agent's one error type.

    ToolError(code, message)   every failure a tool reports to the supervisor

`code` is one of ERROR_CODES; the server maps it to the wire enum. `message` is
meant for the model: it names the failing argument or path.
`from_os_error` is the one table from an OSError to the most specific code.
"""

from __future__ import annotations

import errno
import re
from typing import Final, Literal, get_args

ErrorCode = Literal[
    "INVALID_ARGS",
    "FILE_NOT_FOUND",
    "INVALID_PATH",
    "PERMISSION_DENIED",
    "EXECUTION_FAILED",
    "TIMEOUT",
    "UNKNOWN_TOOL",
]
ERROR_CODES: Final = frozenset(get_args(ErrorCode))

_ERRNO_CODES: Final[dict[int, ErrorCode]] = {
    errno.ENOENT: "FILE_NOT_FOUND",
    errno.EACCES: "PERMISSION_DENIED",
    errno.EPERM: "PERMISSION_DENIED",
    errno.EROFS: "PERMISSION_DENIED",
    errno.ENOTDIR: "INVALID_PATH",
    errno.EISDIR: "INVALID_PATH",
    errno.ELOOP: "INVALID_PATH",
    errno.ENAMETOOLONG: "INVALID_PATH",
    errno.EEXIST: "INVALID_PATH",
}


class ToolError(Exception):
    """A tool failed; `code` says how, `message` says why, for the model."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code: ErrorCode = code
        self.message = message


def from_os_error(exc: OSError, shown_path: str, *, arg: str = "path") -> ToolError:
    """Map an OSError about `shown_path` (as the caller wrote it) to a ToolError."""
    code = _ERRNO_CODES.get(exc.errno or 0, "EXECUTION_FAILED")
    reason = exc.strerror or str(exc)
    return ToolError(code, f"{arg} '{shown_path}': {reason}")


_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def wire_text(text: str) -> str:
    """`text` as a protobuf string can carry it: lone surrogates (from names that are not
    UTF-8, or from the caller's own arguments) become U+FFFD. A message holding one would
    not serialize, and the supervisor would take the failed reply for a broken agent."""
    return _LONE_SURROGATE.sub("\ufffd", text)
