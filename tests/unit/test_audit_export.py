"""`stockade audit verify | export | public-key` against a real SQLite store written by the
supervisor's own writer, and the offline verifier (scripts/verify_audit.py, run as a
separate program with the public key alone): a signed export verifies; changing any byte,
dropping, adding or moving a line, or signing with another key fails it; an export of a
broken chain is refused. The PostgreSQL store answers the same queries
(test_audit_chain.py proves the chain there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stockade.supervisor.app import sealing
from stockade.supervisor.cli.main import main
from stockade.supervisor.config import load_config
from stockade.supervisor.observe.audit import AuditLog
from stockade.supervisor.observe.retention import Retention
from tests.unit.test_audit_chain import DAY, NOW, record

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "verify_audit.py"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    """A supervisor's config whose audit has 60 records, 20 of them old enough that
    retention removed them (leaving a signed anchor)."""
    path = tmp_path / "stockade.toml"
    path.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    config = load_config(path)
    db = config.state_dir / "stockade.db"
    log = AuditLog(db, sealing=sealing(config))
    for i in range(20):
        log.record(record(i, NOW - 10 * DAY))
    for i in range(20, 60):
        log.record(record(i))
    log.close()
    trim = AuditLog(
        db, Retention(max_age_s=DAY, max_bytes=0), clock=lambda: NOW, sealing=sealing(config)
    )
    assert trim.trim()
    trim.close()
    return path


def cli(*args: str) -> int:
    return main(["audit", *args])


def offline(export: Path, key: str) -> subprocess.CompletedProcess[str]:
    """The offline verifier as an operator runs it: its own process, the key alone."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--public-key", key, str(export)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def public_key(config_file: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli("public-key", "--config", str(config_file)) == 0
    return capsys.readouterr().out.strip()


def test_verify_proves_the_chain_and_names_a_broken_record(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("verify", "--config", str(config_file)) == 0
    assert "ok: records 21 to 60 (40)" in capsys.readouterr().out
    db = load_config(config_file).state_dir / "stockade.db"
    import sqlite3

    raw = sqlite3.connect(db)
    raw.execute("UPDATE audit SET tool = 'read_file' WHERE id = 33")
    raw.commit()
    raw.close()
    assert cli("verify", "--config", str(config_file)) == 1
    assert "BROKEN at record 33: its contents do not match its hash" in capsys.readouterr().out
    assert cli("verify", "--config", str(config_file), "--from", "34") == 0


def test_a_signed_export_verifies_offline(
    config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = public_key(config_file, capsys)
    out = tmp_path / "audit.jsonl"
    assert cli("export", "--signed", "--config", str(config_file), "-o", str(out)) == 0
    done = offline(out, key)
    assert done.returncode == 0, done.stderr
    assert "ok: records 21 to 60 (40)" in done.stdout
    assert "record 20 (removed by retention" in done.stdout
    lines = out.read_bytes().splitlines()
    assert [json.loads(x)["type"] for x in (lines[0], lines[1], lines[2], lines[-1])] == [
        "header", "checkpoint", "record", "seal",
    ]  # fmt: skip
    (tmp_path / "key").write_text(key + "\n")
    assert offline(out, str(tmp_path / "key")).returncode == 0  # the key from a file


def test_a_stretch_exports_and_verifies(
    config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = public_key(config_file, capsys)
    out = tmp_path / "part.jsonl"
    args = ("--config", str(config_file), "--from", "30", "--to", "39", "-o", str(out))
    assert cli("export", "--signed", *args) == 0
    done = offline(out, key)
    assert done.returncode == 0, done.stderr
    assert "records 30 to 39 (10)" in done.stdout


@pytest.fixture
def signed_export(
    config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[Path, str]:
    key = public_key(config_file, capsys)
    out = tmp_path / "audit.jsonl"
    assert cli("export", "--signed", "--config", str(config_file), "-o", str(out)) == 0
    return out, key


def every_position(data: bytes) -> list[int]:
    """Positions to change: every 7th byte, and the first and last few."""
    return sorted({*range(0, len(data), 7), 0, 1, len(data) - 2, len(data) - 1})


def test_any_changed_byte_fails_offline(signed_export: tuple[Path, str], tmp_path: Path) -> None:
    """Every 7th byte of the file, in turn (changed to another printable one), fails the
    check, and a few programs' worth: the verifier in this process for speed, then a
    sample through the script itself."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("verify_audit", SCRIPT)
    assert spec
    assert spec.loader
    verifier = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verifier)
    out, key = signed_export
    data = out.read_bytes()
    assert verifier.verify(data.splitlines(keepends=True), key).startswith("ok")
    passed = []
    for at in every_position(data):
        changed = bytearray(data)
        changed[at] = ord("a") if data[at] != ord("a") else ord("b")
        try:
            verifier.verify(bytes(changed).splitlines(keepends=True), key)
        except (verifier.Broken, KeyError, TypeError, ValueError):
            continue
        passed.append(at)
    assert passed == []
    changed = bytearray(data)
    changed[len(data) // 2] ^= 0x01
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(bytes(changed))
    done = offline(broken, key)
    assert done.returncode == 1
    assert "BROKEN" in done.stderr


def test_lines_dropped_added_or_moved_fail(signed_export: tuple[Path, str], tmp_path: Path) -> None:
    out, key = signed_export
    lines = out.read_bytes().splitlines(keepends=True)
    cases = {
        "dropped": lines[:5] + lines[6:],
        "doubled": [*lines[:5], lines[5], *lines[5:]],
        "moved": [*lines[:5], lines[6], lines[5], *lines[7:]],
        "cut": lines[:-1],
        "cut and resealed by none": lines[:-2] + lines[-1:],
    }
    for name, changed in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(b"".join(changed))
        done = offline(path, key)
        assert (name, done.returncode) == (name, 1), done.stdout


def test_another_key_fails(signed_export: tuple[Path, str]) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from stockade.supervisor.observe.chain import public_hex

    out, _ = signed_export
    other = public_hex(Ed25519PrivateKey.generate().public_key())
    done = offline(out, other)
    assert done.returncode == 1
    assert "another public key" in done.stderr


def test_a_broken_chain_is_not_exported(
    config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    raw = sqlite3.connect(load_config(config_file).state_dir / "stockade.db")
    raw.execute("DELETE FROM audit WHERE id = 44")
    raw.commit()
    raw.close()
    out = tmp_path / "audit.jsonl"
    assert cli("export", "--signed", "--config", str(config_file), "-o", str(out)) == 1
    assert "BROKEN at record 45" in capsys.readouterr().err
    assert b'"type":"seal"' not in out.read_bytes()


def test_the_signing_key_is_made_private_and_a_shared_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "stockade.toml"
    path.write_text(f'state_dir = "{tmp_path / "state"}"\n')
    config = load_config(path)
    sealing(config)
    key = config.state_dir / "audit-signing.key"
    assert key.stat().st_mode & 0o777 == 0o600
    key.chmod(0o644)
    from stockade.supervisor.errors import ConfigError

    with pytest.raises(ConfigError, match="open to others: chmod 600"):
        sealing(config)
    given = tmp_path / "missing.key"  # a key given by file is never made
    with pytest.raises(ConfigError, match=r"missing\.key"):
        sealing(load_config(path, {"audit.signing_key": str(given)}))


def test_a_witness_finds_a_log_wiped_and_begun_again(
    config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A chain deleted whole (records, checkpoints, head) and begun again verifies on its
    own; an earlier signed export kept elsewhere (`--witness`) finds it. Retention removing
    the witnessed record leaves an anchor, which satisfies the witness."""
    import sqlite3

    config = load_config(config_file)
    witness = tmp_path / "witness.jsonl"
    assert cli("export", "--signed", "--config", str(config_file), "-o", str(witness)) == 0
    check = ("verify", "--config", str(config_file), "--witness", str(witness))
    assert cli(*check) == 0
    assert "1 witness(es) held" in capsys.readouterr().out
    forged = tmp_path / "forged.jsonl"
    forged.write_bytes(witness.read_bytes().replace(b'"records":40', b'"records":41'))
    assert cli("verify", "--config", str(config_file), "--witness", str(forged)) == 1
    assert "not signed by a trusted key" in capsys.readouterr().out
    raw = sqlite3.connect(config.state_dir / "stockade.db")
    for table in ("audit", "audit_checkpoints", "audit_chain"):
        raw.execute(f"DELETE FROM {table}")
    raw.execute("INSERT INTO audit_chain VALUES ('head', 0, ?)", ("0" * 64,))
    raw.commit()
    raw.close()
    log = AuditLog(config.state_dir / "stockade.db", sealing=sealing(config))
    for i in range(5):
        log.record(record(i))
    log.close()
    assert cli("verify", "--config", str(config_file)) == 0  # on its own, it holds
    capsys.readouterr()
    assert cli(*check) == 1
    assert "record 60, which the witness sealed, is gone" in capsys.readouterr().out


def test_a_witness_holds_after_retention_removes_its_record(
    config_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = load_config(config_file)
    witness = tmp_path / "witness.jsonl"
    assert cli("export", "--signed", "--config", str(config_file), "-o", str(witness)) == 0
    later = AuditLog(
        config.state_dir / "stockade.db", Retention(max_age_s=DAY, max_bytes=0),
        clock=lambda: NOW + 5 * DAY, sealing=sealing(config),
    )  # fmt: skip
    assert later.trim()
    later.close()
    capsys.readouterr()
    assert cli("verify", "--config", str(config_file), "--witness", str(witness)) == 0
    assert "ok: no records (0), 0 signed checkpoint(s) matched, 1 witness(es) held" in (
        capsys.readouterr().out
    )
