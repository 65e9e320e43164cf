"""What the guard is configured with and what it answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Action = Literal["allow", "deny", "ask"]


@dataclass(frozen=True)
class GuardRule:
    """A deny rule from config: a regex searched in each normalized simple command."""

    name: str
    pattern: str  # Python regex over "program-basename arg1 arg2 ..." (single spaces)
    reason: str = ""
    checkpoint: bool = False
    """A rule that does not deny: a command it matches runs (when nothing else stops it) with
    a checkpoint of the workspace taken first ([checkpoints], docs/undo.md)."""


@dataclass(frozen=True)
class GuardResult:
    action: Action
    rule: str | None  # the rule that decided; None when allowed
    reason: str
    unparsed: bool = False  # the command (or code nested in it) could not be parsed
    checkpoint: str = ""  # a checkpoint rule (GuardRule.checkpoint) that matched, if any


class GuardConfigError(ValueError):
    """An invalid guard configuration (bad regex, empty or duplicate rule name)."""
