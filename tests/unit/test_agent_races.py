"""search and apply_patch against a folder that another process keeps swapping for a link out
of the workspace (on a temporary workspace, the agent's functions called directly): each call
acts inside the workspace or fails; none reads or writes through the link."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stockade.agent import files, patch
from stockade.agent.errors import ToolError
from tests.unit.fakes import make_folder

pytestmark = pytest.mark.timeout(120)

FLIP = """
import ctypes, os, sys
# renameat2(RENAME_EXCHANGE): `d` always exists, a folder one moment and a link the next.
libc = ctypes.CDLL(None, use_errno=True)
os.chdir(sys.argv[1])
while True:
    libc.renameat2(-100, b"d", -100, b"d.other", 2)
"""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "ws", {"d/inside.txt": "inside needle\n"})


@pytest.fixture
def outside(tmp_path: Path, ws: Path) -> Path:
    directory = make_folder(
        tmp_path / "outside", {"secret.txt": "outside needle\n", "victim.txt": "outside needle\n"}
    )
    (ws / "d.other").symlink_to(directory)
    return directory


@pytest.fixture
def flipping(ws: Path, outside: Path) -> Iterator[Callable[[], None]]:
    """A process swaps the folder `d` and the link `d.other` (to `outside`), as fast as it
    can, until the test calls the function given (or ends)."""
    proc = subprocess.Popen([sys.executable, "-c", FLIP, str(ws)])

    def stop() -> None:
        proc.kill()
        proc.wait()

    try:
        yield stop
    finally:
        stop()


def snapshot(directory: Path) -> dict[str, str]:
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
    }


def workspace_texts(root: Path) -> dict[str, bytes]:
    """Every regular file below `root`, links not followed."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            if path.is_file() and not path.is_symlink():
                found[str(path.relative_to(root))] = path.read_bytes()
    return found


@pytest.mark.usefixtures("flipping")
async def test_search_never_returns_content_from_behind_a_swapped_folder(
    ws: Path, outside: Path
) -> None:
    inside, codes = 0, set()
    for _ in range(150):
        for args in ({"pattern": "needle"}, {"pattern": "needle", "path": "d"}):
            try:
                result = await files.search(ws, args)
            except ToolError as exc:
                codes.add(exc.code)
                continue
            for match in result["matches"]:
                assert match["text"] == "inside needle", match
                assert match["file"].endswith("inside.txt"), match
                inside += 1
    assert inside > 0, "searches that won the race found the file inside"
    assert codes <= {"INVALID_PATH", "FILE_NOT_FOUND"}


async def test_search_skips_listed_names_that_lead_out(
    ws: Path, outside: Path, tmp_path: Path
) -> None:
    """What ripgrep's walk lists when a folder became a link mid-walk: names behind the link.
    They do not open inside the workspace, so they are skipped."""
    (ws / "a.txt").write_text("a needle\n")
    (ws / "d").rename(ws / "d.dir")
    (ws / "d").symlink_to(outside)
    fake = tmp_path / "listing-rg"
    fake.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" --files "*)\n'
        f"  printf '%s\\0' '{ws}/d/secret.txt' '{ws}/a.txt' '{ws}/d.other/victim.txt'; exit 0;;\n"
        "esac\n"
        'exec rg "$@"\n'
    )
    fake.chmod(0o755)
    result = await files.search(ws, {"pattern": "needle"}, rg=str(fake))
    assert result == {
        "matches": [{"file": "a.txt", "line": 1, "text": "a needle"}],
        "truncated": False,
    }


async def test_search_gives_no_matches_in_binary_files(ws: Path) -> None:
    (ws / "bin").write_bytes(b"zebra\n\0rest\n")
    (ws / "text.txt").write_text("zebra\n")
    result = await files.search(ws, {"pattern": "zebra"})
    assert [m["file"] for m in result["matches"]] == ["text.txt"]


async def test_search_of_many_files_in_batches_keeps_order_and_limit(ws: Path) -> None:
    for index in range(files._SEARCH_BATCH * 2 + 7):
        (ws / f"f{index:04}.txt").write_text("hit\nhit\n")
    result = await files.search(ws, {"pattern": "hit", "max_results": 1000})
    names = [m["file"] for m in result["matches"]]
    assert names == sorted(names)
    assert len(names) == 2 * (files._SEARCH_BATCH * 2 + 7)
    assert result["truncated"] is False
    capped = await files.search(ws, {"pattern": "hit", "max_results": 300})
    assert (len(capped["matches"]), capped["truncated"]) == (300, True)


async def test_search_with_a_bad_pattern_in_an_empty_folder_is_refused(ws: Path) -> None:
    (ws / "empty").mkdir()
    with pytest.raises(ToolError) as info:
        await files.search(ws, {"pattern": "(", "path": "empty"})
    assert info.value.code == "INVALID_ARGS"
    assert "regex parse error" in info.value.message


def patch_of(*sections: str) -> dict[str, str]:
    return {"input": "*** Begin Patch\n" + "".join(sections) + "*** End Patch\n"}


async def test_apply_patch_never_acts_through_a_swapped_folder(
    ws: Path, outside: Path, flipping: Callable[[], None]
) -> None:
    """Adds (also in new folders), moves out of and deletes in `d` while it flips: nothing
    outside changes and no content from outside lands in the workspace."""
    before = snapshot(outside)
    applied, codes = 0, set()
    for i in range(150):
        for args in (
            patch_of(f"*** Add File: d/a{i}.txt\n+new\n"),
            patch_of(f"*** Add File: d/s{i}/deep/b.txt\n+new\n"),
            patch_of("*** Add File: d/victim.txt\n+inside needle\n"),
            patch_of(f"*** Update File: d/victim.txt\n*** Move to: top{i}.txt\n"),
            patch_of("*** Add File: d/victim.txt\n+inside needle\n"),
            patch_of("*** Delete File: d/victim.txt\n"),
            patch_of("*** Update File: d/inside.txt\n@@\n-inside needle\n+inside needle\n"),
        ):
            try:
                await patch.apply_patch(ws, args)
                applied += 1
            except ToolError as exc:
                codes.add(exc.code)
    flipping()
    assert applied > 0, "patches that won the race were applied inside"
    assert codes <= {"INVALID_PATH", "FILE_NOT_FOUND", "INVALID_ARGS"}
    assert snapshot(outside) == before
    texts = workspace_texts(ws)
    assert not [name for name, data in texts.items() if b"outside" in data]


async def test_search_leaves_no_descriptor_open(ws: Path, tmp_path: Path) -> None:
    for index in range(files._SEARCH_BATCH * 3):
        (ws / f"f{index}.txt").write_text("hit\n")
    before = len(os.listdir("/proc/self/fd"))
    await files.search(ws, {"pattern": "hit", "max_results": 5})
    await files.search(ws, {"pattern": "hit", "max_results": 1000})
    slow = tmp_path / "slow-rg"
    slow.write_text(
        '#!/bin/sh\ncase " $* " in *" --files "*) exec rg "$@";; esac\nexec sleep 100\n'
    )
    slow.chmod(0o755)
    with pytest.raises(ToolError):
        await files.search(ws, {"pattern": "hit"}, rg=str(slow), timeout=1.0)
    await asyncio.sleep(0.5)  # a worker thread still opening files closes them when done
    assert len(os.listdir("/proc/self/fd")) == before
