"""Invocations: each program a simple command runs, after seeing through wrappers (``env``,
``nohup``, ``timeout``, ``xargs``, ``busybox``, ``find -exec`` ...), and the helpers that
read an invocation's options and operands."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from stockade.supervisor.policy.guard.parsing import Command, Word, basename
from stockade.supervisor.policy.guard.paths import (
    Place,
    find_narrowed,
    find_root_may_match,
    find_root_span,
    moved,
)

_MAX_CHAIN = 32


@dataclass(frozen=True)
class Inv:
    program: str  # lower-cased basename without ".exe": what built-in rules compare
    name: str  # basename as written: what config rules see first
    word: Word
    args: tuple[Word, ...]
    command: Command
    place: Place

    @property
    def argv(self) -> list[str]:
        return [a.text for a in self.args]


@dataclass(frozen=True)
class _Wrap:
    arg_opts: frozenset[str] = frozenset()  # options that take a separate argument
    operands: int = 0  # positional operands before the wrapped command
    stop: frozenset[str] = frozenset()  # options after which no command runs


def _wrap(arg_opts: str = "", operands: int = 0, stop: str = "") -> _Wrap:
    return _Wrap(frozenset(arg_opts.split()), operands, frozenset(stop.split()))


_WRAPPERS: dict[str, _Wrap] = {
    **dict.fromkeys(
        ("nohup", "builtin", "setsid", "unbuffer", "catchsegv", "fakeroot", "eatmydata"),
        _Wrap(),
    ),
    **dict.fromkeys(("torsocks", "chronic", "coproc", "busybox", "toybox", "proxychains"), _Wrap()),
    "proxychains4": _wrap("-f"),
    **dict.fromkeys(("valgrind", "entr"), _Wrap()),
    "systemd-run": _wrap(
        "-u --unit -p --property -E --setenv -M --machine --uid --gid --nice --slice "
        "--working-directory -H --host --description"
    ),
    "screen": _wrap("-S -c -e -h -p -X -T -t -L -Logfile"),
    "exec": _wrap("-a"),
    "command": _wrap(stop="-v -V"),
    "time": _wrap("-f -o --format --output"),
    "nice": _wrap("-n --adjustment"),
    "timeout": _wrap("-s -k --signal --kill-after", operands=1),
    "stdbuf": _wrap("-i -o -e --input --output --error"),
    "ionice": _wrap("-c -n -p -P -u --class --classdata", stop="-p --pid"),
    "taskset": _wrap(operands=1, stop="-p --pid"),
    "chrt": _wrap(operands=1, stop="-p --pid"),
    "chroot": _wrap("--userspec --groups", operands=1),
    "flock": _wrap("-w -E --timeout --conflict-exit-code", operands=1, stop="-c --command"),
    "strace": _wrap("-e -o -p -s -u -E -P -a -b -I -O -S -X"),
    "ltrace": _wrap("-e -o -p -s -u -n -a -l"),
    "sudo": _wrap("-u -g -C -D -h -p -r -t -U -T --user --group"),
    "doas": _wrap("-u -C"),
    "pkexec": _wrap("--user"),
    "unshare": _wrap("-S -G -w --setuid --setgid --wd"),
    "nsenter": _wrap("-t -S -G --target"),
    "xargs": _wrap(
        "-I -n -P -L -d -E -s -a --max-args --max-procs --max-lines --delimiter --eof "
        "--max-chars --arg-file --process-slot-var"
    ),
}


def invocations_of(command: Command, place: Place) -> list[Inv]:
    found: list[Inv] = []
    pending = [(command.words, place)]
    while pending and len(found) < _MAX_CHAIN:
        words, where = pending.pop(0)
        if words:
            inv = _make_inv(words, command, where)
            found.append(inv)
            inner = replace(where, fed=True) if inv.program == "xargs" else where
            directory = _wrapper_chdir(inv)
            inner = inner if directory is None else moved(inner, directory)
            pending.extend((wrapped, inner) for wrapped in _wrapped(inv))
    return found


def _make_inv(words: tuple[Word, ...], command: Command, place: Place) -> Inv:
    name = basename(words[0].text)
    program = name.lower().removesuffix(".exe")
    return Inv(program, name, words[0], words[1:], command, place)


def _wrapped(inv: Inv) -> list[tuple[Word, ...]]:
    """The word lists of the commands a wrapper runs."""
    if inv.program == "env":
        return _env_wrapped(inv.args)
    if inv.program == "find":
        return _find_exec(inv.args)
    if inv.program == "coproc":
        args = inv.args[1:] if inv.args[1:2] and inv.args[1].text in ("{", "(") else inv.args
        return [args[1:] if args[:1] and args[0].text in ("{", "(") else args]
    if inv.program == "watch":
        index = watch_index(inv.args)
        return [inv.args[index:]] if index is not None and has_option(inv, "-x", "--exec") else []
    spec = _WRAPPERS.get(inv.program)
    index = _command_index(inv.args, spec) if spec else None
    return [inv.args[index:]] if index is not None else []


def _command_index(args: tuple[Word, ...], spec: _Wrap) -> int | None:
    i = 0
    while i < len(args):
        text = args[i].text
        if text == "--":
            i += 1
            break
        if len(text) < 2 or not text.startswith("-"):
            break
        option = text.split("=", 1)[0]
        if option in spec.stop:
            return None
        i += 2 if option in spec.arg_opts and "=" not in text else 1
    i += spec.operands
    return i if i < len(args) else None


_CHDIR_OPTIONS = {
    "env": ("-C", "--chdir"),
    "systemd-run": ("--working-directory",),
    "nsenter": ("--wd",),
    "unshare": ("-w", "--wd"),
}


def _wrapper_chdir(inv: Inv) -> Word | None:
    """The directory a wrapper runs its command in (``env -C DIR rm ..``), if it says."""
    options = _CHDIR_OPTIONS.get(inv.program)
    if inv.program == "chroot":
        return Word("/")  # the command starts at the new root
    if options is None:
        return None
    spec = _WRAPPERS.get(inv.program)
    end = _env_index(inv.args) if spec is None else _command_index(inv.args, spec)
    own = inv.args[: len(inv.args) if end is None else end]  # not the wrapped command's
    found = None
    for i, arg in enumerate(own):
        text = arg.text
        if text in options and i + 1 < len(own):
            found = own[i + 1]
        elif text.startswith(tuple(o + "=" for o in options if o.startswith("--"))):
            found = replace(arg, text=text.partition("=")[2], bare=None)
        elif text[:2] in options and len(text) > 2 and not text.startswith("--"):
            found = replace(arg, text=text[2:], bare=None)
    return found


def _env_index(args: tuple[Word, ...]) -> int | None:
    """Where env's command starts (None: no command, or ``-S``)."""
    i = 0
    while i < len(args):
        text = args[i].text
        if _split_string(args, i) is not None:
            return None
        if text in ("-u", "--unset", "-C", "--chdir"):
            i += 2
        elif text.startswith("-") or re.match(r"[A-Za-z_]\w*=", text):
            i += 1
        else:
            return i
    return None


def _env_wrapped(args: tuple[Word, ...]) -> list[tuple[Word, ...]]:
    i = 0
    while i < len(args):
        text = args[i].text
        split = _split_string(args, i)
        if split is not None:
            return [split]
        if text in ("-u", "--unset", "-C", "--chdir"):
            i += 2
        elif text.startswith("-") or re.match(r"[A-Za-z_]\w*=", text):
            i += 1
        else:
            return [args[i:]]
    return []


def _split_string(args: tuple[Word, ...], i: int) -> tuple[Word, ...] | None:
    """``env -S 'rm -rf /'``: the string is split into words."""
    text = args[i].text
    if text in ("-S", "--split-string") and i + 1 < len(args):
        value, rest = args[i + 1].text, args[i + 2 :]
    elif text.startswith("--split-string="):
        value, rest = text.partition("=")[2], args[i + 1 :]
    elif text.startswith("-S") and len(text) > 2:
        value, rest = text[2:], args[i + 1 :]
    else:
        return None
    return tuple(Word(part) for part in value.split()) + rest


def _find_exec(args: tuple[Word, ...]) -> list[tuple[Word, ...]]:
    """The commands of -exec/-execdir/-ok, with ``{}`` as each root when find may hand it
    over, and as what it finds below: ``ROOT/*`` (anything) unless a name or path test
    narrows that, then ``ROOT/{}``."""
    argv = [a.text for a in args]
    root_words = find_root_words(args)[:8] or [Word(".")]
    below = "/{}" if find_narrowed(argv) else "/*"
    found: list[Word] = []
    for root in root_words:
        if find_root_may_match(argv, root.text):
            found.append(root)
        found.append(replace(root, text=root.text.rstrip("/") + below, bare=None))
    commands: list[tuple[Word, ...]] = []
    i = 0
    while i < len(args):
        if args[i].text in ("-exec", "-execdir", "-ok", "-okdir"):
            end = i + 1
            while end < len(args) and args[end].text not in (";", "+"):
                end += 1
            commands.extend(
                tuple(each if w.text == "{}" else w for w in args[i + 1 : end]) for each in found
            )
            i = end
        i += 1
    return commands


def find_root_words(args: tuple[Word, ...]) -> list[Word]:
    start, end = find_root_span([a.text for a in args])
    return list(args[start:end])


def watch_index(args: tuple[Word, ...]) -> int | None:
    return _command_index(args, _wrap("-n -q --interval --equexit"))


def has_option(inv: Inv, *options: str) -> bool:
    return any(a.text in options for a in inv.args)


def option_flags(args: tuple[Word, ...], longs: Sequence[str] = ()) -> set[str]:
    """Short option letters and (prefix-expanded) long options before "--"."""
    found: set[str] = set()
    for arg in args:
        text = arg.text
        if text == "--":
            break
        if text.startswith("--"):
            option = text.split("=", 1)[0]
            found.update(full for full in longs if len(option) > 2 and full.startswith(option))
            found.add(option)
        elif text.startswith("-") and len(text) > 1:
            found.update(text[1:])
    return found


def operand_texts(args: tuple[Word, ...]) -> list[str]:
    return [a.text for a in args if not a.text.startswith("-") or a.text == "-"]


def operand_words(args: tuple[Word, ...]) -> list[Word]:
    """Operands: words not starting with "-" ("-" itself too), and all after "--"."""
    found, options = [], True
    for arg in args:
        if options and arg.text == "--":
            options = False
        elif not options or not arg.text.startswith("-") or arg.text == "-":
            found.append(arg)
    return found


def norm_path(path: str) -> str:
    return posixpath.normpath(path) if path else path


def norm_abs(path: str) -> str:
    return posixpath.normpath("/" + path.lstrip("/"))


def shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
