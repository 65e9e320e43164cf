"""The E2B JavaScript SDK (`e2b` from npm, pinned in examples/e2b-typescript) against the real
`stockade serve`'s E2B front on both engines: examples/e2b-typescript, compiled by tsc and run
as a subprocess with only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set, creates a
sandbox, runs a command with onStdout/onStderr streaming and one that fails, writes and reads
files, watches a folder while a command makes a file in it and files.write replaces another
(one WRITE, as envd), answers a prompt without a line end once it has arrived (held back,
the run would never end), reads one write echoed by `cat` as one chunk, forks the sandbox
twice, lists by metadata and kills the sandbox. What it prints must be what the sandbox did,
the sandbox must be gone, and the audit log must show its calls with the front "e2b"."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.clients_kit import node_example
from tests.integration.e2b_kit import E2bServed

ROOT = Path(__file__).resolve().parents[2]
E2B_TYPESCRIPT = ROOT / "examples" / "e2b-typescript"
RUN_TIMEOUT_S = 240

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="session")
def e2b_typescript() -> list[str]:
    """tsc-compiled from the current sources."""
    return node_example(E2B_TYPESCRIPT, "e2b")


def run(argv: list[str], served: E2bServed, key: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env.update(E2B_API_URL=served.url, E2B_SANDBOX_URL=served.url, E2B_API_KEY=key)
    return subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)


def test_the_js_sdk_runs_unchanged(e2b_typescript: list[str], served: E2bServed) -> None:
    done = run(e2b_typescript, served, served.token)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = {}
    for line in done.stdout.splitlines():
        out.update(json.loads(line))
    sandbox_id = out["sandbox"]
    assert out["run"] == {
        "exitCode": 0,
        "stdout": "hello from create js\nafter-sleep\n",
        "stderr": "to-stderr\n",
    }
    assert "".join(out["chunks"]["stdout"]) == out["run"]["stdout"]
    assert len(out["chunks"]["stdout"]) >= 2  # streamed as produced
    assert "".join(out["chunks"]["stderr"]) == "to-stderr\n"
    assert out["failed"]["exitCode"] == 3
    assert out["failed"]["stdout"] == "partial\n"
    assert out["failed"]["error"] == "exit status 3"
    assert out["files"] == {
        "text": "written by the e2b JS SDK\n",
        "binaryBytes": 256 * 1024,
        "binarySame": True,
    }
    watched = {(e["name"], e["type"]) for e in out["watched"]}
    assert ("new.txt", "create") in watched, out["watched"]
    old = [e["type"] for e in out["watched"] if e["name"] == "old.txt"]
    assert old == ["write"], out["watched"]  # files.write over a file: envd's one WRITE
    assert not [e for e in out["watched"] if ".stockade-upload" in e["name"]]
    assert out["prompt"]["beforeAnswer"] == "name? "  # no line end, yet there before the answer
    assert out["prompt"]["stdout"] == "name? hi js\n"
    assert out["echoed"] == "Hello,\nWorld!"  # one write of `cat`, one chunk
    assert [f["text"] for f in out["forked"]] == ["from the source"] * 2
    assert len({f["id"] for f in out["forked"]} | {sandbox_id}) == 3
    assert out["listed"] == [sandbox_id]
    assert out["killed"] is True
    with served.sup.client(token=served.token) as client:
        assert not any(sandbox_id in s.key for s in client.list_sandboxes())
        records = [r for r in client.list_audit(limit=500) if sandbox_id in r.sandbox_key]
    tools = {r.tool for r in records if r.front == "e2b"}
    assert {"process", "upload_file", "download_file"} <= tools


def test_a_wrong_key_is_refused(e2b_typescript: list[str], served: E2bServed) -> None:
    done = run(e2b_typescript, served, "not-a-token")
    assert done.returncode == 1
    assert done.stderr.startswith("error: AuthenticationError:"), done.stderr
