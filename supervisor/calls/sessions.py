"""Shell sessions as the supervisor knows them (the state itself lives in the sandbox, kept
by its agent: sandbox_image/agent/shells.py).

For each (key, session) the book keeps the container the session lives in and the folder its
last call ended in: the guard judges the next call from that folder (so `cd /` in one call
and `rm -rf *` in the next is judged as `rm -rf /*`), and a session whose container was
re-created (a heal, a prune, an image change) is refused once, saying so, instead of going
on silently without its folder and environment; the next call of that name starts afresh.

A session the book has not seen (a new one, or one from before a supervisor restart, which
the sandbox kept) is looked up once in its agent's list before the guard judges its call (the
pipeline's _session_folder): a new session starts at the workspace root. When that cannot be
told, the guard judges relative paths as unknown. Bounded: MAX_ENTRIES sessions, the least
recently used forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

MAX_ENTRIES: Final = 65536
MAX_FOLDER_CHARS: Final = 4096


class SessionEnded(Exception):
    """The session's sandbox was re-created since its last call."""


@dataclass
class _Known:
    generation: str
    cwd: str | None


class SessionBook:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._max = max_entries
        self._known: OrderedDict[tuple[str, str], _Known] = OrderedDict()

    def folder(self, key: str, name: str) -> str | None:
        """The absolute folder the session's next call starts in; None: not known."""
        known = self._known.get((key, name))
        return None if known is None else known.cwd

    def known(self, key: str, name: str) -> bool:
        return (key, name) in self._known

    def enter(self, key: str, name: str, generation: str) -> None:
        """Before a call in the session runs in container `generation`: SessionEnded (once)
        when the session lived in another one."""
        known = self._known.get((key, name))
        if known is None:
            self._keep((key, name), _Known(generation, None))
            return
        self._known.move_to_end((key, name))
        if known.generation != generation:
            del self._known[(key, name)]
            raise SessionEnded(
                f"session {name!r} ended: its sandbox was re-created since its last call, and "
                "its folder, environment, options and aliases went with the old container; "
                f"the next call naming {name!r} starts a new session"
            )

    def left(self, key: str, name: str, generation: str, reply: Any) -> None:
        """After a call: the folder the agent says the session is in now."""
        cwd = reply.get("cwd") if isinstance(reply, dict) else None
        usable = isinstance(cwd, str) and cwd.startswith("/") and len(cwd) <= MAX_FOLDER_CHARS
        self._keep((key, name), _Known(generation, cwd if usable else None))

    def forget(self, key: str, name: str | None = None) -> None:
        """One session of the key, or all of them (the sandbox was destroyed)."""
        if name is not None:
            self._known.pop((key, name), None)
            return
        for entry in [e for e in self._known if e[0] == key]:
            del self._known[entry]

    def _keep(self, entry: tuple[str, str], known: _Known) -> None:
        self._known[entry] = known
        self._known.move_to_end(entry)
        while len(self._known) > self._max:
            self._known.popitem(last=False)
