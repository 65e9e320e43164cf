"""The built-in rules' checks: each takes one invocation (or one simple command, for the
checks that need its redirects) and returns what it does when the rule matches, else None.
``rules.RULES`` says which rule each check belongs to."""

from __future__ import annotations

import posixpath
import re

from stockade.supervisor.policy.guard.idioms import setup_idiom
from stockade.supervisor.policy.guard.invocations import (
    Inv,
    find_root_words,
    operand_texts,
    operand_words,
    option_flags,
    shorten,
)
from stockade.supervisor.policy.guard.parsing import Command, Word
from stockade.supervisor.policy.guard.paths import (
    Place,
    find_narrowed,
    image_problem,
    link_paths,
    removal_problem,
)
from stockade.supervisor.policy.guard.vocabulary import DEV_NET, NETCATS

_PRIVILEGED = frozenset({"sudo", "su", "doas", "pkexec", "runuser", "sudoedit"})
_POWER = frozenset({"shutdown", "reboot", "poweroff", "halt"})
_POWER_VERBS = frozenset({"poweroff", "reboot", "halt", "kexec", "soft-reboot", "rescue"})
_POWER_VERBS |= {"emergency", "isolate", "suspend", "hibernate", "hybrid-sleep"}
_POWER_VERBS |= {"suspend-then-hibernate"}
_MINERS = frozenset({"xmrig", "minerd", "cpuminer", "ethminer", "cgminer", "bfgminer", "nbminer"})
_MINERS |= {"lolminer"}
_DISK_WRITERS = frozenset({"tee", "cp", "mv", "install", "shred", "truncate", "ln", "rsync"})
_DISK_WRITERS |= {"fdisk", "sfdisk", "gdisk", "sgdisk", "cfdisk", "parted", "blkdiscard"}
_DISK_WRITERS |= {"hdparm", "badblocks", "pv", "mksquashfs", "mkisofs", "genisoimage", "xorriso"}
_FS_MAKERS = frozenset({"mke2fs", "mkswap", "wipefs", "mkdosfs", "mkntfs", "mkexfatfs"})
_CRITICAL = frozenset({"/", "~", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64"})
_CRITICAL |= {"/opt", "/proc", "/root", "/sbin", "/srv", "/sys", "/usr", "/var"}
_SYSTEM_TREES = (
    *("/etc", "/boot", "/root", "/proc", "/sys", "/dev", "/bin", "/sbin", "/lib", "/lib64"),
    *("/usr/bin", "/usr/sbin", "/usr/lib"),
)
_SETUID = re.compile(r"0*[2-7][0-7]{3}|[ugoa]*[+=][rwxXt]*s[rwxXst]*")
_RAW_DISK = re.compile(
    r"/dev/(?:[shv]d[a-z]|xvd[a-z]|nvme\d|mmcblk\d|disk|dm-\d|md\d|mapper/|loop\d)", re.IGNORECASE
)
_SYSRQ = re.compile(r"^/+proc/+sysrq-trigger$")
_HOME = re.compile(r"^(?:~|\$HOME|\$\{HOME\})(?=/|$)")
_STRATUM = re.compile(r"stratum\d?\+(?:tcp|ssl|tls)://", re.IGNORECASE)
_SOCAT_EXEC = re.compile(r"(?:^|!!)\s*(?:exec|system):", re.IGNORECASE)
_RUNTIME = re.compile(r"[$`]")
_DD_SOURCES = frozenset({"/dev/zero", "/dev/urandom", "/dev/random", "/dev/null", "/dev/stdin"})
_DD_SINKS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


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


def privilege(inv: Inv) -> str | None:
    return f"privilege escalation ({inv.name})" if inv.program in _PRIVILEGED else None


def rm(inv: Inv) -> str | None:
    if inv.program == "rsync":
        return _rsync_delete(inv)
    if inv.program != "rm":
        return None
    flags = option_flags(inv.args, ("--recursive", "--force", "--no-preserve-root", "--dir"))
    if "--no-preserve-root" in flags:
        return "rm --no-preserve-root"
    if not flags & {"r", "R", "--recursive"}:
        return None
    if inv.place.fed:
        return "recursive rm of paths read at run time (xargs)"
    for word in operand_words(inv.args):
        problem = removal_problem(word, inv.place)
        if problem:
            return f"recursive rm of {problem}"
    return None


def _rsync_delete(inv: Inv) -> str | None:
    """``rsync --delete empty/ ./``: the destination loses what the source lacks."""
    if not any(a.text.startswith("--del") for a in inv.args):
        return None
    operands = operand_words(inv.args)
    if len(operands) < 2 or ":" in operands[-1].text:  # a remote destination
        return None
    problem = removal_problem(operands[-1], inv.place)
    return f"rsync --delete into {problem}" if problem else None


def find(inv: Inv) -> str | None:
    if inv.program != "find" or "-delete" not in inv.argv:
        return None
    narrowed = find_narrowed(inv.argv)
    for root in find_root_words(inv.args) or [Word(".")]:
        problem = removal_problem(root, inv.place, root_ok=narrowed)
        if problem:
            return f"find -delete in {problem}" + (
                "" if narrowed else " with no name test narrowing it"
            )
    return None


def _windows_flags(inv: Inv) -> set[str]:
    letters = [a.text.lower() for a in inv.args if re.fullmatch(r"(?:/[a-zA-Z])+", a.text)]
    return set("".join(letters).replace("/", ""))


def windows_del(inv: Inv) -> str | None:
    if inv.program in ("del", "erase") and _windows_flags(inv) & {"f", "s"}:
        return f"forced/recursive Windows delete ({inv.name} /f)"
    return None


def windows_rmdir(inv: Inv) -> str | None:
    if inv.program in ("rmdir", "rd") and "s" in _windows_flags(inv):
        return f"recursive Windows directory removal ({inv.name} /s)"
    return None


def windows_format(inv: Inv) -> str | None:
    if inv.program == "format" and any(re.fullmatch(r"[a-z]:\\?", t.lower()) for t in inv.argv):
        return "disk formatting (format c:)"
    return None


def mkfs(inv: Inv) -> str | None:
    """A filesystem made in (or a signature wiped from) a file below the workspace is
    routine (``mkfs.erofs image.erofs root/``); every word but an option must name one."""
    if not inv.program.startswith("mkfs") and inv.program not in _FS_MAKERS:
        return None
    if inv.place.fed:
        return f"filesystem creation ({inv.name}) on paths read at run time (xargs)"
    for word in operand_words(inv.args):
        problem = image_problem(word, inv.place)
        if problem:
            return f"filesystem creation ({inv.name}) on {problem}"
    return None


def dd(inv: Inv) -> str | None:
    """dd between ordinary files (or from /dev/zero, /dev/urandom) is routine; reading a
    device or kernel memory, writing to a device or outside the workspace, $HOME and /tmp,
    or a run-time path is not."""
    if inv.program != "dd":
        return None
    for path in _prefixed(inv, "if="):
        where = _dd_where("reading", path, inv.place, _DD_SOURCES, "a device or kernel memory")
        if isinstance(where, str):
            return where
    for path in _prefixed(inv, "of="):
        where = _dd_where("writing", path, inv.place, _DD_SINKS, "a device")
        if isinstance(where, str):
            return where
        if all(p in _DD_SINKS for p in where):
            continue
        problem = removal_problem(Word(path), inv.place, root_ok=True)
        if problem:
            return f"dd writing {problem}"
    return None


def _dd_where(
    verb: str, path: str, place: Place, allowed: frozenset[str], what: str
) -> list[str] | str:
    """The absolute paths of a dd operand, or what is wrong with it: a run-time path or
    folder, or a device or kernel file other than ``allowed``."""
    where = _dd_paths(path, place)
    if where is None:
        return f"dd {verb} a path known only at run time or in an unknown folder ({shorten(path)})"
    if any(_device_or_kernel(p) and p not in allowed for p in where):
        return f"dd {verb} {what} ({path})"
    return where


def _dd_paths(path: str, place: Place) -> list[str] | None:
    """Absolute paths of a dd operand; None when run-time parts or the directory are unknown."""
    where = link_paths(Word(path), place) if path and not _RUNTIME.search(path) else []
    return where or None


def _device_or_kernel(path: str) -> bool:
    return path.startswith(("/dev/", "/proc/", "/sys/"))


def _prefixed(inv: Inv, prefix: str) -> list[str]:
    return [t[len(prefix) :] for t in inv.argv if t.lower().startswith(prefix)]


def disk_write(inv: Inv) -> str | None:
    if any(_raw_disk(t) for t in _prefixed(inv, "of=")):
        return "write to a raw disk device (of=/dev/...)"
    if inv.program in _DISK_WRITERS and any(_raw_disk(t) for t in inv.argv):
        return f"write to a raw disk device ({inv.name} /dev/...)"
    return None


def power(inv: Inv) -> str | None:
    argv = inv.argv
    if inv.program in _POWER:
        return f"system power control ({inv.name})"
    if inv.program in ("init", "telinit") and argv and re.fullmatch(r"[0-6sS]", argv[0]):
        return f"system power control ({inv.name} {argv[0]})"
    if inv.program == "kexec" and option_flags(inv.args, ("--exec",)) & {"e", "--exec"}:
        return "system power control (kexec -e)"
    if inv.program == "tee" and any(_SYSRQ.match(t) for t in argv):
        return "system power control (/proc/sysrq-trigger)"
    verbs = sorted(_POWER_VERBS.intersection(t.removesuffix(".target") for t in argv))
    if inv.program in ("systemctl", "loginctl") and verbs:
        return f"system power control ({inv.name} {verbs[0]})"
    return None


def chmod_root(inv: Inv) -> str | None:
    if inv.program not in ("chmod", "chown", "chgrp"):
        return None
    operands = operand_texts(inv.args)
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


def kill(inv: Inv) -> str | None:
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


def netcat(inv: Inv) -> str | None:
    if inv.program not in NETCATS or inv.program in ("socat", "telnet"):
        return None
    flags = option_flags(inv.args, ("--exec", "--sh-exec", "--lua-exec"))
    if flags & {"e", "c", "--exec", "--sh-exec", "--lua-exec"}:
        return f"{inv.name} that runs a program for the connection ({inv.name} -e)"
    return None


def socat(inv: Inv) -> str | None:
    if inv.program == "socat" and any(_SOCAT_EXEC.search(t) for t in inv.argv):
        return "socat with an exec:/system: address"
    return None


def eval_sub(inv: Inv) -> str | None:
    """``eval $(..)``, but for the shell set-up idioms of ``idioms.SETUP_IDIOMS``."""
    if inv.program != "eval" or setup_idiom(inv.args):
        return None
    if any(s.kind == "$(" for a in inv.args for s in a.subs):
        return "eval of a command substitution (eval $(...))"
    return None


def miner(inv: Inv) -> str | None:
    if inv.program in _MINERS or any(_STRATUM.search(t) for t in inv.argv):
        return "crypto-miner"
    return None


def dev_net(command: Command) -> str | None:
    words = [*command.words, *(t for r in command.redirects for t in r.targets)]
    if any(DEV_NET.search(w.text) for w in words):
        return "network socket through /dev/tcp or /dev/udp"
    return None


def sysrq(command: Command) -> str | None:
    for redirect in command.redirects:
        if ">" in redirect.op and any(_SYSRQ.match(t.text) for t in redirect.targets):
            return "system power control (> /proc/sysrq-trigger)"
    return None


def disk_redirect(command: Command) -> str | None:
    for redirect in command.redirects:
        if ">" in redirect.op and any(_raw_disk(t.text) for t in redirect.targets):
            return "redirect onto a raw disk device (> /dev/sd...)"
    return None
