"""Coverage-guided fuzzing of the parsers that take hostile input (docs/security.md, "Fuzzing").

One module per target, each with:

- `INSTRUMENT`: the top-level packages atheris instruments for coverage (what the target
  imports of them the first time, it imports instrumented);
- `REFUSALS`: the exceptions that are the parser's clean refusals (anything else is a crash);
- `one(data)`: feeds one input to the parser.

`python -m fuzz` (`make fuzz`) runs atheris over each target; tests/unit/test_fuzz_corpus.py
replays every corpus file (fuzz/corpus/<target>/) through `check`, without atheris. Nothing
here imports atheris: only the runner does, lazily."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import shutil
import tempfile
from collections.abc import Coroutine
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
TARGETS = (
    "connect",
    "mcp_jsonrpc",
    "files",
    "guard",
    "patch",
    "untar",
    "config",
    "agent_frames",
)
"""Each a module of this package and a folder of fuzz/corpus/."""


def target(name: str) -> ModuleType:
    if name not in TARGETS:
        raise ValueError(f"no fuzz target {name!r}: one of {', '.join(TARGETS)}")
    return importlib.import_module(f"fuzz.{name}")


def check(module: ModuleType, data: bytes) -> None:
    """One input through a target: its clean refusals pass, anything else is raised."""
    with contextlib.suppress(*module.REFUSALS):
        module.one(data)


def corpus_of(name: str) -> list[Path]:
    folder = CORPUS / name
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


_loop: asyncio.AbstractEventLoop | None = None


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`coro` run to its end on one event loop kept for every input (asyncio.run's new loop
    per input would cost more than most parses)."""
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    result = _loop.run_until_complete(coro)
    _loop.run_until_complete(asyncio.sleep(0))  # the closing of generators left unfinished
    return result


SEED_FILES = {
    "a.txt": "alpha\nbeta\ngamma\n",
    "src/main.py": "def main():\n    print('hi')\n\n\nif __name__ == '__main__':\n    main()\n",
    "docs/notes.md": "# Notes\r\n\r\nline one\r\nline two",
}
"""What a workspace holds when an input meets it (for apply_patch's updates to find)."""


class Workspace:
    """A folder the agent's tools work in (`root`), made anew for every input, inside a
    folder of its own that must hold nothing else afterwards (nothing written outside)."""

    def __init__(self) -> None:
        self.outer = Path(tempfile.mkdtemp(prefix="stockade-fuzz-"))
        self.root = self.outer / "workspace"

    def fresh(self) -> Path:
        if self.root.exists():
            _remove(self.root)
        for rel, text in SEED_FILES.items():
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.root / rel).write_text(text)
        return self.root

    def check_outside(self) -> None:
        found = sorted(p.name for p in self.outer.iterdir())
        if found != ["workspace"]:
            raise AssertionError(f"written outside the workspace: {found}")


def _remove(folder: Path) -> None:
    """rmtree, after giving back the permissions an input may have taken away."""
    for dirpath, dirnames, _ in os.walk(folder):
        for name in dirnames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
    os.chmod(folder, 0o700)
    shutil.rmtree(folder)
