"""The command guard: may this shell command run?

The guard is friction, not the security boundary (the sandbox container is),
but it is meant to be hard to fool with shell tricks. It parses the command
with tree-sitter-bash (see ``parsing``), looks at every simple command
wherever it sits (lists, pipelines, subshells, ``if``/``for``/``case``,
functions, ``$(..)``, backticks, ``<(..)``, heredocs), sees through wrappers
(``env``, ``nohup``, ``nice``, ``timeout``, ``command``, ``exec``, ``xargs``,
``busybox``, ``find -exec`` ...) and re-parses code handed to another shell
(``sh -c``, ``bash -c``, ``eval``, ``watch``, heredocs and literal ``echo``
piped into a shell), up to ``max_depth`` levels.

Decision: the first deny wins; otherwise, if any part could not be parsed (or
hit a size/nesting limit), ``on_parse_error`` ("deny" or "ask", never allow);
otherwise the first "ask"; otherwise allow. A deny found in the parsable part
of an unparsable command still denies.

Built-in rules: ``rules.RULES``, the one table of names, categories, actions, what each
blocks and why (docs/policy-guard-rules.md renders it). The modules:

- ``parsing``: shell text to simple commands (tree-sitter-bash, words, expansion, ``cd``);
- ``invocations``: the programs a command runs, through wrappers;
- ``code``: code handed to a shell or interpreter, and what may feed it;
- ``checks`` and ``rules``: the built-in rules;
- ``paths``: where a removal lands;
- ``evaluation``: one check, walking the parsed command against the rules;
- ``checker``: ``Guard``, its configuration and ``check``; ``model``: its inputs and results.

Paths resolve against the directories a command may run in: the call's workdir (below the
workspace), then each ``cd`` (``parsing`` tracks them: ``cd build && rm -rf *`` is
build's contents, ``cd build; rm -rf *`` may be the root's). Code handed to another shell
starts where that shell runs, and ``env -C DIR`` (systemd-run, unshare ...) moves it.
``check``'s ``env`` setting HOME or CDPATH (or a command that sets them) makes ``~`` or
``cd NAME`` unknown. A removal through a symlink the command makes (``ln -s / r; rm -rf
r/*``) is refused; other symlinks are not followed: the container is the boundary there.

Files written earlier in the same command are followed: a file from curl/wget (``-o``,
``-O``, ``> f``, ``| tee f``) or from a decoder, run later (``sh f``, ``. f``, ``./f``), is
denied like ``curl | sh``; a file written with literal ``echo``/``cat <<EOF`` is checked
as the code it holds. Rules also look at arguments as they would be should the run-time
parts be empty (``rm $u-rf $u/``).

Pseudo-rules in results: ``parse-error`` and ``too-complex``.
"""

from stockade.supervisor.policy.guard.checker import Guard
from stockade.supervisor.policy.guard.model import GuardConfigError, GuardResult, GuardRule

__all__ = ["Guard", "GuardConfigError", "GuardResult", "GuardRule"]
