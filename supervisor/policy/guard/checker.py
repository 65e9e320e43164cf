"""The ``Guard``: configuration (extra rules, limits, the workspace and home folders) and
``check``, which hands each command to a fresh ``evaluation.Evaluation`` with the guard's
``GuardSettings`` (never the guard itself: evaluation.py does not import this module)."""

from __future__ import annotations

import posixpath
import re
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import Literal

from stockade.supervisor.policy.guard.evaluation import Decided, Evaluation, GuardSettings
from stockade.supervisor.policy.guard.invocations import norm_abs
from stockade.supervisor.policy.guard.model import GuardConfigError, GuardResult, GuardRule
from stockade.supervisor.policy.guard.paths import SCRATCH
from stockade.supervisor.policy.guard.rules import BUILTIN_NAMES

CACHE_ENTRIES = 4096
"""Verdicts a guard remembers (least recently used forgotten first)."""
CACHE_MAX_CHARS = 2048
"""Longer commands are checked every time: the cache holds at most ~8 MiB of commands."""


class Guard:
    """Decides whether a shell command may run. Immutable; ``check`` is pure and thread-safe."""

    __slots__ = ("_cache", "_names", "_settings")
    _names: tuple[str, ...]
    _settings: GuardSettings
    _cache: _Verdicts

    def __init__(
        self,
        extra_rules: Sequence[GuardRule] = (),
        *,
        on_parse_error: Literal["deny", "ask"] = "deny",
        max_depth: int = 8,
        workspace: str = "/workspace",
        home: str = SCRATCH,
        cache_entries: int = CACHE_ENTRIES,
    ) -> None:
        """``workspace``: the sandbox's workspace root, where commands start (below it a
        recursive removal is routine); ``home``: its $HOME (below it too); ``cache_entries``:
        how many verdicts to remember (0: none; bench/guard.py times checks without)."""
        if on_parse_error not in ("deny", "ask"):
            raise GuardConfigError(
                f"on_parse_error must be 'deny' or 'ask', not {on_parse_error!r}"
            )
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise GuardConfigError(f"max_depth must be a positive integer, not {max_depth!r}")
        if (
            isinstance(cache_entries, bool)
            or not isinstance(cache_entries, int)
            or cache_entries < 0
        ):
            raise GuardConfigError(f"cache_entries must be an integer >= 0, not {cache_entries!r}")
        extra = _compile_rules(extra_rules)
        settings = GuardSettings(
            workspace=_root_folder("workspace", workspace),
            home=_root_folder("home", home),
            extra=extra,
            max_depth=max_depth,
            on_parse_error=on_parse_error,
        )
        object.__setattr__(self, "_settings", settings)
        object.__setattr__(self, "_names", BUILTIN_NAMES + tuple(r.name for r, _ in extra))
        object.__setattr__(self, "_cache", _Verdicts(cache_entries))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    @property
    def rule_names(self) -> tuple[str, ...]:
        """Built-in rule names (including the parse-error/too-complex pseudo-rules), then extras."""
        return self._names

    def check(
        self,
        command: str,
        *,
        workdir: str | None = ".",
        env: Mapping[str, str] | None = None,
        shell: str = "bash",
    ) -> GuardResult:
        """Allow, deny or ask for one shell command string, run in ``workdir`` (relative to
        the workspace, or absolute; None: not known) with ``env`` added to its environment
        (one that sets CDPATH makes ``cd NAME`` unknown; one that sets HOME makes ``~`` that
        path when it is a literal one in the workspace or /tmp, else unknown), by ``shell``
        ("bash" or "sh": the parser reads bash's grammar, of which what dash accepts is
        nearly all; the shell is here for a parse per shell)."""
        base = (
            None
            if workdir is None
            else (norm_abs(posixpath.join(self._settings.workspace, workdir)),)
        )
        if len(command) > CACHE_MAX_CHARS or not self._cache.size:
            return self._evaluate(command, base, env)
        # Everything a verdict depends on besides the command: the guard's own settings are
        # fixed (one cache per Guard; new rules make a new Guard), the rest is here.
        key = (command, base, shell, tuple(sorted(env.items())) if env else ())
        if (known := self._cache.get(key)) is not None:
            return known
        verdict = self._evaluate(command, base, env)
        if not verdict.unparsed:  # the parse's CPU budget is time: such verdicts are redone
            self._cache.put(key, verdict)
        return verdict

    def _evaluate(
        self, command: str, base: tuple[str, ...] | None, env: Mapping[str, str] | None
    ) -> GuardResult:
        evaluation = Evaluation(self._settings, base, env or {})
        try:
            evaluation.script(evaluation.parse(command), depth=0)
        except Decided as decided:
            return decided.result
        except RecursionError:
            evaluation.note_unparsed("too-complex", "command is nested too deeply to check")
        return evaluation.finish()

    @property
    def cached(self) -> int:
        """How many verdicts the guard remembers now (at most CACHE_ENTRIES)."""
        return len(self._cache)


class _Verdicts:
    """A bounded LRU of verdicts, safe across threads (long commands are checked in one)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Hashable, GuardResult] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable) -> GuardResult | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: Hashable, verdict: GuardResult) -> None:
        with self._lock:
            self._items[key] = verdict
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


def _root_folder(what: str, path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/") or norm_abs(path) == "/":
        raise GuardConfigError(f"{what} must be an absolute folder other than /, not {path!r}")
    return norm_abs(path)


def _compile_rules(rules: Sequence[GuardRule]) -> tuple[tuple[GuardRule, re.Pattern[str]], ...]:
    seen = set(BUILTIN_NAMES)
    compiled = []
    for rule in rules:
        if not isinstance(rule, GuardRule):
            raise GuardConfigError(f"expected a GuardRule, got {type(rule).__name__}")
        if (
            not isinstance(rule.name, str)
            or not rule.name.strip()
            or rule.name != rule.name.strip()
        ):
            raise GuardConfigError(f"guard rule name must be a non-blank string, not {rule.name!r}")
        if rule.name in seen:
            raise GuardConfigError(f"guard rule name {rule.name!r} is already taken")
        if not isinstance(rule.pattern, str) or not rule.pattern:
            raise GuardConfigError(f"guard rule {rule.name!r} needs a non-empty pattern")
        try:
            regex = re.compile(rule.pattern)
        except re.error as exc:
            raise GuardConfigError(f"guard rule {rule.name!r}: invalid regex: {exc}") from exc
        seen.add(rule.name)
        compiled.append((rule, regex))
    return tuple(compiled)
