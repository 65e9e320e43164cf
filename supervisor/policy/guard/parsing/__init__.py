"""Shell text to normalized simple commands, for the command guard.

tree-sitter-bash gives the syntax tree; this module turns every simple command
in it into the words bash would pass to ``execve``, as far as that is knowable
without running anything:

- quotes are removed (``'..'``, ``".."``, ANSI-C ``$'..'``, ``$".."``),
  backslash escapes resolved and adjacent pieces joined (``r""m`` -> ``rm``);
- brace expansion is applied (``{rm,-rf,/}`` -> ``rm -rf /``) and ``$IFS``
  separates fields (``rm${IFS}-rf`` -> ``rm -rf``);
- variables assigned a literal earlier in the same script, and ``$(echo ..)``,
  ``$(printf ..)`` or ``$(cat <<EOF ..)`` substitutions, are replaced by their
  value;
- anything else only known at run time keeps its source text and marks the
  word ``dynamic``;
- each command carries the directories it may run in (``cwds``), relative to the
  script's start: ``cd build && rm -rf *`` runs ``rm`` in ``build`` only, ``cd build;
  rm -rf *`` in ``build`` or (should ``cd`` fail) the start. Subshells, pipeline stages
  and substitutions do not pass a ``cd`` on; a ``cd`` to a run-time value, in a loop or
  function, or ``eval``/``source``/``popd`` make the directory unknown (None).

Commands inside substitutions, subshells, compound statements, functions and
heredoc pipelines are all collected. When tree-sitter reports a syntax error,
a plain ``shlex`` tokenization is added so the guard can still find a deny.
Nothing here decides policy.
"""

from stockade.supervisor.policy.guard.parsing.expansion import (
    brace_expand,
    c_escapes,
    static_output,
)
from stockade.supervisor.policy.guard.parsing.script import parse_script
from stockade.supervisor.policy.guard.parsing.syntax import (
    MAX_BRACE_WORDS,
    MAX_BYTES,
    MAX_NESTING,
    MAX_NODES,
    MAX_PIPES,
    Command,
    Cwds,
    Redirect,
    Script,
    Sub,
    Word,
    basename,
)
from stockade.supervisor.policy.guard.parsing.trees import PARSE_SECONDS, Budget

__all__ = [
    "MAX_BRACE_WORDS",
    "MAX_BYTES",
    "MAX_NESTING",
    "MAX_NODES",
    "MAX_PIPES",
    "PARSE_SECONDS",
    "Budget",
    "Command",
    "Cwds",
    "Redirect",
    "Script",
    "Sub",
    "Word",
    "basename",
    "brace_expand",
    "c_escapes",
    "parse_script",
    "static_output",
]
