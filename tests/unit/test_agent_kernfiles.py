"""The agent's bare-syscall kernel files: a kept file shows its current content on every read."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.agent import kernfiles


def test_a_kept_file_is_read_afresh_each_time(tmp_path: Path) -> None:
    counter = tmp_path / "oom_control"
    counter.write_text("oom_kill 0\n")
    kept = kernfiles.Kept(str(counter))
    assert kept.read() == "oom_kill 0\n"
    with counter.open("r+") as file:  # the same inode, changed in place, as the kernel does
        file.write("oom_kill 7\n")
    assert kept.read() == "oom_kill 7\n"
    assert kept.read() == "oom_kill 7\n"


def test_a_kept_file_missing_at_first_stays_missing(tmp_path: Path) -> None:
    path = tmp_path / "memory.events"
    kept = kernfiles.Kept(str(path))
    with pytest.raises(FileNotFoundError):
        kept.read()
    path.write_text("oom_kill 1\n")
    with pytest.raises(FileNotFoundError):
        kept.read()


def test_write_replaces_the_content_of_an_existing_file_only(tmp_path: Path) -> None:
    target = tmp_path / "oom_score_adj"
    target.write_text("0")
    kernfiles.write(str(target), "1000")
    assert target.read_text() == "1000"
    with pytest.raises(FileNotFoundError):
        kernfiles.write(str(tmp_path / "absent"), "1000")
    assert not (tmp_path / "absent").exists()
