"""Words without a syntax tree: segments joined into fields (``$IFS`` splitting, brace
expansion, globs), backslash and ANSI-C escapes, and what ``echo``/``printf``/``cat <<EOF``
print."""

from __future__ import annotations

import itertools
import re

from stockade.supervisor.policy.guard.parsing.syntax import (
    MAX_BRACE_WORDS,
    Command,
    Sub,
    Word,
    basename,
)

LIT, QUOTED, EXPANDED, DYN, SPLIT = range(5)
Seg = tuple[str, int]
GLOB = re.compile(r"[*?\[]")
_BACKSLASH = re.compile(r"\\(.)", re.DOTALL)
_DQUOTE_ESCAPE = re.compile(r'\\([$`"\\\n])')
_C_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}|[0-7]{1,3}|c.|.)")
_C_SIMPLE = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r"}
_C_SIMPLE |= {"t": "\t", "v": "\v"}
_PRINTF_CONV = re.compile(r"%[%sb]")
_SEQUENCE = re.compile(r"(-?\d+|[a-zA-Z])\.\.(-?\d+|[a-zA-Z])(?:\.\.(-?\d+))?")
_PROTECT = str.maketrans("{},.", "\ue000\ue001\ue002\ue003")
_UNPROTECT = str.maketrans("\ue000\ue001\ue002\ue003", "{},.")


def static_output(command: Command) -> str | None:
    """What ``echo``/``printf`` of literals, or ``cat <<EOF``, writes to stdout."""
    words = command.words
    if not words or any(w.dynamic for w in words) or any(">" in r.op for r in command.redirects):
        return None
    program, args = basename(words[0].text), [w.text for w in words[1:]]
    if program == "echo":
        return _echo(args)
    if program == "printf":
        return _printf(args)
    stdin = next((r.stdin for r in reversed(command.redirects) if r.stdin), None)
    if program == "cat" and not args and stdin is not None and not stdin.dynamic:
        return stdin.text
    return None


def c_escapes(text: str) -> str:
    """Resolve backslash escapes as ``$'..'``, ``echo -e`` and ``printf`` do."""
    return _C_ESCAPE.sub(_c_escape, text) if "\\" in text else text


def _c_escape(match: re.Match[str]) -> str:
    code = match.group(1)
    head = code[0]
    if head in "xuU" and len(code) > 1:
        return chr(min(int(code[1:], 16), 0x10FFFF))
    if head in "01234567":  # not isdigit(): \8, \9 and other digits escape nothing
        return chr(int(code, 8))
    if head == "c" and len(code) == 2:
        return chr(ord(code[1]) & 0x1F)
    return _C_SIMPLE.get(code, code)


def unescape_word(text: str) -> list[Seg]:
    if "\\" not in text:
        return [(text, LIT)]
    out: list[Seg] = []
    pos = 0
    for match in _BACKSLASH.finditer(text):
        if match.start() > pos:
            out.append((text[pos : match.start()], LIT))
        if match.group(1) != "\n":
            out.append((match.group(1), QUOTED))
        pos = match.end()
    if pos < len(text):
        out.append((text[pos:], LIT))
    return out


def dquote(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    return _DQUOTE_ESCAPE.sub(lambda m: "" if m.group(1) == "\n" else m.group(1), text)


def fields(segs: list[Seg], subs: tuple[Sub, ...]) -> list[Word]:
    groups: list[list[Seg]] = [[]]
    for seg in segs:
        if seg[1] != SPLIT:
            groups[-1].append(seg)
        elif groups[-1]:
            groups.append([])
    words: list[Word] = []
    for group in groups:
        if group:
            words.extend(_field_words(group, subs))
    return words


def _field_words(group: list[Seg], subs: tuple[Sub, ...]) -> list[Word]:
    dynamic = any(k == DYN for _, k in group)
    glob = any(k in (LIT, EXPANDED) and GLOB.search(s) for s, k in group)
    if not any(k == LIT and "{" in s for s, k in group):
        bare = "".join(s for s, k in group if k != DYN) if dynamic else None
        return [Word("".join(s for s, _ in group), dynamic, glob, subs, bare)]
    masked = "".join(s if k == LIT else s.translate(_PROTECT) for s, k in group)
    texts = brace_expand(masked)
    if texts is None:  # too many words: keep it, but do not trust it
        texts, dynamic = [masked], True
    return [Word(t.translate(_UNPROTECT), dynamic, glob, subs) for t in texts]


def brace_expand(word: str) -> list[str] | None:
    """Bash brace expansion; None when it would make more than MAX_BRACE_WORDS words."""
    done: list[str] = []
    pending = [word]
    while pending:
        current = pending.pop()
        group = _brace_group(current)
        if group is None:
            done.append(current)
        else:
            i, j, parts = group
            pending.extend(current[:i] + p + current[j + 1 :] for p in reversed(parts))
        if len(done) + len(pending) > MAX_BRACE_WORDS:
            return None
    return done


def _brace_group(word: str) -> tuple[int, int, list[str]] | None:
    start = 0
    while (i := word.find("{", start)) >= 0:
        depth, cuts, j = 0, [i], -1
        for k in range(i, len(word)):
            if word[k] == "{":
                depth += 1
            elif word[k] == "}":
                depth -= 1
                if depth == 0:
                    j = k
                    break
            elif word[k] == "," and depth == 1:
                cuts.append(k)
        if j < 0:
            return None
        if len(cuts) > 1:
            cuts.append(j)
            return i, j, [word[a + 1 : b] for a, b in itertools.pairwise(cuts)]
        sequence = _sequence(word[i + 1 : j])
        if sequence is not None:
            return i, j, sequence
        start = i + 1
    return None


def _sequence(inner: str) -> list[str] | None:
    match = _SEQUENCE.fullmatch(inner)
    if match is None:
        return None
    first, last, step_text = match.groups()
    step = abs(int(step_text or "1")) or 1
    if first.lstrip("-").isdigit() and last.lstrip("-").isdigit():
        a, b = int(first), int(last)
        values = range(a, b + 1, step) if a <= b else range(a, b - 1, -step)
        return [str(v) for v in values] if len(values) <= MAX_BRACE_WORDS else None
    if first.isalpha() and last.isalpha():
        a, b = ord(first), ord(last)
        letters = range(a, b + 1, step) if a <= b else range(a, b - 1, -step)
        return [chr(c) for c in letters]
    return None


def _echo(args: list[str]) -> str:
    escapes = False
    while args and re.fullmatch(r"-[neE]+", args[0]):
        escapes = "e" in args[0]
        args = args[1:]
    text = " ".join(args)
    return c_escapes(text) if escapes else text


def _printf(args: list[str]) -> str | None:
    if args and args[0] == "--":
        args = args[1:]
    if not args or args[0].startswith("-") or re.search(r"%(?![%sb])", args[0]):
        return None
    fmt, values = args[0], args[1:]
    slots = len([m for m in _PRINTF_CONV.findall(fmt) if m != "%%"])
    rounds = [values[i : i + slots] for i in range(0, len(values), slots)] if slots else []
    return "".join(_printf_round(fmt, chunk) for chunk in rounds or [[]])


def _printf_round(fmt: str, values: list[str]) -> str:
    supply = iter(values)
    pieces = _PRINTF_CONV.split(fmt)
    convs = _PRINTF_CONV.findall(fmt)
    out = [c_escapes(pieces[0])]
    for conv, piece in zip(convs, pieces[1:], strict=True):
        if conv == "%%":
            out.append("%")
        else:
            value = next(supply, "")
            out.append(c_escapes(value) if conv == "%b" else value)
        out.append(c_escapes(piece))
    return "".join(out)
