"""Shell set-up idioms: ``eval "$(X init ...)"`` of the tools that set up a shell that way.

``eval`` of a command substitution runs code nobody has read (rule ``eval-substitution``),
except when the substitution is one of these: one simple command, its program a bare name
or an absolute path, every word literal, no redirect but ``2>/dev/null``, the whole argument
of ``eval``, and its words fully matching a line of ``SETUP_IDIOMS``. Each line names a
set-up verb (``init``, ``hook``, ``activate``, ``env``, ``shellenv``, ``completion`` ...),
never a verb that runs another program (``pyenv exec``, ``direnv exec``, ``mise exec``,
``conda run``, ``ssh-agent CMD``). ``eval`` of downloaded or decoded text stays refused
(``eval "$(curl ..)"``, ``eval "$(echo .. | base64 -d)"``): no downloader or decoder is in
the list, and a pipeline, a list or a second substitution is never an idiom.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from stockade.supervisor.policy.guard.parsing import Command, Redirect, Word, basename

_MORE = r"(?: [\w.,:=/~+@%-]+)*"
"""Further literal words after the verb: shells, options, names, paths."""
_SHELL = r"(?:bash|zsh|sh|posix|fish|ksh)"
SETUP_IDIOMS: tuple[tuple[str, str], ...] = (
    ("pyenv init, pyenv virtualenv-init", rf"pyenv (?:init|virtualenv-init){_MORE}"),
    ("rbenv, nodenv, goenv, jenv, plenv, phpenv init",
     rf"(?:rbenv|nodenv|goenv|jenv|plenv|phpenv|luaenv|scalaenv|tfenv) init{_MORE}"),
    ("direnv hook", rf"direnv hook{_MORE}"),
    ("conda/mamba shell hook",
     rf"(?:conda|mamba) shell\.{_SHELL} hook{_MORE}|(?:micromamba|mamba|conda) shell hook{_MORE}"),
    ("mise/rtx activate", rf"(?:mise|rtx) activate{_MORE}"),
    ("zoxide, starship, atuin, mcfly, oh-my-posh, scmpuff init",
     rf"(?:zoxide|starship|atuin|mcfly|oh-my-posh|scmpuff) init{_MORE}"),
    ("fnm env", rf"fnm env{_MORE}"),
    ("ssh-agent", r"ssh-agent(?: -[scDk]+| -t \w+| -a [\w./~-]+| -E \w+)*"),
    ("keychain --eval", rf"keychain --eval{_MORE}"),
    ("brew shellenv", rf"brew shellenv{_MORE}"),
    ("dircolors", r"dircolors(?: -[bcp]+| --sh| --bourne-shell| --csh| --c-shell| [\w./~-]+)*"),
    ("minikube docker-env",
     rf"minikube(?: -p [\w.-]+| --profile[= ][\w.-]+)* (?:docker|podman)-env{_MORE}"),
    ("docker-machine env", rf"docker-machine env{_MORE}"),
    ("opam env", rf"opam (?:env|config env){_MORE}"),
    ("luarocks path", rf"luarocks path{_MORE}"),
    ("thefuck --alias", r"thefuck --alias(?: [\w-]+)?"),
    ("fzf --bash", r"fzf --(?:bash|zsh|fish)"),
    ("poetry env activate", r"poetry env activate"),
    ("a tool's shell completion",
     r"(?:kubectl|helm|kind|k3d|minikube|gh|glab|docker|podman|uv|uvx|rustup|poetry|pipx|pdm"
     r"|hatch|deno|bun|pnpm|npm|just|flux|argocd|istioctl|eksctl|doctl|kustomize|stern|velero)"
     rf" (?:completion|completions|generate-shell-completion)(?: -s| --shell)? {_SHELL}"),
    ("pip completion", rf"pip3? completion --{_SHELL}"),
    ("register-python-argcomplete", r"register-python-argcomplete [\w.-]+"),
)  # fmt: skip
"""(what, the words of the command, program basename first, as a regex they fully match)."""
_IDIOMS = re.compile("|".join(f"(?:{pattern})" for _, pattern in SETUP_IDIOMS))
_SUBSTITUTION = re.compile(r"\$\(.*\)|`.*`", re.DOTALL)
_QUIET = frozenset({"2>", "&>", ">"})


def _quiet(redirect: Redirect) -> bool:
    """``2>/dev/null``: the only redirect an idiom may have."""
    return redirect.op in _QUIET and [t.text for t in redirect.targets] == ["/dev/null"]


def setup_idiom(args: Sequence[Word]) -> bool:
    """Whether ``eval ARGS`` is a known shell set-up idiom (``eval "$(pyenv init -)"``)."""
    if args[:1] and args[0].text == "--":
        args = args[1:]
    if len(args) != 1 or len(args[0].subs) != 1:
        return False
    word, sub = args[0], args[0].subs[0]
    if not _SUBSTITUTION.fullmatch(word.text) or len(sub.commands) != 1:
        return False
    return _idiom_command(sub.commands[0])


def keeps_directory(args: Sequence[Word]) -> bool:
    """Whether ``eval ARGS`` leaves the directory where it was: a set-up idiom, but not
    zoxide's, which may redefine ``cd`` (``zoxide init --cmd cd``)."""
    return setup_idiom(args) and not any(
        c.words and basename(c.words[0].text) == "zoxide" for s in args[-1].subs for c in s.commands
    )


def _idiom_command(command: Command) -> bool:
    words = command.words
    if not words or any(w.dynamic or w.glob or w.subs for w in words):
        return False
    if any(not _quiet(r) for r in command.redirects):
        return False
    program = words[0].text
    if "/" in program and not program.startswith("/"):
        return False  # a relative path: a program of the workspace's own
    text = " ".join([basename(program), *(w.text for w in words[1:])])
    return _IDIOMS.fullmatch(text) is not None
