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
        "verbose",
        "xtrace",
    ]
)
"""`set -o` options a session keeps: not noexec or onecmd (a session that set them would
never run a command, nor its trailer, again), nor those of interactive shells."""
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
  __stockade_so=$SHELLOPTS __stockade_bo=$BASHOPTS
  set +aeuvx
  export -n __stockade_so __stockade_bo
  { export -p; declare -f; alias -p; } >"$__stockade_out.state"
  printf '%s\0%s\0%s\0%s\0%s\0' "$PWD" "${HOME-}" "${CDPATH+set}" "$__stockade_so" \
    "$__stockade_bo" >"$__stockade_out.where"
}
trap '{ __stockade_save; } 2>/dev/null' EXIT
"""
_PREAMBLE: Final = r"""__stockade_cmd=$1 __stockade_dir=$2 __stockade_out=$3 __stockade_opts=$4
__stockade_state=$5 __stockade_keep=$6
shift 6
for __stockade_n in $__stockade_keep; do
  printf -v "__stockade_v_$__stockade_n" %s "${!__stockade_n}"
done
shopt -s expand_aliases
[ -n "$__stockade_state" ] && . "$__stockade_state" 2>/dev/null
for __stockade_n in $__stockade_keep; do
  __stockade_v=__stockade_v_$__stockade_n
  export "$__stockade_n=${!__stockade_v}"
  unset "$__stockade_v"
done
if [ -n "$__stockade_dir" ]; then
  __stockade_old=${OLDPWD-}
  if builtin cd -- "$__stockade_dir" 2>/dev/null; then OLDPWD=$__stockade_old
  else printf 'stockade: the session'"'"'s folder %s is gone: in %s\n' "$__stockade_dir" \
    "$PWD" >&2
  fi
fi
"""
_RUN: Final = r"""eval "unset __stockade_cmd __stockade_dir __stockade_old __stockade_opts \
__stockade_state __stockade_keep __stockade_n __stockade_v
$__stockade_opts
$__stockade_cmd"
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
    cwd: str = ""
    """Its folder after its last call; "": a new session (the call's own folder)."""
    home: str | None = None
    cdpath: bool = False
    opts: str = ""
    """The shopt and set commands that bring back its options."""
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


class Sessions:
    """The sessions of this sandbox, by name."""

    def __init__(self, folder: Path = FOLDER, max_sessions: int = MAX_SESSIONS) -> None:
        self.folder = folder
        self._max = max_sessions
        self._table: dict[str, Session] = {}

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
        state = self._state(session)
        saved = session.cwd != "" and _is_file(state)
        env = dict(call_env) if saved else {**os.environ, **call_env}
        keep_names = " ".join(n for n in call_env if _IDENTIFIER.fullmatch(n)) if saved else ""
        out = self.folder / f"{session.name}.{secrets.token_hex(6)}" if keep else None
        folder = str(cwd) if cwd is not None else session.cwd
        script = _CALL_SCRIPT if keep else _START_SCRIPT
        args = [command, folder, str(out or ""), session.opts, str(state) if saved else ""]
        return Launch([*shell.argv(script), "bash", *args, keep_names], env, out)

    def finish(self, session: Session, launch: Launch, ended: bool) -> dict[str, Any]:
        """Take the state the call's trailer left (when the command `ended` by itself) and
        clean up; what the result tells of the session."""
        out = launch.out
        if out is None:
            return {"name": session.name, "cwd": session.cwd, "kept": False}
        try:
            kept = ended and self._take(session, out)
        finally:
            for suffix in (".state", ".where"):
                with contextlib.suppress(OSError):
                    os.unlink(f"{out}{suffix}")
        session.calls += 1
        return {"name": session.name, "cwd": session.cwd, "kept": kept}

    def _take(self, session: Session, out: Path) -> bool:
        state = Path(f"{out}.state")
        try:
            where = _read(Path(f"{out}.where"), MAX_WHERE_BYTES).split(b"\0")
            _regular(state, MAX_STATE_BYTES)
        except (OSError, ValueError):
            return False
        if len(where) != 6 or not where[0].startswith(b"/") or len(where[0]) > MAX_FOLDER:
            return False
        try:
            os.replace(state, self._state(session))
        except OSError:
            return False
        cwd, home, _, shellopts, bashopts = (os.fsdecode(w) for w in where[:5])
        session.cwd, session.home, session.cdpath = cwd, home or None, where[2] == b"set"
        session.opts = restoring(shellopts, bashopts)
        return True

    def _state(self, session: Session) -> Path:
        return self.folder / f"{session.name}.state"

    def _make_folder(self) -> None:
        try:
            os.mkdir(self.folder, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(self.folder).st_mode):
                raise ToolError(
                    "EXECUTION_FAILED", f"{self.folder} is not a folder: sessions cannot run"
                ) from None


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


def _regular(path: Path, limit: int) -> None:
    """ValueError unless `path` is a regular file (not a link) of at most `limit` bytes."""
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        raise ValueError(f"{path} is not a regular file within {limit} bytes")


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


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
