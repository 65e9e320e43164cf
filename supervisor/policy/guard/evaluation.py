"""One ``Guard.check``: walks the parsed command against the rules.

It checks every simple command and every invocation in it (``rules.RULES``), follows code
handed to another shell or interpreter (up to the guard's ``max_depth``), looks at what feeds
a shell or interpreter its code (pipelines, ``<(..)``, ``>(..)``, files written earlier in the
same command), learns the directories commands run in (the workdir, ``cd``, ``env -C``) and
whether HOME or CDPATH may have changed, and stops at the first deny.

It reads the guard's configuration through ``GuardSettings``, which checker.py's ``Guard``
makes once; it never imports checker.py (which imports it)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NoReturn

from stockade.supervisor.policy.guard.code import (
    Code,
    code_of,
    download_targets,
    embedded_commands,
    is_decoder,
    producer_of,
    stdin_body,
)
from stockade.supervisor.policy.guard.idioms import keeps_directory
from stockade.supervisor.policy.guard.invocations import (
    Inv,
    invocations_of,
    norm_path,
    operand_texts,
    operand_words,
    option_flags,
    shorten,
)
from stockade.supervisor.policy.guard.model import GuardResult, GuardRule
from stockade.supervisor.policy.guard.parsing import (
    Budget,
    Command,
    Cwds,
    Script,
    Sub,
    Word,
    basename,
    parse_script,
    static_output,
)
from stockade.supervisor.policy.guard.paths import (
    Place,
    given_home,
    known_prefix,
    link_paths,
    removal_problem,
    resolve_cwds,
)
from stockade.supervisor.policy.guard.rules import ON_COMMAND, ON_INVOCATION
from stockade.supervisor.policy.guard.vocabulary import DEV_NET, DOWNLOADERS, NETCATS, SHELLS

_CANDIDATES = ("rm", "find", "dd", "chmod", "chown", "nc", "socat")
_SETS_HOME = re.compile(r"(?<![$\w{])HOME\b")
_REVERSE_SHELL = (
    re.compile(r"socket|fsockopen|IO::Socket|net\.connect|new\s+net\.Socket", re.IGNORECASE),
    re.compile(r"connect|TCPSocket|fsockopen|IO::Socket::INET|PeerAddr", re.IGNORECASE),
    re.compile(r"subprocess|pty|spawn|exec|dup2|popen|system|child_process|/bin/\w*sh\b"),
)
_FORK_LOOP = re.compile(
    r"\bwhile\b[^\n]*\bfork\b|\bfork\b[^\n]*\b(?:while|iter\s*\(|count\s*\(|repeat\s*\()"
    r"|\bloop\s*\{\s*fork|\bfor\s*\(\s*;\s*;\s*\)[^\n]*\bfork"
)
_RMTREE = re.compile(
    r"\b(?:rmtree|rm_rf|rm_r|remove_tree|rmSync|rimraf|removeSync|emptyDirSync)\s*\(\s*"
    r"(?P<q>['\"])(?P<path>[^'\"]*)(?P=q)"
)
_MAX_EMBEDDED = 32


@dataclass(frozen=True, slots=True)
class GuardSettings:
    """What an evaluation reads of its ``Guard``: the configuration, checked by the guard."""

    workspace: str
    """The sandbox's workspace root (absolute, normalised)."""
    home: str
    """Its $HOME (absolute, normalised)."""
    extra: tuple[tuple[GuardRule, re.Pattern[str]], ...]
    """The configured deny rules, compiled."""
    max_depth: int
    """How deep code handed to another shell or interpreter is followed."""
    on_parse_error: Literal["deny", "ask"]


class Decided(Exception):
    def __init__(self, result: GuardResult) -> None:
        super().__init__(result.reason)
        self.result = result


class Evaluation:
    """State of one ``Guard.check`` call; raises ``Decided`` on the first deny."""

    def __init__(
        self, settings: GuardSettings, base: tuple[str, ...] | None, env: Mapping[str, str]
    ) -> None:
        self.settings = settings
        self.base = base  # absolute directories the script being walked starts in
        home = given_home(env["HOME"], settings.workspace) if "HOME" in env else settings.home
        self.home: str | None = home
        self.cdpath = "CDPATH" in env
        self.links: dict[str, None] = {}  # symlinks the command makes (absolute paths)
        self.asked: GuardResult | None = None
        self.unparsed: tuple[str, str] | None = None  # (pseudo-rule, why)
        self.cache: dict[int, tuple[Command, list[Inv]]] = {}
        self.budget = Budget()
        self.written: dict[str, tuple[str, str] | str] = {}  # file -> (rule, what) or content
        self.checkpoint = ""  # the first checkpoint rule that matched

    def deny(self, rule: str, what: str) -> NoReturn:
        reason = f"{what} is blocked by rule {rule}"
        raise Decided(GuardResult("deny", rule, reason, self.unparsed is not None))

    def ask(self, rule: str, what: str) -> None:
        if self.asked is None:
            self.asked = GuardResult("ask", rule, f"{what}; needs approval (rule {rule})")

    def note_unparsed(self, rule: str, why: str) -> None:
        if self.unparsed is None:
            self.unparsed = (rule, why)

    def finish(self) -> GuardResult:
        if self.unparsed is None:
            found = self.asked or GuardResult("allow", None, "no rule matched")
            return replace(found, checkpoint=self.checkpoint) if self.checkpoint else found
        rule, why = self.unparsed
        action = self.settings.on_parse_error
        outcome = "blocked" if action == "deny" else "held for approval"
        return GuardResult(action, rule, f"{why}; not checkable, so {outcome} (rule {rule})", True)

    def invocations(self, command: Command) -> list[Inv]:
        cached = self.cache.get(id(command))
        if cached is None or cached[0] is not command:
            place = self.place(command.cwds)
            cached = self.cache[id(command)] = (command, invocations_of(command, place))
        return cached[1]

    def place(self, cwds: Cwds = ("",)) -> Place:
        """Where a command that runs in ``cwds`` (relative to the script's start) runs."""
        return _place(self.base, cwds, self.settings.workspace, self.home, tuple(self.links))

    def parse(self, text: str, positional: Sequence[str] | None = ()) -> Script:
        """Parse shell text; a text that may set HOME or CDPATH makes them unknown."""
        if _SETS_HOME.search(text):
            self.home = None
        self.cdpath |= "CDPATH" in text
        return parse_script(
            text,
            positional=positional,
            budget=self.budget,
            cdpath=self.cdpath,
            keeps_dir=keeps_directory,
        )

    def sub_invocations(self, sub: Sub) -> list[Inv]:
        return [inv for command in sub.commands for inv in self.invocations(command)]

    # walking ----------------------------------------------------------------------

    def script(self, script: Script, depth: int) -> None:
        if script.error:
            self.note_unparsed("too-complex" if script.too_complex else "parse-error", script.error)
        for name in script.fork_bombs:
            if name == "while":
                self.deny("fork-bomb", "fork bomb (endless loop that starts background processes)")
            self.deny("fork-bomb", f"fork bomb (function {name!r} calls itself concurrently)")
        for command in script.commands:
            self.note_links(command)
        for previous, command in zip((None, *script.commands), script.commands, strict=False):
            self.note_written(command, previous)
        for stages in script.pipelines:
            self.note_teed(stages)
        for command in script.commands:
            self.command(command, depth)
        for stages in script.pipelines:
            self.pipeline(stages, depth)

    def command(self, command: Command, depth: int) -> None:
        for name, on_command in ON_COMMAND:
            what = on_command(command)
            if what:
                self.deny(name, what)
        for inv in self.invocations(command):
            self.invocation(inv, depth)
        for reader in self.output_readers(command):  # `curl x > >(sh)`
            self.upstream(self.invocations(command), reader.name)

    def output_readers(self, command: Command) -> list[Inv]:
        """Interpreters reading their code from an output process substitution ``>(..)``."""
        words = [*command.words, *(t for r in command.redirects for t in r.targets)]
        subs = [s for w in words for s in w.subs if s.kind == ">("]
        invs = [inv for sub in subs for inv in self.sub_invocations(sub)]
        return [inv for inv in invs if (code := code_of(inv)) and code.stdin]

    def invocation(self, inv: Inv, depth: int) -> None:
        for name, on_invocation in ON_INVOCATION:
            what = on_invocation(inv)
            if what:
                self.deny(name, what)
        if any(a.bare is not None for a in inv.args):  # `rm $u-rf $u/`: $u may be empty
            args = tuple(
                a if a.bare is None or known_prefix(a.text) else Word(a.bare, dynamic=True)
                for a in inv.args
            )
            bare = replace(inv, args=tuple(a for a in args if a.text))
            for name, on_invocation in ON_INVOCATION:
                what = on_invocation(bare)
                if what:
                    self.deny(name, f"{what}, should its run-time parts be empty")
        self.config_rules(inv)
        code = code_of(inv)
        if code is not None:
            self.code(inv, code, depth)
        self.run_written(inv, code, depth)
        if inv.word.dynamic or inv.word.glob:
            self.dynamic(inv)

    # files written earlier in the same command, then run -----------------------------

    def note_written(self, command: Command, previous: Command | None) -> None:
        """``curl -o f URL``, ``base64 -d > f``, ``echo 'code' > f``: remember what f holds.
        ``a | b > f`` and ``{ a; } > f`` come as a command with no words after ``b``/``a``."""
        source = previous if not command.words and previous is not None else command
        invs = self.invocations(source)
        producer = producer_of(invs)
        kept = tuple(r for r in source.redirects if ">" not in r.op)
        content = static_output(replace(source, redirects=kept))
        for inv in invs:
            for path in download_targets(inv):
                self.written[norm_path(path)] = (
                    "remote-code-exec",
                    f"file downloaded by {inv.name}",
                )
        for redirect in command.redirects:
            if redirect.op in (">", ">>", ">|", "&>", "&>>") and redirect.targets:
                path = norm_path(redirect.targets[0].text)
                if producer is not None:
                    self.written[path] = producer
                elif content is not None:
                    self.written[path] = content

    def note_links(self, command: Command) -> None:
        """``ln -s / x``: a removal through x later in the command is refused (the guard
        follows no symlink, but it can see the ones the command makes)."""
        words = command.words
        if not words or basename(words[0].text) != "ln":
            return
        args = words[1:]
        if not option_flags(args, ("--symbolic",)) & {"s", "--symbolic"}:
            return
        operands = operand_words(args)
        names = [operands[-1]] if len(operands) > 1 else []
        names += [Word(posixpath.basename(o.text.rstrip("/")) or "root") for o in operands[:1]]
        place = Place(resolve_cwds(self.base, command.cwds, self.home), self.settings.workspace)
        for name in names:
            self.links.update(dict.fromkeys(link_paths(name, place)))

    def note_teed(self, stages: tuple[tuple[Command, ...], ...]) -> None:
        """``curl URL | tee f``."""
        producer: tuple[str, str] | None = None
        for stage in stages:
            invs = [inv for command in stage for inv in self.invocations(command)]
            for inv in invs:
                if producer is not None and inv.program == "tee":
                    for path in operand_texts(inv.args):
                        self.written[norm_path(path)] = producer
            producer = producer or producer_of(invs)

    def run_written(self, inv: Inv, code: Code | None, depth: int) -> None:
        """A file noted by ``note_written`` run as a program or script."""
        paths = [code.operand.text] if code is not None and code.operand is not None else []
        if "/" in inv.word.text:
            paths.append(inv.word.text)
        for path in paths:
            held = self.written.get(norm_path(path))
            if isinstance(held, tuple):
                rule, what = held
                self.deny(rule, f"{what} ({path}) run as code by {inv.name}")
            if isinstance(held, str):
                with self.running_in(inv):
                    self.source(code.lang if code is not None else "sh", held, depth)

    def config_rules(self, inv: Inv) -> None:
        if not self.settings.extra:
            return
        text = " ".join([inv.name, *inv.argv])
        for rule, regex in self.settings.extra:
            if rule.checkpoint:
                if not self.checkpoint and regex.search(text):
                    self.checkpoint = rule.name
                continue
            if regex.search(text):
                self.deny(rule.name, rule.reason or f"{shorten(text)!r} matches {rule.pattern!r}")

    @contextlib.contextmanager
    def running_in(self, inv: Inv) -> Iterator[None]:
        """Code ``inv`` runs starts in the directories ``inv`` runs in."""
        saved, self.base = self.base, inv.place.cwds
        try:
            yield
        finally:
            self.base = saved

    def code(self, inv: Inv, code: Code, depth: int) -> None:
        with self.running_in(inv):
            self.fed_code(inv, code, depth)

    def fed_code(self, inv: Inv, code: Code, depth: int) -> None:
        body = stdin_body(inv.command) if code.stdin else None
        fed = [w for w in (code.inline, code.operand, body) if w is not None]
        if code.stdin:
            redirects = inv.command.redirects
            fed += [
                t for r in redirects if r.op.startswith("<") and r.stdin is None for t in r.targets
            ]
        for word in fed:
            for sub in word.subs:
                self.upstream(self.sub_invocations(sub), inv.name)
        for source in (code.inline, body):
            if source is not None:
                self.source(code.lang, source.text, depth, positional=code.positional)

    def source(
        self,
        lang: str,
        text: str,
        depth: int,
        *,
        strict: bool = True,
        positional: Sequence[str] | None = (),
    ) -> None:
        if lang == "script":
            self.script_code(text, depth)
        elif depth >= self.settings.max_depth:
            self.note_unparsed("too-complex", f"shell code nested more than {depth} levels deep")
        else:
            script = self.parse(text, positional)
            self.script(script if strict else replace(script, error=None), depth + 1)

    def script_code(self, text: str, depth: int) -> None:
        if DEV_NET.search(text):
            self.deny("dev-tcp", "network socket through /dev/tcp or /dev/udp")
        if all(p.search(text) for p in _REVERSE_SHELL):
            self.deny("script-reverse-shell", "inline code that connects a socket to a shell")
        if _FORK_LOOP.search(text):
            self.deny("fork-bomb", "fork bomb (fork in a loop)")
        for match in _RMTREE.finditer(text):
            problem = removal_problem(Word(match.group("path")), self.place())
            if problem:
                self.deny("destructive-rm", f"inline code that removes {problem}")
        for embedded in itertools.islice(embedded_commands(text), _MAX_EMBEDDED):
            self.source("sh", embedded, depth, strict=False)

    def upstream(self, producers: list[Inv], consumer: str) -> None:
        """Deny when a downloader, decoder or socket feeds code to ``consumer``."""
        for inv in producers:
            if inv.program in DOWNLOADERS:
                self.deny("remote-code-exec", f"output of {inv.name} run as code by {consumer}")
        for inv in producers:
            if is_decoder(inv):
                self.deny("decode-to-shell", f"decoded data ({inv.name}) run as code by {consumer}")
        for inv in producers:
            if inv.program in NETCATS:
                self.deny("netcat-shell", f"network data ({inv.name}) run as code by {consumer}")

    def pipeline(self, stages: tuple[tuple[Command, ...], ...], depth: int) -> None:
        invs = [[inv for c in stage for inv in self.invocations(c)] for stage in stages]
        for i, stage in enumerate(invs):
            readers = [(inv, code) for inv in stage if (code := code_of(inv)) and code.stdin]
            if any(inv.program in ("xargs", "parallel") for inv in stage[:1]):  # stdin -> argv
                readers += [(inv, code) for inv in stage[1:] if (code := code_of(inv))]
            if not readers:
                continue
            self.upstream([inv for earlier in invs[:i] for inv in earlier], readers[0][0].name)
            output = static_output(stages[i - 1][0]) if i and len(stages[i - 1]) == 1 else None
            if output is not None:  # `echo 'rm -rf /' | sh`: check what the shell reads
                for reader, code in readers:
                    with self.running_in(reader):
                        self.source(code.lang, output, depth)
        programs = {inv.program for stage in invs for inv in stage}
        if programs & SHELLS and programs & NETCATS:
            self.deny("netcat-shell", "shell connected to a network socket by a pipeline")

    def dynamic(self, inv: Inv) -> None:
        for sub in inv.word.subs:
            self.upstream(self.sub_invocations(sub), shorten(inv.word.text))
        for candidate in _CANDIDATES:
            probe = replace(inv, program=candidate)
            for _, on_invocation in ON_INVOCATION:
                what = on_invocation(probe)
                if what:
                    self.deny(
                        "dynamic-command",
                        f"run-time command name {shorten(inv.word.text)!r} with arguments that "
                        f"would be destructive for {candidate} ({what})",
                    )
        self.ask(
            "dynamic-command", f"command name {shorten(inv.word.text)!r} is known only at run time"
        )


@functools.lru_cache(maxsize=512)
def _place(
    base: tuple[str, ...] | None,
    cwds: Cwds,
    workspace: str,
    home: str | None,
    links: tuple[str, ...],
) -> Place:
    """Places repeat (the same few directories in every check): built once."""
    return Place(resolve_cwds(base, cwds, home), workspace, home, links=links)
