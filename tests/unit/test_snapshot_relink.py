"""A restore into the sandbox a snapshot was taken of links the files its workspace still
holds unchanged and copies the others (snapshots/restore.py, Reuse): the result is what a
copy of every file gives, entry by entry (tree_of), whatever changed in between. Each hazard
of the links has its test: a file changed in the same second as the capture, one changed
with its size and mtime put back, a hard-linked pair, a file replaced by a link, another
owner, a set-user-ID bit, an extended attribute, a change between staging and the switch, a
crash between the two, a size-capped workspace, and a manifest from before walked_ns."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import pytest

from stockade.supervisor.sandboxes.layout import Paths, paths_at
from stockade.supervisor.sandboxes.snapshots import staging
from stockade.supervisor.sandboxes.snapshots.repository import SnapshotNotFound, SnapshotStore
from tests.unit.snapshot_trees import IDS, make_tree, tree_of

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="owners are set: needs root")

FILES = 40
SETTLE_S = 1.1
"""Longer than the second within which a file's ctime makes it copied, never linked."""


def chown_all(root: Path, ids: tuple[int, int]) -> None:
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            os.chown(os.path.join(folder, name), *ids, follow_symlinks=False)
    os.chown(root, *ids)


@pytest.fixture
def box(tmp_path: Path) -> Paths:
    """A sandbox's folder whose workspace holds make_tree's tree and FILES files more, owned
    by IDS and older than a second."""
    paths = paths_at(tmp_path / "box")
    paths.workspace.mkdir(parents=True)
    make_tree(paths.workspace)
    (paths.workspace / "many").mkdir()
    for i in range(FILES):
        (paths.workspace / "many" / f"f{i:03d}").write_bytes(os.urandom(3000))
    chown_all(paths.workspace, IDS)
    time.sleep(SETTLE_S)
    return paths


def taken(store: SnapshotStore, paths: Paths) -> dict[bytes, tuple[object, ...]]:
    """Snapshot the workspace as "s" and return what a restore must give back."""
    store.capture("t", "s", paths.workspace, "box")
    return tree_of(paths.workspace)


def restored(store: SnapshotStore, paths: Paths, *, link: bool = True) -> staging.Staged:
    staged = staging.stage(store, "t", "s", paths, IDS, 0, link=link)
    staged.switch()
    return staged


def inode(path: Path) -> int:
    return os.lstat(path).st_ino


def counts(staged: staging.Staged) -> tuple[int, int]:
    assert staged.reuse is not None
    return staged.reuse.linked, staged.reuse.copied


def all_files(root: Path) -> list[Path]:
    return [Path(d) / n for d, _, names in os.walk(root) for n in names]


def test_only_the_changed_files_are_copied(store: SnapshotStore, box: Paths) -> None:
    want = taken(store, box)
    files = len([p for p in all_files(box.workspace) if not p.is_symlink()])
    kept = box.workspace / "many" / "f000"
    before = inode(kept)
    (box.workspace / "many" / "f001").write_bytes(b"rewritten")
    (box.workspace / "many" / "f002").unlink()
    (box.workspace / "many" / "new").write_bytes(b"new")
    (box.workspace / "empty").rmdir()
    staged = restored(store, box)
    assert tree_of(box.workspace) == want  # modes, owners, mtimes of folders, links, names
    assert counts(staged) == (files - 2, 2)
    assert inode(kept) == before
    assert {os.lstat(p).st_nlink for p in all_files(box.workspace) if not p.is_symlink()} == {1}
    assert not (box.root / "workspace.restoring").exists()


def test_a_file_changed_in_the_same_second_as_the_capture_is_copied(
    store: SnapshotStore, box: Paths
) -> None:
    hot = box.workspace / "many" / "f003"
    hot.write_bytes(b"A" * 3000)
    os.chown(hot, *IDS)
    want = taken(store, box)
    mtime = os.stat(hot).st_mtime_ns
    with open(hot, "r+b") as f:  # as a write in the capture's clock tick would: ctime may stay
        f.write(b"B" * 3000)
    os.utime(hot, ns=(mtime, mtime))
    before = inode(hot)
    staged = restored(store, box)
    assert hot.read_bytes() == b"A" * 3000
    assert inode(hot) != before
    assert tree_of(box.workspace) == want
    assert counts(staged)[1] == 1


def test_content_changed_with_size_and_mtime_put_back_is_copied(
    store: SnapshotStore, box: Paths
) -> None:
    want = taken(store, box)
    victim = box.workspace / "many" / "f004"
    old = os.stat(victim)
    victim.write_bytes(os.urandom(3000))  # `touch -d` after: only the ctime tells
    os.utime(victim, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert (os.stat(victim).st_size, os.stat(victim).st_mtime_ns) == (3000, old.st_mtime_ns)
    staged = restored(store, box)
    assert tree_of(box.workspace) == want
    assert inode(victim) != old.st_ino
    assert counts(staged)[1] == 1


def test_a_hard_linked_pair_comes_back_as_two_files(store: SnapshotStore, tmp_path: Path) -> None:
    paths = paths_at(tmp_path / "box")
    paths.workspace.mkdir(parents=True)
    (paths.workspace / "a").write_bytes(b"shared")
    os.link(paths.workspace / "a", paths.workspace / "b")
    chown_all(paths.workspace, IDS)
    time.sleep(SETTLE_S)
    want = taken(store, paths)
    staged = restored(store, paths)
    assert tree_of(paths.workspace) == want
    a, b = os.stat(paths.workspace / "a"), os.stat(paths.workspace / "b")
    assert a.st_ino != b.st_ino, "two files, as a copy gives"
    assert (a.st_nlink, b.st_nlink) == (1, 1)
    assert counts(staged) == (1, 1)


def test_a_file_replaced_by_a_link_comes_back_a_file(store: SnapshotStore, box: Paths) -> None:
    want = taken(store, box)
    swapped = box.workspace / "many" / "f005"
    swapped.unlink()
    os.symlink("/etc/passwd", swapped)
    restored(store, box)
    assert tree_of(box.workspace) == want
    assert not swapped.is_symlink()


def test_a_file_of_another_owner_or_setuid_or_with_xattrs_is_copied(
    store: SnapshotStore, box: Paths
) -> None:
    other, setuid, marked = (box.workspace / "many" / f"f{i:03d}" for i in (6, 7, 8))
    os.chown(other, 1111, 2222)
    setuid.chmod(0o4755)
    os.setxattr(marked, "user.note", b"kept by a link, not by a copy")
    time.sleep(SETTLE_S)
    want = taken(store, box)
    staged = restored(store, box)
    got = tree_of(box.workspace)
    assert got.pop(b"many/f006") == (*want.pop(b"many/f006")[:-1], IDS)
    assert got.pop(b"many/f007") == ("f", 0o755, *want.pop(b"many/f007")[2:])  # no setuid
    assert got == want
    assert os.listxattr(marked) == []
    assert counts(staged)[1] == 3


def test_a_change_between_staging_and_the_switch_is_copied(
    store: SnapshotStore, box: Paths
) -> None:
    want = taken(store, box)
    staged = staging.stage(store, "t", "s", box, IDS, 0, link=True)
    late = box.workspace / "many" / "f009"
    late.write_bytes(b"written while the old container still ran")
    staged.switch()
    assert tree_of(box.workspace) == want
    assert counts(staged)[1] == 1


def test_a_crash_before_the_switch_leaves_the_live_workspace_as_it_was(
    store: SnapshotStore, box: Paths
) -> None:
    taken(store, box)
    (box.workspace / "many" / "f010").write_bytes(b"after the snapshot")
    live = tree_of(box.workspace)
    staged = staging.stage(store, "t", "s", box, IDS, 0, link=True)
    assert staged.reuse is not None
    folders = sorted(staged.reuse.pending, key=len)
    staging.hostfs.remove_tree(box.root / "workspace.restoring" / "many")  # fails part way
    assert ("many",) in folders
    with pytest.raises(OSError, match="staged folder"):
        staged.switch()
    staged.discard()  # what _into does; a supervisor that died instead: the next stage()
    assert tree_of(box.workspace) == live
    assert {os.lstat(p).st_nlink for p in all_files(box.workspace) if not p.is_symlink()} == {1}
    assert not (box.root / "workspace.restoring").exists()


def test_a_staged_folder_left_by_a_crash_is_removed_without_touching_the_live_files(
    store: SnapshotStore, box: Paths
) -> None:
    want = taken(store, box)
    staged = staging.stage(store, "t", "s", box, IDS, 0, link=True)
    assert staged.reuse is not None
    store.relink("t", "s", staged.folder, IDS, staged.reuse)  # linked, then the supervisor died
    assert staged.reuse.linked > FILES
    live = tree_of(box.workspace)
    staging.stage(store, "t", "s", box, IDS, 0, link=True)  # the next restore, after a restart
    assert tree_of(box.workspace) == live == want
    assert {os.lstat(p).st_nlink for p in all_files(box.workspace) if not p.is_symlink()} == {1}


def test_no_link_without_link_nor_for_an_old_manifest(store: SnapshotStore, box: Paths) -> None:
    want = taken(store, box)
    kept = box.workspace / "many" / "f011"
    before = inode(kept)
    assert restored(store, box, link=False).reuse is None
    assert inode(kept) != before
    assert tree_of(box.workspace) == want
    manifest = store.root / "t" / "manifests" / "s.json.gz"
    body = json.loads(gzip.decompress(manifest.read_bytes()))
    del body["head"]["walked_ns"]  # written before restores linked
    manifest.write_bytes(gzip.compress(json.dumps(body).encode()))
    staged = restored(store, box)
    assert counts(staged)[0] == 0
    assert tree_of(box.workspace) == want


def test_a_capped_workspace_copies(store: SnapshotStore, box: Paths) -> None:
    want = taken(store, box)
    staged = staging.stage(store, "t", "s", box, IDS, 8, link=True)
    assert staged.reuse is None  # a new file system: a link cannot reach it
    staged.switch()
    assert box.image.exists()
    staging.workspaces.mount_image(box.image, box.workspace, fresh=False)
    try:
        assert {k: v for k, v in tree_of(box.workspace).items() if k != b"lost+found"} == want
    finally:
        staging.workspaces.unmount(box.workspace)


def test_a_snapshot_deleted_between_staging_and_the_switch_is_a_clear_error(
    store: SnapshotStore, box: Paths
) -> None:
    taken(store, box)
    staged = staging.stage(store, "t", "s", box, IDS, 0, link=True)
    (box.workspace / "many" / "f012").write_bytes(b"changed: its stored copy is needed")
    live = tree_of(box.workspace)
    store.delete("t", "s")  # its content collected
    with pytest.raises(SnapshotNotFound, match="deleted while it was restored"):
        staged.switch()
    staged.discard()
    assert tree_of(box.workspace) == live
