"""hostfs.remove_tree over trees shaped like hostile workspaces: links are removed, never
followed; depth and permissions do not stop it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stockade.supervisor.sandboxes.hostfs import remove_tree
from tests.unit.fakes import make_folder


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "outside", {"keep.txt": "keep", "sub/keep2.txt": "keep2"})


def test_links_are_removed_not_followed(tmp_path: Path, outside: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")
    os.symlink(outside, tree / "dir-link")
    os.symlink(outside / "keep.txt", tree / "a" / "file-link")
    os.symlink("../../..", tree / "a" / "b" / "up")
    os.mkfifo(tree / "a" / "fifo")
    os.link(outside / "keep.txt", tree / "hard")
    remove_tree(tree)
    assert not tree.exists()
    assert (outside / "keep.txt").read_text() == "keep"
    assert (outside / "sub" / "keep2.txt").read_text() == "keep2"


def test_a_link_as_the_tree_itself_is_unlinked(tmp_path: Path, outside: Path) -> None:
    os.symlink(outside, tmp_path / "tree")
    remove_tree(tmp_path / "tree")
    assert not os.path.lexists(tmp_path / "tree")
    assert (outside / "keep.txt").is_file()


def test_deeper_than_the_recursion_limit_and_path_max(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(1500):  # 1500 levels of 10 bytes: past the recursion limit and PATH_MAX
            os.mkdir("d" * 10, dir_fd=fd)
            child = os.open("d" * 10, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)
    remove_tree(tree)
    assert not tree.exists()


def test_unreadable_folders_and_many_siblings(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    for i in range(200):
        (tree / f"s{i}" / "x").mkdir(parents=True)
    (tree / "locked" / "inner").mkdir(parents=True)
    (tree / "locked" / "inner" / "f").write_text("x")
    os.chmod(tree / "locked" / "inner", 0)
    os.chmod(tree / "locked", 0)
    if os.geteuid() != 0:
        pytest.skip("only root reads folders of mode 000")
    remove_tree(tree)
    assert not tree.exists()
