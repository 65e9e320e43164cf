"""`python -m bench.guard`: the command guard's corpora (tests/corpora) with the default
guard: how many ordinary commands it refuses (target 0; guard_ordinary.txt and
guard_manuals.txt) and how many destructive or
obfuscated ones it refuses (target >= 99%), and what a check costs. No engine needed.

With $TLDR_PAGES naming a tldr-pages checkout, also the ~29,000 example commands of its
common and linux pages (tests/corpora/generate.py `tldr_commands`): their refusals by rule,
each rule with the reason it refuses, and every parse-error refusal checked with `bash -n`
(target: none of a command bash accepts). `--all` lists every refusal."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from statistics import median
from typing import Any

from stockade.supervisor.policy.guard import Guard
from stockade.supervisor.policy.guard.rules import RULES
from tests.corpora.generate import TLDR_ENV, tldr_commands, tldr_pages

CORPORA = Path(__file__).resolve().parent.parent / "tests" / "corpora"
ORDINARY = CORPORA / "guard_ordinary.txt"
MANUALS = CORPORA / "guard_manuals.txt"
"""More ordinary commands: common tools' documented usages, written for the corpus."""
ORDINARY_CORPORA = (ORDINARY, MANUALS)
DESTRUCTIVE = CORPORA / "guard_destructive.txt"
DESTRUCTIVE_TARGET = 0.99
SHOWN = 5
"""Refusals of one rule of the tldr-pages examples kept and shown (all of them with --all)."""
_WHY = {rule.name: rule.why for rule in RULES}


def load_corpus(path: Path) -> list[str]:
    """One command a line; "#" lines and blank lines skipped; a line ending in a backslash
    goes on with the next one (the backslash becomes a newline: heredocs, scripts)."""
    commands: list[str] = []
    pending: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        commands.append("\n".join([*pending, line]))
        pending = []
    if pending:
        raise ValueError(f"{path.name}: the last command ends in a backslash")
    return commands


def load_ordinary() -> list[str]:
    """Every ordinary command: guard_ordinary.txt, then guard_manuals.txt."""
    return [command for path in ORDINARY_CORPORA for command in load_corpus(path)]


def refusals(guard: Guard, commands: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
    """The commands the guard does not allow, by rule: (command, the guard's reason)."""
    by_rule: dict[str, list[tuple[str, str]]] = {}
    for command in commands:
        result = guard.check(command)
        if result.action != "allow":
            by_rule.setdefault(result.rule or "?", []).append((command, result.reason))
    return by_rule


def bash_accepts(command: str) -> bool:
    """Whether `bash -n` parses the command (bash must be installed)."""
    bash = shutil.which("bash")
    if bash is None:
        raise RuntimeError("bash is not installed: valid bash cannot be told from invalid")
    run = subprocess.run([bash, "-n", "-c", command], capture_output=True, timeout=10)
    return run.returncode == 0


def valid_parse_errors(by_rule: dict[str, list[tuple[str, str]]]) -> list[str]:
    """The parse-error refusals of commands bash accepts (target: none)."""
    return [c for c, _ in by_rule.get("parse-error", []) if bash_accepts(c)]


def _check_times(guard: Guard, commands: list[str]) -> list[int]:
    times = []
    for command in commands:
        start = time.perf_counter_ns()
        guard.check(command)
        times.append(time.perf_counter_ns() - start)
    return times


def _tldr(guard: Guard, timer: Guard, kept: int | None) -> dict[str, Any]:
    """The tldr-pages figures, with ``kept`` refusals of each rule (all: None; results.json
    keeps a few, the counts say how many there were); ``timer`` times the checks."""
    pages = tldr_pages()
    if pages is None:
        return {"skipped": f"${TLDR_ENV} names no tldr-pages checkout"}
    commands = tldr_commands(pages)
    by_rule = refusals(guard, commands)
    times = _check_times(timer, commands)
    return {
        "commands": len(commands),
        "refused": sum(map(len, by_rule.values())),
        "counts": {rule: len(found) for rule, found in by_rule.items()},
        "by_rule": {rule: found[:kept] for rule, found in by_rule.items()},
        "parse_errors_bash_accepts": valid_parse_errors(by_rule),
        "check_median_us": median(times) / 1000,
        "check_max_us": max(times) / 1000,
    }


def run_guard_bench(guard: Guard | None = None, kept: int | None = SHOWN) -> dict[str, Any]:
    """Both committed corpora, and the tldr-pages examples when $TLDR_PAGES is set (``kept``
    refusals of each rule listed; None: all)."""
    given, guard = guard, guard or Guard()
    ordinary, destructive = load_ordinary(), load_corpus(DESTRUCTIVE)
    started = time.perf_counter()
    by_rule = refusals(guard, ordinary)
    passed = [c for c in destructive if guard.check(c).action != "deny"]
    seconds = time.perf_counter() - started
    # what a check costs when its verdict is not remembered: the default guard without a cache
    timer = Guard(cache_entries=0) if given is None else given
    times = _check_times(timer, ordinary + destructive)
    return {
        "ordinary": len(ordinary),
        "ordinary_refused": [c for found in by_rule.values() for c, _ in found],
        "ordinary_by_rule": by_rule,
        "destructive": len(destructive),
        "destructive_refused": len(destructive) - len(passed),
        "destructive_not_denied": passed,
        "check_median_us": median(times) / 1000,
        "check_max_us": max(times) / 1000,
        "seconds": seconds,
        "tldr": _tldr(guard, timer, kept),
    }


def _by_rule_lines(
    by_rule: dict[str, list[tuple[str, str]]],
    counts: dict[str, int] | None = None,
    valid: int | None = None,
) -> list[str]:
    """Each rule's refusals, the rule's reason first; ``counts``: how many each rule refused,
    when ``by_rule`` lists only some; ``valid``: how many parse errors are of commands bash
    accepts, when that was checked."""
    counts = counts or {rule: len(found) for rule, found in by_rule.items()}
    lines = []
    for rule, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        why = _WHY.get(rule, "a configured rule")
        if rule == "parse-error" and valid is not None:
            why += f"; bash -n rejects {count - valid} of these {count} too"
        lines.append(f"    {rule} ({count}): {why}")
        found = by_rule.get(rule, [])
        lines += [f"      {command!r}: {reason}" for command, reason in found]
        if count > len(found):
            lines.append(f"      ... and {count - len(found)} more (python -m bench.guard --all)")
    return lines


def section(r: dict[str, Any]) -> str:
    share = r["destructive_refused"] / r["destructive"]
    ordinary_ok = "met" if not r["ordinary_refused"] else "MISSED"
    destructive_ok = "met" if share >= DESTRUCTIVE_TARGET else "MISSED"
    lines = [
        "Command guard corpora (default guard, tests/corpora)",
        f"  ordinary commands refused     {len(r['ordinary_refused']):>4} of {r['ordinary']:<4}"
        f"  target 0        {ordinary_ok}",
        f"  destructive commands refused  {r['destructive_refused']:>4} of {r['destructive']:<4}"
        f"  {share:6.1%}  target >= {DESTRUCTIVE_TARGET:.0%}  {destructive_ok}",
        f"  one check: median {r['check_median_us']:.0f} us, max {r['check_max_us']:.0f} us",
    ]
    lines += _by_rule_lines(r["ordinary_by_rule"])
    lines += [f"  not denied (destructive): {c!r}" for c in r["destructive_not_denied"]]
    tldr = r["tldr"]
    if "skipped" in tldr:
        lines.append(f"  tldr-pages examples: not measured ({tldr['skipped']})")
        return "\n".join(lines)
    valid = tldr["parse_errors_bash_accepts"]
    lines += [
        f"  tldr-pages examples refused   {tldr['refused']:>5} of {tldr['commands']:<6}"
        f"  {tldr['refused'] / tldr['commands']:6.1%}, by rule:",
        *_by_rule_lines(tldr["by_rule"], tldr["counts"], len(valid)),
        f"  tldr-pages parse errors of commands bash -n accepts  {len(valid)}  target 0  "
        + ("met" if not valid else "MISSED"),
        *(f"    {c!r}" for c in valid),
        f"  one check (tldr-pages): median {tldr['check_median_us']:.0f} us, "
        f"max {tldr['check_max_us']:.0f} us",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    results = run_guard_bench(kept=None if "--all" in sys.argv[1:] else SHOWN)
    print(section(results))
    if "--json" in sys.argv[1:]:
        print(json.dumps(results, indent=2))
