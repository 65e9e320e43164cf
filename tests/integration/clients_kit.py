"""What the tests of the example clients share: building them (`build`, and `node_example`
for the TypeScript ones), and `missing`, what an absent toolchain is (a failure in CI, else a
skip)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

BUILD_TIMEOUT_S = 280


def missing(what: str) -> NoReturn:
    """No toolchain: in CI (which ran scripts/setup.sh test) that is a failure, elsewhere a skip."""
    message = f"{what}; scripts/setup.sh test installs it"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def build(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}"


def node_example(folder: Path, package: str) -> list[str]:
    """The TypeScript example in `folder` tsc-compiled (`npm run build`) from the current
    sources, its node_modules holding `package`: the command that runs it."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing("node and npm are not installed")
    if not (folder / "node_modules" / package).is_dir():
        missing(f"{folder}/node_modules is missing (npm ci)")
    build([npm, "run", "--silent", "build"], folder)
    return [node, str(folder / "dist" / "main.js")]
