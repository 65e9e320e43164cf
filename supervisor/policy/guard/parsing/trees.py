"""tree-sitter-bash: one parser per thread, and a CPU budget every parse of one guard check
shares."""

from __future__ import annotations

import threading
import time

import tree_sitter
import tree_sitter_bash
from tree_sitter import Node

PARSE_SECONDS = 2.0
"""CPU seconds all the parses of one guard check may take together."""
_LANGUAGE = tree_sitter.Language(tree_sitter_bash.language())
_LOCAL = threading.local()
ASCII_ONLY = bytes.maketrans(bytes(range(0x80, 0x100)), b"x" * 0x80)


class Budget:
    """CPU time one guard check may spend parsing. tree-sitter's error recovery is superlinear
    on some inputs (200 KB of ``a|a|...|`` takes minutes and gigabytes), so every parse of one
    check shares this and stops when it runs out."""

    def __init__(self, seconds: float = PARSE_SECONDS) -> None:
        self.deadline = time.thread_time() + seconds

    def spent(self, *_: object) -> bool:
        return time.thread_time() > self.deadline


def tree_parse(data: bytes, budget: Budget) -> tree_sitter.Tree | None:
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


def _parser() -> tree_sitter.Parser:
    parser: tree_sitter.Parser | None = getattr(_LOCAL, "parser", None)
    if parser is None:
        parser = _LOCAL.parser = tree_sitter.Parser(_LANGUAGE)
    return parser


def syntax_error(root: Node, src: bytes) -> str:
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            snippet = src[node.start_byte : node.start_byte + 40].decode("utf-8", "replace")
            what = f"missing {node.type!r}" if node.is_missing else f"unexpected {snippet!r}"
            return f"syntax error at byte {node.start_byte}: {what}"
        stack.extend(c for c in reversed(node.children) if c.has_error or c.is_missing)
    return "syntax error"
