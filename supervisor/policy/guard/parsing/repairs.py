"""Valid bash that tree-sitter-bash (0.25) does not parse, rewritten so that it does.

tree-sitter-bash's grammar misses a few things bash accepts (each found by running the
guard's corpora through ``bash -n``, tests/unit/test_guard_bash_valid.py):

- a closing keyword straight after a compound command, with no ``;`` between:
  ``(cd x || continue; make) done``, ``{ ...; done } | cat``, ``{ make; } fi``, ``(true) then``;
- the read-write redirect ``<>`` (``exec 3<>file``);
- ``==`` or ``=~`` as an ordinary word (``echo ==``), outside ``[[ ]]``;
- ``$`` before a character that starts no expansion, which bash keeps as it is (``a:$%``);
- a command word that starts with ``[`` but is no ``[`` command (``[a-z][3-9]``);
- ``;&`` and ``;;&`` ending a ``case`` item on one line;
- a backslash ending the text (``echo \\``), which bash keeps as a character.

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

from stockade.supervisor.policy.guard.parsing.trees import (
    ASCII_ONLY,
    Budget,
    syntax_error,
    tree_parse,
)

MAX_REPAIRS = 8
"""Repairs tried on one text before its syntax error stands."""
_WINDOW = 24
"""Bytes either side of an error where a repair may apply."""
_END = rb"(?:[)}]|\b(?:done|fi|esac))"
_SEPARATOR = re.compile(
    _END + rb"([ \t])(?=[ \t]*(?:(?:done|fi|esac|then|do|else|elif)\b|\}))"
)  # a closing keyword right after a compound command: one separator before it
_OPERATOR_WORD = re.compile(rb"(?:^|(?<=[\s;&|(]))(==|=~)(?=[\s;&|)]|$)")
"""``==`` or ``=~`` as a word of its own (tree-sitter reads it as an operator anywhere)."""
_REPAIRS: tuple[tuple[re.Pattern[bytes], bytes], ...] = (
    (_SEPARATOR, b";"),
    (re.compile(rb"(?<![<>])(<>)(?![<>&(])"), b"> "),  # read-write: read as a write
    (_OPERATOR_WORD, b"xx"),
    (re.compile(rb"(\$)(?=[%,/=+:.^~])"), b"\\"),  # a `$` bash keeps as it is (`a:$%`)
    (re.compile(rb"(?:^|(?<=[\s;&|(]))(\[)(?=[^\s\[\]])"), b"?"),  # `[a-z]*` as a command
    (re.compile(rb"(;;&)"), b";; "),
    (re.compile(rb"(?<!\\)(\\)\Z"), b" "),  # a backslash ending the text: bash keeps it
    (re.compile(rb"(?<!;)(;&)"), b";;"),
)  # fmt: skip
_OPERATORS = re.compile(rb"==|=~")
_MISREAD = frozenset({"word", "regex", "extglob_pattern", "==", "=~"})


def parse_tree(data: bytes, budget: Budget) -> tuple[tree_sitter.Tree | None, str | None]:
    """Parse ``data`` (non-ASCII read as ASCII letters), repairing valid bash tree-sitter
    misses: the tree (None when the budget ran out; its offsets are ``data``'s) and the
    syntax error that stands, if any."""
    text = data.translate(ASCII_ONLY)
    tree = tree_parse(text, budget)
    if tree is None:
        return None, None
    if not tree.root_node.has_error and b"==" not in text and b"=~" not in text:
        return tree, None  # the usual case, kept cheap
    return _repaired(tree, text, data, budget)


def _repaired(
    first: tree_sitter.Tree, text: bytes, data: bytes, budget: Budget
) -> tuple[tree_sitter.Tree | None, str | None]:
    tree: tree_sitter.Tree | None = first
    keywords: list[int] = []  # where a repair put a separator before a closing keyword
    for attempt in range(MAX_REPAIRS + 1):
        if tree is None:
            return None, None
        error = _first_error(tree.root_node, text)
        if error is None and all(_is_keyword(tree, at) for at in keywords):
            return tree, None
        if error is None or attempt == MAX_REPAIRS:
            break
        repaired = _repair(text, error)
        if repaired is None:
            break
        text, at = repaired
        keywords += [at] if at is not None else []
        tree = tree_parse(text, budget)
    return first, _error_of(first.root_node, data)


def _error_of(root: Node, data: bytes) -> str:
    if root.has_error:
        return syntax_error(root, data)
    where = _misread(root, data) or (0, 0)
    return f"syntax error at byte {where[0]}: {data[where[0] : where[0] + 40]!r} read as a regex"


def _first_error(root: Node, text: bytes) -> tuple[int, int] | None:
    """The byte range of the first error (or missing token) in the tree, or of an operator
    tree-sitter read as a regular expression outside ``[[ ]]`` (``$(echo == ; rm ..)``
    would otherwise hide the command after it in one "regex" argument)."""
    if not root.has_error:  # the usual case: cheap
        return _misread(root, text) if _OPERATORS.search(text) else None
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            return node.start_byte, max(node.end_byte, node.start_byte + 1)
        stack.extend(c for c in reversed(node.children) if c.has_error or c.is_missing)
    return None


def _misread(root: Node, text: bytes) -> tuple[int, int] | None:
    """The first ``==`` or ``=~`` word of a command that tree-sitter read as an operator: it
    may have swallowed what follows (a ``regex`` argument up to the ``)``, or the next line
    as more arguments: ``echo =~<newline>rm -rf /``). In a test or arithmetic it is one."""
    for match in _OPERATOR_WORD.finditer(text):
        node = root.descendant_for_byte_range(match.start(1), match.end(1))
        while node is not None and node.type in _MISREAD:
            node = node.parent
        if node is not None and node.type == "command":
            return match.start(1), match.end(1)
    return None


def _is_keyword(tree: tree_sitter.Tree, at: int) -> bool:
    """A repair's closing keyword is syntax in the repaired tree, not a command's name
    (tree-sitter reads a ``done`` or ``}`` closing nothing as a command)."""
    node = tree.root_node.descendant_for_byte_range(at, at + 1)
    return node is not None and not node.is_named


def _repair(text: bytes, error: tuple[int, int]) -> tuple[bytes, int | None] | None:
    """The text with the first repair that applies near the error (and, for a separator,
    where the keyword after it starts), or None."""
    start, end = max(0, error[0] - _WINDOW), min(len(text), error[1] + _WINDOW)
    for pattern, replacement in _REPAIRS:
        match = pattern.search(text, start, end)
        if match:
            repaired = text[: match.start(1)] + replacement + text[match.end(1) :]
            if pattern is not _SEPARATOR:
                return repaired, None
            keyword = re.compile(rb"[ \t]*").match(repaired, match.end(1))
            return repaired, keyword.end() if keyword else None
    return None
