"""The supervisor's layers hold, and docs/architecture.md draws the tree as it is.

- The import-linter contracts in pyproject.toml (`[tool.importlinter]`: the layers, no front
  importing another, no import cycle at any depth, the agent and the client apart from the
  supervisor) are kept: `lint-imports` passes (`make lint` runs it too).
- The contract's layers are the page's, in the page's order: each layer's first row in the
  table of "The layers" names it, top first.
- Every module of the supervisor, the client and the agent is listed on the page in the row
  of its folder, and every module listed there exists.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
SKIPPED = {"__init__.py", "__main__.py"}
"""Not listed: a package's own docstring says what it holds."""
GENERATED = re.compile(r"_pb2(_grpc)?\.pyi?$")


def _contract(contract_id: str) -> dict[str, list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for contract in config["contracts"]:
        if contract["id"] == contract_id:
            return dict(contract)
    raise AssertionError(f"no import-linter contract {contract_id!r} in pyproject.toml")


def _table(section: str) -> list[list[str]]:
    """The rows of the first table under the `## section` heading, cells stripped."""
    text = PAGE.read_text()
    start = text.index(f"\n## {section}\n")
    rows: list[list[str]] = []
    for line in text[start:].splitlines()[2:]:
        if line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
            rows.append([cell.strip().replace("\\|", "|") for cell in cells])
        elif rows:
            break
    assert rows, f"no table under '## {section}'"
    return rows[2:]  # past the header and its rule


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _modules(folder: Path) -> set[str]:
    return {
        p.name
        for p in folder.iterdir()
        if p.suffix == ".py" and p.name not in SKIPPED and not GENERATED.search(p.name)
    }


def _python_folders(top: Path) -> set[Path]:
    return {p.parent for p in top.rglob("*.py") if "__pycache__" not in p.parts} | {top}


def _listed(rows: list[list[str]], base: Path, path_column: int) -> dict[Path, set[str]]:
    """Each row's folder (or module) under `base`, with the module names its last cell lists
    (names alone: a name with a folder in it points elsewhere)."""
    listed: dict[Path, set[str]] = {}
    for row in rows:
        for path in _ticked(row[path_column]):
            names = {t for t in _ticked(row[-1]) if t.endswith(".py") and "/" not in t}
            listed.setdefault(base / path, set()).update(names)
    return listed


def test_the_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout


def test_the_contract_names_the_layers_the_page_draws() -> None:
    drawn = [row[0].strip("`") for row in _table("The layers") if row[0]]
    assert drawn == list(_contract("layers")["layers"])


def test_every_supervisor_module_is_on_the_page_and_every_listed_one_exists() -> None:
    top = ROOT / "supervisor"
    listed = _listed(_table("The layers"), top, path_column=1)
    for path, names in listed.items():
        assert path.exists(), f"docs/architecture.md lists {path.relative_to(ROOT)}: not there"
        if path.is_dir():
            missing, gone = _modules(path) - names, names - _modules(path)
            where = path.relative_to(ROOT)
            assert not missing, f"{where}: not listed on the page: {sorted(missing)}"
            assert not gone, f"{where}: listed on the page but not there: {sorted(gone)}"
    rows_for = {p for p in listed if p.is_dir()} | {top}
    unlisted = _python_folders(top) - rows_for
    names = sorted(str(p.relative_to(ROOT)) for p in unlisted)
    assert not unlisted, f"folders with no row on the page: {names}"
    tops = {p.relative_to(top).parts[0] for p in listed}
    entries = {p.name for p in top.iterdir() if p.name not in SKIPPED | {"__pycache__"}}
    entries = {e for e in entries if e.endswith(".py") or (top / e).is_dir()}
    assert entries <= tops, f"supervisor/ entries with no row: {sorted(entries - tops)}"


def test_every_module_of_the_other_packages_is_on_the_page() -> None:
    rows = [row for row in _table("The other packages")]
    listed = _listed(rows, ROOT, path_column=0)
    assert listed, "no rows under 'The other packages'"
    for path, names in listed.items():
        assert path.is_dir(), f"docs/architecture.md lists {path.relative_to(ROOT)}: not a folder"
        where = path.relative_to(ROOT)
        assert _modules(path) == names, (
            f"{where}: not listed {sorted(_modules(path) - names)}, "
            f"not there {sorted(names - _modules(path))}"
        )


def test_the_contract_would_catch_an_import_that_runs_up(tmp_path: Path) -> None:
    """The check is live: with `calls` drawn above `fronts` (fronts import calls), it breaks."""
    layers = list(_contract("layers")["layers"])
    i, j = layers.index("fronts"), layers.index("calls")
    layers[i], layers[j] = layers[j], layers[i]
    drawn = ", ".join(f'"{name}"' for name in layers)
    config = tmp_path / "contracts.toml"
    config.write_text(
        '[tool.importlinter]\nroot_packages = ["stockade"]\n\n'
        '[[tool.importlinter.contracts]]\nid = "swapped"\nname = "swapped"\ntype = "layers"\n'
        f'containers = ["stockade.supervisor"]\nlayers = [{drawn}]\n'
    )
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "stockade.supervisor.fronts is not allowed to import stockade.supervisor.calls" in (
        done.stdout
    )
