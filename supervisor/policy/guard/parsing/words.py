"""Words from the syntax tree: the text bash would pass to ``execve`` for each word, as far as
that is knowable without running anything."""

from __future__ import annotations

import abc
import contextlib
import re
from collections.abc import Callable, Iterator, Sequence

from tree_sitter import Node

from stockade.supervisor.policy.guard.parsing.expansion import (
    DYN,
    EXPANDED,
    LIT,
    QUOTED,
    SPLIT,
    Seg,
    c_escapes,
    dquote,
    fields,
    static_output,
    unescape_word,
)
from stockade.supervisor.policy.guard.parsing.repairs import parse_tree
from stockade.supervisor.policy.guard.parsing.syntax import (
    MAX_NESTING,
    MAX_NODES,
    Command,
    Cwds,
    Sub,
    TooComplex,
    Word,
)
from stockade.supervisor.policy.guard.parsing.trees import Budget

STATEMENTS = frozenset({"program", "command", "pipeline", "list", "subshell"})
STATEMENTS |= {"compound_statement", "redirected_statement", "variable_assignment"}
STATEMENTS |= {"variable_assignments", "declaration_command", "unset_command"}
STATEMENTS |= {"function_definition", "if_statement", "elif_clause", "else_clause"}
STATEMENTS |= {"while_statement", "for_statement", "c_style_for_statement", "case_statement"}
STATEMENTS |= {"case_item", "do_group", "negated_command", "test_command", "ERROR"}
_JOINED = re.compile(rb"(?:\\\n)*")
_SPECIAL = frozenset("0123456789@*#")
_HIDDEN_SUB = re.compile(r"`|\$\(|[<>]\(")
_NAME = re.compile(r"[A-Za-z_]\w*")
NO_CD = ("\0",)  # `cd_done` when the last command was no cd


class WordWalker(abc.ABC):
    """A walk over one syntax tree, and how it makes words: quotes, escapes, parameters,
    known variables and substitutions. ``walker.Walker`` adds the statements."""

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
        self.cd_done: Cwds = NO_CD  # the last command was a cd: where it went
        self.cdpath = False
        self.keeps_dir: Callable[[Sequence[Word]], bool] | None = None  # an eval that does not cd

    def text(self, node: Node) -> str:
        return self.src[node.start_byte : node.end_byte].decode("utf-8", "replace")

    def tick(self) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise TooComplex(f"command has more than {MAX_NODES} syntax nodes")

    @contextlib.contextmanager
    def own_cwd(self, scoped: bool = True) -> Iterator[None]:
        """A subshell, pipeline stage or substitution: its cd does not last."""
        saved = self.cwds
        try:
            yield
        finally:
            if scoped:
                self.cwds, self.cd_done = saved, NO_CD

    def words(self, pieces: list[Node]) -> list[Word]:
        """Pieces with nothing but line continuations between them are one shell word
        (tree-sitter splits ``r\\<newline>m`` and ``rm$IFS$9-rf`` apart)."""
        words: list[Word] = []
        segs: list[Seg] = []
        subs: list[Sub] = []
        dollar, end = False, -1
        for piece in pieces:
            if end >= 0 and not _JOINED.fullmatch(self.src[end : piece.start_byte]):
                words.extend(fields(segs, tuple(subs)))
                segs, subs, dollar = [], [], False
            end = piece.end_byte
            text = self.text(piece)
            if dollar and piece.type == "word" and text[:1] in _SPECIAL:  # `$` `9-rf`
                self.parameter(text[0], segs, quoted=False, source="$" + text[0])
                segs.extend(unescape_word(text[1:]))
            elif dollar and piece.type == "word" and (name := _NAME.match(text)):  # `$` `IFS/`
                self.named(name.group(), segs)
                segs.extend(unescape_word(text[name.end() :]))
            elif piece.type != "$":
                if dollar and piece.type not in ("string", "translated_string"):
                    segs.append(("$", LIT))
                self.segments(piece, segs, subs, quoted=False)
            dollar = piece.type == "$"
        if dollar:
            segs.append(("$", LIT))
        words.extend(fields(segs, tuple(subs)))
        return words

    def expand(self, node: Node) -> list[Word]:
        segs: list[Seg] = []
        subs: list[Sub] = []
        self.segments(node, segs, subs, quoted=False)
        return fields(segs, tuple(subs))

    def value_word(self, node: Node) -> Word:
        """An assignment value: no field splitting, no brace expansion."""
        segs: list[Seg] = []
        subs: list[Sub] = []
        self.segments(node, segs, subs, quoted=False)
        text = "".join(" " if k == SPLIT else s for s, k in segs)
        return Word(text, any(k == DYN for _, k in segs), False, tuple(subs))

    def joined(self, node: Node, *, quoted: bool) -> Word:
        segs: list[Seg] = []
        subs: list[Sub] = []
        self.string(node, segs, subs, inner=(node.start_byte, node.end_byte))
        text = "".join(s for s, _ in segs)
        return Word(text, any(k == DYN for _, k in segs), False, tuple(subs))

    def segments(self, node: Node, out: list[Seg], subs: list[Sub], *, quoted: bool) -> None:
        self.tick()
        kind = node.type
        text = self.text(node)
        if kind == "word":
            out.extend([(text, QUOTED)] if quoted else unescape_word(text))
        elif kind == "raw_string":
            out.append((text[1:-1], QUOTED))
        elif kind == "ansi_c_string":
            out.append((c_escapes(text[2:-1]), QUOTED))
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
                out.append((text, DYN))
        elif kind in ("brace_expression", "number") or node.child_count == 0:
            out.append((text, QUOTED if quoted else LIT))
        else:
            subs.extend(self.scan(node))
            out.append((text, DYN))

    def string(
        self, node: Node, out: list[Seg], subs: list[Sub], *, inner: tuple[int, int]
    ) -> None:
        pos, end = inner
        for child in node.children:
            if child.start_byte < pos or child.end_byte > end or child.type == '"':
                continue
            if child.start_byte > pos:
                out.append((dquote(self.src[pos : child.start_byte]), QUOTED))
            if child.type in ("string_content", "heredoc_content"):
                out.append((dquote(self.src[child.start_byte : child.end_byte]), QUOTED))
            else:
                self.segments(child, out, subs, quoted=True)
            pos = child.end_byte
        if end > pos:
            out.append((dquote(self.src[pos:end]), QUOTED))

    def expansion(self, node: Node, out: list[Seg], subs: list[Sub], *, quoted: bool) -> None:
        raw = self.text(node)
        source = raw.lstrip()
        if len(source) < len(raw):  # tree-sitter puts a preceding blank inside the node
            out.append((raw[: len(raw) - len(source)], QUOTED if quoted else SPLIT))
        name, simple = None, True
        for child in node.children:
            if child.type in ("variable_name", "special_variable_name") and name is None:
                name = self.text(child)
            elif child.type not in ("$", "${", "}"):
                simple = False
        if name == "IFS":
            out.append((" ", QUOTED) if quoted else ("", SPLIT))
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
            out.append((source, DYN))

    def named(self, name: str, out: list[Seg]) -> None:
        """``$NAME`` unquoted, where tree-sitter split the ``$`` from the name."""
        if name == "IFS":
            out.append(("", SPLIT))
        elif name in self.vars:
            self.value(self.vars[name], out, quoted=False)
        else:
            out.append(("$" + name, DYN))

    def parameter(self, name: str, out: list[Seg], *, quoted: bool, source: str) -> None:
        """``$0``..``$9``, ``$@``, ``$*``, ``$#`` from the known positional parameters."""
        known = self.positional
        if known is None or (name == "0" and not known):
            out.append((source, DYN))
        elif name.isdigit():
            index = int(name)
            self.value(known[index] if index < len(known) else "", out, quoted=quoted)
        elif name == "#":
            out.append((str(max(len(known) - 1, 0)), QUOTED))
        elif name == "@" and quoted:  # "$@": one word per parameter
            for i, value in enumerate(known[1:]):
                out.extend([("", SPLIT)] if i else [])
                out.append((value, QUOTED))
        else:
            self.value(" ".join(known[1:]), out, quoted=quoted)

    def reparse(self, text: str) -> Sub:
        """Commands in a piece of text tree-sitter did not parse as code."""
        self.depth += 1
        try:
            if self.depth > MAX_NESTING:
                raise TooComplex(f"command nests deeper than {MAX_NESTING} levels")
            data = (": " + text).encode("utf-8", "replace")
            tree, syntax = parse_tree(data, self.budget)
            if tree is None:
                raise TooComplex("command took too long to parse")
            inner = type(self)(data, self.positional, self.budget)
            inner.vars, inner.aliases, inner.ifs = self.vars, self.aliases, self.ifs
            inner.depth, inner.nodes, inner.cond = self.depth, self.nodes, self.cond + 1
            inner.background, inner.cwds, inner.cdpath = self.background, self.cwds, self.cdpath
            inner.keeps_dir = self.keeps_dir
            inner.statement(tree.root_node)
        finally:
            self.depth -= 1
        self.nodes = inner.nodes
        self.error = self.error or syntax or inner.error
        self.commands.extend(inner.commands)
        self.pipelines.extend(inner.pipelines)
        self.fork_bombs.extend(inner.fork_bombs)
        return Sub("$(", tuple(inner.commands))

    def value(self, value: str, out: list[Seg], *, quoted: bool) -> None:
        """A known expansion result: one piece when quoted, split on $IFS when not."""
        if quoted or not value:
            out.append((value, QUOTED))
        elif self.ifs is None:
            out.append((value, DYN))
        else:
            parts = re.split(f"[{re.escape(self.ifs)}]+", value) if self.ifs else [value]
            for i, part in enumerate(parts):
                out.extend([("", SPLIT)] if i else [])
                out.extend([(part, EXPANDED)] if part else [])

    def sub(self, node: Node) -> Sub:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise TooComplex(f"command nests deeper than {MAX_NESTING} levels")
        start = len(self.commands)
        kind = "$(" if node.type == "command_substitution" else node.children[0].type
        named = [c for c in node.children if c.is_named]
        self.cond += 1
        try:
            with self.own_cwd():
                for child in named:
                    self.statement(child) if child.type in STATEMENTS else self.scan(child)
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
            elif current.type in STATEMENTS:
                self.statement(current)
            else:
                stack.extend(reversed(current.children))
        return found

    @abc.abstractmethod
    def statement(self, node: Node) -> None:
        """Collect the commands of one statement (``walker.Walker``)."""
