"""The command guard: may this shell command run?

The guard is friction, not the security boundary (the sandbox container is),
but it is meant to be hard to fool with shell tricks. It parses the command
with tree-sitter-bash (see ``shell_parse``), looks at every simple command
wherever it sits (lists, pipelines, subshells, ``if``/``for``/``case``,
functions, ``$(..)``, backticks, ``<(..)``, heredocs), sees through wrappers
(``env``, ``nohup``, ``nice``, ``timeout``, ``command``, ``exec``, ``xargs``,
``busybox``, ``find -exec`` ...) and re-parses code handed to another shell
(``sh -c``, ``bash -c``, ``eval``, ``watch``, heredocs and literal ``echo``
piped into a shell), up to ``max_depth`` levels.

Decision: the first deny wins; otherwise, if any part could not be parsed (or
hit a size/nesting limit), ``on_parse_error`` ("deny" or "ask", never allow);
otherwise the first "ask"; otherwise allow. A deny found in the parsable part
of an unparsable command still denies.

Built-in rules (name: category):

- ``privilege-escalation``: privilege-escalation. sudo, su, doas, pkexec, runuser.
- ``destructive-rm``: destructive-file-ops. Recursive rm (any spelling of -r), ``rsync
  --delete`` or inline ``rmtree(..)`` of anything but a path below the workspace root,
  $HOME or /tmp (see ``guard_paths``): the workspace root and the folders above it (``.``,
  ``/workspace``, ``build/../..``), a glob that can match everything at one of those roots
  (``*``, ``.*``, ``./*``), /, ~, system folders, a path known only at run time
  (``"$DIR"``, ``$(..)``, after ``cd "$X"``, what xargs reads); ``--no-preserve-root``.
  Routine cleanup (``rm -rf build dist node_modules``) passes: the workspace is the agent's.
- ``destructive-find``: destructive-file-ops. ``find -delete`` in the same places; at a
  root itself (``find . -delete``) unless a name or path test nothing undoes narrows it.
- ``windows-del``: destructive-file-ops. ``del /f``, ``del /s`` (also ``erase``).
- ``windows-rmdir``: destructive-file-ops. ``rmdir /s``, ``rd /s``.
- ``windows-format``: disk-destruction. ``format c:``.
- ``mkfs``: disk-destruction. mkfs, mkfs.*, mke2fs, mkswap, wipefs.
- ``raw-disk-write``: disk-destruction. A redirect, ``of=``, tee/cp/shred/...
  onto /dev/sd*, /dev/nvme*, /dev/vd*, /dev/hd*, /dev/xvd*, /dev/mmcblk* ...
- ``dd-copy``: disk-destruction. dd reading a device or kernel memory (not /dev/zero,
  /dev/urandom ...), writing a device or anywhere but below the workspace, $HOME and
  /tmp, or a run-time path; dd between ordinary files passes.
- ``system-power``: system-control. shutdown, reboot, poweroff, halt, init 0/6,
  systemctl/loginctl poweroff|reboot|halt|kexec.
- ``kill-all``: system-control. ``kill -9 -1``, ``kill 1`` (init), ``killall5``.
- ``chmod-root``: permissions. chmod/chown/chgrp on / or a system or home directory,
  or on anything under /etc, /boot, /root, /proc, /sys, /dev, /bin, /usr/bin ...;
  chmod setting the setuid/setgid bit.
- ``dev-tcp``: reverse-shell. ``/dev/tcp/`` or ``/dev/udp/`` anywhere.
- ``netcat-shell``: reverse-shell. nc/ncat -e/-c/--exec/--sh-exec, or a shell
  and netcat/socat/telnet in one pipeline, or network data run as code.
- ``socat-exec``: reverse-shell. socat with an ``exec:``/``system:`` address.
- ``script-reverse-shell``: reverse-shell. python/perl/ruby/php/node code with
  a socket, a connect and a process spawn.
- ``remote-code-exec``: remote-code-exec. Downloader output run as code
  (``curl | sh``, ``sh <(curl ..)``, ``bash -c "$(curl ..)"``).
- ``decode-to-shell``: eval-injection. Decoder output run as code
  (``base64 -d | sh``, ``xxd -r | bash``).
- ``eval-substitution``: eval-injection. ``eval`` of a command substitution.
- ``fork-bomb``: fork-bomb. A function that calls itself in the background or
  in a pipeline (``:(){ :|:& };:``), or ``fork`` in a loop in inline code.
- ``crypto-miner``: abuse. Known miners, ``stratum+tcp://`` pools.
- ``dynamic-command``: dynamic. The program name is only known at run time
  (``$CMD``, ``$(..)``, a glob): ask; deny when the arguments would be
  destructive for rm, find, dd, chmod, chown, nc or socat.

Paths resolve against the directories a command may run in: the call's workdir (below the
workspace), then each ``cd`` (``shell_parse`` tracks them: ``cd build && rm -rf *`` is
build's contents, ``cd build; rm -rf *`` may be the root's). Code handed to another shell
starts where that shell runs, and ``env -C DIR`` (systemd-run, unshare ...) moves it.
``check``'s ``env`` setting HOME or CDPATH (or a command that sets them) makes ``~`` or
``cd NAME`` unknown. A removal through a symlink the command makes (``ln -s / r; rm -rf
r/*``) is refused; other symlinks are not followed: the container is the boundary there.

Files written earlier in the same command are followed: a file from curl/wget (``-o``,
``-O``, ``> f``, ``| tee f``) or from a decoder, run later (``sh f``, ``. f``, ``./f``), is
denied like ``curl | sh``; a file written with literal ``echo``/``cat <<EOF`` is checked
as the code it holds. Rules also look at arguments as they would be should the run-time
parts be empty (``rm $u-rf $u/``).

Pseudo-rules in results: ``parse-error`` and ``too-complex``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import posixpath
import re
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NoReturn

from stockade.supervisor.policy.guard_paths import (
    SCRATCH,
    Place,
    find_narrowed,
    find_root_may_match,
    find_root_span,
    known_prefix,
    link_paths,
    moved,
    removal_problem,
    resolve_cwds,
)
from stockade.supervisor.policy.shell_parse import (
    Budget,
    Command,
    Cwds,
    Script,
    Sub,
    Word,
    basename,
    parse_script,
    static_output,
)

__all__ = ["Guard", "GuardConfigError", "GuardResult", "GuardRule"]

Action = Literal["allow", "deny", "ask"]


@dataclass(frozen=True)
class GuardRule:
    """A deny rule from config: a regex searched in each normalized simple command."""

    name: str
    pattern: str  # Python regex over "program-basename arg1 arg2 ..." (single spaces)
    reason: str = ""


@dataclass(frozen=True)
class GuardResult:
    action: Action
    rule: str | None  # the rule that decided; None when allowed
    reason: str
    unparsed: bool = False  # the command (or code nested in it) could not be parsed


class GuardConfigError(ValueError):
    """An invalid guard configuration (bad regex, empty or duplicate rule name)."""


# -- vocabulary -------------------------------------------------------------

_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "csh", "tcsh"})
_SHELLS |= {"rbash", "yash", "posh"}
_DOWNLOADERS = frozenset({"curl", "wget", "fetch", "http", "https", "xh", "aria2c", "lwp-request"})
_DOWNLOADERS |= {"lwp-download"}
_NETCATS = frozenset({"nc", "ncat", "netcat", "nc.traditional", "nc.openbsd", "socat", "telnet"})
_PRIVILEGED = frozenset({"sudo", "su", "doas", "pkexec", "runuser", "sudoedit"})
_POWER = frozenset({"shutdown", "reboot", "poweroff", "halt"})
_POWER_VERBS = frozenset({"poweroff", "reboot", "halt", "kexec", "soft-reboot", "rescue"})
_POWER_VERBS |= {"emergency", "isolate", "suspend", "hibernate", "hybrid-sleep"}
_POWER_VERBS |= {"suspend-then-hibernate"}
_MINERS = frozenset({"xmrig", "minerd", "cpuminer", "ethminer", "cgminer", "bfgminer", "nbminer"})
_MINERS |= {"lolminer"}
_DISK_WRITERS = frozenset({"tee", "cp", "mv", "install", "shred", "truncate", "ln", "rsync"})
_DISK_WRITERS |= {"fdisk", "sfdisk", "gdisk", "sgdisk", "cfdisk", "parted", "blkdiscard"}
_DISK_WRITERS |= {"hdparm", "badblocks", "pv"}
_DASH_C = frozenset({"su", "flock", "script", "runuser"})
_STDIN_PATHS = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})
_CRITICAL = frozenset({"/", "~", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64"})
_CRITICAL |= {"/opt", "/proc", "/root", "/sbin", "/srv", "/sys", "/usr", "/var"}
_SYSTEM_TREES = (
    *("/etc", "/boot", "/root", "/proc", "/sys", "/dev", "/bin", "/sbin", "/lib", "/lib64"),
    *("/usr/bin", "/usr/sbin", "/usr/lib"),
)
_SETUID = re.compile(r"0*[2-7][0-7]{3}|[ugoa]*[+=][rwxXt]*s[rwxXst]*")
_DECODERS = {"base64": "d D --decode", "base32": "d D --decode", "basenc": "d --decode"}
_DECODERS |= {"xxd": "r --reverse", "gzip": "d --decompress --decode", "bzip2": "d --decompress"}
_DECODERS |= {"xz": "d --decompress", "zstd": "d --decompress", "lzma": "d --decompress"}
_DECODERS |= {"gpg": "d --decrypt"}
_ALWAYS_DECODERS = frozenset({"uudecode", "rev", "zcat", "gunzip", "bzcat", "bunzip2", "xzcat"})
_ALWAYS_DECODERS |= {"unxz", "zstdcat", "unzstd", "lzcat", "unlzma", "tr", "uncompress"}
_CANDIDATES = ("rm", "find", "dd", "chmod", "chown", "nc", "socat")
_RAW_DISK = re.compile(
    r"/dev/(?:[shv]d[a-z]|xvd[a-z]|nvme\d|mmcblk\d|disk|dm-\d|md\d|mapper/|loop\d)", re.IGNORECASE
)
_DEV_NET = re.compile(r"/dev/+(?:\./+)*(?:tcp|udp)/|/inet[46]?/(?:tcp|udp)/", re.IGNORECASE)
_SETS_HOME = re.compile(r"(?<![$\w{])HOME\b")
_SYSRQ = re.compile(r"^/+proc/+sysrq-trigger$")
_HOME = re.compile(r"^(?:~|\$HOME|\$\{HOME\})(?=/|$)")
_STRATUM = re.compile(r"stratum\d?\+(?:tcp|ssl|tls)://", re.IGNORECASE)
_SOCAT_EXEC = re.compile(r"(?:^|!!)\s*(?:exec|system):", re.IGNORECASE)
_SCRIPT_NAME = re.compile(r"(python|pypy|perl|ruby|nodejs|node|php|luajit|lua|[gmn]?awk)[\d.]*")
_LANG_ALIASES = {"pypy": "python", "nodejs": "node", "luajit": "lua", "gawk": "awk"}
_LANG_ALIASES |= {"mawk": "awk", "nawk": "awk"}
_REVERSE_SHELL = (
    re.compile(r"socket|fsockopen|IO::Socket|net\.connect|new\s+net\.Socket", re.IGNORECASE),
    re.compile(r"connect|TCPSocket|fsockopen|IO::Socket::INET|PeerAddr", re.IGNORECASE),
    re.compile(r"subprocess|pty|spawn|exec|dup2|popen|system|child_process|/bin/\w*sh\b"),
)
_FORK_LOOP = re.compile(
    r"\bwhile\b[^\n]*\bfork\b|\bfork\b[^\n]*\b(?:while|iter\s*\(|count\s*\(|repeat\s*\()"
    r"|\bloop\s*\{\s*fork|\bfor\s*\(\s*;\s*;\s*\)[^\n]*\bfork"
)
_RMTREE = re.compile(
    r"\b(?:rmtree|rm_rf|rm_r|remove_tree|rmSync|rimraf|removeSync|emptyDirSync)\s*\(\s*"
    r"(?P<q>['\"])(?P<path>[^'\"]*)(?P=q)"
)
_ARGV = re.compile(r"\[\s*(?:['\"](?:\\.|[^'\"\\])*['\"]\s*,?\s*)+\]")
_ARGV_ITEM = re.compile(r"(['\"])((?:\\.|(?!\1).)*)\1")
_ARGV_PROGRAM = re.compile(r"(['\"])([\w./-]+)\1\s*,\s*$")
_AWK_PIPE = re.compile(
    r"(?:\"(?P<data>(?:\\.|[^\"\\])*)\"\s*\)?\s*)?\|&?\s*\"(?P<cmd>(?:\\.|[^\"\\])*)\""
    r"|\"(?P<getline>(?:\\.|[^\"\\])*)\"\s*\|&?\s*getline"
)
_EMBEDDED = re.compile(
    r"""\b(?:system|popen|exec\w*|spawn\w*|shell_exec|passthru|check_output|check_call"""
    r"""|getoutput|getstatusoutput|call|run|Popen)(?:\s*\(\s*\[?\s*|\s+)(?P<q>['"])"""
    r"""(?P<body>(?:\\.|(?!(?P=q)).)*)(?P=q)|`(?P<tick>[^`\n]*)`""",
    re.DOTALL,
)
_RUNTIME = re.compile(r"[$`]")
_DD_SOURCES = frozenset({"/dev/zero", "/dev/urandom", "/dev/random", "/dev/null", "/dev/stdin"})
_DD_SINKS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
_MAX_CHAIN = 32
_MAX_EMBEDDED = 32


# -- invocations: one program run, after seeing through wrappers -------------


@dataclass(frozen=True)
class _Inv:
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
_SHELL_ARG_OPTS = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
_SCRIPT_FLAGS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "python": (frozenset({"-c"}), frozenset({"-W", "-X"})),
    "perl": (frozenset({"-e", "-E"}), frozenset()),
    "ruby": (frozenset({"-e"}), frozenset({"-r", "-I", "-C"})),
    "node": (frozenset({"-e", "--eval", "-p", "--print"}), frozenset({"-r", "--require"})),
    "php": (frozenset({"-r"}), frozenset({"-c", "-d", "-z"})),
    "lua": (frozenset({"-e"}), frozenset({"-l"})),
}
_FILE_FLAGS = frozenset({("python", "-m"), ("php", "-f")})


def _invocations(command: Command, place: Place) -> list[_Inv]:
    found: list[_Inv] = []
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


def _make_inv(words: tuple[Word, ...], command: Command, place: Place) -> _Inv:
    name = basename(words[0].text)
    program = name.lower().removesuffix(".exe")
    return _Inv(program, name, words[0], words[1:], command, place)


def _wrapped(inv: _Inv) -> list[tuple[Word, ...]]:
    """The word lists of the commands a wrapper runs."""
    if inv.program == "env":
        return _env_wrapped(inv.args)
    if inv.program == "find":
        return _find_exec(inv.args)
    if inv.program == "coproc":
        args = inv.args[1:] if inv.args[1:2] and inv.args[1].text in ("{", "(") else inv.args
        return [args[1:] if args[:1] and args[0].text in ("{", "(") else args]
    if inv.program == "watch":
        index = _watch_index(inv.args)
        return [inv.args[index:]] if index is not None and _has(inv, "-x", "--exec") else []
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


def _wrapper_chdir(inv: _Inv) -> Word | None:
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
    root_words = _find_root_words(args)[:8] or [Word(".")]
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


def _find_root_words(args: tuple[Word, ...]) -> list[Word]:
    start, end = find_root_span([a.text for a in args])
    return list(args[start:end])


def _find_roots(argv: list[str]) -> list[str]:
    start, end = find_root_span(argv)
    return argv[start:end]


def _watch_index(args: tuple[Word, ...]) -> int | None:
    return _command_index(args, _wrap("-n -q --interval --equexit"))


def _has(inv: _Inv, *options: str) -> bool:
    return any(a.text in options for a in inv.args)


# -- code handed to an interpreter ------------------------------------------


@dataclass(frozen=True)
class _Code:
    lang: Literal["sh", "script"]
    inline: Word | None = None  # -c/-e code, eval's arguments
    operand: Word | None = None  # script file operand
    stdin: bool = False  # reads its program from stdin
    positional: tuple[str, ...] | None = None  # $0 $1 .. of `sh -c CODE $0 $1 ..`


def _code_of(inv: _Inv) -> _Code | None:
    program, args = inv.program, inv.args
    if program in _SHELLS:
        return _shell_code(args)
    if program == "eval":
        return _Code("sh", _joined(args)) if args else None
    if program in ("at", "batch"):
        return None if _has(inv, "-f") else _Code("sh", stdin=True)
    if program == "trap":
        rest = args[1:] if args[:1] and args[0].text == "--" else args
        return _Code("sh", rest[0]) if len(rest) > 1 and rest[0].text not in ("-p", "-l") else None
    if program in ("source", ".") and args:
        return _Code("sh", None, args[0], args[0].text in _STDIN_PATHS)
    if program == "watch" and not _has(inv, "-x", "--exec"):
        index = _watch_index(args)
        return _Code("sh", _joined(args[index:])) if index is not None else None
    if program in _DASH_C:
        code = _dash_c(args)
        return _Code("sh", code) if code is not None else None
    return _script_code(program, args)


def _joined(words: Sequence[Word]) -> Word:
    text = " ".join(w.text for w in words)
    return Word(text, any(w.dynamic for w in words), False, tuple(s for w in words for s in w.subs))


def _shell_code(args: tuple[Word, ...]) -> _Code:
    dash_c = dash_s = False
    i = 0
    while i < len(args):
        text = args[i].text
        if text in ("--", "-"):
            i += 1
            break
        if text in _SHELL_ARG_OPTS:
            i += 2
        elif len(text) > 1 and text[0] in "-+":
            dash_c |= text[0] == "-" and not text.startswith("--") and "c" in text
            dash_s |= "s" in text and not text.startswith("--")
            i += 1
        else:
            break
    operand = args[i] if i < len(args) else None
    if dash_c:
        rest = args[i + 1 :]
        known = None if any(w.dynamic for w in rest) else tuple(w.text for w in rest)
        return _Code("sh", operand or Word(""), positional=known)
    stdin = dash_s or operand is None or operand.text in _STDIN_PATHS
    return _Code("sh", None, None if stdin else operand, stdin)


def _dash_c(args: tuple[Word, ...]) -> Word | None:
    for i, arg in enumerate(args):
        if arg.text in ("-c", "--command") and i + 1 < len(args):
            return args[i + 1]
        if arg.text.startswith("--command="):
            return Word(arg.text.partition("=")[2], arg.dynamic, False, arg.subs)
    return None


def _script_code(program: str, args: tuple[Word, ...]) -> _Code | None:
    match = _SCRIPT_NAME.fullmatch(program)
    if match is None:
        return None
    lang = _LANG_ALIASES.get(match.group(1), match.group(1))
    return _awk_code(args) if lang == "awk" else _interpreter_code(lang, args)


def _interpreter_code(lang: str, args: tuple[Word, ...]) -> _Code:
    inline_flags, arg_opts = _SCRIPT_FLAGS[lang]
    i = 0
    while i < len(args):
        text = args[i].text
        if text == "--":
            i += 1
            break
        if text == "-" or not text.startswith("-"):
            break
        if (lang, text) in _FILE_FLAGS:
            return _Code("script")
        inline = _inline_code(args, i, inline_flags, arg_opts)
        if inline is not None:
            return _Code("script", inline)
        i += 2 if text in arg_opts else 1
    operand = args[i] if i < len(args) else None
    stdin = operand is None or operand.text in _STDIN_PATHS
    return _Code("script", None, None if stdin else operand, stdin)


def _inline_code(
    args: tuple[Word, ...], i: int, inline_flags: frozenset[str], arg_opts: frozenset[str]
) -> Word | None:
    """-c CODE, -cCODE, or a flag cluster ending in the code flag (perl -ne CODE)."""
    text = args[i].text
    following = args[i + 1] if i + 1 < len(args) else Word("")
    if text in inline_flags:
        return following
    if text.startswith("--") or text[:2] in arg_opts:
        return None
    for k, char in enumerate(text[1:], start=1):
        if f"-{char}" in inline_flags:
            rest = text[k + 1 :]
            return Word(rest, args[i].dynamic, False, args[i].subs) if rest else following
    return None


def _awk_code(args: tuple[Word, ...]) -> _Code:
    i = 0
    while i < len(args):
        text = args[i].text
        if text.startswith("-f") or text == "--file":
            return _Code("script")
        if text in ("-v", "-F", "--assign", "--field-separator"):
            i += 2
        elif text == "--":
            i += 1
            break
        elif text.startswith("-") and len(text) > 1:
            i += 1
        else:
            break
    return _Code("script", args[i] if i < len(args) else None)


def _stdin_body(command: Command) -> Word | None:
    return next((r.stdin for r in reversed(command.redirects) if r.stdin is not None), None)


# -- per-invocation rule checks: a description when the rule matches ------------


def _flags(args: tuple[Word, ...], longs: Sequence[str] = ()) -> set[str]:
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


def _operands(args: tuple[Word, ...]) -> list[str]:
    return [a.text for a in args if not a.text.startswith("-") or a.text == "-"]


def _critical(path: str) -> bool:
    """/, ~ or a top-level system directory (also with /* or trailing slashes)."""
    text = _HOME.sub("~", path)
    while text.endswith(("/*", "/.")):
        text = text[:-2]
    if text.startswith("/") or (not text and path.startswith("/")):
        text = posixpath.normpath("/" + text.lstrip("/"))
    return text.rstrip("/") in _CRITICAL or text == "/"


def _raw_disk(path: str) -> bool:
    if not path.startswith("/"):
        return False
    return _RAW_DISK.match(posixpath.normpath("/" + path.lstrip("/"))) is not None


def _privilege(inv: _Inv) -> str | None:
    return f"privilege escalation ({inv.name})" if inv.program in _PRIVILEGED else None


def _rm(inv: _Inv) -> str | None:
    if inv.program == "rsync":
        return _rsync_delete(inv)
    if inv.program != "rm":
        return None
    flags = _flags(inv.args, ("--recursive", "--force", "--no-preserve-root", "--dir"))
    if "--no-preserve-root" in flags:
        return "rm --no-preserve-root"
    if not flags & {"r", "R", "--recursive"}:
        return None
    if inv.place.fed:
        return "recursive rm of paths read at run time (xargs)"
    for word in _operand_words(inv.args):
        problem = removal_problem(word, inv.place)
        if problem:
            return f"recursive rm of {problem}"
    return None


def _rsync_delete(inv: _Inv) -> str | None:
    """``rsync --delete empty/ ./``: the destination loses what the source lacks."""
    if not any(a.text.startswith("--del") for a in inv.args):
        return None
    operands = _operand_words(inv.args)
    if len(operands) < 2 or ":" in operands[-1].text:  # a remote destination
        return None
    problem = removal_problem(operands[-1], inv.place)
    return f"rsync --delete into {problem}" if problem else None


def _operand_words(args: tuple[Word, ...]) -> list[Word]:
    """Operands: words not starting with "-" ("-" itself too), and all after "--"."""
    found, options = [], True
    for arg in args:
        if options and arg.text == "--":
            options = False
        elif not options or not arg.text.startswith("-") or arg.text == "-":
            found.append(arg)
    return found


def _find(inv: _Inv) -> str | None:
    if inv.program != "find" or "-delete" not in inv.argv:
        return None
    narrowed = find_narrowed(inv.argv)
    for root in _find_root_words(inv.args) or [Word(".")]:
        problem = removal_problem(root, inv.place, root_ok=narrowed)
        if problem:
            return f"find -delete in {problem}" + (
                "" if narrowed else " with no name test narrowing it"
            )
    return None


def _windows_flags(inv: _Inv) -> set[str]:
    letters = [a.text.lower() for a in inv.args if re.fullmatch(r"(?:/[a-zA-Z])+", a.text)]
    return set("".join(letters).replace("/", ""))


def _windows_del(inv: _Inv) -> str | None:
    if inv.program in ("del", "erase") and _windows_flags(inv) & {"f", "s"}:
        return f"forced/recursive Windows delete ({inv.name} /f)"
    return None


def _windows_rmdir(inv: _Inv) -> str | None:
    if inv.program in ("rmdir", "rd") and "s" in _windows_flags(inv):
        return f"recursive Windows directory removal ({inv.name} /s)"
    return None


def _windows_format(inv: _Inv) -> str | None:
    if inv.program == "format" and any(re.fullmatch(r"[a-z]:\\?", t.lower()) for t in inv.argv):
        return "disk formatting (format c:)"
    return None


def _mkfs(inv: _Inv) -> str | None:
    if inv.program.startswith("mkfs") or inv.program in ("mke2fs", "mkswap", "wipefs"):
        return f"filesystem creation ({inv.name})"
    return None


def _dd(inv: _Inv) -> str | None:
    """dd between ordinary files (or from /dev/zero, /dev/urandom) is routine; reading a
    device or kernel memory, writing to a device or outside the workspace, $HOME and /tmp,
    or a run-time path is not."""
    if inv.program != "dd":
        return None
    for path in _prefixed(inv, "if="):
        where = _dd_paths(path, inv.place)
        if where is None:
            return (
                f"dd reading a path known only at run time or in an unknown folder ({_short(path)})"
            )
        if any(_device_or_kernel(p) and p not in _DD_SOURCES for p in where):
            return f"dd reading a device or kernel memory ({path})"
    for path in _prefixed(inv, "of="):
        where = _dd_paths(path, inv.place)
        if where is None:
            return (
                f"dd writing a path known only at run time or in an unknown folder ({_short(path)})"
            )
        if any(_device_or_kernel(p) and p not in _DD_SINKS for p in where):
            return f"dd writing a device ({path})"
        if all(p in _DD_SINKS for p in where):
            continue
        problem = removal_problem(Word(path), inv.place, root_ok=True)
        if problem:
            return f"dd writing {problem}"
    return None


def _dd_paths(path: str, place: Place) -> list[str] | None:
    """Absolute paths of a dd operand; None when run-time parts or the directory are unknown."""
    where = link_paths(Word(path), place) if path and not _RUNTIME.search(path) else []
    return where or None


def _device_or_kernel(path: str) -> bool:
    return path.startswith(("/dev/", "/proc/", "/sys/"))


def _norm_abs(path: str) -> str:
    return posixpath.normpath("/" + path.lstrip("/"))


def _prefixed(inv: _Inv, prefix: str) -> list[str]:
    return [t[len(prefix) :] for t in inv.argv if t.lower().startswith(prefix)]


def _disk_write(inv: _Inv) -> str | None:
    if any(_raw_disk(t) for t in _prefixed(inv, "of=")):
        return "write to a raw disk device (of=/dev/...)"
    if inv.program in _DISK_WRITERS and any(_raw_disk(t) for t in inv.argv):
        return f"write to a raw disk device ({inv.name} /dev/...)"
    return None


def _power(inv: _Inv) -> str | None:
    argv = inv.argv
    if inv.program in _POWER:
        return f"system power control ({inv.name})"
    if inv.program in ("init", "telinit") and argv and re.fullmatch(r"[0-6sS]", argv[0]):
        return f"system power control ({inv.name} {argv[0]})"
    if inv.program == "kexec" and _flags(inv.args, ("--exec",)) & {"e", "--exec"}:
        return "system power control (kexec -e)"
    if inv.program == "tee" and any(_SYSRQ.match(t) for t in argv):
        return "system power control (/proc/sysrq-trigger)"
    verbs = sorted(_POWER_VERBS.intersection(t.removesuffix(".target") for t in argv))
    if inv.program in ("systemctl", "loginctl") and verbs:
        return f"system power control ({inv.name} {verbs[0]})"
    return None


def _chmod_root(inv: _Inv) -> str | None:
    if inv.program not in ("chmod", "chown", "chgrp"):
        return None
    operands = _operands(inv.args)
    if any(map(_critical, operands)):
        return f"{inv.name} of / or a system or home directory"
    if any(_in_system_tree(a.text) for a in inv.args if not a.dynamic):
        return f"{inv.name} of a file in a system directory (/etc, /bin, /usr/bin ...)"
    mode = next((t for t in inv.argv if not re.fullmatch(r"-[RvcfH]+|--\S+", t)), "")
    if inv.program == "chmod" and _SETUID.fullmatch(mode):
        return f"chmod that sets the setuid/setgid bit ({mode})"
    return None


def _in_system_tree(path: str) -> bool:
    if not path.startswith("/"):
        return False
    norm = posixpath.normpath("/" + path.lstrip("/"))
    return any(norm == top or norm.startswith(top + "/") for top in _SYSTEM_TREES)


def _kill(inv: _Inv) -> str | None:
    if inv.program == "killall5":
        return "signal to every process (killall5)"
    if inv.program != "kill":
        return None
    argv = inv.argv
    i = 2 if argv[:1] in (["-s"], ["-n"]) else int(len(argv) > 1 and argv[0][:1] == "-")
    i += argv[i : i + 1] == ["--"]
    if any(t in ("-1", "1") for t in argv[i:]) or argv == ["-1"]:
        return "signal to every process or to init (kill -1, kill 1)"
    return None


def _netcat(inv: _Inv) -> str | None:
    if inv.program not in _NETCATS or inv.program in ("socat", "telnet"):
        return None
    flags = _flags(inv.args, ("--exec", "--sh-exec", "--lua-exec"))
    if flags & {"e", "c", "--exec", "--sh-exec", "--lua-exec"}:
        return f"{inv.name} that runs a program for the connection ({inv.name} -e)"
    return None


def _socat(inv: _Inv) -> str | None:
    if inv.program == "socat" and any(_SOCAT_EXEC.search(t) for t in inv.argv):
        return "socat with an exec:/system: address"
    return None


def _eval_sub(inv: _Inv) -> str | None:
    if inv.program == "eval" and any(s.kind == "$(" for a in inv.args for s in a.subs):
        return "eval of a command substitution (eval $(...))"
    return None


def _miner(inv: _Inv) -> str | None:
    if inv.program in _MINERS or any(_STRATUM.search(t) for t in inv.argv):
        return "crypto-miner"
    return None


# -- per-command rule checks (need the redirects) -------------------------------


def _dev_net(command: Command) -> str | None:
    words = [*command.words, *(t for r in command.redirects for t in r.targets)]
    if any(_DEV_NET.search(w.text) for w in words):
        return "network socket through /dev/tcp or /dev/udp"
    return None


def _sysrq(command: Command) -> str | None:
    for redirect in command.redirects:
        if ">" in redirect.op and any(_SYSRQ.match(t.text) for t in redirect.targets):
            return "system power control (> /proc/sysrq-trigger)"
    return None


def _disk_redirect(command: Command) -> str | None:
    for redirect in command.redirects:
        if ">" in redirect.op and any(_raw_disk(t.text) for t in redirect.targets):
            return "redirect onto a raw disk device (> /dev/sd...)"
    return None


@dataclass(frozen=True)
class _Rule:
    name: str
    category: str
    on_invocation: Callable[[_Inv], str | None] | None = None
    on_command: Callable[[Command], str | None] | None = None


_RULES = (
    _Rule("privilege-escalation", "privilege-escalation", _privilege),
    _Rule("destructive-rm", "destructive-file-ops", _rm),
    _Rule("destructive-find", "destructive-file-ops", _find),
    _Rule("windows-del", "destructive-file-ops", _windows_del),
    _Rule("windows-rmdir", "destructive-file-ops", _windows_rmdir),
    _Rule("windows-format", "disk-destruction", _windows_format),
    _Rule("mkfs", "disk-destruction", _mkfs),
    _Rule("raw-disk-write", "disk-destruction", _disk_write, _disk_redirect),
    _Rule("dd-copy", "disk-destruction", _dd),
    _Rule("system-power", "system-control", _power, _sysrq),
    _Rule("kill-all", "system-control", _kill),
    _Rule("chmod-root", "permissions", _chmod_root),
    _Rule("dev-tcp", "reverse-shell", None, _dev_net),
    _Rule("netcat-shell", "reverse-shell", _netcat),
    _Rule("socat-exec", "reverse-shell", _socat),
    _Rule("script-reverse-shell", "reverse-shell"),
    _Rule("remote-code-exec", "remote-code-exec"),
    _Rule("decode-to-shell", "eval-injection"),
    _Rule("eval-substitution", "eval-injection", _eval_sub),
    _Rule("fork-bomb", "fork-bomb"),
    _Rule("crypto-miner", "abuse", _miner),
    _Rule("dynamic-command", "dynamic"),
)
_ON_INVOCATION = tuple((r.name, r.on_invocation) for r in _RULES if r.on_invocation)
_ON_COMMAND = tuple((r.name, r.on_command) for r in _RULES if r.on_command)
_BUILTIN_NAMES = (*(r.name for r in _RULES), "parse-error", "too-complex")


def _is_decoder(inv: _Inv) -> bool:
    """Does this turn its input into something else (decode, decompress, decrypt, reverse)?"""
    if inv.program in _ALWAYS_DECODERS:
        return inv.program != "tr" or len(_operands(inv.args)) == 2
    options = _DECODERS.get(inv.program)
    if options is not None:
        longs = [o for o in options.split() if o.startswith("--")]
        return bool(_flags(inv.args, longs) & set(options.split()))
    if inv.program == "openssl":
        return bool({"base64", "enc"} & set(inv.argv)) and "d" in _flags(inv.args)
    return False


# -- evaluation -------------------------------------------------------------------


class _Decided(Exception):
    def __init__(self, result: GuardResult) -> None:
        super().__init__(result.reason)
        self.result = result


class _Evaluation:
    """State of one ``Guard.check`` call; raises ``_Decided`` on the first deny."""

    def __init__(self, guard: Guard, base: tuple[str, ...] | None, env: Mapping[str, str]) -> None:
        self.guard = guard
        self.base = base  # absolute directories the script being walked starts in
        self.home: str | None = None if "HOME" in env else guard._home
        self.cdpath = "CDPATH" in env
        self.links: dict[str, None] = {}  # symlinks the command makes (absolute paths)
        self.asked: GuardResult | None = None
        self.unparsed: tuple[str, str] | None = None  # (pseudo-rule, why)
        self.cache: dict[int, tuple[Command, list[_Inv]]] = {}
        self.budget = Budget()
        self.written: dict[str, tuple[str, str] | str] = {}  # file -> (rule, what) or content

    def deny(self, rule: str, what: str) -> NoReturn:
        reason = f"{what} is blocked by rule {rule}"
        raise _Decided(GuardResult("deny", rule, reason, self.unparsed is not None))

    def ask(self, rule: str, what: str) -> None:
        if self.asked is None:
            self.asked = GuardResult("ask", rule, f"{what}; needs approval (rule {rule})")

    def note_unparsed(self, rule: str, why: str) -> None:
        if self.unparsed is None:
            self.unparsed = (rule, why)

    def finish(self) -> GuardResult:
        if self.unparsed is None:
            return self.asked or GuardResult("allow", None, "no rule matched")
        rule, why = self.unparsed
        action = self.guard._on_parse_error
        outcome = "blocked" if action == "deny" else "held for approval"
        return GuardResult(action, rule, f"{why}; not checkable, so {outcome} (rule {rule})", True)

    def invocations(self, command: Command) -> list[_Inv]:
        cached = self.cache.get(id(command))
        if cached is None or cached[0] is not command:
            place = self.place(command.cwds)
            cached = self.cache[id(command)] = (command, _invocations(command, place))
        return cached[1]

    def place(self, cwds: Cwds = ("",)) -> Place:
        """Where a command that runs in ``cwds`` (relative to the script's start) runs."""
        return _place(self.base, cwds, self.guard._workspace, self.home, tuple(self.links))

    def parse(self, text: str, positional: Sequence[str] | None = ()) -> Script:
        """Parse shell text; a text that may set HOME or CDPATH makes them unknown."""
        if _SETS_HOME.search(text):
            self.home = None
        self.cdpath |= "CDPATH" in text
        return parse_script(text, positional=positional, budget=self.budget, cdpath=self.cdpath)

    def sub_invocations(self, sub: Sub) -> list[_Inv]:
        return [inv for command in sub.commands for inv in self.invocations(command)]

    # walking ----------------------------------------------------------------------

    def script(self, script: Script, depth: int) -> None:
        if script.error:
            self.note_unparsed("too-complex" if script.too_complex else "parse-error", script.error)
        for name in script.fork_bombs:
            if name == "while":
                self.deny("fork-bomb", "fork bomb (endless loop that starts background processes)")
            self.deny("fork-bomb", f"fork bomb (function {name!r} calls itself concurrently)")
        for command in script.commands:
            self.note_links(command)
        for previous, command in zip((None, *script.commands), script.commands, strict=False):
            self.note_written(command, previous)
        for stages in script.pipelines:
            self.note_teed(stages)
        for command in script.commands:
            self.command(command, depth)
        for stages in script.pipelines:
            self.pipeline(stages, depth)

    def command(self, command: Command, depth: int) -> None:
        for name, on_command in _ON_COMMAND:
            what = on_command(command)
            if what:
                self.deny(name, what)
        for inv in self.invocations(command):
            self.invocation(inv, depth)
        for reader in self.output_readers(command):  # `curl x > >(sh)`
            self.upstream(self.invocations(command), reader.name)

    def output_readers(self, command: Command) -> list[_Inv]:
        """Interpreters reading their code from an output process substitution ``>(..)``."""
        words = [*command.words, *(t for r in command.redirects for t in r.targets)]
        subs = [s for w in words for s in w.subs if s.kind == ">("]
        invs = [inv for sub in subs for inv in self.sub_invocations(sub)]
        return [inv for inv in invs if (code := _code_of(inv)) and code.stdin]

    def invocation(self, inv: _Inv, depth: int) -> None:
        for name, on_invocation in _ON_INVOCATION:
            what = on_invocation(inv)
            if what:
                self.deny(name, what)
        if any(a.bare is not None for a in inv.args):  # `rm $u-rf $u/`: $u may be empty
            args = tuple(
                a if a.bare is None or known_prefix(a.text) else Word(a.bare, dynamic=True)
                for a in inv.args
            )
            bare = replace(inv, args=tuple(a for a in args if a.text))
            for name, on_invocation in _ON_INVOCATION:
                what = on_invocation(bare)
                if what:
                    self.deny(name, f"{what}, should its run-time parts be empty")
        self.config_rules(inv)
        code = _code_of(inv)
        if code is not None:
            self.code(inv, code, depth)
        self.run_written(inv, code, depth)
        if inv.word.dynamic or inv.word.glob:
            self.dynamic(inv)

    # files written earlier in the same command, then run -----------------------------

    def note_written(self, command: Command, previous: Command | None) -> None:
        """``curl -o f URL``, ``base64 -d > f``, ``echo 'code' > f``: remember what f holds.
        ``a | b > f`` and ``{ a; } > f`` come as a command with no words after ``b``/``a``."""
        source = previous if not command.words and previous is not None else command
        invs = self.invocations(source)
        producer = _producer(invs)
        kept = tuple(r for r in source.redirects if ">" not in r.op)
        content = static_output(replace(source, redirects=kept))
        for inv in invs:
            for path in _download_targets(inv):
                self.written[_norm(path)] = ("remote-code-exec", f"file downloaded by {inv.name}")
        for redirect in command.redirects:
            if redirect.op in (">", ">>", ">|", "&>", "&>>") and redirect.targets:
                path = _norm(redirect.targets[0].text)
                if producer is not None:
                    self.written[path] = producer
                elif content is not None:
                    self.written[path] = content

    def note_links(self, command: Command) -> None:
        """``ln -s / x``: a removal through x later in the command is refused (the guard
        follows no symlink, but it can see the ones the command makes)."""
        words = command.words
        if not words or basename(words[0].text) != "ln":
            return
        args = words[1:]
        if not _flags(args, ("--symbolic",)) & {"s", "--symbolic"}:
            return
        operands = _operand_words(args)
        names = [operands[-1]] if len(operands) > 1 else []
        names += [Word(posixpath.basename(o.text.rstrip("/")) or "root") for o in operands[:1]]
        place = Place(resolve_cwds(self.base, command.cwds, self.home), self.guard._workspace)
        for name in names:
            self.links.update(dict.fromkeys(link_paths(name, place)))

    def note_teed(self, stages: tuple[tuple[Command, ...], ...]) -> None:
        """``curl URL | tee f``."""
        producer: tuple[str, str] | None = None
        for stage in stages:
            invs = [inv for command in stage for inv in self.invocations(command)]
            for inv in invs:
                if producer is not None and inv.program == "tee":
                    for path in _operands(inv.args):
                        self.written[_norm(path)] = producer
            producer = producer or _producer(invs)

    def run_written(self, inv: _Inv, code: _Code | None, depth: int) -> None:
        """A file noted by ``note_written`` run as a program or script."""
        paths = [code.operand.text] if code is not None and code.operand is not None else []
        if "/" in inv.word.text:
            paths.append(inv.word.text)
        for path in paths:
            held = self.written.get(_norm(path))
            if isinstance(held, tuple):
                rule, what = held
                self.deny(rule, f"{what} ({path}) run as code by {inv.name}")
            if isinstance(held, str):
                with self.running_in(inv):
                    self.source(code.lang if code is not None else "sh", held, depth)

    def config_rules(self, inv: _Inv) -> None:
        if not self.guard._extra:
            return
        text = " ".join([inv.name, *inv.argv])
        for rule, regex in self.guard._extra:
            if regex.search(text):
                self.deny(rule.name, rule.reason or f"{_short(text)!r} matches {rule.pattern!r}")

    @contextlib.contextmanager
    def running_in(self, inv: _Inv) -> Iterator[None]:
        """Code ``inv`` runs starts in the directories ``inv`` runs in."""
        saved, self.base = self.base, inv.place.cwds
        try:
            yield
        finally:
            self.base = saved

    def code(self, inv: _Inv, code: _Code, depth: int) -> None:
        with self.running_in(inv):
            self.fed_code(inv, code, depth)

    def fed_code(self, inv: _Inv, code: _Code, depth: int) -> None:
        body = _stdin_body(inv.command) if code.stdin else None
        fed = [w for w in (code.inline, code.operand, body) if w is not None]
        if code.stdin:
            redirects = inv.command.redirects
            fed += [
                t for r in redirects if r.op.startswith("<") and r.stdin is None for t in r.targets
            ]
        for word in fed:
            for sub in word.subs:
                self.upstream(self.sub_invocations(sub), inv.name)
        for source in (code.inline, body):
            if source is not None:
                self.source(code.lang, source.text, depth, positional=code.positional)

    def source(
        self,
        lang: str,
        text: str,
        depth: int,
        *,
        strict: bool = True,
        positional: Sequence[str] | None = (),
    ) -> None:
        if lang == "script":
            self.script_code(text, depth)
        elif depth >= self.guard._max_depth:
            self.note_unparsed("too-complex", f"shell code nested more than {depth} levels deep")
        else:
            script = self.parse(text, positional)
            self.script(script if strict else replace(script, error=None), depth + 1)

    def script_code(self, text: str, depth: int) -> None:
        if _DEV_NET.search(text):
            self.deny("dev-tcp", "network socket through /dev/tcp or /dev/udp")
        if all(p.search(text) for p in _REVERSE_SHELL):
            self.deny("script-reverse-shell", "inline code that connects a socket to a shell")
        if _FORK_LOOP.search(text):
            self.deny("fork-bomb", "fork bomb (fork in a loop)")
        for match in _RMTREE.finditer(text):
            problem = removal_problem(Word(match.group("path")), self.place())
            if problem:
                self.deny("destructive-rm", f"inline code that removes {problem}")
        for embedded in itertools.islice(_embedded_commands(text), _MAX_EMBEDDED):
            self.source("sh", embedded, depth, strict=False)

    def upstream(self, producers: list[_Inv], consumer: str) -> None:
        """Deny when a downloader, decoder or socket feeds code to ``consumer``."""
        for inv in producers:
            if inv.program in _DOWNLOADERS:
                self.deny("remote-code-exec", f"output of {inv.name} run as code by {consumer}")
        for inv in producers:
            if _is_decoder(inv):
                self.deny("decode-to-shell", f"decoded data ({inv.name}) run as code by {consumer}")
        for inv in producers:
            if inv.program in _NETCATS:
                self.deny("netcat-shell", f"network data ({inv.name}) run as code by {consumer}")

    def pipeline(self, stages: tuple[tuple[Command, ...], ...], depth: int) -> None:
        invs = [[inv for c in stage for inv in self.invocations(c)] for stage in stages]
        for i, stage in enumerate(invs):
            readers = [(inv, code) for inv in stage if (code := _code_of(inv)) and code.stdin]
            if any(inv.program in ("xargs", "parallel") for inv in stage[:1]):  # stdin -> argv
                readers += [(inv, code) for inv in stage[1:] if (code := _code_of(inv))]
            if not readers:
                continue
            self.upstream([inv for earlier in invs[:i] for inv in earlier], readers[0][0].name)
            output = static_output(stages[i - 1][0]) if i and len(stages[i - 1]) == 1 else None
            if output is not None:  # `echo 'rm -rf /' | sh`: check what the shell reads
                for reader, code in readers:
                    with self.running_in(reader):
                        self.source(code.lang, output, depth)
        programs = {inv.program for stage in invs for inv in stage}
        if programs & _SHELLS and programs & _NETCATS:
            self.deny("netcat-shell", "shell connected to a network socket by a pipeline")

    def dynamic(self, inv: _Inv) -> None:
        for sub in inv.word.subs:
            self.upstream(self.sub_invocations(sub), _short(inv.word.text))
        for candidate in _CANDIDATES:
            probe = replace(inv, program=candidate)
            for _, on_invocation in _ON_INVOCATION:
                what = on_invocation(probe)
                if what:
                    self.deny(
                        "dynamic-command",
                        f"run-time command name {_short(inv.word.text)!r} with arguments that "
                        f"would be destructive for {candidate} ({what})",
                    )
        self.ask(
            "dynamic-command", f"command name {_short(inv.word.text)!r} is known only at run time"
        )


def _embedded_commands(text: str) -> Iterator[str]:
    """Shell commands in inline code: ``system("..")``, backticks, argv lists
    (``subprocess.run(["rm", "-rf", "/"])``, ``spawn("rm", [..])``), awk ``print .. | "sh"``."""
    for match in _EMBEDDED.finditer(text):
        embedded = match.group("body") if match.group("q") else match.group("tick")
        yield _unescape(embedded or "")
    for match in _ARGV.finditer(text):
        argv = [_unescape(m.group(2)) for m in _ARGV_ITEM.finditer(match.group())]
        program = _ARGV_PROGRAM.search(text[max(0, match.start() - 200) : match.start()])
        yield shlex.join(([program.group(2)] if program else []) + argv)
    for match in _AWK_PIPE.finditer(text):
        command = _unescape(match.group("cmd") or match.group("getline") or "")
        yield command
        data = match.group("data")
        if data and command.split()[:1] and basename(command.split()[0]) in _SHELLS:
            yield _unescape(data)


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _producer(invs: list[_Inv]) -> tuple[str, str] | None:
    for inv in invs:
        if inv.program in _DOWNLOADERS:
            return ("remote-code-exec", f"file downloaded by {inv.name}")
        if _is_decoder(inv):
            return ("decode-to-shell", f"file decoded by {inv.name}")
    return None


def _download_targets(inv: _Inv) -> list[str]:
    """Files curl or wget write: ``-o f``, ``-O`` (the URL's name), wget's default."""
    if inv.program not in ("curl", "wget"):
        return []
    output = ("-o", "--output") if inv.program == "curl" else ("-O", "--output-document")
    found, urls, remote_name = [], [], inv.program == "wget"
    argv = inv.argv
    for i, text in enumerate(argv):
        option = text.split("=", 1)[0]
        short = re.fullmatch(r"-[a-zA-Z]*" + output[0][1], text)
        if (text in output or short) and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif option == output[1] and "=" in text:
            found.append(text.partition("=")[2])
        elif text.startswith(output[0]) and not text.startswith("--") and len(text) > 2:
            found.append(text[2:])
        elif inv.program == "curl" and (
            text in ("--remote-name", "--remote-name-all") or re.fullmatch(r"-[a-zA-Z]*O", text)
        ):
            remote_name = True
        elif "://" in text:
            urls.append(text)
    if remote_name and not found:
        found += [posixpath.basename(u.split("?", 1)[0].rstrip("/")) or "index.html" for u in urls]
    return [f for f in found if f and f != "-"]


def _norm(path: str) -> str:
    return posixpath.normpath(path) if path else path


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- the guard ----------------------------------------------------------------------


class Guard:
    """Decides whether a shell command may run. Immutable; ``check`` is pure and thread-safe."""

    __slots__ = ("_extra", "_home", "_max_depth", "_names", "_on_parse_error", "_workspace")
    _extra: tuple[tuple[GuardRule, re.Pattern[str]], ...]
    _home: str
    _max_depth: int
    _names: tuple[str, ...]
    _on_parse_error: Literal["deny", "ask"]
    _workspace: str

    def __init__(
        self,
        extra_rules: Sequence[GuardRule] = (),
        *,
        on_parse_error: Literal["deny", "ask"] = "deny",
        max_depth: int = 8,
        workspace: str = "/workspace",
        home: str = SCRATCH,
    ) -> None:
        """``workspace``: the sandbox's workspace root, where commands start (below it a
        recursive removal is routine); ``home``: its $HOME (below it too)."""
        if on_parse_error not in ("deny", "ask"):
            raise GuardConfigError(
                f"on_parse_error must be 'deny' or 'ask', not {on_parse_error!r}"
            )
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise GuardConfigError(f"max_depth must be a positive integer, not {max_depth!r}")
        extra = _compile_rules(extra_rules)
        object.__setattr__(self, "_workspace", _root_folder("workspace", workspace))
        object.__setattr__(self, "_home", _root_folder("home", home))
        object.__setattr__(self, "_extra", extra)
        object.__setattr__(self, "_max_depth", max_depth)
        object.__setattr__(self, "_on_parse_error", on_parse_error)
        object.__setattr__(self, "_names", _BUILTIN_NAMES + tuple(r.name for r, _ in extra))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    @property
    def rule_names(self) -> tuple[str, ...]:
        """Built-in rule names (including the parse-error/too-complex pseudo-rules), then extras."""
        return self._names

    def check(
        self, command: str, *, workdir: str | None = ".", env: Mapping[str, str] | None = None
    ) -> GuardResult:
        """Allow, deny or ask for one shell command string, run in ``workdir`` (relative to
        the workspace, or absolute; None: not known) with ``env`` added to its environment
        (one that sets HOME or CDPATH makes ``~`` or ``cd NAME`` unknown)."""
        base = None if workdir is None else (_norm_abs(posixpath.join(self._workspace, workdir)),)
        evaluation = _Evaluation(self, base, env or {})
        try:
            evaluation.script(evaluation.parse(command), depth=0)
        except _Decided as decided:
            return decided.result
        except RecursionError:
            evaluation.note_unparsed("too-complex", "command is nested too deeply to check")
        return evaluation.finish()


@functools.lru_cache(maxsize=512)
def _place(
    base: tuple[str, ...] | None,
    cwds: Cwds,
    workspace: str,
    home: str | None,
    links: tuple[str, ...],
) -> Place:
    """Places repeat (the same few directories in every check): built once."""
    return Place(resolve_cwds(base, cwds, home), workspace, home, links=links)


def _root_folder(what: str, path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/") or _norm_abs(path) == "/":
        raise GuardConfigError(f"{what} must be an absolute folder other than /, not {path!r}")
    return _norm_abs(path)


def _compile_rules(rules: Sequence[GuardRule]) -> tuple[tuple[GuardRule, re.Pattern[str]], ...]:
    seen = set(_BUILTIN_NAMES)
    compiled = []
    for rule in rules:
        if not isinstance(rule, GuardRule):
            raise GuardConfigError(f"expected a GuardRule, got {type(rule).__name__}")
        if (
            not isinstance(rule.name, str)
            or not rule.name.strip()
            or rule.name != rule.name.strip()
        ):
            raise GuardConfigError(f"guard rule name must be a non-blank string, not {rule.name!r}")
        if rule.name in seen:
            raise GuardConfigError(f"guard rule name {rule.name!r} is already taken")
        if not isinstance(rule.pattern, str) or not rule.pattern:
            raise GuardConfigError(f"guard rule {rule.name!r} needs a non-empty pattern")
        try:
            regex = re.compile(rule.pattern)
        except re.error as exc:
            raise GuardConfigError(f"guard rule {rule.name!r}: invalid regex: {exc}") from exc
        seen.add(rule.name)
        compiled.append((rule, regex))
    return tuple(compiled)
