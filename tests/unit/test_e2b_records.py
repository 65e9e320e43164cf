"""The E2B sandbox records on disk (fronts/e2b/records.py): one file per sandbox, so that a
change writes one record whatever the number of sandboxes; the older single file migrated
once; a torn or forged record file set aside with a log line; writes of one record landing
in the order they were asked for."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor.fronts.e2b.records import PAUSED, E2bSandbox, Records, new_sandbox_id


def sandbox(tenant: str = "acme", **kw: Any) -> E2bSandbox:
    sid = kw.pop("sandbox_id", new_sandbox_id())
    values: dict[str, Any] = {
        "sandbox_id": sid, "tenant": tenant, "key": f"{tenant}\0e2b-{sid}",
        "template_id": "base", "access_token": "tok-" + sid,
        "started_at": 1000.0, "end_at": 2000.0,
    }  # fmt: skip
    values.update(kw)
    return E2bSandbox(**values)


def folder(state: Path) -> Path:
    return state / "e2b" / "sandboxes"


def stamps(state: Path) -> dict[str, tuple[int, int]]:
    """Each record file's inode and modification time: what a rewrite changes."""
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(folder(state).iterdir())
    }


async def test_a_change_writes_its_own_record_only(tmp_path: Path) -> None:
    records = Records(tmp_path)
    many = [sandbox(metadata={"n": str(i)}) for i in range(40)]
    for one in many:
        await records.add(one)
    before, writes = stamps(tmp_path), records.writes
    changed = many[17]
    changed.end_at = 9999.0
    await records.save(changed)
    after = stamps(tmp_path)
    assert records.writes == writes + 1
    assert {n for n in after if after[n] != before[n]} == {f"{changed.sandbox_id}.json"}
    await records.remove(many[3].sandbox_id)
    assert records.writes == writes + 2
    assert set(stamps(tmp_path)) == set(after) - {f"{many[3].sandbox_id}.json"}
    assert Records(tmp_path).by_id(changed.sandbox_id) == changed


async def test_the_latest_write_of_a_record_wins(tmp_path: Path) -> None:
    records = Records(tmp_path)
    one = sandbox()
    await records.add(one)
    saves = []
    for end in range(3000, 3050):
        one.end_at = float(end)
        saves.append(records.save(one))
    await asyncio.gather(*saves)
    assert Records(tmp_path).by_id(one.sandbox_id) == one
    gone = sandbox()
    await records.add(gone)
    await asyncio.gather(records.save(gone), records.remove(gone.sandbox_id))
    assert not (folder(tmp_path) / f"{gone.sandbox_id}.json").exists()
    assert Records(tmp_path).by_id(gone.sandbox_id) is None


def test_the_older_single_file_is_migrated_once(tmp_path: Path) -> None:
    (tmp_path / "e2b").mkdir()
    old = [sandbox(), sandbox("other", state=PAUSED, metadata={"k": "v"}, env_vars={"A": "b"})]
    legacy = tmp_path / "e2b" / "sandboxes.json"
    legacy.write_text(json.dumps([s.to_json() for s in old]))
    records = Records(tmp_path)
    assert sorted(records, key=lambda s: s.tenant) == old
    assert not legacy.exists()
    assert sorted(stamps(tmp_path)) == sorted(f"{s.sandbox_id}.json" for s in old)
    again = Records(tmp_path)
    assert sorted(again, key=lambda s: s.tenant) == old
    assert again.writes == 0  # nothing left to migrate


def test_a_record_file_kept_newer_than_the_older_file_wins(tmp_path: Path) -> None:
    """A crash between the migration's writes and the old file's removal: the per-sandbox
    file, written since, is kept."""
    newer = sandbox(end_at=5000.0)
    folder(tmp_path).mkdir(parents=True)
    (folder(tmp_path) / f"{newer.sandbox_id}.json").write_text(json.dumps(newer.to_json()))
    stale = sandbox(sandbox_id=newer.sandbox_id, end_at=1500.0)
    (tmp_path / "e2b" / "sandboxes.json").write_text(json.dumps([stale.to_json()]))
    assert Records(tmp_path).by_id(newer.sandbox_id) == newer


@pytest.mark.parametrize(
    "content",
    [
        b'{"sandbox_id": "',  # torn
        b"",
        b"\xff\xfe not json",
        b"[]",
        b'{"tenant": "acme"}',  # fields missing
        b'{"sandbox_id": "aaaaaaaaaaaaaaaaaaaa", "tenant": "acme", "key": "k", '
        b'"template_id": "base", "access_token": "t", "started_at": 1, "end_at": 2}',  # forged
    ],
)
def test_a_torn_or_forged_record_is_set_aside_with_a_log_line(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    good = sandbox()
    folder(tmp_path).mkdir(parents=True)
    (folder(tmp_path) / f"{good.sandbox_id}.json").write_text(json.dumps(good.to_json()))
    bad_id = new_sandbox_id()
    bad = folder(tmp_path) / f"{bad_id}.json"
    bad.write_bytes(content)
    with caplog.at_level(logging.WARNING, "stockade.e2b"):
        records = Records(tmp_path)
    assert list(records) == [good]
    assert records.by_id(bad_id) is None
    said = [r.getMessage() for r in caplog.records]
    assert any(str(bad) in line and "unreadable" in line for line in said)
    assert not bad.exists()
    assert (folder(tmp_path) / f"{bad_id}.json.bad").read_bytes() == content
    assert list(Records(tmp_path)) == [good]  # set aside once, not read again


def test_leftovers_of_a_cut_write_and_strangers_are_not_records(tmp_path: Path) -> None:
    folder(tmp_path).mkdir(parents=True)
    one = sandbox()
    tmp = folder(tmp_path) / f"{one.sandbox_id}.json.tmp"
    tmp.write_text(json.dumps(one.to_json()))
    os.symlink("/etc/passwd", folder(tmp_path) / "notanid.json")
    assert len(Records(tmp_path)) == 0
    assert not tmp.exists()
    assert (folder(tmp_path) / "notanid.json").is_symlink()  # not its to remove


async def test_memory_only_records_write_nothing(tmp_path: Path) -> None:
    records = Records(None)
    one = sandbox()
    await records.add(one)
    await records.save(one)
    assert await records.remove(one.sandbox_id) == one
    assert records.writes == 0
    assert list(tmp_path.iterdir()) == []
