"""Which shell runs a command, and shell sessions that keep their state between calls.

The shell (`shell` and `login` in exec's and process start's arguments; the supervisor sets
them from the sandbox's profile): `bash` (`/bin/bash -c`, the default), `sh` (`/bin/sh -c`,
dash on the image), `login` adds `-l` to bash (its profile scripts run first).

A session (`session` NAME, bash only) keeps its working folder, exported environment,
shell options (`set -o`, `shopt`), functions and aliases from one call to the next. The
state is captured after each command and restored before the next, not kept in a
long-lived shell read through markers:

- after: an EXIT trap (so it runs after `exit N` too, which keeps its status) writes
  `export -p`, `declare -f` and `alias -p` into one file bash can source, and the folder,
  HOME, whether CDPATH is set, SHELLOPTS and BASHOPTS (NUL-separated) into another; builtins
  only, no fork, two files written;
- before: the agent starts bash with no environment but the call's own `env` (so a variable
  the session unset stays unset), and a preamble sources the saved file (the exported
  variables, functions and aliases), puts the call's `env` back over it, `cd`s to the saved
  folder (keeping OLDPWD) and evaluates the command after the saved options (so `set -x`
  traces the command alone); a new session starts from the agent's environment;
- the agent takes the new state only from a command that ended by itself: a command killed
  at its timeout, cancelled, or whose trailer did not finish leaves the session as it was
  before the call. Nothing lives in a process between calls: a supervisor restart changes
  nothing (the state is here, in the agent and under /tmp), a re-created sandbox has none.

What a command leaves here is its own sandbox's business: sandbox code may rewrite its
sessions' files, as it may run anything as the sandbox user; the agent reads them with
bounds, as regular files, never following a link, and takes only option names it knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from .argcheck import Args, expect_only, opt_bool, opt_str, req_str
from .errors import ToolError

SHELLS: Final = {"bash": "/bin/bash", "sh": "/bin/sh"}
DEFAULT_SHELL: Final = "bash"
FOLDER: Final = Path("/tmp/.stockade-sessions")
MAX_SESSIONS: Final = 32
"""Sessions a sandbox keeps at once; past it a new one is refused until one is ended."""
MAX_STATE_BYTES: Final = 4 * 1024 * 1024
"""Exported variables, functions and aliases a session keeps (nvm's functions are ~150 KiB);
over it, the call's state is not kept."""
MAX_FOLDER: Final = 4096
"""The longest folder a session keeps (bash's $PWD may grow past PATH_MAX)."""
MAX_WHERE_BYTES: Final = 3 * MAX_FOLDER + 4096
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_OPTION: Final = re.compile(r"[a-z0-9_-]{1,32}")
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

SET_OPTIONS: Final = frozenset(
    [
        "allexport",
        "braceexpand",
        "errexit",
        "errtrace",
        "functrace",
        "hashall",
        "interactive-comments",
        "keyword",
        "noclobber",
        "noglob",
        "nolog",
        "nounset",
        "physical",
        "pipefail",
        "posix",
        "xtrace",
    ]
)
"""`set -o` options a session keeps: not noexec or onecmd (a session that set them would
never run a command, nor its trailer, again), not verbose (it would echo the trailer), nor
those of interactive shells."""
SET_DEFAULTS: Final = frozenset({"braceexpand", "hashall", "interactive-comments"})
SHOPT_DEFAULTS: Final = frozenset(
    [
        "checkwinsize",
        "cmdhist",
        "complete_fullquote",
        "extquote",
        "force_fignore",
        "globasciiranges",
        "globskipdots",
        "hostcomplete",
        "interactive_comments",
        "patsub_replacement",
        "progcomp",
        "promptvars",
        "sourcepath",
        "expand_aliases",
    ]
)
"""What a session's bash starts with on (bash 5.2's defaults, and expand_aliases, which the
preamble sets): those the session turned off are turned off again."""
SHOPT_FIXED: Final = frozenset({"login_shell", "restricted_shell"})

_TRAILER: Final = r"""__stockade_save() {
  unset -f __stockade_save
  { printf '%s\0%s\0%s\0%s\0%s\0' "$PWD" "${HOME-}" "${CDPATH+set}" "$SHELLOPTS" "$BASHOPTS"
    export -p; printf '\0'; declare -f; alias -p; } >"$__stockade_out"
}
trap '{ __stockade_save; } 2>/dev/null' EXIT
"""
_PREAMBLE: Final = r"""__stockade_out=$3
[ -n "$5" ] && . "$5" 2>/dev/null
[ -z "$2" ] || printf 'stockade: the session'"'"'s folder %s is gone: in %s\n' "$2" "$PWD" >&2
"""
_RUN: Final = r"""eval "shift 5
$4
$1"
"""
_CALL_SCRIPT: Final = _PREAMBLE + _TRAILER + _RUN
_START_SCRIPT: Final = _PREAMBLE + _RUN


@dataclass(frozen=True)
class Shell:
    program: str
    login: bool = False

    @property
    def name(self) -> str:
        return "bash" if self.program == SHELLS["bash"] else "sh"

    def argv(self, command: str) -> list[str]:
        return [self.program, *(["-l"] if self.login else []), "-c", command]


def shell_of(args: Args) -> Shell:
    """The shell a call asks for (`shell`, `login`); bash when it names none."""
    name = opt_str(args, "shell", DEFAULT_SHELL)
    program = SHELLS.get(name)
    if program is None:
        raise ToolError("INVALID_ARGS", f"argument 'shell' must be bash or sh, not {name[:32]!r}")
    login = opt_bool(args, "login", False)
    if login and name != "bash":
        raise ToolError("INVALID_ARGS", "argument 'login' is for bash")
    return Shell(program, login)


@dataclass
class Session:
    name: str
    env: dict[str, str] | None = None
    """Its exported environment after its last call; None: the agent's (a new session)."""
    defs: bytes = b""
    """The SHA-256 of the functions and aliases it keeps in its file to source; b"": none."""
    cwd: str = ""
    """Its folder after its last call; "": a new session (the call's own folder)."""
    home: str | None = None
    cdpath: bool = False
    opts: str = "shopt -s expand_aliases"
    """The shopt and set commands that bring back its options (a new one: aliases on)."""
    calls: int = 0
    busy: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "cwd": self.cwd, "calls": self.calls, "busy": self.busy}


@dataclass
class Launch:
    """How to start one session call: argv, environment, and where its trailer writes."""

    argv: list[str]
    env: dict[str, str]
    out: Path | None
    cwd: Path | None
    """The folder to start in; None: the call's default (the workspace root)."""


class Sessions:
    """The sessions of this sandbox, by name."""

    def __init__(self, folder: Path = FOLDER, max_sessions: int = MAX_SESSIONS) -> None:
        self.folder = folder
        self._max = max_sessions
        self._table: dict[str, Session] = {}
        self._made = False

    def list(self) -> list[dict[str, Any]]:
        return [s.describe() for s in sorted(self._table.values(), key=lambda s: s.name)]

    def end(self, name: str) -> bool:
        session = self._table.pop(_name(name), None)
        if session is None:
            return False
        with contextlib.suppress(OSError):
            self._state(session).unlink()
        return True

    def open(self, name: str, shell: Shell) -> Session:
        """The session of that name, new when there is none."""
        name = _name(name)
        if shell.name != "bash":
            raise ToolError(
                "INVALID_ARGS", "sessions keep bash's state: this sandbox's shell is sh"
            )
        session = self._table.get(name)
        if session is None:
            if len(self._table) >= self._max:
                raise ToolError(
                    "EXECUTION_FAILED", f"this sandbox keeps {self._max} sessions, the most: "
                    "end one (EndSession) first",
                )  # fmt: skip
            session = self._table[name] = Session(name)
        return session

    @contextlib.asynccontextmanager
    async def hold(self, session: Session) -> Any:
        """One call at a time in a session: another is refused at once, not queued (its wait
        would eat its time, and the state it starts from would not be the one it asked for)."""
        if session.lock.locked():
            raise ToolError(
                "EXECUTION_FAILED", f"session {session.name!r} is running another call; "
                "wait for it, or use another session",
            )  # fmt: skip
        async with session.lock:
            session.busy = True
            try:
                yield
            finally:
                session.busy = False

    def launch(
        self,
        session: Session,
        shell: Shell,
        command: str,
        call_env: dict[str, str],
        cwd: Path | None,
        *,
        keep: bool,
    ) -> Launch:
        """argv and environment of a call in `session` (in `cwd` when the call names one,
        else the session's folder); `keep`: capture the state afterwards (exec, not start)."""
        self._make_folder()
        env = {**(os.environ if session.env is None else session.env), **call_env}
        out = self.folder / f"{session.name}.{secrets.token_hex(6)}" if keep else None
        start, folder = _start_in(session, cwd)
        state = str(self._state(session)) if session.defs and _is_file(self._state(session)) else ""
        script = _CALL_SCRIPT if keep else _START_SCRIPT
        args = [command, folder, str(out or ""), session.opts, state]
        return Launch([*shell.argv(script), "bash", *args], env, out, start)

    def finish(self, session: Session, launch: Launch, ended: bool) -> dict[str, Any]:
        """Take the state the call's trailer left (when the command `ended` by itself) and
        clean up; what the result tells of the session."""
        out = launch.out
        if out is None:
            return {"name": session.name, "cwd": session.cwd, "kept": False}
        try:
            kept = ended and self._take(session, out)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(out)
        session.calls += 1
        return {"name": session.name, "cwd": session.cwd, "kept": kept}

    def _take(self, session: Session, out: Path) -> bool:
        """The state the trailer wrote in one file: folder, HOME, CDPATH set, SHELLOPTS and
        BASHOPTS (NUL-terminated), `export -p`, a NUL, then `declare -f` and `alias -p`."""
        try:
            record = _read(out, MAX_STATE_BYTES + MAX_WHERE_BYTES).split(b"\0", 5)
            if len(record) != 6 or not record[0].startswith(b"/"):
                return False
            printed, _, defs = record[5].partition(b"\0")
            env = exported(printed)
        except (OSError, ValueError):
            return False
        if len(record[0]) > MAX_FOLDER or len(printed) + len(defs) > MAX_STATE_BYTES:
            return False
        digest = hashlib.sha256(defs).digest() if defs else b""
        if digest != session.defs and not self._keep_defs(session, defs):
            return False
        _keep_level(env)
        cwd, home, _, shellopts, bashopts = (
            w.decode("utf-8", "surrogateescape") for w in record[:5]
        )
        session.env, session.defs = env, digest
        session.cwd, session.home, session.cdpath = cwd, home or None, record[2] == b"set"
        session.opts = restoring(shellopts, bashopts)
        return True

    def _keep_defs(self, session: Session, defs: bytes) -> bool:
        """Its functions and aliases into its file to source (written aside, then renamed)."""
        state = self._state(session)
        if not defs:
            with contextlib.suppress(FileNotFoundError):
                state.unlink()
            return True
        aside = Path(f"{state}.{secrets.token_hex(6)}")
        try:
            fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, defs)
            finally:
                os.close(fd)
            os.replace(aside, state)
        except OSError:
            with contextlib.suppress(OSError):
                aside.unlink()
            return False
        return True

    def _state(self, session: Session) -> Path:
        return self.folder / f"{session.name}.state"

    def _make_folder(self) -> None:
        if self._made:
            return
        try:
            os.mkdir(self.folder, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(self.folder).st_mode):
                raise ToolError(
                    "EXECUTION_FAILED", f"{self.folder} is not a folder: sessions cannot run"
                ) from None
        self._made = True


def restoring(shellopts: str, bashopts: str) -> str:
    """The commands that bring back these options (SHELLOPTS and BASHOPTS as saved) in a
    session's new bash: shopt first, `set` last (so that xtrace traces the command alone).
    Only option names a shell may take; the rest is dropped."""
    on = {o for o in bashopts.split(":") if _OPTION.fullmatch(o)} - SHOPT_FIXED
    sets = {o for o in shellopts.split(":") if o in SET_OPTIONS}
    lines = []
    if off := sorted(SHOPT_DEFAULTS - on):
        lines.append("shopt -u " + " ".join(off))
    if on:
        lines.append("shopt -s " + " ".join(sorted(on)))
    flags = [f"+o {o}" for o in sorted(SET_DEFAULTS - sets)]
    flags += [f"-o {o}" for o in sorted(sets - SET_DEFAULTS)]
    if flags:
        lines.append("set " + " ".join(flags))
    return "\n".join(lines)


def _name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ToolError(
            "INVALID_ARGS", "argument 'session' must be 1 to 64 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit",
        )  # fmt: skip
    return name


def _read(path: Path, limit: int) -> bytes:
    """A regular file's bytes, never through a link nor from a FIFO; ValueError past limit."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path} is over {limit} bytes")
    return data


def _start_in(session: Session, cwd: Path | None) -> tuple[Path | None, str]:
    """Where a session's call starts (the call's own folder, else the session's: no `cd`,
    PWD and OLDPWD as they were), and a folder the preamble says is gone: for a new session
    or one whose folder is gone or closed to the sandbox user, the call's default."""
    if cwd is not None:
        return cwd, ""
    usable = session.cwd and os.path.isdir(session.cwd)
    if usable and os.access(session.cwd, os.X_OK, effective_ids=True):
        return Path(session.cwd), ""
    return None, session.cwd


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _keep_level(env: dict[str, str]) -> None:
    """SHLVL as the agent's: bash adds one at each start, which a session would pile up."""
    level = os.environ.get("SHLVL")
    if level is None:
        env.pop("SHLVL", None)
    else:
        env["SHLVL"] = level


_EXPORTED: Final = re.compile(
    rb"(?:declare|export)(?: -([a-zA-Z-]+))? ([A-Za-z_][A-Za-z0-9_]*)(?:=(\$'.*'|\".*\"|\(.*\)))?"
)
_DOUBLE_QUOTED: Final = re.compile(rb'\\([\\"$`])')
_ANSI_C: Final = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|(.))", re.DOTALL)
_ANSI_C_LETTERS: Final = {
    b"a": b"\a", b"b": b"\b", b"e": b"\x1b", b"E": b"\x1b", b"f": b"\f", b"n": b"\n",
    b"r": b"\r", b"t": b"\t", b"v": b"\v", b"\\": b"\\", b"'": b"'", b'"': b'"', b"?": b"?",
}  # fmt: skip


def exported(data: bytes) -> dict[str, str]:
    """The environment `export -p` printed (bash 5.2: one line a variable, `declare -x NAME`
    with a double-quoted value, or `$'...'` for one with characters that do not print;
    `export NAME=...` in POSIX mode). Exported arrays are no environment and are left out;
    ValueError on a line of another shape (then the state is not taken)."""
    env: dict[str, str] = {}
    for line in data.split(b"\n"):
        if not line:
            continue
        match = _EXPORTED.fullmatch(line)
        if match is None:
            raise ValueError("export -p printed a line of an unknown shape")
        flags, name, value = match.groups()
        if value is None or value[:1] == b"(" or (flags and (b"a" in flags or b"A" in flags)):
            continue
        if value[:1] == b'"' and b"\\" not in value:
            if b'"' in value[1:-1]:
                raise ValueError("a double-quoted value with a bare quote")
            text = value[1:-1]
        else:
            text = _unquoted(value)
        env[name.decode()] = text.decode("utf-8", "surrogateescape")
    return env


def _unquoted(value: bytes) -> bytes:
    if value.startswith(b'"'):
        inner = value[1:-1]
        if _DOUBLE_QUOTED.sub(b"", inner).count(b'"'):
            raise ValueError("a double-quoted value with a bare quote")
        return _DOUBLE_QUOTED.sub(rb"\1", inner)
    return _ANSI_C.sub(_ansi_c_escape, value[2:-1])


def _ansi_c_escape(match: re.Match[bytes]) -> bytes:
    octal, hexa, letter = match.groups()
    if octal is not None:
        return bytes([int(octal, 8) & 0xFF])
    if hexa is not None:
        return bytes([int(hexa, 16)])
    known = _ANSI_C_LETTERS.get(letter)
    if known is None:
        raise ValueError(f"an escape bash does not print: \\{letter!r}")
    return known


SESSIONS: Final = Sessions()
"""The agent's sessions (exec and process start share them)."""


async def session_tool(root: Path, args: Args, table: Sessions | None = None) -> dict[str, Any]:
    """The session tool: `list` the sessions, or `end` one (`session`)."""
    table = SESSIONS if table is None else table
    action = req_str(args, "action")
    if action == "list":
        expect_only(args, ("action",))
        return {"sessions": table.list()}
    if action == "end":
        expect_only(args, ("action", "session"))
        return {"ended": table.end(req_str(args, "session"))}
    raise ToolError("INVALID_ARGS", "argument 'action' must be list or end")
