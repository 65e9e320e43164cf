"""scripts/e2b_conformance.py without a supervisor: which of E2B's test files make each
folder of the table, how pytest's report becomes the table's counts and failures, and its
refusals of a folder that is not E2B's python-sdk."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "e2b_conformance.py"


@pytest.fixture(scope="module")
def conformance() -> ModuleType:
    spec = importlib.util.spec_from_file_location("e2b_conformance", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["e2b_conformance"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["e2b_conformance"]
    return module


def sdk_tree(root: Path) -> Path:
    """A stand-in for E2B's packages/python-sdk: the files the table names, for both."""
    sdk = root / "python-sdk"
    for variant in ("sync", "async"):
        base = sdk / "tests" / variant
        for rel in (
            f"sandbox_{variant}/commands/test_run.py",
            f"sandbox_{variant}/files/test_write.py",
            f"sandbox_{variant}/test_fork.py",
            f"api_{variant}/test_sbx_snapshot.py",
            f"sandbox_{variant}/test_snapshot.py",
        ):
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text("")
    (sdk / "tests" / "conftest.py").write_text("")
    return sdk


def test_folders_are_found_for_both_variants(conformance: ModuleType, tmp_path: Path) -> None:
    tests = sdk_tree(tmp_path) / "tests"
    found = conformance.folder_paths(tests, "async", [])
    assert ("commands", "tests/async/sandbox_async/commands") in found
    assert ("snapshot", "tests/async/api_async/test_sbx_snapshot.py") in found
    assert ("snapshot", "tests/async/sandbox_async/test_snapshot.py") in found
    assert not [rel for _name, rel in found if "sync/" in rel and "async" not in rel]
    assert not [name for name, _rel in found if name == "pty"]  # absent: not run
    assert conformance.folder_paths(tests, "sync", ["fork"]) == [
        ("fork", "tests/sync/sandbox_sync/test_fork.py")
    ]


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.sync.sandbox_sync.commands.test_run"
  file="tests/sync/sandbox_sync/commands/test_run.py" name="test_ok" />
<testcase classname="tests.sync.sandbox_sync.commands.test_run"
  file="tests/sync/sandbox_sync/commands/test_run.py" name="test_bad">
  <failure message="AssertionError: assert 1 == 2">long text</failure></testcase>
<testcase classname="tests.sync.sandbox_sync.test_fork" name="test_skipped">
  <skipped message="needs the cloud" /></testcase>
<testcase classname="tests.sync.api_sync.test_sbx_snapshot"
  file="tests/sync/api_sync/test_sbx_snapshot.py" name="test_broken">
  <error message="">E   ConnectionError: refused
  more</error></testcase>
</testsuite></testsuites>
"""


def test_the_report_becomes_the_table(conformance: ModuleType, tmp_path: Path) -> None:
    sdk = sdk_tree(tmp_path)
    report = tmp_path / "junit.xml"
    report.write_text(JUNIT)
    results = conformance.parse_junit(report)
    assert results["tests/sync/sandbox_sync/commands/test_run.py::test_ok"] == ("passed", "")
    assert results["tests/sync/sandbox_sync/test_fork.py::test_skipped"][0] == "skipped"
    table = conformance.tally(sdk, results, [])
    assert (table["commands"].passed, table["commands"].failed) == (1, 1)
    assert table["fork"].skipped == 1
    assert table["snapshot"].failures == [
        ("tests/sync/api_sync/test_sbx_snapshot.py::test_broken", "ConnectionError: refused")
    ]
    text = conformance.markdown(table, "2.63.0", "podman")
    assert "e2b 2.63.0, podman" in text
    assert "| commands | 1 | 1 | 0 |" in text
    assert "| **all** | 1 | 2 | 1 |" in text
    assert "- `tests/sync/sandbox_sync/commands/test_run.py::test_bad`: AssertionError" in text


def test_it_refuses_what_is_not_the_sdks_tests(tmp_path: Path) -> None:
    for args in ([str(tmp_path), "--url", "http://127.0.0.1:1"], [str(sdk_tree(tmp_path))]):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2
        assert "error:" in done.stderr
