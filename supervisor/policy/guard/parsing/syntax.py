"""What parsing yields: simple commands made of words (with the substitutions in them and the
directories each command may run in), redirects and scripts; and the parser's limits."""

from __future__ import annotations

from dataclasses import dataclass

MAX_BYTES = 256 * 1024
"""Longer commands are not parsed at all (the guard treats them as unparsed)."""
MAX_NESTING = 64
"""Statements and substitutions nested deeper than this are "too complex"."""
MAX_NODES = 20_000
MAX_BRACE_WORDS = 256
MAX_PIPES = 1000
"""More ``|`` than this (quoted or not) are not parsed: tree-sitter's error recovery after a
long pipeline takes memory no progress callback can stop (``a|`` * 10,000 took 1 GB)."""
Cwds = tuple[str, ...] | None
"""Directories a command may run in: "" is where the script starts, other relative paths
are below it, "/.." absolute, "~.." the home directory's; None: not known."""


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


class TooComplex(Exception):
    pass


def basename(text: str) -> str:
    return text.rsplit("/", 1)[-1]
