"""Code handed to an interpreter: a shell's ``-c`` string, script or stdin, ``eval``,
``trap``, ``source``, python/perl/ruby/node/php/lua/awk inline code; the shell commands
inline code embeds; and the programs whose output must not become code (decoders,
downloaders) and the files they write."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from stockade.supervisor.policy.guard.idioms import setup_idiom
from stockade.supervisor.policy.guard.invocations import (
    Inv,
    has_option,
    operand_texts,
    option_flags,
    watch_index,
)
from stockade.supervisor.policy.guard.parsing import Command, Word, basename
from stockade.supervisor.policy.guard.vocabulary import DOWNLOADERS, SHELLS

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
_DASH_C = frozenset({"su", "flock", "script", "runuser"})
_STDIN_PATHS = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})
_SCRIPT_NAME = re.compile(r"(python|pypy|perl|ruby|nodejs|node|php|luajit|lua|[gmn]?awk)[\d.]*")
_LANG_ALIASES = {"pypy": "python", "nodejs": "node", "luajit": "lua", "gawk": "awk"}
_LANG_ALIASES |= {"mawk": "awk", "nawk": "awk"}
_DECODERS = {"base64": "d D --decode", "base32": "d D --decode", "basenc": "d --decode"}
_DECODERS |= {"xxd": "r --reverse", "gzip": "d --decompress --decode", "bzip2": "d --decompress"}
_DECODERS |= {"xz": "d --decompress", "zstd": "d --decompress", "lzma": "d --decompress"}
_DECODERS |= {"gpg": "d --decrypt"}
_ALWAYS_DECODERS = frozenset({"uudecode", "rev", "zcat", "gunzip", "bzcat", "bunzip2", "xzcat"})
_ALWAYS_DECODERS |= {"unxz", "zstdcat", "unzstd", "lzcat", "unlzma", "tr", "uncompress"}
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


@dataclass(frozen=True)
class Code:
    lang: Literal["sh", "script"]
    inline: Word | None = None  # -c/-e code, eval's arguments
    operand: Word | None = None  # script file operand
    stdin: bool = False  # reads its program from stdin
    positional: tuple[str, ...] | None = None  # $0 $1 .. of `sh -c CODE $0 $1 ..`


def code_of(inv: Inv) -> Code | None:
    program, args = inv.program, inv.args
    if program in SHELLS:
        return _shell_code(args)
    if program == "eval":  # a set-up idiom's code is the tool's own: nothing to read
        return Code("sh", _joined(args)) if args and not setup_idiom(args) else None
    if program in ("at", "batch"):
        return None if has_option(inv, "-f") else Code("sh", stdin=True)
    if program == "trap":
        rest = args[1:] if args[:1] and args[0].text == "--" else args
        return Code("sh", rest[0]) if len(rest) > 1 and rest[0].text not in ("-p", "-l") else None
    if program in ("source", ".") and args:
        return Code("sh", None, args[0], args[0].text in _STDIN_PATHS)
    if program == "watch" and not has_option(inv, "-x", "--exec"):
        index = watch_index(args)
        return Code("sh", _joined(args[index:])) if index is not None else None
    if program in _DASH_C:
        code = _dash_c(args)
        return Code("sh", code) if code is not None else None
    return _script_code(program, args)


def _joined(words: Sequence[Word]) -> Word:
    text = " ".join(w.text for w in words)
    return Word(text, any(w.dynamic for w in words), False, tuple(s for w in words for s in w.subs))


def _shell_code(args: tuple[Word, ...]) -> Code:
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
        return Code("sh", operand or Word(""), positional=known)
    stdin = dash_s or operand is None or operand.text in _STDIN_PATHS
    return Code("sh", None, None if stdin else operand, stdin)


def _dash_c(args: tuple[Word, ...]) -> Word | None:
    for i, arg in enumerate(args):
        if arg.text in ("-c", "--command") and i + 1 < len(args):
            return args[i + 1]
        if arg.text.startswith("--command="):
            return Word(arg.text.partition("=")[2], arg.dynamic, False, arg.subs)
    return None


def _script_code(program: str, args: tuple[Word, ...]) -> Code | None:
    match = _SCRIPT_NAME.fullmatch(program)
    if match is None:
        return None
    lang = _LANG_ALIASES.get(match.group(1), match.group(1))
    return _awk_code(args) if lang == "awk" else _interpreter_code(lang, args)


def _interpreter_code(lang: str, args: tuple[Word, ...]) -> Code:
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
            return Code("script")
        inline = _inline_code(args, i, inline_flags, arg_opts)
        if inline is not None:
            return Code("script", inline)
        i += 2 if text in arg_opts else 1
    operand = args[i] if i < len(args) else None
    stdin = operand is None or operand.text in _STDIN_PATHS
    return Code("script", None, None if stdin else operand, stdin)


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


def _awk_code(args: tuple[Word, ...]) -> Code:
    i = 0
    while i < len(args):
        text = args[i].text
        if text.startswith("-f") or text == "--file":
            return Code("script")
        if text in ("-v", "-F", "--assign", "--field-separator"):
            i += 2
        elif text == "--":
            i += 1
            break
        elif text.startswith("-") and len(text) > 1:
            i += 1
        else:
            break
    return Code("script", args[i] if i < len(args) else None)


def stdin_body(command: Command) -> Word | None:
    return next((r.stdin for r in reversed(command.redirects) if r.stdin is not None), None)


def is_decoder(inv: Inv) -> bool:
    """Does this turn its input into something else (decode, decompress, decrypt, reverse)?"""
    if inv.program in _ALWAYS_DECODERS:
        return inv.program != "tr" or len(operand_texts(inv.args)) == 2
    options = _DECODERS.get(inv.program)
    if options is not None:
        longs = [o for o in options.split() if o.startswith("--")]
        return bool(option_flags(inv.args, longs) & set(options.split()))
    if inv.program == "openssl":
        return bool({"base64", "enc"} & set(inv.argv)) and "d" in option_flags(inv.args)
    return False


def embedded_commands(text: str) -> Iterator[str]:
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
        if data and command.split()[:1] and basename(command.split()[0]) in SHELLS:
            yield _unescape(data)


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def producer_of(invs: list[Inv]) -> tuple[str, str] | None:
    for inv in invs:
        if inv.program in DOWNLOADERS:
            return ("remote-code-exec", f"file downloaded by {inv.name}")
        if is_decoder(inv):
            return ("decode-to-shell", f"file decoded by {inv.name}")
    return None


def download_targets(inv: Inv) -> list[str]:
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
