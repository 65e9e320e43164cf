"""The console end to end in headless Chromium against a real `stockade serve` on a real
engine: tests/browser/console.mjs (playwright-core driving Debian's /usr/bin/chromium) signs
in with tokens, watches a sandbox appear after a call, answers an approval that a waiting
gRPC call (the CLI) then passes (Always only once confirmed, the keys only on the focused
request, a 250 KB command folded beside its buttons, a write_file's diff with a secret of the
file masked), sees one answered from the CLI leave the
page, approves a brand-new tenant's first call from an operator's page opened before it,
shows a key's right-to-left override, filters the
audit log, pauses and resumes, quarantines (a gRPC call then refused) and releases, and is
refused without a session, with a forged CSRF token and across tenants; checks the
overview's counts against the lists they link to and the gRPC API, reads a sandbox's files
and background processes through the agent, opens the isolation table's raw JSON and sees
the guard's match marked in a pending command. Screenshots of each
page go to test-artifacts/console/ (git-ignored), and each page in both themes at 1440 and
900 px, where axe-core (npm) finds no serious or critical violation.

On both engines (about 15 s each): the pages show what the engine reports (state, cgroup
figures, processes, the isolation report)."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.supervisor.calls.lifecycle import LIFECYCLE_TOOLS
from tests.integration.harness import Supervisor, free_tcp_address, running_supervisor

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[2]
BROWSER_TESTS = ROOT / "tests" / "browser"
ARTIFACTS = ROOT / "test-artifacts" / "console"
CHROMIUM = Path("/usr/bin/chromium")


class Console:
    def __init__(self, engine: str, sup: Supervisor, url: str, tokens: dict[str, str]) -> None:
        self.engine = engine
        self.sup = sup
        self.url = url
        self.tokens = tokens


@pytest.fixture(scope="module")
def console(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    modules = BROWSER_TESTS / "node_modules"
    if not CHROMIUM.exists() or not all(
        (modules / name).is_dir() for name in ("playwright-core", "axe-core")
    ):
        pytest.fail(
            "the browser tests need Debian's chromium and tests/browser/node_modules: "
            "run scripts/setup.sh (or apt-get install chromium; cd tests/browser && npm ci)"
        )
    tokens = {name: secrets.token_hex(20) for name in ("alice", "bob", "ops", "dave")}
    path = tmp_path_factory.mktemp("console") / "tokens"
    path.write_text("".join(f"{t} {name}\n" for name, t in tokens.items()))
    path.chmod(0o600)
    address = free_tcp_address()
    config = (
        f'[console]\nlisten = "{address}"\noperators = ["ops"]\nrefresh_s = 0.5\n'
        '[approvals]\nmode = "on-miss"\nallowlist = ["echo *", "sleep *"]\ntimeout_s = 120\n'
        'files = ["write_file"]\n'
    )
    with running_supervisor(
        engine,
        config,
        listen=free_tcp_address(),
        auth_config=f'[auth]\ntokens_file = "{path}"\n',
    ) as sup:
        yield Console(engine, sup, f"http://{address}", tokens)


def test_the_console_in_a_browser(console: Console) -> None:
    key = f"console-{uuid.uuid4().hex[:8]}"
    artifacts = ARTIFACTS / console.engine
    shutil.rmtree(artifacts, ignore_errors=True)
    scenario = {
        "console": console.url,
        "server": console.sup.target,
        "python": sys.executable,
        "tokens": console.tokens,
        "key": key,
        "artifacts": str(artifacts),
    }
    run = subprocess.run(
        ["node", str(BROWSER_TESTS / "console.mjs")],
        cwd=BROWSER_TESTS,
        env={**_environment(), "CONSOLE_TEST": json.dumps(scenario)},
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert run.returncode == 0, (
        f"{run.stdout}\n{run.stderr}\n--- supervisor log ---\n" + (console.sup.log()[-4000:])
    )
    assert "step: done" in run.stdout
    pages = ("login", "sandboxes", "approvals", "audit", "audit-record", "sandbox", "overview")
    shown = ("approvals-confirm-always", "approvals-big-command", "bidi-key", "approvals-marked")
    shown += ("overview-counts", "overview-7d", "files", "file", "processes", "isolation-table")
    shown += ("approvals-diff",)
    for name in (*pages, "confirm-quarantine", "sandbox-quarantined", "quarantines", *shown):
        assert (artifacts / f"{name}.png").stat().st_size > 1000, name
    themed = ("login", "overview", "sandboxes", "sandbox", "approvals", "audit", "quarantines")
    themed += ("files", "processes", "isolation")
    for name in themed:
        for theme in ("light", "dark"):
            for width in (1440, 900):
                assert (artifacts / f"{name}-{theme}-{width}.png").stat().st_size > 1000
    # what the browser did, seen through the gRPC API and its audit log
    with console.sup.client(token=console.tokens["alice"]) as client:
        assert client.get_sandbox(key).state == "RUNNING"
        records = client.list_audit(sandbox_key=key, limit=100)
    approvers = {r.approver for r in records if r.approval}
    assert approvers >= {"console:tenant:alice", "carol-at-the-cli"}
    actions = [r.tool for r in records if r.front == "console" and r.tool in LIFECYCLE_TOOLS]
    assert sorted(actions) == [
        "pause_sandbox",
        "quarantine_sandbox",
        "release_quarantine",
        "resume_sandbox",
    ]
    assert not [r for r in records if r.tool == "housekeeping"]  # each action once
    reads = [r for r in records if r.front == "console" and r.tool in ("list_files", "read_file")]
    assert reads
    readers = {r.caller.split("@")[0] for r in reads}
    assert readers <= {"console:tenant:alice", "console:operator:ops"}
    assert any(r.caller.startswith("console:tenant:alice@") for r in reads)
    alarms = [r for r in records if r.tool == "alarm"]
    assert len(alarms) == 1
    assert "odd <traffic> seen by the browser test" in alarms[0].arguments_json


def _environment() -> dict[str, str]:
    import os

    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, str(ROOT), env.get("PYTHONPATH")) if p)
    return env
