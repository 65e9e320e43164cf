"""Through a real `stockade serve` (both engines): the calls it records form a chain that
`stockade audit verify` proves after a graceful stop, with the head checkpoint the
shutdown signed; a signed export verifies offline; `stockade policy replay` of a stricter
candidate over those calls names the one it would now refuse (docs/audit.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stockade.supervisor.cli.main import main
from tests.integration.harness import running_supervisor

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "verify_audit.py"


def test_a_served_audit_verifies_exports_and_replays(
    engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_supervisor(engine) as sup:
        with sup.client() as c:
            box = c.sandbox("chain")
            for command in ("echo one", "git push origin main || true", "echo two"):
                assert box.exec(command).exit_code == 0
        sup.stop()  # graceful: the writer signs the chain's head as it closes
        config = str(sup.config_file())
        assert main(["audit", "verify", "--config", config]) == 0
        verified = capsys.readouterr().out
        assert "ok: records 1 to" in verified
        assert "0 signed checkpoint" not in verified
        out = tmp_path / "audit.jsonl"
        assert main(["audit", "export", "--signed", "--config", config, "-o", str(out)]) == 0
        assert main(["audit", "public-key", "--config", config]) == 0
        key = capsys.readouterr().out.strip()
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--public-key", key, str(out)],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        candidate = tmp_path / "candidate.toml"
        candidate.write_text(
            Path(config).read_text() + '[[guard.rules]]\nname = "no-push"\npattern = "git push"\n'
        )
        assert main(["policy", "replay", "--config", str(candidate), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
    [change] = report["changes"]
    assert (change["was"], change["now"], change["rule"], change["count"]) == (
        "allowed", "refused", "guard.no-push", 1,
    )  # fmt: skip
