"""Statements from the syntax tree: lists, pipelines, compound statements, functions,
assignments, redirects and heredocs, with the directories commands may run in (``cd``)."""

from __future__ import annotations

import re

from tree_sitter import Node

from stockade.supervisor.policy.guard.parsing.syntax import (
    MAX_NESTING,
    Command,
    Cwds,
    Redirect,
    Sub,
    TooComplex,
    Word,
    basename,
)
from stockade.supervisor.policy.guard.parsing.words import NO_CD, STATEMENTS, WordWalker

_REDIRECTS = frozenset({"file_redirect", "heredoc_redirect", "herestring_redirect"})
_UNCONDITIONAL = frozenset({"program", "compound_statement", "redirected_statement"})
_VAR_WRITERS = frozenset({"read", "mapfile", "readarray", "getopts", "printf", "unset"})
_CD = frozenset({"cd", "pushd", "chdir"})
_CD_PREFIXES = frozenset({"builtin", "command", "time", "-p", "--"})
_CWD_UNKNOWN = frozenset({"popd", "eval", "source", "."})
_LOOPS = frozenset({"for_statement", "c_style_for_statement", "while_statement"})
_CHANGES_DIR = re.compile(rb"\b(?:cd|pushd|popd|chdir)\b")


class Walker(WordWalker):
    """One pass over a syntax tree; collects commands in source order."""

    def statement(self, node: Node) -> None:
        self.depth += 1
        self.tick()
        if self.depth > MAX_NESTING:
            raise TooComplex(f"command nests deeper than {MAX_NESTING} levels")
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
            if child.type in STATEMENTS:
                background = i + 1 < len(children) and children[i + 1].type == "&"
                self.background += background
                self.cond += background
                saved = self.cwds
                self.statement(child)
                if background:  # `cd x &` runs in a subshell: its cd does not last
                    self.cwds, self.cd_done = saved, NO_CD
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
        seen, went = [self.cwds], NO_CD
        for op, item in reversed(items):
            if op == "&&" and went != NO_CD:  # `cd x && ..`: runs only where cd went
                self.cwds = went
            self.cd_done = NO_CD
            self.statement(item) if item.type in STATEMENTS else self.scan(item)
            went = self.cd_done if item.type == "command" else NO_CD
            seen.append(self.cwds)
        self.cwds = _union(*seen)
        self.cond -= 1

    def change_dir(self, words: list[Word]) -> None:
        """After ``cd DIR``: where the next command may run (cd may fail, so also here)."""
        while words and words[0].text in _CD_PREFIXES and not words[0].dynamic:
            words = words[1:]  # `builtin cd /`, `command cd /`, `time -p cd /`
        program = words[0].text if words else ""
        self.cd_done = NO_CD
        if program == "trap" and any(_CHANGES_DIR.search(w.text.encode()) for w in words):
            self.cwds = None  # `trap 'cd /' DEBUG`: runs in this shell, before each command
        if not words or words[0].dynamic or program not in _CD | _CWD_UNKNOWN:
            return
        if program == "eval" and self.keeps_dir is not None and self.keeps_dir(words[1:]):
            return  # `eval "$(pyenv init -)"`: a set-up idiom, which changes no directory
        went = _cd(words[1:], self.cwds, cdpath=self.cdpath) if program in _CD else None
        self.cd_done = went
        self.cwds = _union(self.cwds, went)

    def pipeline(self, node: Node, head: tuple[Command, ...]) -> None:
        stages = [head] if head else []
        self.cond += 1
        for child in node.children:
            if child.type in STATEMENTS:
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
            elif child.type in STATEMENTS:
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
                if child.type in STATEMENTS:
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
            elif kind in STATEMENTS:
                trailing.append(child)
        return [Redirect("<<", (), body), *found]


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
