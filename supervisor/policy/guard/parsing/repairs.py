"""Valid bash that tree-sitter-bash (0.25) does not parse, rewritten so that it does.

tree-sitter-bash's grammar misses a few things bash accepts (each found by running the
guard's corpora through ``bash -n``, tests/unit/test_guard_bash_valid.py):

- a closing keyword straight after a compound command, with no ``;`` between:
  ``(cd x || continue; make) done``, ``{ ...; done } | cat``, ``{ make; } fi``, ``(true) then``;
- the read-write redirect ``<>`` (``exec 3<>file``);
- ``==`` or ``=~`` as an ordinary word (``echo ==``), outside ``[[ ]]``;
- ``$`` before a character that starts no expansion, which bash keeps as it is (``a:$%``);
- a command word that starts with ``[`` but is no ``[`` command (``[a-z][3-9]``);
- ``;&`` and ``;;&`` ending a ``case`` item on one line.

A repair rewrites bytes near the first syntax error into the same number of bytes that
tree-sitter does parse, and the text is parsed again, up to ``MAX_REPAIRS`` times. Only a
tree with no error at all is used; the walker then reads every word's text from the
original command (offsets are unchanged), so a repair changes how the text is split into
commands, never what a word says: ``<>`` is read as ``>``, a write (the guard checks writes
at least as strictly as reads); every other rewrite puts a separator where bash sees one, or
turns a character tree-sitter stops at into a plain word character in a word.
"""

from __future__ import annotations

import re

import tree_sitter
from tree_sitter import Node

from stockade.supervisor.policy.guard.parsing.trees import ASCII_ONLY, Budget, tree_parse

MAX_REPAIRS = 8
"""Repairs tried on one text before its syntax error stands."""
_WINDOW = 24
"""Bytes either side of an error where a repair may apply."""
_END = rb"(?:[)}]|\b(?:done|fi|esac))"
_REPAIRS: tuple[tuple[re.Pattern[bytes], bytes], ...] = (
    # a closing keyword right after a compound command: one separator before it
    (re.compile(_END + rb"([ \t])(?=[ \t]*(?:(?:done|fi|esac|then|do|else|elif)\b|\}))"), b";"),
    (re.compile(rb"(?<![<>])(<>)(?![<>&(])"), b"> "),  # read-write: read as a write
    (re.compile(rb"(?:^|(?<=[\s;&|]))(==|=~)(?=[\s;&|)]|$)"), b"xx"),
    (re.compile(rb"(\$)(?=[%,/=+:.^\]}~\s]|$)"), b"\\"),  # a `$` bash keeps as it is
    (re.compile(rb"(?:^|(?<=[\s;&|(]))(\[)(?=[^\s\]])"), b"?"),  # `[a-z]*` as a command
    (re.compile(rb"(;;&)"), b";; "),
    (re.compile(rb"(?<!;)(;&)"), b";;"),
)  # fmt: skip


def parse_tree(data: bytes, budget: Budget) -> tree_sitter.Tree | None:
    """Parse ``data`` (non-ASCII read as ASCII letters), repairing valid bash tree-sitter
    misses; None when the budget ran out. The tree's offsets are ``data``'s."""
    text = data.translate(ASCII_ONLY)
    first = tree = tree_parse(text, budget)
    for _ in range(MAX_REPAIRS):
        if tree is None or not tree.root_node.has_error:
            return tree
        repaired = _repair(text, _first_error(tree.root_node))
        if repaired is None:
            break
        text, tree = repaired, tree_parse(repaired, budget)
    return tree if tree is None or not tree.root_node.has_error else first


def _first_error(root: Node) -> tuple[int, int] | None:
    """The byte range of the first error (or missing token) in the tree."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            return node.start_byte, max(node.end_byte, node.start_byte + 1)
        stack.extend(c for c in reversed(node.children) if c.has_error or c.is_missing)
    return None


def _repair(text: bytes, error: tuple[int, int] | None) -> bytes | None:
    """The text with the first repair that applies near the error, or None."""
    if error is None:
        return None
    start, end = max(0, error[0] - _WINDOW), min(len(text), error[1] + _WINDOW)
    for pattern, replacement in _REPAIRS:
        match = pattern.search(text, start, end)
        if match:
            return text[: match.start(1)] + replacement + text[match.end(1) :]
    return None
