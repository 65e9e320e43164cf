"""Shell text to normalized simple commands, for the command guard.

tree-sitter-bash gives the syntax tree; this module turns every simple command
in it into the words bash would pass to ``execve``, as far as that is knowable
without running anything:

- quotes are removed (``'..'``, ``".."``, ANSI-C ``$'..'``, ``$".."``),
  backslash escapes resolved and adjacent pieces joined (``r""m`` -> ``rm``);
- brace expansion is applied (``{rm,-rf,/}`` -> ``rm -rf /``) and ``$IFS``
  separates fields (``rm${IFS}-rf`` -> ``rm -rf``);
- variables assigned a literal earlier in the same script, and ``$(echo ..)``,
  ``$(printf ..)`` or ``$(cat <<EOF ..)`` substitutions, are replaced by their
  value;
- anything else only known at run time keeps its source text and marks the
  word ``dynamic``;
- each command carries the directories it may run in (``cwds``), relative to the
  script's start: ``cd build && rm -rf *`` runs ``rm`` in ``build`` only, ``cd build;
  rm -rf *`` in ``build`` or (should ``cd`` fail) the start. Subshells, pipeline stages
  and substitutions do not pass a ``cd`` on; a ``cd`` to a run-time value, in a loop or
  function, or ``eval``/``source``/``popd`` make the directory unknown (None).

Commands inside substitutions, subshells, compound statements, functions and
heredoc pipelines are all collected. When tree-sitter reports a syntax error,
a plain ``shlex`` tokenization is added so the guard can still find a deny.
Nothing here decides policy.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import shlex
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import tree_sitter
import tree_sitter_bash
from tree_sitter import Node

MAX_BYTES = 256 * 1024
"""Longer commands are not parsed at all (the guard treats them as unparsed)."""
MAX_NESTING = 64
"""Statements and substitutions nested deeper than this are "too complex"."""
MAX_NODES = 20_000
MAX_BRACE_WORDS = 256
MAX_PIPES = 1000
"""More ``|`` than this (quoted or not) are not parsed: tree-sitter's error recovery after a
long pipeline takes memory no progress callback can stop (``a|`` * 10,000 took 1 GB)."""
PARSE_SECONDS = 2.0
"""CPU seconds all the parses of one guard check may take together."""
_FALLBACK_BYTES = 64 * 1024

_LANGUAGE = tree_sitter.Language(tree_sitter_bash.language())
_LOCAL = threading.local()

# Segment kinds while a word is built: literal text subject to brace expansion
# and globbing, quoted literal, expansion result (globbed, not brace-expanded),
# run-time value (source text kept), field separator.
_LIT, _QUOTED, _EXPANDED, _DYN, _SPLIT = range(5)
_Seg = tuple[str, int]

_STATEMENTS = frozenset({"program", "command", "pipeline", "list", "subshell"})
_STATEMENTS |= {"compound_statement", "redirected_statement", "variable_assignment"}
_STATEMENTS |= {"variable_assignments", "declaration_command", "unset_command"}
_STATEMENTS |= {"function_definition", "if_statement", "elif_clause", "else_clause"}
_STATEMENTS |= {"while_statement", "for_statement", "c_style_for_statement", "case_statement"}
_STATEMENTS |= {"case_item", "do_group", "negated_command", "test_command", "ERROR"}
_REDIRECTS = frozenset({"file_redirect", "heredoc_redirect", "herestring_redirect"})
_UNCONDITIONAL = frozenset({"program", "compound_statement", "redirected_statement"})
_VAR_WRITERS = frozenset({"read", "mapfile", "readarray", "getopts", "printf", "unset"})
_GLOB = re.compile(r"[*?\[]")
_JOINED = re.compile(rb"(?:\\\n)*")
_SPECIAL = frozenset("0123456789@*#")
_HIDDEN_SUB = re.compile(r"`|\$\(|[<>]\(")
_BACKSLASH = re.compile(r"\\(.)", re.DOTALL)
_DQUOTE_ESCAPE = re.compile(r'\\([$`"\\\n])')
_C_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}|[0-7]{1,3}|c.|.)")
_C_SIMPLE = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r"}
_C_SIMPLE |= {"t": "\t", "v": "\v"}
_PRINTF_CONV = re.compile(r"%[%sb]")
_SEQUENCE = re.compile(r"(-?\d+|[a-zA-Z])\.\.(-?\d+|[a-zA-Z])(?:\.\.(-?\d+))?")
_NAME = re.compile(r"[A-Za-z_]\w*")
_IFS = re.compile(r"\$\{IFS[^}]*\}|\$IFS\b")
_PROTECT = str.maketrans("{},.", "\ue000\ue001\ue002\ue003")
_UNPROTECT = str.maketrans("\ue000\ue001\ue002\ue003", "{},.")
# tree-sitter-bash 0.25 can segfault on 4-byte UTF-8 after a "{" (tree-sitter-bash#337). The
# parser gets a copy with every non-ASCII byte replaced by "x": same length, so node offsets
# still slice the real text out of the original bytes, and bash never treats a non-ASCII
# byte as an operator or quote, so the tree keeps its shape.
_ASCII_ONLY = bytes.maketrans(bytes(range(0x80, 0x100)), b"x" * 0x80)
_KEYWORDS = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for"})
_KEYWORDS |= {"case", "esac", "in", "{", "}", "!", "time"}


Cwds = tuple[str, ...] | None
"""Directories a command may run in: "" is where the script starts, other relative paths
are below it, "/.." absolute, "~.." the home directory's; None: not known."""
_NO_CD = ("\0",)  # `cd_done` when the last command was no cd
_CD = frozenset({"cd", "pushd", "chdir"})
_CD_PREFIXES = frozenset({"builtin", "command", "time", "-p", "--"})
_CWD_UNKNOWN = frozenset({"popd", "eval", "source", "."})
_LOOPS = frozenset({"for_statement", "c_style_for_statement", "while_statement"})
_CHANGES_DIR = re.compile(rb"\b(?:cd|pushd|popd|chdir)\b")


@dataclass(frozen=True)
class Sub:
    """A command substitution ``$(..)`` or process substitution ``<(..)``."""

    kind: str
    commands: tuple[Command, ...]
    output: str | None = None  # what it prints, when that is known statically


@dataclass(frozen=True)
class Word:
    text: str  # normalized; run-time parts keep their source text
    dynamic: bool = False  # part of the value is only known at run time
    glob: bool = False  # has unquoted glob characters
    subs: tuple[Sub, ...] = ()
    bare: str | None = None  # a dynamic word's text should its run-time parts be empty


@dataclass(frozen=True)
class Redirect:
    op: str  # ">", ">>", "<", "&>", ">&", "<<", "<<<", ...
    targets: tuple[Word, ...] = ()
    stdin: Word | None = None  # heredoc body or herestring fed to the command


@dataclass(frozen=True)
class Command:
    words: tuple[Word, ...]
    redirects: tuple[Redirect, ...] = ()
    background: bool = False  # run with a trailing "&"
    cwds: Cwds = ("",)  # where it may run, relative to the script's start; None: unknown


@dataclass(frozen=True)
class Script:
    commands: tuple[Command, ...] = ()
    pipelines: tuple[tuple[tuple[Command, ...], ...], ...] = ()  # stages of 2+ stage pipelines
    fork_bombs: tuple[str, ...] = ()  # functions that call themselves concurrently
    error: str | None = None  # why the text did not parse cleanly
    too_complex: bool = False  # a size or nesting limit was hit


class _TooComplex(Exception):
    pass


def basename(text: str) -> str:
    return text.rsplit("/", 1)[-1]


class Budget:
    """CPU time one guard check may spend parsing. tree-sitter's error recovery is superlinear
    on some inputs (200 KB of ``a|a|...|`` takes minutes and gigabytes), so every parse of one
    check shares this and stops when it runs out."""

    def __init__(self, seconds: float = PARSE_SECONDS) -> None:
        self.deadline = time.thread_time() + seconds

    def spent(self, *_: object) -> bool:
        return time.thread_time() > self.deadline


def parse_script(
    text: str,
    *,
    positional: Sequence[str] | None = (),
    budget: Budget | None = None,
    cdpath: bool = False,
) -> Script:
    """Parse shell text; never raises for any input string.

    ``positional`` holds ``$0 $1 ...`` (``$0`` first; default: a ``sh -c`` without operands,
    so ``$1``.. and ``$@`` are empty); None when they are unknown. ``cdpath``: CDPATH may
    be set, so ``cd NAME`` may go anywhere (also when the text mentions CDPATH).
    """
    error = "command contains a NUL byte" if "\x00" in text else None
    text = text.replace("\x00", " ")
    data = text.encode("utf-8", "replace")
    if len(data) > MAX_BYTES:
        return Script(error=f"command is {len(data)} bytes (limit {MAX_BYTES})", too_complex=True)
    pipes = data.count(b"|") - 2 * data.count(b"||")
    if pipes > MAX_PIPES:
        return Script(error=f"command has {pipes} '|' (limit {MAX_PIPES})", too_complex=True)
    budget = budget or Budget()
    tree = _parse(data.translate(_ASCII_ONLY), budget)
    if tree is None:
        return Script(error="command took too long to parse", too_complex=True)
    root = tree.root_node
    walker = _Walker(data, positional, budget)
    walker.cdpath = cdpath or b"CDPATH" in data
    try:
        walker.statement(root)
    except (_TooComplex, RecursionError) as exc:
        return Script(tuple(_fallback(text)), error=str(exc) or "too deep", too_complex=True)
    if error is None and root.has_error:
        error = _syntax_error(root, data)
    error = error or walker.error
    fallback = _fallback(text) if error else []
    return Script(
        tuple(walker.commands + fallback),
        tuple(walker.pipelines),
        tuple(walker.fork_bombs),
        error,
    )


def _parse(data: bytes, budget: Budget) -> tree_sitter.Tree | None:
    """tree-sitter parse that gives up (None) when the budget runs out."""
    if budget.spent():
        return None

    def read(offset: int, _point: object) -> bytes:
        return data[offset : offset + 65536]

    parser = _parser()
    try:
        return parser.parse(read, progress_callback=budget.spent)
    except ValueError:  # "Parsing failed": the budget ran out
        parser.reset()  # a cancelled parse would otherwise resume on the next call
        return None


def static_output(command: Command) -> str | None:
    """What ``echo``/``printf`` of literals, or ``cat <<EOF``, writes to stdout."""
    words = command.words
    if not words or any(w.dynamic for w in words) or any(">" in r.op for r in command.redirects):
        return None
    program, args = basename(words[0].text), [w.text for w in words[1:]]
    if program == "echo":
        return _echo(args)
    if program == "printf":
        return _printf(args)
    stdin = next((r.stdin for r in reversed(command.redirects) if r.stdin), None)
    if program == "cat" and not args and stdin is not None and not stdin.dynamic:
        return stdin.text
    return None


def c_escapes(text: str) -> str:
    """Resolve backslash escapes as ``$'..'``, ``echo -e`` and ``printf`` do."""
    return _C_ESCAPE.sub(_c_escape, text) if "\\" in text else text


def _c_escape(match: re.Match[str]) -> str:
    code = match.group(1)
    head = code[0]
    if head in "xuU" and len(code) > 1:
        return chr(min(int(code[1:], 16), 0x10FFFF))
    if head.isdigit():
        return chr(int(code, 8))
    if head == "c" and len(code) == 2:
        return chr(ord(code[1]) & 0x1F)
    return _C_SIMPLE.get(code, code)


def _parser() -> tree_sitter.Parser:
    parser: tree_sitter.Parser | None = getattr(_LOCAL, "parser", None)
    if parser is None:
        parser = _LOCAL.parser = tree_sitter.Parser(_LANGUAGE)
    return parser


class _Walker:
    """One pass over a syntax tree; collects commands in source order."""

    def __init__(self, src: bytes, positional: Sequence[str] | None, budget: Budget) -> None:
        self.src = src
        self.positional = None if positional is None else tuple(positional)
        self.budget = budget
        self.error: str | None = None  # a syntax error in text tree-sitter left unparsed
        self.commands: list[Command] = []
        self.pipelines: list[tuple[tuple[Command, ...], ...]] = []
        self.fork_bombs: list[str] = []
        self.vars: dict[str, str] = {}
        self.aliases: dict[str, str] = {}
        self.cond = 0  # > 0 inside branches, loops, lists, pipelines, functions
        self.ifs: str | None = " \t\n"  # None once IFS is set to something unknown
        self.background = 0
        self.depth = 0
        self.nodes = 0
        self.cwds: Cwds = ("",)
        self.cd_done: Cwds = _NO_CD  # the last command was a cd: where it went
        self.cdpath = False

    def text(self, node: Node) -> str:
        return self.src[node.start_byte : node.end_byte].decode("utf-8", "replace")

    def tick(self) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _TooComplex(f"command has more than {MAX_NODES} syntax nodes")

    # statements ---------------------------------------------------------

    def statement(self, node: Node) -> None:
        self.depth += 1
        self.tick()
        if self.depth > MAX_NESTING:
            raise _TooComplex(f"command nests deeper than {MAX_NESTING} levels")
        try:
            self._dispatch(node)
        finally:
            self.depth -= 1

    def _dispatch(self, node: Node) -> None:
        kind = node.type
        if kind == "command":
            self.command(node, [])
        elif kind == "pipeline":
            self.pipeline(node, ())
        elif kind == "list":
            self.and_or(node)
        elif kind == "redirected_statement":
            self.redirected(node)
        elif kind == "variable_assignment":
            self.assignment(node)
        elif kind in ("declaration_command", "unset_command"):
            self.declaration(node)
        elif kind == "function_definition":
            self.function(node)
        elif kind in _LOOPS and _CHANGES_DIR.search(self.src, node.start_byte, node.end_byte):
            self.cwds = None  # a cd runs again on each pass: where is unknown
            self.loop(node) if kind == "while_statement" else self.block(node, conditional=True)
        elif kind == "while_statement":
            self.loop(node)
        elif kind == "subshell":
            with self.own_cwd():
                self.block(node, conditional=False)
        else:
            self.block(node, conditional=kind not in _UNCONDITIONAL)

    def block(self, node: Node, *, conditional: bool) -> None:
        self.cond += conditional
        children = node.children
        for i, child in enumerate(children):
            if child.type in _STATEMENTS:
                background = i + 1 < len(children) and children[i + 1].type == "&"
                self.background += background
                self.cond += background
                saved = self.cwds
                self.statement(child)
                if background:  # `cd x &` runs in a subshell: its cd does not last
                    self.cwds, self.cd_done = saved, _NO_CD
                self.background -= background
                self.cond -= background
            elif child.type == "variable_name":  # for NAME in ...
                self.vars.pop(self.text(child), None)
            elif child.is_named:
                self.scan(child)
        self.cond -= conditional

    def loop(self, node: Node) -> None:
        """``while true; do sh & done``: an endless loop that starts background processes."""
        first = len(self.commands)
        self.block(node, conditional=True)
        endless = ["false"] if node.children[0].type == "until" else ["true"], [":"]
        condition = self.commands[first].words if first < len(self.commands) else ()
        body = self.commands[first + 1 :]
        if [w.text for w in condition] in endless and any(c.background for c in body):
            self.fork_bombs.append("while")

    def and_or(self, node: Node) -> None:
        items: list[tuple[str, Node]] = []  # (operator before it, item), last first
        while node.type == "list":  # left-recursive: flatten without recursion
            named = [c for c in node.children if c.is_named]
            if not named:
                break
            op = next((c.type for c in node.children if not c.is_named), "")
            items.extend((op, item) for item in reversed(named[1:]))
            node = named[0]
        items.append(("", node))
        self.cond += 1
        seen, went = [self.cwds], _NO_CD
        for op, item in reversed(items):
            if op == "&&" and went != _NO_CD:  # `cd x && ..`: runs only where cd went
                self.cwds = went
            self.cd_done = _NO_CD
            self.statement(item) if item.type in _STATEMENTS else self.scan(item)
            went = self.cd_done if item.type == "command" else _NO_CD
            seen.append(self.cwds)
        self.cwds = _union(*seen)
        self.cond -= 1

    @contextlib.contextmanager
    def own_cwd(self, scoped: bool = True) -> Iterator[None]:
        """A subshell, pipeline stage or substitution: its cd does not last."""
        saved = self.cwds
        try:
            yield
        finally:
            if scoped:
                self.cwds, self.cd_done = saved, _NO_CD

    def change_dir(self, words: list[Word]) -> None:
        """After ``cd DIR``: where the next command may run (cd may fail, so also here)."""
        while words and words[0].text in _CD_PREFIXES and not words[0].dynamic:
            words = words[1:]  # `builtin cd /`, `command cd /`, `time -p cd /`
        program = words[0].text if words else ""
        self.cd_done = _NO_CD
        if program == "trap" and any(_CHANGES_DIR.search(w.text.encode()) for w in words):
            self.cwds = None  # `trap 'cd /' DEBUG`: runs in this shell, before each command
        if not words or words[0].dynamic or program not in _CD | _CWD_UNKNOWN:
            return
        went = _cd(words[1:], self.cwds, cdpath=self.cdpath) if program in _CD else None
        self.cd_done = went
        self.cwds = _union(self.cwds, went)

    def pipeline(self, node: Node, head: tuple[Command, ...]) -> None:
        stages = [head] if head else []
        self.cond += 1
        for child in node.children:
            if child.type in _STATEMENTS:
                start = len(self.commands)
                with self.own_cwd():
                    self.statement(child)
                stages.append(tuple(self.commands[start:]))
            elif child.is_named:
                self.scan(child)
        self.cond -= 1
        if len(stages) > 1:
            self.pipelines.append(tuple(stages))

    def redirected(self, node: Node) -> None:
        redirects: list[Redirect] = []
        trailing: list[Node] = []  # statements tree-sitter nests in a heredoc (`<<EOF | sh`)
        bodies: list[Node] = []
        for child in node.children:
            if child.type in _REDIRECTS:
                redirects.extend(self.redirect(child, trailing))
            elif child.type in _STATEMENTS:
                bodies.append(child)
            elif child.is_named:
                self.scan(child)
        start = len(self.commands)
        if len(bodies) == 1 and bodies[0].type == "command":
            self.command(bodies[0], redirects)
        else:
            for body in bodies:
                self.statement(body)
            self.commands.append(Command((), tuple(redirects), self.background > 0, self.cwds))
        head = tuple(self.commands[start:])
        self.cond += 1
        for extra in trailing:
            self.pipeline(extra, head) if extra.type == "pipeline" else self.statement(extra)
        self.cond -= 1

    def command(self, node: Node, redirects: list[Redirect]) -> None:
        own: list[Redirect] = []
        pieces: list[Node] = []
        for child in node.children:
            kind = child.type
            if kind == "variable_assignment":  # prefix assignment: only its substitutions run
                self.scan(child)
            elif kind in _REDIRECTS:
                own.extend(self.redirect(child, []))
            elif kind == "command_name":
                pieces.extend(_flat(child.children))
            else:
                pieces.extend(_flat([child]))
        words = self.after_words(self.words(pieces))
        background = self.background > 0
        self.commands.append(Command(tuple(words), tuple(own + redirects), background, self.cwds))
        self.change_dir(words)

    def words(self, pieces: list[Node]) -> list[Word]:
        """Pieces with nothing but line continuations between them are one shell word
        (tree-sitter splits ``r\\<newline>m`` and ``rm$IFS$9-rf`` apart)."""
        words: list[Word] = []
        segs: list[_Seg] = []
        subs: list[Sub] = []
        dollar, end = False, -1
        for piece in pieces:
            if end >= 0 and not _JOINED.fullmatch(self.src[end : piece.start_byte]):
                words.extend(_fields(segs, tuple(subs)))
                segs, subs, dollar = [], [], False
            end = piece.end_byte
            text = self.text(piece)
            if dollar and piece.type == "word" and text[:1] in _SPECIAL:  # `$` `9-rf`
                self.parameter(text[0], segs, quoted=False, source="$" + text[0])
                segs.extend(_unescape_word(text[1:]))
            elif dollar and piece.type == "word" and (name := _NAME.match(text)):  # `$` `IFS/`
                self.named(name.group(), segs)
                segs.extend(_unescape_word(text[name.end() :]))
            elif piece.type != "$":
                if dollar and piece.type not in ("string", "translated_string"):
                    segs.append(("$", _LIT))
                self.segments(piece, segs, subs, quoted=False)
            dollar = piece.type == "$"
        if dollar:
            segs.append(("$", _LIT))
        words.extend(_fields(segs, tuple(subs)))
        return words

    def after_words(self, words: list[Word]) -> list[Word]:
        """Apply aliases and forget variables this command may set."""
        if not words or words[0].dynamic:
            return words
        program = words[0].text
        if program in self.aliases:
            words = [Word(w) for w in self.aliases[program].split()] + words[1:]
        elif program == "alias":
            for word in words[1:]:
                name, eq, value = word.text.partition("=")
                if eq:
                    self.aliases[name] = value
        elif program in _VAR_WRITERS:
            for word in words[1:]:
                self.vars.pop(word.text.split("=", 1)[0], None)
        elif program in ("set", "shift"):
            self.set_positional(words[1:] if program == "set" else None)
        return words

    def set_positional(self, args: list[Word] | None) -> None:
        """``set -- a b`` sets ``$1 $2``; ``shift`` or anything unclear makes them unknown."""
        if args is not None and args and args[0].text == "--":
            args = args[1:]
        elif args is not None and (not args or args[0].text.startswith(("-", "+"))):
            return  # options only
        known = self.positional
        if args is None or self.cond or known is None or any(w.dynamic for w in args):
            self.positional = None
        else:
            self.positional = (known[:1] or ("",)) + tuple(w.text for w in args)

    def assignment(self, node: Node) -> Word:
        name_node, value = node.child_by_field_name("name"), node.child_by_field_name("value")
        name = self.text(name_node) if name_node else ""
        op = "+=" if any(c.type == "+=" for c in node.children) else "="
        word = self.value_word(value) if value is not None else Word("")
        literal = op == "=" and not word.dynamic and (value is None or value.type != "array")
        if literal and not self.cond:
            self.vars[name] = word.text
        else:
            self.vars.pop(name, None)
        if name == "IFS":
            self.ifs = word.text if literal and not self.cond else None
        return Word(f"{name}{op}{word.text}", word.dynamic, False, word.subs)

    def declaration(self, node: Node) -> None:
        words: list[Word] = []
        for child in node.children:
            if child.type == "variable_assignment":
                words.append(self.assignment(child))
            elif child.type == "variable_name":
                self.vars.pop(self.text(child), None)
                words.append(Word(self.text(child)))
            elif child.is_named:
                words.extend(self.expand(child))
            else:
                words.append(Word(self.text(child)))
        self.commands.append(Command(tuple(words), (), self.background > 0, self.cwds))

    def function(self, node: Node) -> None:
        name_node = node.child_by_field_name("name")
        name = self.text(name_node) if name_node else ""
        first_command, first_pipeline = len(self.commands), len(self.pipelines)
        self.cond += 1
        outer, self.positional = self.positional, None  # $1.. are the function's arguments
        with self.own_cwd():
            for child in node.children:
                if child.type in _STATEMENTS:
                    self.statement(child)
        if _CHANGES_DIR.search(self.src, node.start_byte, node.end_byte):
            self.cwds = None  # each call may change directory
        self.positional = outer
        self.cond -= 1
        piped = {id(c) for p in self.pipelines[first_pipeline:] for s in p for c in s}
        for command in self.commands[first_command:]:
            calls_self = command.words and basename(command.words[0].text) == name
            if calls_self and (command.background or id(command) in piped):
                self.fork_bombs.append(name)
                break

    # redirects ------------------------------------------------------------

    def redirect(self, node: Node, trailing: list[Node]) -> list[Redirect]:
        if node.type == "heredoc_redirect":
            return self.heredoc(node, trailing)
        op, targets = "", list[Word]()
        for child in node.children:
            if child.type == "file_descriptor":
                continue
            if not child.is_named and not op:
                op = child.type
            elif child.is_named:
                targets.extend(self.expand(child))
        if node.type == "herestring_redirect":
            text = " ".join(w.text for w in targets)
            stdin = Word(text, any(w.dynamic for w in targets), False, _subs(targets))
            return [Redirect("<<<", (), stdin)]
        return [Redirect(op, tuple(targets))]

    def heredoc(self, node: Node, trailing: list[Node]) -> list[Redirect]:
        found: list[Redirect] = []
        quoted, body = False, Word("")
        for child in node.children:
            kind = child.type
            if kind == "heredoc_start":
                quoted = any(q in self.text(child) for q in "'\"\\")
            elif kind == "heredoc_body":
                body = Word(self.text(child)) if quoted else self.joined(child, quoted=True)
            elif kind in _REDIRECTS:
                found.extend(self.redirect(child, trailing))
            elif kind in _STATEMENTS:
                trailing.append(child)
        return [Redirect("<<", (), body), *found]

    # words ----------------------------------------------------------------

    def expand(self, node: Node) -> list[Word]:
        segs: list[_Seg] = []
        subs: list[Sub] = []
        self.segments(node, segs, subs, quoted=False)
        return _fields(segs, tuple(subs))

    def value_word(self, node: Node) -> Word:
        """An assignment value: no field splitting, no brace expansion."""
        segs: list[_Seg] = []
        subs: list[Sub] = []
        self.segments(node, segs, subs, quoted=False)
        text = "".join(" " if k == _SPLIT else s for s, k in segs)
        return Word(text, any(k == _DYN for _, k in segs), False, tuple(subs))

    def joined(self, node: Node, *, quoted: bool) -> Word:
        segs: list[_Seg] = []
        subs: list[Sub] = []
        self.string(node, segs, subs, inner=(node.start_byte, node.end_byte))
        text = "".join(s for s, _ in segs)
        return Word(text, any(k == _DYN for _, k in segs), False, tuple(subs))

    def segments(self, node: Node, out: list[_Seg], subs: list[Sub], *, quoted: bool) -> None:
        self.tick()
        kind = node.type
        text = self.text(node)
        if kind == "word":
            out.extend([(text, _QUOTED)] if quoted else _unescape_word(text))
        elif kind == "raw_string":
            out.append((text[1:-1], _QUOTED))
        elif kind == "ansi_c_string":
            out.append((c_escapes(text[2:-1]), _QUOTED))
        elif kind == "string":
            self.string(node, out, subs, inner=(node.start_byte + 1, node.end_byte - 1))
        elif kind in ("concatenation", "translated_string"):
            for child in node.children:
                if child.type != "$":
                    self.segments(child, out, subs, quoted=quoted)
        elif kind in ("simple_expansion", "expansion"):
            self.expansion(node, out, subs, quoted=quoted)
        elif kind in ("command_substitution", "process_substitution"):
            sub = self.sub(node)
            subs.append(sub)
            if sub.output is not None:
                self.value(sub.output.rstrip("\n"), out, quoted=quoted)
            else:
                out.append((text, _DYN))
        elif kind in ("brace_expression", "number") or node.child_count == 0:
            out.append((text, _QUOTED if quoted else _LIT))
        else:
            subs.extend(self.scan(node))
            out.append((text, _DYN))

    def string(
        self, node: Node, out: list[_Seg], subs: list[Sub], *, inner: tuple[int, int]
    ) -> None:
        pos, end = inner
        for child in node.children:
            if child.start_byte < pos or child.end_byte > end or child.type == '"':
                continue
            if child.start_byte > pos:
                out.append((_dquote(self.src[pos : child.start_byte]), _QUOTED))
            if child.type in ("string_content", "heredoc_content"):
                out.append((_dquote(self.src[child.start_byte : child.end_byte]), _QUOTED))
            else:
                self.segments(child, out, subs, quoted=True)
            pos = child.end_byte
        if end > pos:
            out.append((_dquote(self.src[pos:end]), _QUOTED))

    def expansion(self, node: Node, out: list[_Seg], subs: list[Sub], *, quoted: bool) -> None:
        raw = self.text(node)
        source = raw.lstrip()
        if len(source) < len(raw):  # tree-sitter puts a preceding blank inside the node
            out.append((raw[: len(raw) - len(source)], _QUOTED if quoted else _SPLIT))
        name, simple = None, True
        for child in node.children:
            if child.type in ("variable_name", "special_variable_name") and name is None:
                name = self.text(child)
            elif child.type not in ("$", "${", "}"):
                simple = False
        if name == "IFS":
            out.append((" ", _QUOTED) if quoted else ("", _SPLIT))
            return
        if not simple:
            subs.extend(self.scan(node))
            for child in node.children:  # `${x:=`id`}`, `${x#$(id)}`: left as plain text
                if child.child_count == 0 and _HIDDEN_SUB.search(self.text(child)):
                    subs.append(self.reparse(self.text(child)))
        if simple and name in self.vars:
            self.value(self.vars[name], out, quoted=quoted)
        elif simple and name is not None and name in _SPECIAL:
            self.parameter(name, out, quoted=quoted, source=source)
        else:
            out.append((source, _DYN))

    def named(self, name: str, out: list[_Seg]) -> None:
        """``$NAME`` unquoted, where tree-sitter split the ``$`` from the name."""
        if name == "IFS":
            out.append(("", _SPLIT))
        elif name in self.vars:
            self.value(self.vars[name], out, quoted=False)
        else:
            out.append(("$" + name, _DYN))

    def parameter(self, name: str, out: list[_Seg], *, quoted: bool, source: str) -> None:
        """``$0``..``$9``, ``$@``, ``$*``, ``$#`` from the known positional parameters."""
        known = self.positional
        if known is None or (name == "0" and not known):
            out.append((source, _DYN))
        elif name.isdigit():
            index = int(name)
            self.value(known[index] if index < len(known) else "", out, quoted=quoted)
        elif name == "#":
            out.append((str(max(len(known) - 1, 0)), _QUOTED))
        elif name == "@" and quoted:  # "$@": one word per parameter
            for i, value in enumerate(known[1:]):
                out.extend([("", _SPLIT)] if i else [])
                out.append((value, _QUOTED))
        else:
            self.value(" ".join(known[1:]), out, quoted=quoted)

    def reparse(self, text: str) -> Sub:
        """Commands in a piece of text tree-sitter did not parse as code."""
        self.depth += 1
        try:
            if self.depth > MAX_NESTING:
                raise _TooComplex(f"command nests deeper than {MAX_NESTING} levels")
            data = (": " + text).encode("utf-8", "replace")
            tree = _parse(data.translate(_ASCII_ONLY), self.budget)
            if tree is None:
                raise _TooComplex("command took too long to parse")
            inner = _Walker(data, self.positional, self.budget)
            inner.vars, inner.aliases, inner.ifs = self.vars, self.aliases, self.ifs
            inner.depth, inner.nodes, inner.cond = self.depth, self.nodes, self.cond + 1
            inner.background, inner.cwds, inner.cdpath = self.background, self.cwds, self.cdpath
            inner.statement(tree.root_node)
        finally:
            self.depth -= 1
        self.nodes = inner.nodes
        if tree.root_node.has_error:
            self.error = self.error or _syntax_error(tree.root_node, data)
        self.error = self.error or inner.error
        self.commands.extend(inner.commands)
        self.pipelines.extend(inner.pipelines)
        self.fork_bombs.extend(inner.fork_bombs)
        return Sub("$(", tuple(inner.commands))

    def value(self, value: str, out: list[_Seg], *, quoted: bool) -> None:
        """A known expansion result: one piece when quoted, split on $IFS when not."""
        if quoted or not value:
            out.append((value, _QUOTED))
        elif self.ifs is None:
            out.append((value, _DYN))
        else:
            parts = re.split(f"[{re.escape(self.ifs)}]+", value) if self.ifs else [value]
            for i, part in enumerate(parts):
                out.extend([("", _SPLIT)] if i else [])
                out.extend([(part, _EXPANDED)] if part else [])

    def sub(self, node: Node) -> Sub:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _TooComplex(f"command nests deeper than {MAX_NESTING} levels")
        start = len(self.commands)
        kind = "$(" if node.type == "command_substitution" else node.children[0].type
        named = [c for c in node.children if c.is_named]
        self.cond += 1
        try:
            with self.own_cwd():
                for child in named:
                    self.statement(child) if child.type in _STATEMENTS else self.scan(child)
        finally:
            self.cond -= 1
            self.depth -= 1
        commands = tuple(self.commands[start:])
        simple = len(named) == 1 and named[0].type in ("command", "redirected_statement")
        output = static_output(commands[0]) if simple and len(commands) == 1 else None
        return Sub(kind, commands, output if kind == "$(" else None)

    def scan(self, node: Node) -> list[Sub]:
        """Walk a non-statement subtree for the substitutions (and statements) in it."""
        found: list[Sub] = []
        stack = [node]
        while stack:
            current = stack.pop()
            self.tick()
            if current.type in ("command_substitution", "process_substitution"):
                found.append(self.sub(current))
            elif current.type in _STATEMENTS:
                self.statement(current)
            else:
                stack.extend(reversed(current.children))
        return found


def _union(*choices: Cwds) -> Cwds:
    first = choices[0]
    if all(c == first for c in choices):  # the usual case: no cd
        return first
    if any(c is None for c in choices):
        return None
    return tuple(dict.fromkeys(d for c in choices if c is not None for d in c))


def _cd(args: list[Word], cwds: Cwds, *, cdpath: bool) -> Cwds:
    """Where ``cd ARGS`` goes from ``cwds``; None when that is not known."""
    operands = [a for a in args if not (a.text.startswith("-") and len(a.text) > 1)]
    if args[:1] and args[0].text == "--":
        operands = list(args[1:])
    if len(operands) > 1 or any(a.dynamic for a in operands):
        return None
    target = operands[0].text if operands else "~"
    if target == "-" or (target.startswith("~") and not re.fullmatch(r"~(?:/.*)?", target)):
        return None  # `cd -`, `~user`
    if target.startswith(("/", "~")):
        return (target,)
    searched = cdpath and not target.startswith(("./", "../")) and target not in (".", "..")
    if cwds is None or searched:  # CDPATH: `cd NAME` may go to any folder holding NAME
        return None
    return tuple(c + "/" + target if c else target for c in cwds)


def _flat(nodes: list[Node]) -> list[Node]:
    return [part for n in nodes for part in (n.children if n.type == "concatenation" else [n])]


def _subs(words: list[Word]) -> tuple[Sub, ...]:
    return tuple(s for w in words for s in w.subs)


def _unescape_word(text: str) -> list[_Seg]:
    if "\\" not in text:
        return [(text, _LIT)]
    out: list[_Seg] = []
    pos = 0
    for match in _BACKSLASH.finditer(text):
        if match.start() > pos:
            out.append((text[pos : match.start()], _LIT))
        if match.group(1) != "\n":
            out.append((match.group(1), _QUOTED))
        pos = match.end()
    if pos < len(text):
        out.append((text[pos:], _LIT))
    return out


def _dquote(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    return _DQUOTE_ESCAPE.sub(lambda m: "" if m.group(1) == "\n" else m.group(1), text)


def _fields(segs: list[_Seg], subs: tuple[Sub, ...]) -> list[Word]:
    groups: list[list[_Seg]] = [[]]
    for seg in segs:
        if seg[1] != _SPLIT:
            groups[-1].append(seg)
        elif groups[-1]:
            groups.append([])
    words: list[Word] = []
    for group in groups:
        if group:
            words.extend(_field_words(group, subs))
    return words


def _field_words(group: list[_Seg], subs: tuple[Sub, ...]) -> list[Word]:
    dynamic = any(k == _DYN for _, k in group)
    glob = any(k in (_LIT, _EXPANDED) and _GLOB.search(s) for s, k in group)
    if not any(k == _LIT and "{" in s for s, k in group):
        bare = "".join(s for s, k in group if k != _DYN) if dynamic else None
        return [Word("".join(s for s, _ in group), dynamic, glob, subs, bare)]
    masked = "".join(s if k == _LIT else s.translate(_PROTECT) for s, k in group)
    texts = brace_expand(masked)
    if texts is None:  # too many words: keep it, but do not trust it
        texts, dynamic = [masked], True
    return [Word(t.translate(_UNPROTECT), dynamic, glob, subs) for t in texts]


def brace_expand(word: str) -> list[str] | None:
    """Bash brace expansion; None when it would make more than MAX_BRACE_WORDS words."""
    done: list[str] = []
    pending = [word]
    while pending:
        current = pending.pop()
        group = _brace_group(current)
        if group is None:
            done.append(current)
        else:
            i, j, parts = group
            pending.extend(current[:i] + p + current[j + 1 :] for p in reversed(parts))
        if len(done) + len(pending) > MAX_BRACE_WORDS:
            return None
    return done


def _brace_group(word: str) -> tuple[int, int, list[str]] | None:
    start = 0
    while (i := word.find("{", start)) >= 0:
        depth, cuts, j = 0, [i], -1
        for k in range(i, len(word)):
            if word[k] == "{":
                depth += 1
            elif word[k] == "}":
                depth -= 1
                if depth == 0:
                    j = k
                    break
            elif word[k] == "," and depth == 1:
                cuts.append(k)
        if j < 0:
            return None
        if len(cuts) > 1:
            cuts.append(j)
            return i, j, [word[a + 1 : b] for a, b in itertools.pairwise(cuts)]
        sequence = _sequence(word[i + 1 : j])
        if sequence is not None:
            return i, j, sequence
        start = i + 1
    return None


def _sequence(inner: str) -> list[str] | None:
    match = _SEQUENCE.fullmatch(inner)
    if match is None:
        return None
    first, last, step_text = match.groups()
    step = abs(int(step_text or "1")) or 1
    if first.lstrip("-").isdigit() and last.lstrip("-").isdigit():
        a, b = int(first), int(last)
        values = range(a, b + 1, step) if a <= b else range(a, b - 1, -step)
        return [str(v) for v in values] if len(values) <= MAX_BRACE_WORDS else None
    if first.isalpha() and last.isalpha():
        a, b = ord(first), ord(last)
        letters = range(a, b + 1, step) if a <= b else range(a, b - 1, -step)
        return [chr(c) for c in letters]
    return None


def _echo(args: list[str]) -> str:
    escapes = False
    while args and re.fullmatch(r"-[neE]+", args[0]):
        escapes = "e" in args[0]
        args = args[1:]
    text = " ".join(args)
    return c_escapes(text) if escapes else text


def _printf(args: list[str]) -> str | None:
    if args and args[0] == "--":
        args = args[1:]
    if not args or args[0].startswith("-") or re.search(r"%(?![%sb])", args[0]):
        return None
    fmt, values = args[0], args[1:]
    slots = len([m for m in _PRINTF_CONV.findall(fmt) if m != "%%"])
    rounds = [values[i : i + slots] for i in range(0, len(values), slots)] if slots else []
    return "".join(_printf_round(fmt, chunk) for chunk in rounds or [[]])


def _printf_round(fmt: str, values: list[str]) -> str:
    supply = iter(values)
    pieces = _PRINTF_CONV.split(fmt)
    convs = _PRINTF_CONV.findall(fmt)
    out = [c_escapes(pieces[0])]
    for conv, piece in zip(convs, pieces[1:], strict=True):
        if conv == "%%":
            out.append("%")
        else:
            value = next(supply, "")
            out.append(c_escapes(value) if conv == "%b" else value)
        out.append(c_escapes(piece))
    return "".join(out)


def _syntax_error(root: Node, src: bytes) -> str:
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            snippet = src[node.start_byte : node.start_byte + 40].decode("utf-8", "replace")
            what = f"missing {node.type!r}" if node.is_missing else f"unexpected {snippet!r}"
            return f"syntax error at byte {node.start_byte}: {what}"
        stack.extend(c for c in reversed(node.children) if c.has_error or c.is_missing)
    return "syntax error"


def _fallback(text: str) -> list[Command]:
    """Best-effort commands from a plain tokenization, used only to find a deny."""
    text = _IFS.sub(" ", text[:_FALLBACK_BYTES])
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        tokens = list(lexer)
    except ValueError:
        tokens = text.split()
    commands: list[Command] = []
    words: list[Word] = []
    redirects: list[Redirect] = []
    op = ""
    for token in tokens:
        if op:
            redirects.append(Redirect(op, (Word(token),)))
            op = ""
        elif token and all(ch in "();<>|&" for ch in token):
            if "<" in token or ">" in token:
                op = token
            else:
                commands.append(Command(tuple(words), tuple(redirects)))
                words, redirects = [], []
        elif words or token not in _KEYWORDS:
            words.extend(
                Word(t, glob=bool(_GLOB.search(t))) for t in brace_expand(token) or [token]
            )
    commands.append(Command(tuple(words), tuple(redirects)))
    return [c for c in commands if c.words or c.redirects]
