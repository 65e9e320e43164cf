"""envd's files for the E2B front: GET/POST /files and the filesystem.Filesystem RPCs.

Every operation goes through Stockade's one pipeline: /files through the file transfers
(write_file/read_file policy, download scrubbing, audit), the Filesystem RPCs through the
`exec` tool with a fixed, quoted coreutils command (guard, policy, audit), all named "e2b"
in audit and run on the sandbox's scoped key. E2B paths (/home/user/..., ~/..., relative)
map onto /workspace; any other absolute path is the container's own (the container is the
boundary, as on E2B: what the sandbox's user may read or write), but for /proc, /sys and /dev
(`target_of`), which only a read reaches, as a command (`Files.kernel_read`)."""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request

from stockade.supervisor import errors
from stockade.supervisor.calls.transfers import FileTransfers, Transfer
from stockade.supervisor.fronts.e2b import file_metadata
from stockade.supervisor.fronts.e2b.connect import ConnectError, Json
from stockade.supervisor.fronts.e2b.context import FRONT, E2bContext
from stockade.supervisor.fronts.e2b.records import E2bSandbox
from stockade.supervisor.models import CallContext, ErrorCode, ToolCall, ToolResult

HOME = "/home/user"
SANDBOX_STATE = "e2b_sandbox"
_FIELDS = "%y\\0%Y\\0%s\\0%m\\0%M\\0%u\\0%g\\0%T@\\0{path}\\0"
"""find's fields of an entry, each ended by a NUL: no file name can hold one (a tab or a
newline can). %Y is the type a symlink leads to (N: to nothing, L: a loop); a symlink's
entry then gets one field more, its resolved absolute path (`realpath -m`), any other an
empty one: see _find's script."""
_FIELD_COUNT = 10


def _print(path: str) -> str:
    """find's action: a symlink's fields and its resolved path (an empty field where even
    `realpath -m` fails, a loop), any other entry's fields and an empty one; `path` is find's
    field for the entry's path: %P (from the starting point) or %p (as given)."""
    fields = _FIELDS.format(path=path)
    return (
        f"\\( -type l -printf '{fields}' "
        f"\\( -exec realpath -z -m -- {{}} \\; -o -printf '\\0' \\) \\)"
        f" -o -printf '{fields}\\0'"
    )


_PRINT = _print("%P")
_PRINT_GIVEN = _print("%p")
_OWNERS = {"sandbox": "user"}
"""The sandbox's one unprivileged user (`sandbox` in the image) is E2B's `user`: the SDK and
E2B's templates name a file's owner and group so."""
_TYPES = {"f": "FILE_TYPE_FILE", "d": "FILE_TYPE_DIRECTORY", "l": "FILE_TYPE_SYMLINK"}
"""A link to a file or a folder has its type; one to nothing (or a loop) stays a symlink."""
_OTHER = "FILE_TYPE_UNSPECIFIED"
_CODES: dict[type[errors.StockadeError], str] = {
    errors.NotFound: "not_found",
    errors.AlreadyExists: "already_exists",
    errors.InvalidRequest: "invalid_argument",
    errors.PolicyDenied: "permission_denied",
    errors.Unauthenticated: "unauthenticated",
    errors.QuotaExceeded: "resource_exhausted",
    errors.CallTimedOut: "deadline_exceeded",
    errors.Unsupported: "unimplemented",
}


def caller_of(request: Request) -> str:
    """Who an envd request comes from, for the audit log."""
    return f"e2b:{request.client.host if request.client else ''}"


def error_of(result: ToolResult) -> ConnectError:
    """A tool call's refusal or failure as a Connect error the SDKs map to an exception."""
    code = _TOOL_CODES.get(result.error_code, "internal")
    return ConnectError(code, result.error_message or result.for_llm or "the call failed")


_TOOL_CODES: dict[ErrorCode, str] = {
    ErrorCode.PERMISSION_DENIED: "permission_denied",
    ErrorCode.APPROVAL_DENIED: "permission_denied",
    ErrorCode.RATE_LIMITED: "resource_exhausted",
    ErrorCode.INVALID_ARGS: "invalid_argument",
    ErrorCode.INVALID_PATH: "invalid_argument",
    ErrorCode.NOT_FOUND: "not_found",
    ErrorCode.FILE_NOT_FOUND: "not_found",
    ErrorCode.TIMEOUT: "deadline_exceeded",
    ErrorCode.SANDBOX_LOST: "unavailable",
    ErrorCode.EXECUTION_FAILED: "failed_precondition",
}


def sandbox_of(request: Request) -> E2bSandbox:
    record: E2bSandbox = request.scope["state"][SANDBOX_STATE]
    return record


def connect_error(exc: errors.StockadeError) -> ConnectError:
    for cls, code in _CODES.items():
        if isinstance(exc, cls):
            return ConnectError(code, str(exc))
    return ConnectError(
        "unavailable" if isinstance(exc, errors.SandboxLost) else "internal", str(exc)
    )


def workspace_path(path: str) -> str:
    """The path relative to /workspace for an E2B path, "." for the home itself."""
    if path in ("~", HOME) or path.startswith(("~/", HOME + "/")):
        path = path[1:] if path.startswith("~") else path[len(HOME) :]
        path = path.lstrip("/") or "."
    elif path == "/workspace" or path.startswith("/workspace/"):
        path = path[len("/workspace") :].lstrip("/") or "."
    elif path.startswith("/"):
        raise ConnectError("invalid_argument", f"only paths under {HOME} are reachable: {path}")
    norm = posixpath.normpath(path or ".")
    if norm == ".." or norm.startswith("../"):
        raise ConnectError("invalid_argument", f"the path leaves {HOME}: {path}")
    return norm


def e2b_path(rel: str) -> str:
    return HOME if rel == "." else f"{HOME}/{rel}"


KERNEL_FILES = ("/proc", "/sys", "/dev")
"""Not reached by the agent's file calls: their files are not files (endless, or the agent's
own state); the agent refuses them after following symlinks too (agent paths.KERNEL_FILES).
A read (GET /files) of one is a command instead (`kernel_read`), as the sandbox's user."""
KERNEL_READ_MAX = 64 * 1024
"""What a read of a kernel file gives at most (`/proc/...` files are small; `/dev/zero` is
endless): its first KERNEL_READ_MAX bytes."""


@dataclass(frozen=True)
class Target:
    """Where an E2B file call acts."""

    path: str
    """Relative to /workspace ("." for itself) when in the home, else absolute."""
    shown: str
    """As E2B shows it (/home/user/...)."""
    wide: bool
    """Outside the home: the agent's container_wide."""
    kernel: bool = False
    """In /proc, /sys or /dev (target_of with kernel=True only)."""

    @property
    def arg(self) -> str:
        """As a command that runs in /workspace names it (never starting with "-")."""
        relative = not self.wide and not self.path.startswith(".")
        return "./" + self.path if relative else self.path

    @property
    def quoted(self) -> str:
        """For a command that runs in /workspace."""
        return shlex.quote(self.arg)


def target_of(path: str, kernel: bool = False) -> Target:
    """An E2B path: in the home (relative, ~, /home/user, /workspace) onto the workspace,
    any other absolute one as itself, normalized; one in /proc, /sys or /dev is refused
    (with `kernel`: a Target marked `kernel`, for a read)."""
    if path.startswith("/"):
        norm = "/" + posixpath.normpath(path).lstrip("/")
        if not _in_home(norm):
            if any(norm == k or norm.startswith(k + "/") for k in KERNEL_FILES):
                if not kernel:
                    raise ConnectError("invalid_argument", f"file calls do not reach {norm}")
                return Target(norm, norm, True, kernel=True)
            return Target(norm, norm, True)
        path = norm
    rel = workspace_path(path)
    return Target(rel, e2b_path(rel), False)


def _in_home(norm: str) -> bool:
    return any(norm == h or norm.startswith(h + "/") for h in (HOME, "/workspace"))


def _entries(
    out: str, base: str, metadata: Callable[[str], dict[str, str] | None] | None = None
) -> list[Json]:
    """The entries of find's NUL-ended fields, sorted by path; `metadata` gives an entry's
    from find's path field."""
    fields = out.split("\0")[:-1]
    records = [fields[i : i + _FIELD_COUNT] for i in range(0, len(fields), _FIELD_COUNT)]
    return [
        file_metadata.attach(_entry(r, base), metadata(r[-2]) if metadata else None)
        for r in sorted(records, key=lambda r: r[-2])
        if len(r) == _FIELD_COUNT
    ]


def _entry(parts: list[str], base: str) -> Json:
    """One entry as envd reports it: `mode` holds the permission bits only (no type bit); a
    symlink has the type of what it leads to and, as `symlinkTarget`, the absolute path it
    resolves to (its own mode, size and owner are the link's; one that leads nowhere stays a
    symlink)."""
    kind, leads_to, size, mode, perms, owner, group, mtime, rel, resolved = parts
    name = posixpath.basename(rel) if rel else posixpath.basename(base) or base
    path = posixpath.normpath(posixpath.join(base, rel)) if rel else base
    stamp = datetime.fromtimestamp(float(mtime or 0), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    entry: Json = {
        "name": name,
        "type": _TYPES.get(leads_to if kind == "l" and leads_to in ("f", "d") else kind, _OTHER),
        "path": path,
        "size": size,
        "mode": int(mode, 8),
        "permissions": perms,
        "owner": _OWNERS.get(owner, owner),
        "group": _OWNERS.get(group, group),
        "modifiedTime": stamp,
    }
    if kind == "l" and resolved:
        entry["symlinkTarget"] = shown_path(resolved)
    return entry


def shown_path(real: str) -> str:
    """A path inside the sandbox as E2B shows it: /workspace is /home/user."""
    if real == "/workspace" or real.startswith("/workspace/"):
        return HOME + real[len("/workspace") :]
    return real


class Files:
    def __init__(self, ctx: E2bContext) -> None:
        self._ctx = ctx
        self.wrote: Callable[[str, str], None] | None = None
        """Told (E2B sandbox id, workspace path) of each file an upload wrote in the home."""

    @property
    def _transfers(self) -> FileTransfers:
        ctx = self._ctx
        return FileTransfers(ctx.config, ctx.manager, ctx.policy)

    # /files
    def transfer(self, request: Request, target: Target) -> Transfer:
        record = sandbox_of(request)
        return Transfer(
            record.key,
            target.path,
            False,
            CallContext(),
            caller_of(request),
            front=FRONT,
            container_wide=target.wide,
        )

    async def download(self, request: Request, path: str) -> AsyncIterator[bytes]:
        target = target_of(path, kernel=True)
        if target.kernel:
            yield await self.kernel_read(request, target)
            return
        async for item in self._transfers.download(self.transfer(request, target)):
            if isinstance(item, bytes):
                yield item

    async def kernel_read(self, request: Request, target: Target) -> bytes:
        """A file in /proc, /sys or /dev, read as `commands.run("head -c ...")` would read it:
        the exec tool as the sandbox's user through the pipeline (guard, policy, audit, the
        output scrubbed: /proc/self/environ is the command's own environment, its secrets
        redacted), never the agent's own open. Its first KERNEL_READ_MAX bytes, as text
        (UTF-8; what is not becomes U+FFFD, as any command's output)."""
        script = (
            f"[ -e {target.quoted} ] || exit 3; [ -d {target.quoted} ] && exit 4; "
            f"exec head -c {KERNEL_READ_MAX} -- {target.quoted}"
        )
        code, out, err = await self._sh(request, script)
        if code == 3:
            raise ConnectError("not_found", f"no such file: {target.shown}")
        if code == 4:
            raise ConnectError("invalid_argument", f"{target.shown} is a directory")
        if code != 0:
            raise _failed(code, err)
        return out.encode()

    async def upload(self, request: Request, path: str, chunks: AsyncIterator[bytes]) -> Json:
        target = target_of(path)
        await self._transfers.upload(self.transfer(request, target), chunks)
        if self.wrote is not None and not target.wide:
            self.wrote(sandbox_of(request).sandbox_id, target.path)
        return {"name": posixpath.basename(target.shown), "type": "file", "path": target.shown}

    async def set_metadata(
        self, request: Request, paths: list[str], metadata: dict[str, str]
    ) -> None:
        """Give the files just uploaded (E2B paths) this metadata, as `user.e2b.*` extended
        attributes (file_metadata): one command through the pipeline for all of them."""
        for targets in _batches([target_of(p).arg for p in paths]):
            code, _, err = await self._sh(request, file_metadata.set_command(metadata, targets))
            if code != 0:
                raise ConnectError(
                    "permission_denied" if "Permission denied" in err else "internal",
                    "the file was written, but its metadata could not be stored: "
                    + (err.strip().splitlines() or [f"exit {code}"])[-1],
                )

    # Filesystem RPCs, as shell commands through the pipeline's exec tool
    async def _sh(self, request: Request, script: str) -> tuple[int, str, str]:
        record = sandbox_of(request)
        call = ToolCall(
            sandbox_key=record.key,
            tool="exec",
            arguments_json=json.dumps({"command": script, "timeout": 60}),
            front=FRONT,
        )
        result = await self._ctx.pipeline.call(call, caller=caller_of(request))
        data: dict[str, Any] = result.data or {}
        code = data.get("exit_code")
        if not isinstance(code, int):
            raise error_of(result)
        return code, str(data.get("stdout", "")), str(data.get("stderr", ""))

    async def _find(self, request: Request, target: Target, depth: int | None) -> list[Json]:
        q = target.quoted
        rng = "-maxdepth 0" if depth is None else f"-mindepth 1 -maxdepth {depth}"
        script = (
            f"[ -e {q} ] || [ -L {q} ] || exit 3; "
            + ("" if depth is None else f"[ -d {q} ] || exit 4; ")
            + f"{file_metadata.read_command(f'{q} {rng}')}; "
            + f"find {q} {rng} {_PRINT}"
        )
        code, out, err = await self._sh(request, script)
        if code == 3:
            raise ConnectError("not_found", f"no such file or directory: {target.shown}")
        if code == 4:
            raise ConnectError("invalid_argument", f"not a directory: {target.shown}")
        if code != 0:
            raise ConnectError("internal", err.strip() or f"exit {code}")
        found, out = file_metadata.split_output(out)
        start = target.arg.rstrip("/") + "/"
        return _entries(
            out, target.shown, lambda rel: found.get(start + rel if rel else target.arg)
        )

    async def entries(self, request: Request, paths: list[str]) -> dict[str, Json]:
        """The entries of these E2B paths (each as Stat reports it, metadata too) in one
        command through the pipeline, by path; one that is not there is left out."""
        args = {target_of(p).arg: p for p in paths}
        by_arg: dict[str, Json] = {}
        for batch in _batches(list(args)):
            given = " ".join(shlex.quote(a) for a in batch)
            script = (
                f"{file_metadata.read_command(f'{given} -maxdepth 0')} 2>/dev/null; "
                f"find {given} -maxdepth 0 {_PRINT_GIVEN} 2>/dev/null; exit 0"
            )
            _, out, _ = await self._sh(request, script)
            found, out = file_metadata.split_output(out)
            fields = out.split("\0")[:-1]
            for i in range(0, len(fields) - _FIELD_COUNT + 1, _FIELD_COUNT):
                record = fields[i : i + _FIELD_COUNT]
                entry = _entry(record, HOME)
                by_arg[record[-2]] = file_metadata.attach(entry, found.get(record[-2]))
        return {args[a]: e for a, e in by_arg.items() if a in args}

    async def stat(self, request: Request, msg: Json) -> Json:
        found = await self._find(request, target_of(str(msg.get("path", ""))), None)
        if not found:
            raise ConnectError("not_found", f"no such file: {msg.get('path')}")
        return {"entry": found[0]}

    async def list_dir(self, request: Request, msg: Json) -> Json:
        try:
            depth = int(msg.get("depth") or 1)
        except (TypeError, ValueError):
            raise ConnectError("invalid_argument", "depth must be a number, 1..64") from None
        if depth < 1 or depth > 64:
            raise ConnectError("invalid_argument", "depth must be 1..64")
        target = target_of(str(msg.get("path", "")))
        return {"entries": await self._find(request, target, depth)}

    async def make_dir(self, request: Request, msg: Json) -> Json:
        target = target_of(str(msg.get("path", "")))
        q = target.quoted
        code, _, err = await self._sh(
            request, f"[ -d {q} ] && exit 5; [ -e {q} ] && exit 4; mkdir -p -- {q}"
        )
        if code == 5:
            raise ConnectError("already_exists", f"directory already exists: {target.shown}")
        if code == 4:
            raise ConnectError("invalid_argument", f"path is not a directory: {target.shown}")
        if code != 0:
            raise _failed(code, err)
        return await self.stat(request, {"path": target.shown})

    async def move(self, request: Request, msg: Json) -> Json:
        src = target_of(str(msg.get("source", "")))
        dst = target_of(str(msg.get("destination", "")))
        qs, qd = src.quoted, dst.quoted
        script = (
            f"[ -e {qs} ] || [ -L {qs} ] || exit 3; "
            f'mkdir -p -- "$(dirname {qd})"; mv -T -- {qs} {qd}'
        )
        code, _, err = await self._sh(request, script)
        if code == 3:
            raise ConnectError("not_found", f"no such file or directory: {src.shown}")
        if code != 0:
            raise _failed(code, err)
        return await self.stat(request, {"path": dst.shown})

    async def remove(self, request: Request, msg: Json) -> Json:
        target = target_of(str(msg.get("path", "")))
        if target.path in (".", "/"):
            raise ConnectError("invalid_argument", f"{target.shown} itself cannot be removed")
        code, _, err = await self._sh(request, f"rm -rf -- {target.quoted}")
        if code != 0:
            raise _failed(code, err)
        return {}


BATCH_CHARS = 32 << 10
"""The most characters of paths one command names (the guard parses at most 256 KiB of a
command; a path may be 4 KiB long): more paths go in more commands."""


def _batches(args: list[str]) -> list[list[str]]:
    """The paths in groups of at most BATCH_CHARS characters (one at least)."""
    out: list[list[str]] = []
    size = 0
    for arg in args:
        if not out or size + len(arg) > BATCH_CHARS:
            out.append([])
            size = 0
        out[-1].append(arg)
        size += len(arg) + 3
    return out


def _failed(code: int, err: str) -> ConnectError:
    """A command's failure: permission_denied where the sandbox's user may not (a path
    outside the home it cannot write, as E2B answers), else internal."""
    text = err.strip() or f"exit {code}"
    return ConnectError("permission_denied" if "Permission denied" in text else "internal", text)
