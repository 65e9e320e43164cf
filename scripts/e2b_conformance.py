#!/usr/bin/env python3
"""Run E2B's own python-sdk tests, unmodified, against Stockade's E2B front and print the
conformance table of docs/e2b.md (each folder: passed, failed, skipped; every failure with its
first line). It fetches nothing: give it the `packages/python-sdk` folder of an e2b-dev/E2B
checkout (its `tests` and `pytest.ini` are used as they are). See docs/e2b.md.

    # a supervisor of its own on an engine (run from the repository root, with the
    # integration tests' lock: they share the engine service and the image tag)
    flock /tmp/stockade-it.lock .venv/bin/python scripts/e2b_conformance.py \\
        --engine podman /tmp/e2b-src/packages/python-sdk
    # or against a supervisor already serving E2B
    .venv/bin/python scripts/e2b_conformance.py --url http://127.0.0.1:3000 --token TOKEN PATH

The tests run with the `e2b` package installed here (its version is printed with the table);
they need pytest, pytest-asyncio, pytest-timeout and attrs. `--json FILE` also writes every
test's outcome."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FOLDERS: list[tuple[str, list[str]]] = [
    ("commands", ["sandbox_{v}/commands"]),
    ("files", ["sandbox_{v}/files"]),
    ("pty", ["sandbox_{v}/pty"]),
    ("create", ["sandbox_{v}/test_create.py"]),
    ("kill", ["sandbox_{v}/test_kill.py", "api_{v}/test_sbx_kill.py"]),
    ("connect", ["sandbox_{v}/test_connect.py"]),
    ("timeout", ["sandbox_{v}/test_timeout.py"]),
    ("metrics", ["sandbox_{v}/test_metrics.py"]),
    ("info", ["api_{v}/test_sbx_info.py"]),
    ("list", ["api_{v}/test_sbx_list.py"]),
    ("fork", ["sandbox_{v}/test_fork.py"]),
    (
        "snapshot",
        [
            "sandbox_{v}/test_snapshot.py",
            "sandbox_{v}/test_snapshot_api.py",
            "sandbox_{v}/test_snapshot_filesystem_only.py",
            "api_{v}/test_sbx_snapshot.py",
        ],
    ),
]
"""The issue's folders: (name, paths under sync/ or async/, `{v}` being sync or async)."""

VARIANTS = ("sync", "async")


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    """(test id, first line of what failed)."""


def folder_paths(tests: Path, variant: str, names: list[str]) -> list[tuple[str, str]]:
    """(folder name, path relative to the python-sdk folder) of `names` for `variant`."""
    out = []
    for name, patterns in FOLDERS:
        if names and name not in names:
            continue
        for pattern in patterns:
            rel = f"tests/{variant}/{pattern.format(v=variant)}"
            if (tests.parent / rel).exists():
                out.append((name, rel))
    return out


def first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("E   "):
            return line[4:].strip()[:200]
    return (text.strip().splitlines() or [""])[0][:200]


def run_variant(
    sdk: Path, variant: str, names: list[str], env: dict[str, str], extra: list[str]
) -> dict[str, tuple[str, str]]:
    """pytest over the variant's folders: test id -> (outcome, first line of a failure)."""
    paths = folder_paths(sdk / "tests", variant, names)
    if not paths:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-o",
            "junit_family=xunit1",
            f"--junitxml={junit}",
            *extra,
            *(rel for _name, rel in paths),
        ]
        subprocess.run(cmd, cwd=sdk, env=env, check=False)
        if not junit.exists():
            raise SystemExit(f"pytest wrote no report for {variant}")
        return parse_junit(junit)


def parse_junit(path: Path) -> dict[str, tuple[str, str]]:
    results: dict[str, tuple[str, str]] = {}
    for case in ElementTree.parse(path).iter("testcase"):
        # xunit1 names the file; else the class name is the module's path from the rootdir
        test_file = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        test_id = f"{test_file}::{case.get('name')}"
        outcome, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                why = first_line(child.get("message") or child.text or "")
            elif child.tag == "skipped":
                outcome, why = "skipped", (child.get("message") or "")[:200]
        results[test_id] = outcome, why
    return results


def tally(sdk: Path, results: dict[str, tuple[str, str]], names: list[str]) -> dict[str, Tally]:
    table = {name: Tally() for name, _ in FOLDERS if not names or name in names}
    for variant in VARIANTS:
        for name, rel in folder_paths(sdk / "tests", variant, names):
            for test_id, (outcome, why) in results.items():
                if not test_id.startswith(rel):
                    continue
                t = table[name]
                if outcome == "passed":
                    t.passed += 1
                elif outcome == "skipped":
                    t.skipped += 1
                else:
                    t.failed += 1
                    t.failures.append((test_id, why))
    return table


def markdown(table: dict[str, Tally], version: str, label: str) -> str:
    lines = [
        f"E2B python-sdk tests, e2b {version}, {label}",
        "",
        "| folder (sync + async) | passed | failed | skipped |",
        "|---|---|---|---|",
    ]
    total = Tally()
    for name, t in table.items():
        lines.append(f"| {name} | {t.passed} | {t.failed} | {t.skipped} |")
        total.passed += t.passed
        total.failed += t.failed
        total.skipped += t.skipped
    lines.append(f"| **all** | {total.passed} | {total.failed} | {total.skipped} |")
    failures = [f for t in table.values() for f in t.failures]
    if failures:
        lines += ["", "Failures:"]
        lines += [f"- `{test_id}`: {why}" for test_id, why in failures]
    return "\n".join(lines)


@contextlib.contextmanager
def supervisor(engine: str) -> Iterator[tuple[str, str]]:
    """A `stockade serve` of this checkout serving E2B on loopback: (url, a token)."""
    sys.path.insert(0, str(ROOT))
    from tests.integration.e2b_kit import serving_e2b
    from tests.integration.harness import bring_up, stop_started_services

    bring_up(engine)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="e2bconf") as folder,
            serving_e2b(engine, Path(folder)) as served,
        ):
            yield served.url, served.token
    finally:
        stop_started_services()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sdk", type=Path, help="the packages/python-sdk folder of E2B")
    parser.add_argument("--engine", choices=("podman", "docker"))
    parser.add_argument("--url", help="an E2B front already serving (with --token)")
    parser.add_argument("--token")
    parser.add_argument("--folder", action="append", default=[], help="only these folders")
    parser.add_argument("--json", type=Path, help="also write every test's outcome here")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    args = parser.parse_args()
    sdk = args.sdk.resolve()
    if not (sdk / "tests" / "conftest.py").exists():
        parser.error(f"{sdk} is not E2B's packages/python-sdk (no tests/conftest.py)")
    if bool(args.engine) == bool(args.url):
        parser.error("give --engine or --url (with --token)")
    version = metadata.version("e2b")

    with contextlib.ExitStack() as stack:
        if args.engine:
            url, token = stack.enter_context(supervisor(args.engine))
            label = args.engine
        else:
            url, token, label = args.url.rstrip("/"), args.token or "", args.url
        env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
        env |= {"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": token}
        results: dict[str, tuple[str, str]] = {}
        for variant in VARIANTS:
            results |= run_variant(sdk, variant, args.folder, env, args.pytest_args)

    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True))
    print(markdown(tally(sdk, results, args.folder), version, label))
    return 0


if __name__ == "__main__":
    sys.exit(main())
