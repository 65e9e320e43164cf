"""An upload seen by a watch as E2B's envd shows a write: `write` of the file it replaces,
`create`, `chmod` and `write` of a new one (envd's open, chown and write), never the
temporary file or a create of the final name; a failed upload shows nothing and leaves the
old file; lone renames of files named like an upload's do not grow the watch's memory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stockade.agent import transfers, watch
from stockade.agent.errors import ToolError
from tests.unit.fakes import make_folder
from tests.unit.test_agent_watch import watching

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "ws", files={"old.txt": "old"}, dirs=("sub",))


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def broken() -> AsyncIterator[bytes]:
    yield b"half"
    raise ToolError("INVALID_ARGS", "the body was cut short")


async def upload(ws: Path, path: str, *parts: bytes) -> None:
    await transfers.receive(ws, path, tar=False, mode=0, chunks=chunks(*parts))


async def test_an_upload_over_a_file_is_one_write(ws: Path) -> None:
    async with watching(ws, ".") as seen:
        await upload(ws, "old.txt", b"new ", b"content")
        (ws / "marker").write_text("")
        await seen.until("create", "marker")
    assert seen.pairs()[: seen.pairs().index(("create", "marker"))] == [("write", "old.txt")]
    assert (ws / "old.txt").read_text() == "new content"


async def test_an_upload_of_a_new_file_is_create_chmod_then_write(ws: Path) -> None:
    async with watching(ws, ".", recursive=True) as seen:
        await upload(ws, "sub/new.txt", b"x")
        await seen.until("write", "sub/new.txt")
    assert seen.pairs() == [
        ("create", "sub/new.txt"),
        ("chmod", "sub/new.txt"),
        ("write", "sub/new.txt"),
    ]
    assert not any(transfers.UPLOAD_PREFIX in name for _, name in seen.pairs())


async def test_a_failed_upload_shows_nothing_and_keeps_the_file(ws: Path) -> None:
    async with watching(ws, ".") as seen:
        with pytest.raises(ToolError):
            await transfers.receive(ws, "old.txt", tar=False, mode=0, chunks=broken())
        (ws / "marker").write_text("")
        await seen.until("create", "marker")
    assert seen.pairs()[0] == ("create", "marker")
    assert (ws / "old.txt").read_text() == "old"
    assert [p.name for p in ws.iterdir() if p.name.startswith(transfers.UPLOAD_PREFIX)] == []


async def test_lone_renames_of_upload_names_are_bounded(ws: Path, tmp_path: Path) -> None:
    """A sandbox moving files named like uploads out of the folder (their far end never
    comes): the watch remembers at most _LANDINGS of them, and reports none."""
    away = make_folder(tmp_path / "away")
    async with watching(ws, ".") as seen:
        for i in range(watch._LANDINGS * 3):
            name = f"{transfers.UPLOAD_PREFIX}{i:016x}-w"
            (ws / name).write_text("")
            (ws / name).rename(away / name)
        (ws / "marker").write_text("")
        await seen.until("create", "marker")
        assert len(seen.watch._landing) <= watch._LANDINGS
    assert seen.pairs() == [("create", "marker")]


async def test_a_rename_by_the_sandbox_is_still_rename_and_create(ws: Path) -> None:
    async with watching(ws, ".") as seen:
        (ws / "old.txt").rename(ws / "moved.txt")
        await seen.until("create", "moved.txt")
    assert seen.pairs() == [("rename", "old.txt"), ("create", "moved.txt")]
