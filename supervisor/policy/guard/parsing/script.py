"""``parse_script``: shell text to the simple commands in it, with a plain tokenization added
when tree-sitter reports a syntax error (so a deny can still be found)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence

from stockade.supervisor.policy.guard.parsing.expansion import (
    GLOB,
    brace_expand,
)
from stockade.supervisor.policy.guard.parsing.repairs import parse_tree
from stockade.supervisor.policy.guard.parsing.syntax import (
    MAX_BYTES,
    MAX_PIPES,
    Command,
    Redirect,
    Script,
    TooComplex,
    Word,
)
from stockade.supervisor.policy.guard.parsing.trees import Budget
from stockade.supervisor.policy.guard.parsing.walker import Walker

_FALLBACK_BYTES = 64 * 1024
_IFS = re.compile(r"\$\{IFS[^}]*\}|\$IFS\b")
_KEYWORDS = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for"})
_KEYWORDS |= {"case", "esac", "in", "{", "}", "!", "time"}


def parse_script(
    text: str,
    *,
    positional: Sequence[str] | None = (),
    budget: Budget | None = None,
    cdpath: bool = False,
    keeps_dir: Callable[[Sequence[Word]], bool] | None = None,
) -> Script:
    """Parse shell text; never raises for any input string.

    ``positional`` holds ``$0 $1 ...`` (``$0`` first; default: a ``sh -c`` without operands,
    so ``$1``.. and ``$@`` are empty); None when they are unknown. ``cdpath``: CDPATH may
    be set, so ``cd NAME`` may go anywhere (also when the text mentions CDPATH).
    ``keeps_dir``: whether an ``eval`` with these arguments leaves the directory as it is
    (a shell set-up idiom; any other ``eval`` makes it unknown).
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
    tree, syntax = parse_tree(data, budget)
    if tree is None:
        return Script(error="command took too long to parse", too_complex=True)
    root = tree.root_node
    walker = Walker(data, positional, budget)
    walker.cdpath = cdpath or b"CDPATH" in data
    walker.keeps_dir = keeps_dir
    try:
        walker.statement(root)
    except (TooComplex, RecursionError) as exc:
        return Script(tuple(_fallback(text)), error=str(exc) or "too deep", too_complex=True)
    error = error or syntax or walker.error
    fallback = _fallback(text) if error else []
    return Script(
        tuple(walker.commands + fallback),
        tuple(walker.pipelines),
        tuple(walker.fork_bombs),
        error,
    )


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
            words.extend(Word(t, glob=bool(GLOB.search(t))) for t in brace_expand(token) or [token])
    commands.append(Command(tuple(words), tuple(redirects)))
    return [c for c in commands if c.words or c.redirects]
