"""The store's capture in steps (a pre-copy while the tree changes, then a capture that reads
only what changed since), optional parts (/tmp), transient captures (a fork's), the byte
budget that stops a capture part way, and the staged workspace switched in one step."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stockade.supervisor.errors import InvalidRequest, QuotaExceeded
from stockade.supervisor.sandboxes.layout import paths_at
from stockade.supervisor.sandboxes.snapshots import staging
from stockade.supervisor.sandboxes.snapshots.capture import DIR_FLAGS
from stockade.supervisor.sandboxes.snapshots.repository import (
    MAIN,
    Opener,
    SnapshotNotFound,
    SnapshotStore,
    check_name,
)
from tests.unit.snapshot_trees import IDS, owned, tree_of


def opener(path: Path) -> Opener:
    return lambda: os.open(path, DIR_FLAGS)


def age(root: Path, seconds: float) -> None:
    """Make every file's ctime older than the pre-copy's racy window: ctime cannot be set,
    so wait instead (only files whose ctime is within a second are re-read)."""
    del root
    time.sleep(seconds)


@pytest.fixture
def tree(tree: Path) -> Path:
    """conftest.py's tree with 20 random files more."""
    for i in range(20):
        (tree / f"f{i}").write_bytes(os.urandom(1000))
    return tree


def test_precopy_then_frozen_pass_reads_only_what_changed(
    store: SnapshotStore, tree: Path, tmp_path: Path
) -> None:
    age(tree, 1.2)
    session = store.begin("t")
    try:
        cached, _ = session.precopy({MAIN: opener(tree)}, "box")
        (tree / "f3").write_bytes(b"changed after the pre-copy")
        (tree / "new").write_bytes(b"new file")
        snap, stats = session.capture("one", {MAIN: opener(tree)}, "box", cached, source="k")
    finally:
        session.end()
    assert stats.files_read == 2  # f3 and new: nothing else is read while frozen
    assert snap.source == "k"
    assert snap.parts == (MAIN,)
    target = tmp_path / "r"
    store.restore("t", "one", target, IDS)
    assert tree_of(target) == owned(tree_of(tree), IDS)


def test_precopy_s_records_stand_for_the_unchanged_entries_while_frozen(
    store: SnapshotStore, tree: Path, tmp_path: Path
) -> None:
    """The frozen pass given the pre-copy's records (capture.Known) takes over every entry
    whose record is the same, reads f3 and new, and the restore is exact."""
    age(tree, 1.2)
    session = store.begin("t")
    try:
        cached, known = session.precopy({MAIN: opener(tree)}, "box")
        assert known
        (tree / "f3").write_bytes(b"changed after the pre-copy")
        (tree / "new").write_bytes(b"new file")
        got, stats = session.walk({MAIN: opener(tree)}, cached, known)
        session.record("one", got, "box")
    finally:
        session.end()
    assert stats.files_read == 2
    target = tmp_path / "r"
    store.restore("t", "one", target, IDS)
    assert tree_of(target) == owned(tree_of(tree), IDS)


def test_precopy_leaves_recently_changed_files_out_of_its_cache(
    store: SnapshotStore, tree: Path
) -> None:
    """A file written within a second of the pre-copy may be written while it is read with
    its ctime unchanged (the kernel's coarse clock): the frozen pass reads it again."""
    session = store.begin("t")
    try:
        cached, _ = session.precopy({MAIN: opener(tree)}, "box")
        _, stats = session.capture("one", {MAIN: opener(tree)}, "box", cached)
    finally:
        session.end()
    files = [os.path.join(folder, n) for folder, _, names in os.walk(tree) for n in names]
    assert stats.files_read == sum(not os.path.islink(f) for f in files)


def test_parts_are_restored_each_into_its_own_target(
    store: SnapshotStore, tree: Path, tmp_path: Path
) -> None:
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    tmp.chmod(0o1777)
    (tmp / "t1").write_text("in tmp")
    session = store.begin("t")
    try:
        trees = {MAIN: opener(tree), "tmp": opener(tmp)}
        snap, _ = session.capture("one", trees, "box", {})
    finally:
        session.end()
    assert snap.parts == ("tmp", MAIN)
    fresh_tmp = tmp_path / "fresh-tmp"
    fresh_tmp.mkdir()
    os.chmod(fresh_tmp, 0o1777)
    store.restore("t", "one", opener(fresh_tmp), IDS, part="tmp")
    assert (fresh_tmp / "t1").read_text() == "in tmp"
    assert (fresh_tmp / "t1").stat().st_uid == IDS[0]
    assert os.stat(fresh_tmp).st_uid == os.getuid()  # an opened target keeps its owner
    assert os.stat(fresh_tmp).st_mode & 0o7777 == 0o1777
    store.capture("t", "two", tree)
    with pytest.raises(SnapshotNotFound, match="holds no tmp"):
        store.restore("t", "two", opener(fresh_tmp), IDS, part="tmp")


def test_transient_captures_are_neither_listed_nor_counted_nor_nameable(
    store: SnapshotStore, tree: Path
) -> None:
    store.capture("t", "kept", tree)
    hold = store.hold_transient("t", "~fork-00ff")  # as a fork holds its capture
    session = store.begin("t")
    try:
        session.capture("~fork-00ff", {MAIN: opener(tree)}, "box", {})
    finally:
        session.end()
    assert [s.name for s in store.list("t")] == ["kept"]
    assert store.usage("t").count == 1
    assert store.get("t", "~fork-00ff").transient
    with pytest.raises(InvalidRequest):
        check_name("~fork-00ff")
    with pytest.raises(InvalidRequest):
        store.capture("t", "~fork-00ff", tree)  # the one-pass capture takes caller names
    store.delete("t", "~fork-00ff")
    hold.release()


@pytest.mark.parametrize("name", ["", "../x", "a/b", "x" * 129, "\x00", "é", ".hidden", "~mine"])
def test_caller_names_are_checked(name: str) -> None:
    with pytest.raises(InvalidRequest):
        check_name(name)


def test_a_capture_past_its_budget_stops_and_leaves_nothing(
    store: SnapshotStore, tree: Path
) -> None:
    store.capture("t", "first", tree)
    before = store.usage("t")
    (tree / "big").write_bytes(os.urandom(200_000))
    session = store.begin("t")
    try:
        session.budget = (100_000, "over the tenant's quota")
        with pytest.raises(QuotaExceeded, match="over the tenant's quota"):
            session.capture("second", {MAIN: opener(tree)}, "box", {})
    finally:
        session.end()
    assert store.usage("t") == before
    assert [s.name for s in store.list("t")] == ["first"]


def test_a_capture_past_max_bytes_is_undone(store: SnapshotStore, tree: Path) -> None:
    session = store.begin("t")
    try:
        with pytest.raises(QuotaExceeded):
            session.capture("one", {MAIN: opener(tree)}, "box", {}, max_bytes=1000)
    finally:
        session.end()
    assert store.usage("t").count == 0
    assert store.usage("t").bytes == 0


def test_staged_workspace_switches_in_one_step(
    store: SnapshotStore, tree: Path, tmp_path: Path
) -> None:
    store.capture("t", "one", tree)
    paths = paths_at(tmp_path / "box")
    paths.workspace.mkdir(parents=True)
    (paths.workspace / "old-file").write_text("old")
    staged = staging.stage(store, "t", "one", paths, IDS, 0)
    assert (paths.workspace / "old-file").exists()  # nothing changes before the switch
    staged.switch()
    assert tree_of(paths.workspace) == owned(tree_of(tree), IDS)
    assert not (paths.root / "workspace.restoring").exists()


def test_a_failed_stage_leaves_the_workspace_as_it_was(
    store: SnapshotStore, tree: Path, tmp_path: Path
) -> None:
    paths = paths_at(tmp_path / "box")
    paths.workspace.mkdir(parents=True)
    (paths.workspace / "old-file").write_text("old")
    with pytest.raises(SnapshotNotFound):
        staging.stage(store, "t", "missing", paths, IDS, 0)
    assert (paths.workspace / "old-file").read_text() == "old"
    assert not (paths.root / "workspace.restoring").exists()


def test_staged_leftovers_of_a_crash_are_removed(
    store: SnapshotStore, tree: Path, tmp_path: Path
) -> None:
    store.capture("t", "one", tree)
    paths = paths_at(tmp_path / "box")
    paths.workspace.mkdir(parents=True)
    leftover = paths.root / "workspace.restoring"
    (leftover / "half").mkdir(parents=True)
    staging.stage(store, "t", "one", paths, IDS, 0).switch()
    assert tree_of(paths.workspace) == owned(tree_of(tree), IDS)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a file system needs root")
def test_a_snapshot_too_big_for_the_cap_is_a_clear_error(
    store: SnapshotStore, tmp_path: Path
) -> None:
    big = tmp_path / "big"
    big.mkdir()
    (big / "blob").write_bytes(os.urandom(3 << 20))
    store.capture("t", "big", big)
    paths = paths_at(tmp_path / "box")
    paths.workspace.mkdir(parents=True)
    with pytest.raises(staging.SnapshotTooBig, match="size cap"):
        staging.stage(store, "t", "big", paths, IDS, 2)
    assert not (paths.root / "workspace.img.restoring").exists()
    assert not (paths.root / "workspace.restoring").exists()
    staged = staging.stage(store, "t", "big", paths, IDS, 8)
    staged.switch()
    assert paths.image.exists()
    assert not paths.workspace.is_mount()


def _object_names(store: SnapshotStore) -> set[str]:
    return {p.name for p in (store.root / "t" / "objects").glob("*/*")}


def test_a_pre_copy_of_a_file_changed_since_is_not_kept(store: SnapshotStore, tree: Path) -> None:
    age(tree, 1.2)
    session = store.begin("t")
    try:
        cached, _ = session.precopy({MAIN: opener(tree)}, "box")
        (tree / "f3").write_bytes(b"changed after the pre-copy")
        (tree / "f4").unlink()
        session.capture("one", {MAIN: opener(tree)}, "box", cached)
    finally:
        session.end()
    wanted = {e for e in _object_names(store)}
    store.delete("t", "one")  # collects what no manifest uses: nothing was left unused
    assert _object_names(store) == set()
    assert len(wanted) == sum(1 for p in tree.rglob("*") if p.is_file() and not p.is_symlink())


def test_a_session_that_records_nothing_leaves_nothing(store: SnapshotStore, tree: Path) -> None:
    store.capture("t", "kept", tree)
    before = _object_names(store)
    (tree / "brand-new").write_bytes(os.urandom(5000))
    session = store.begin("t")
    try:
        session.precopy({MAIN: opener(tree)}, "box")
        assert _object_names(store) != before
    finally:
        session.end()
    assert _object_names(store) == before


def test_a_deferred_walk_writes_its_content_with_the_manifest(
    store: SnapshotStore, tree: Path, tmp_path: Path
) -> None:
    """A checkpoint's walk (session.defer) keeps new small files in memory and writes them
    into the store with the manifest, not before: the restore is exact; a file over
    DEFER_FILE_BYTES is stored at once; a session that records nothing leaves nothing."""
    from stockade.supervisor.sandboxes.snapshots.repository import DEFER_FILE_BYTES

    (tree / "big").write_bytes(os.urandom(DEFER_FILE_BYTES + 1))
    (tree / "twin-a").write_bytes(b"same content")
    (tree / "twin-b").write_bytes(b"same content")
    session = store.begin("t")
    try:
        session.defer = True
        got, stats = session.walk({MAIN: opener(tree)}, {})
        assert len(_object_names(store)) == 1, "only the big file is in the store yet"
        session.record("one", got, "box")
    finally:
        session.end()
    files = [p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()]
    assert stats.files_read == len(files)
    assert len(_object_names(store)) == len({p.read_bytes() for p in files})
    target = tmp_path / "r"
    store.restore("t", "one", target, IDS)
    assert tree_of(target) == owned(tree_of(tree), IDS)
    (tree / "unrecorded").write_bytes(b"never kept")
    before = _object_names(store)
    session = store.begin("t")
    try:
        session.defer = True
        session.walk({MAIN: opener(tree)}, {})
    finally:
        session.end()
    assert _object_names(store) == before


def test_a_deferred_walk_meets_the_quota_while_it_walks(store: SnapshotStore, tree: Path) -> None:
    """The content kept in memory counts against the session's budget as it is read: the
    walk (before the call) fails, not the write after it."""
    session = store.begin("t")
    try:
        session.defer = True
        session.budget = (100, "over the tenant's bytes")
        with pytest.raises(QuotaExceeded, match="over the tenant's bytes"):
            session.walk({MAIN: opener(tree)}, {})
    finally:
        session.end()
    assert _object_names(store) == set()


def test_a_deferred_walk_keeps_at_most_its_bound_in_memory(
    store: SnapshotStore, tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past DEFER_BYTES of kept content, the rest is stored as it is read; all of it is in
    the store once recorded."""
    from stockade.supervisor.sandboxes.snapshots import repository

    monkeypatch.setattr(repository, "DEFER_BYTES", 2500)  # two or three of the 1000-byte files
    session = store.begin("t")
    try:
        session.defer = True
        got, _ = session.walk({MAIN: opener(tree)}, {})
        kept = len(session._deferred)
        assert kept >= 1
        assert session._deferred_bytes <= 2500
        assert len(_object_names(store)) == len({p.read_bytes() for p in _files(tree)}) - kept
        session.record("one", got, "box")
    finally:
        session.end()
    assert len(_object_names(store)) == len({p.read_bytes() for p in _files(tree)})
    store.restore("t", "one", tmp_path / "r", IDS)
    assert tree_of(tmp_path / "r") == owned(tree_of(tree), IDS)


def _files(tree: Path) -> list[Path]:
    return [p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()]
