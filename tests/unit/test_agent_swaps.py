"""A folder or file swapped by sandbox code between the path check and its use: the agent's
file tools and transfers refuse it instead of following it (paths.open_dir / open_in).
The swap is made deterministic by doing it right after `resolve`."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from stockade.agent import files, patch, paths, transfers
from stockade.agent.errors import ToolError
from tests.unit.fakes import make_folder


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "ws", {"d/f.txt": "inside\n"})


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "outside", {"f.txt": "outside\n"})


def swap_for_link(folder: Path, target: Path) -> None:
    os.rename(folder, folder.with_name(folder.name + ".old"))
    os.symlink(target, folder)


def test_write_into_a_folder_swapped_for_a_link_is_refused(ws: Path, outside: Path) -> None:
    path = paths.resolve(ws, "d/f.txt", kind="file")
    swap_for_link(ws / "d", outside)
    with pytest.raises(ToolError) as info:
        files._atomic_write(ws, path, b"pwned", "d/f.txt")
    assert info.value.code == "INVALID_PATH"
    assert "became a link" in info.value.message
    assert (outside / "f.txt").read_text() == "outside\n"
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"], "no temporary file left"


def test_read_through_a_folder_swapped_for_a_link_is_refused(ws: Path, outside: Path) -> None:
    path = paths.resolve(ws, "d/f.txt", kind="file")
    swap_for_link(ws / "d", outside)
    with pytest.raises(ToolError) as info:
        files._read_bytes(path, "d/f.txt", ws)
    assert info.value.code == "INVALID_PATH"


def test_a_file_swapped_for_a_link_is_not_followed(ws: Path, outside: Path) -> None:
    path = paths.resolve(ws, "d/f.txt", kind="file")
    (ws / "d" / "f.txt").unlink()
    os.symlink(outside / "f.txt", ws / "d" / "f.txt")
    with pytest.raises(ToolError) as info:
        files._read_bytes(path, "d/f.txt", ws)
    assert info.value.code == "INVALID_PATH"
    with pytest.raises(ToolError) as info:
        files._atomic_write(ws, path, b"pwned", "d/f.txt")
    assert info.value.code == "INVALID_PATH"
    assert (outside / "f.txt").read_text() == "outside\n"


async def test_download_of_a_file_swapped_for_a_fifo_fails_at_once(ws: Path) -> None:
    path = paths.resolve(ws, "d/f.txt", kind="file")
    (ws / "d" / "f.txt").unlink()
    os.mkfifo(ws / "d" / "f.txt")  # no writer: a blocking open would hang forever
    with pytest.raises(ToolError) as info:
        async for _ in transfers._read(ws, path, "d/f.txt"):
            pass
    assert info.value.code == "INVALID_PATH"


async def test_uploads_and_tar_never_open_a_folder_that_became_a_link(
    ws: Path, outside: Path
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"pwned"

    target = paths.resolve(ws, "d", kind="dir")
    swap_for_link(ws / "d", outside)
    with pytest.raises(ToolError) as opened:
        paths.open_dir(ws, target, "d")  # what upload and tar do after resolve
    assert opened.value.code == "INVALID_PATH"
    for tar in (False, True):
        with pytest.raises(ToolError) as info:
            await transfers.receive(ws, "d/x" if not tar else "d", tar=tar, mode=0, chunks=chunks())
        assert info.value.code == "INVALID_PATH"
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"]


PATCHES = {
    "add": "*** Add File: d/new.txt\n+pwned\n",
    "add in a new folder": "*** Add File: d/sub/deep/new.txt\n+pwned\n",
    "update": "*** Update File: d/f.txt\n@@\n-inside\n+pwned\n",
    "move out": "*** Update File: d/f.txt\n*** Move to: moved.txt\n",
    "move in": "*** Update File: top.txt\n*** Move to: d/top.txt\n",
    "delete": "*** Delete File: d/f.txt\n",
}


@pytest.mark.parametrize("section", PATCHES.values(), ids=PATCHES.keys())
def test_apply_patch_into_a_folder_swapped_after_planning_is_refused(
    ws: Path, outside: Path, section: str
) -> None:
    """Everything is checked and planned, then `d` becomes a link out: the commit writes,
    creates, moves and deletes nothing outside (and takes nothing from there)."""
    (ws / "top.txt").write_text("top\n")
    plan = patch._plan(ws, patch.parse(f"*** Begin Patch\n{section}*** End Patch\n"))
    swap_for_link(ws / "d", outside)
    with pytest.raises(ToolError) as info:
        patch._commit(ws, plan)
    assert info.value.code == "INVALID_PATH"
    assert "became a link" in info.value.message
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"]
    assert (outside / "f.txt").read_text() == "outside\n"
    assert not (ws / "moved.txt").exists()


def test_apply_patch_never_reads_through_a_folder_swapped_for_a_link(
    ws: Path, outside: Path
) -> None:
    (outside / "f.txt").write_text("inside\nsecret\n")
    text = "*** Begin Patch\n*** Update File: d/f.txt\n@@\n-inside\n+x\n*** End Patch\n"
    [op] = patch.parse(text)
    path = paths.resolve(ws, "d/f.txt", kind="file")
    swap_for_link(ws / "d", outside)
    with pytest.raises(ToolError) as info:
        patch._patched_file(ws, path, op)
    assert info.value.code == "INVALID_PATH"
    with pytest.raises(ToolError) as info:
        patch._mode_in(ws, path, "d/f.txt")
    assert info.value.code == "INVALID_PATH"
    with pytest.raises(ToolError) as info:
        paths.exists_in(ws, path, "d/f.txt")  # not even whether a file is there
    assert info.value.code == "INVALID_PATH"


def test_exists_in(ws: Path) -> None:
    root = Path(os.path.realpath(ws))
    assert paths.exists_in(ws, root, ".")
    assert paths.exists_in(ws, root / "d" / "f.txt", "d/f.txt")
    assert not paths.exists_in(ws, root / "d" / "no.txt", "d/no.txt")
    assert not paths.exists_in(ws, root / "no" / "x.txt", "no/x.txt"), "a missing folder"
    assert not paths.exists_in(ws, root / "d" / "f.txt" / "x", "d/f.txt/x"), "a file as folder"
    os.symlink("/nowhere", ws / "d" / "dangling")
    assert paths.exists_in(ws, root / "d" / "dangling", "d/dangling"), "a link is not followed"


def test_missing_folders_are_made_level_by_level_never_through_a_swapped_link(
    ws: Path, outside: Path
) -> None:
    """write_file, uploads and apply_patch make missing parents with make_folders: a folder
    swapped for a link after the check leads nowhere outside (mkdir(parents=True) followed
    it and made the folders in `outside`)."""
    target = paths.resolve(ws, "d/new/deeper", must_exist=False, kind="dir")
    swap_for_link(ws / "d", outside)
    with pytest.raises(ToolError) as info:
        paths.make_folders(ws, target, "d/new/deeper")
    assert info.value.code == "INVALID_PATH"
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"]


def test_make_folders_reports_what_it_made_and_accepts_a_racing_mkdir(ws: Path) -> None:
    root = Path(os.path.realpath(ws))
    made: list[Path] = []
    paths.make_folders(ws, root / "x" / "y" / "z", "x/y/z", made)
    assert made == [root / "x", root / "x" / "y", root / "x" / "y" / "z"]
    made.clear()
    paths.make_folders(ws, root / "x" / "y" / "z", "x/y/z", made)
    assert made == [], "nothing to make the second time"
    (root / "x" / "file").write_text("")
    with pytest.raises(ToolError):
        paths.make_folders(ws, root / "x" / "file" / "sub", "x/file/sub")


async def test_write_file_makes_no_folder_outside_when_its_parent_is_swapped(
    ws: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_resolve = paths.resolve

    def resolve_then_swap(*args: object, **kw: object) -> Path:
        resolved = real_resolve(*args, **kw)  # type: ignore[arg-type]
        swap_for_link(ws / "d", outside)
        return resolved

    monkeypatch.setattr(paths, "resolve", resolve_then_swap)
    with pytest.raises(ToolError) as info:
        await files.write_file(ws, {"path": "d/new/x.txt", "content": "x"})
    assert info.value.code == "INVALID_PATH"
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"], "a folder made outside"
