"""Where a removal lands, for the command guard: may this path be removed recursively? (And
where a `find` starts, and whether a name test narrows what it matches.)

The sandbox's workspace is the agent's: a recursive removal of anything below its root is
routine (``rm -rf build``, ``find dist -delete``), and so is one below the home directory
(``$HOME`` is /tmp in the sandbox) or /tmp. Everything else is refused: the workspace root
itself and the folders above it (``.``, ``/workspace``, ``build/../..``), ``/``, ``~``, /tmp
and every system folder, a glob that can match everything at one of those roots (``*``,
``.*``, ``./*``, ``/workspace/*``), and any path whose value is known only at run time
(``"$DIR"``, ``$(cmd)``, a relative path after ``cd "$X"``, paths ``xargs`` reads).

Paths are resolved lexically against the directories the command may run in (the call's
workdir, then each ``cd``; see ``parsing``). Symlinks are not followed: the guard
cannot know them (``rm -rf link/`` where ``link`` points at /etc passes). The container is
the boundary there: system folders are read-only to the sandbox's user. The one link it
knows is the sandbox image's /home/user, the workspace (E2B's default user's home).
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from stockade.supervisor.policy.guard.parsing import Cwds, Word

__all__ = [
    "Place",
    "find_narrowed",
    "find_root_may_match",
    "find_root_span",
    "given_home",
    "known_prefix",
    "link_paths",
    "moved",
    "removal_problem",
    "resolve_cwds",
]

SCRATCH = "/tmp"
IMAGE_HOME = "/home/user"
"""A symlink to /workspace in the sandbox image: paths below it are the workspace's."""
IMAGE_WORKSPACE = "/workspace"

_HOME = re.compile(r"^(?:~|\$HOME|\$\{HOME\})(?=/|$)")
_PWD = re.compile(r"^(?:\$PWD|\$\{PWD\}|\$\(pwd\)|`pwd`)(?=/|$)")
_RUNTIME = re.compile(r"[$`]")
_GLOB = re.compile(r"[*?\[]|[@!+](?=\()")
_EXTGLOB = re.compile(r"[@!+*?]\(")
_WILDCARDS = re.compile(r"\[[^\]]*\]|[*?]")
_FIND_NAMES = frozenset({"-name", "-iname", "-path", "-ipath", "-wholename", "-iwholename"})
_FIND_NAMES |= {"-regex", "-iregex", "-lname", "-ilname"}
_FIND_OPTIONS = frozenset({"-H", "-L", "-P"})  # before the roots; also -D debug, -Olevel
_ANY_NAME = re.compile(r"\[[^\]]*\]|[*?/.^$+\\]")  # a pattern only of these matches anything
_NARROW_CHARS = 2  # literal characters (besides dots) a glob at a root must have


@dataclass(frozen=True)
class Place:
    """Where a program runs: the absolute directories it may run in (None: unknown), the
    workspace root, the home directory (None: the command may have changed HOME), and
    whether its operands are read at run time (``xargs rm -rf``)."""

    cwds: tuple[str, ...] | None = None
    workspace: str = "/workspace"
    home: str | None = None
    fed: bool = False
    links: tuple[str, ...] = ()  # symlinks the command itself makes

    @property
    def roots(self) -> tuple[str, ...]:
        """Folders whose contents may be removed, though not the folders themselves."""
        return tuple(r for r in (self.workspace, self.home, SCRATCH) if r)


def resolve_cwds(base: tuple[str, ...] | None, cwds: Cwds, home: str | None) -> Cwds:
    """Absolute directories from a command's ``cwds`` (relative to its script's start)."""
    if base is None or cwds is None:
        return None
    found: list[str] = []
    for cwd in cwds:
        if cwd.startswith("~"):
            if home is None:
                return None
            found.append(_absolute(home + cwd[1:]))
        else:
            found.extend(_absolute(posixpath.join(b, cwd)) for b in base)
    return tuple(dict.fromkeys(found))


def link_paths(word: Word, place: Place) -> list[str]:
    """Where a symlink named ``word`` lands (nothing when that is not known)."""
    paths = _absolute_paths(word, place)
    return [] if isinstance(paths, str) else paths


def moved(place: Place, directory: Word) -> Place:
    """Where a command runs after a wrapper changed directory (``env -C DIR``)."""
    paths = _absolute_paths(directory, place)
    return replace(place, cwds=None if isinstance(paths, str) or not paths else tuple(paths))


def removal_problem(word: Word, place: Place, *, root_ok: bool = False) -> str | None:
    """Why removing ``word`` recursively would reach beyond routine cleanup, or None.
    ``root_ok``: the roots themselves may be named (``find . -name '*.pyc' -delete``)."""
    paths = _absolute_paths(word, place)
    if isinstance(paths, str):
        return paths
    for path in paths:
        problem = _path_problem(path, place, root_ok=root_ok)
        if problem:
            return problem
    return None


def image_problem(word: Word, place: Place) -> str | None:
    """Why a filesystem maker may not write ``word``: only a file below the workspace is an
    image it may make (not a device, nothing outside, not a run-time path or folder)."""
    paths = _absolute_paths(word, place)
    if isinstance(paths, str):
        return paths
    for path in paths:
        if any(_through(path, link) for link in place.links):
            return f"a path through a symlink the command makes ({path})"
        if not _below(path, place.workspace):
            return f"a path outside the workspace ({path})"
    return None


def find_root_may_match(argv: Sequence[str], root: str) -> bool:
    """Can ``find ROOT ... -exec`` hand the root itself to the command? Not with
    ``-mindepth 1`` or a ``-name`` test the root's name fails (and no ``-o``/``!``)."""
    if any(t in ("-o", "-or", "!", "-not", ",") for t in argv):
        return True
    for i, text in enumerate(argv[:-1]):
        if text == "-mindepth" and argv[i + 1].isdigit() and int(argv[i + 1]) >= 1:
            return False
    name = posixpath.basename(root.rstrip("/")) or root[:1]
    for i, text in enumerate(argv[:-1]):
        if text == "-name" and not fnmatch.fnmatchcase(name, argv[i + 1]):
            return False
        if text == "-iname" and not fnmatch.fnmatch(name.lower(), argv[i + 1].lower()):
            return False
    return True


def known_prefix(text: str) -> bool:
    """``$HOME/x``, ``$PWD/x``, ``$(pwd)/x``: run-time only in a part the guard knows."""
    match = _HOME.match(text) or _PWD.match(text)
    return match is not None and not _RUNTIME.search(text[match.end() :])


def find_narrowed(argv: list[str]) -> bool:
    """Does a name or path test (or -empty) narrow what find matches? Not ``-name '*'``,
    not one that ``!``, ``-not`` or an ``-o`` with another kind of test can undo."""
    if any(t in ("!", "-not", ",") for t in argv):
        return False
    narrowed, groups = False, [[False, True]]  # per open group: has -o, only name tests
    for i, text in enumerate(argv):
        previous = argv[i - 1] if i else ""
        if previous in _FIND_NAMES:
            continue  # the pattern
        if text == "(":
            groups.append([False, True])
        elif text == ")" and len(groups) > 1:
            has_or, only_names = groups.pop()
            if has_or and not only_names:
                return False
        elif text in ("-o", "-or"):
            if len(groups) == 1:
                return False
            groups[-1][0] = True
        elif (
            text in _FIND_NAMES and i + 1 < len(argv) and _ANY_NAME.sub("", argv[i + 1])
        ) or text == "-empty":
            narrowed = True
        elif text not in ("-a", "-and"):
            groups[-1][1] = False
    return narrowed


def find_root_span(argv: list[str]) -> tuple[int, int]:
    """Where the roots are: after -H/-L/-P/-D x/-O3, up to the first test or action."""
    start = 0
    while start < len(argv) and (argv[start] in _FIND_OPTIONS or argv[start][:2] in ("-O", "-D")):
        start += 2 if argv[start] == "-D" else 1
    end = start
    while end < len(argv) and not argv[end].startswith(("-", "(", "!")):
        end += 1
    return min(start, len(argv)), end


def _absolute_paths(word: Word, place: Place) -> list[str] | str:
    text = word.text
    bases: tuple[str, ...] | None
    if match := _HOME.match(text):
        if place.home is None:
            return "a path in a home directory the command may have changed"
        bases, rest = (place.home,), text[match.end() :]
    elif match := _PWD.match(text):
        bases, rest = place.cwds, text[match.end() :]
    elif text.startswith("~"):
        return f"a path in another user's home directory or the directory stack ({_short(text)})"
    elif text.startswith("/"):
        bases, rest = ("/",), text
    else:
        bases, rest = place.cwds, text
    if word.dynamic and _RUNTIME.search(rest):
        return f"a path known only at run time ({_short(text)})"
    if bases is None:
        return f"a relative path ({_short(text)}) in a directory known only at run time"
    if not text:
        return []
    return [_absolute(b + "/" + rest) for b in bases]


def _path_problem(path: str, place: Place, *, root_ok: bool) -> str | None:
    for link in place.links:
        if _through(path, link):
            return f"a path through a symlink the command makes ({link})"
    parts = path.split("/")
    glob_at = next((i for i, part in enumerate(parts) if _GLOB.search(part)), None)
    directory = path if glob_at is None else "/".join(parts[:glob_at]) or "/"
    roots = place.roots
    if any(_below(directory, root) for root in roots):
        return None
    if directory in roots:
        if glob_at is None:
            return None if root_ok else _root_name(directory, place)
        if root_ok or glob_at < len(parts) - 1 or _narrow(parts[glob_at]):
            return None
        return f"a glob that can match everything in {directory} ({parts[glob_at]})"
    if directory == place.workspace or _below(place.workspace, directory):
        return f"the workspace root or a folder above it ({path})"
    return f"a path outside the workspace ({path})"


def _through(path: str, link: str) -> bool:
    """Is ``path`` the link or below it (a glob segment may match the link's name)?"""
    links, parts = link.split("/"), path.split("/")
    return len(parts) >= len(links) and all(
        fnmatch.fnmatchcase(name, part) for name, part in zip(links, parts, strict=False)
    )


def _root_name(directory: str, place: Place) -> str:
    if directory == place.workspace:
        return f"the workspace root ({directory})"
    return f"the home or temporary directory itself ({directory})"


def _narrow(segment: str) -> bool:
    """Does a glob name few enough entries to be a cleanup (``*.egg-info``, not ``.*``)?"""
    if _EXTGLOB.search(segment):
        return False
    literal = _WILDCARDS.sub("", segment).replace(".", "")
    return len(literal) >= _NARROW_CHARS


def _below(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/") and path != root


def _absolute(path: str) -> str:
    path = posixpath.normpath("/" + path.lstrip("/"))
    if path == IMAGE_HOME or path.startswith(IMAGE_HOME + "/"):
        return IMAGE_WORKSPACE + path[len(IMAGE_HOME) :]
    return path


def given_home(value: str, workspace: str) -> str | None:
    """The home directory a call's env sets (HOME=...), when the guard can trust it: an
    absolute path known before the command runs, in the workspace or /tmp (a home is a
    root whose contents may be removed: HOME=/etc must not make /etc/* routine)."""
    if not value.startswith("/") or _RUNTIME.search(value):
        return None
    home = _absolute(value)
    for root in (workspace, SCRATCH):
        if home == root or home.startswith(root + "/"):
            return home
    return None


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
