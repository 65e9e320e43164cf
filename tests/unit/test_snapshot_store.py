"""The snapshot store over real trees in a temp folder: exact round trips (content, modes,
links, empty folders, non-UTF-8 names, mtimes), dedup, garbage collection, and trees shaped
by hostile sandbox code (links planted or swapped in mid-capture, hard links, bounds)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor.errors import InvalidRequest
from stockade.supervisor.sandboxes.snapshots import capture as capture_mod
from stockade.supervisor.sandboxes.snapshots.capture import DIR_FLAGS, Limits, SnapshotTooLarge
from stockade.supervisor.sandboxes.snapshots.repository import (
    SnapshotExists,
    SnapshotNotFound,
    SnapshotStore,
    _collect,
)
from stockade.supervisor.sandboxes.snapshots.restore import TargetNotEmpty
from tests.unit.snapshot_trees import IDS, NON_UTF8, owned, settle, tree_of


def test_round_trip_is_exact(store: SnapshotStore, tree: Path, tmp_path: Path) -> None:
    os.mkfifo(tree / "fifo")
    before = tree_of(tree)
    snap, _ = store.capture("tenant", "one", tree, lineage="box")
    assert snap.skipped == ("fifo",)
    del before[b"fifo"]
    target = tmp_path / "restored"
    store.restore("tenant", "one", target, IDS)
    assert tree_of(target) == owned(before, IDS)
    info = os.stat(target)
    assert (info.st_uid, info.st_gid) == IDS
    source = os.stat(tree)
    assert stat.S_IMODE(info.st_mode) == stat.S_IMODE(source.st_mode)
    assert info.st_mtime_ns == source.st_mtime_ns
    assert NON_UTF8 in os.listdir(os.fsencode(target))


def test_change_then_restore_gives_back_the_snapshot(
    store: SnapshotStore, tree: Path, tmp_path: Path
) -> None:
    before = tree_of(tree)
    store.capture("tenant", "one", tree, lineage="box")
    (tree / "sub" / "a.txt").write_text("changed")
    (tree / "private").chmod(0o644)
    (tree / "rel-link").unlink()
    os.symlink("elsewhere", tree / "rel-link")
    (tree / "empty" / "new").write_text("new")
    (tree / "new-file").write_text("new")
    (tree / "sub" / "deep" / "bin.dat").unlink()
    store.capture("tenant", "two", tree, lineage="box")
    assert tree_of(tree) != before
    target = tmp_path / "restored"
    store.restore("tenant", "one", target, IDS)
    assert tree_of(target) == owned(before, IDS)


def test_setuid_and_setgid_are_dropped(store: SnapshotStore, tree: Path, tmp_path: Path) -> None:
    (tree / "run.sh").chmod(0o6755)
    (tree / "sub").chmod(0o2775)
    store.capture("tenant", "one", tree)
    store.restore("tenant", "one", tmp_path / "r", IDS)
    assert stat.S_IMODE(os.stat(tmp_path / "r" / "run.sh").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(tmp_path / "r" / "sub").st_mode) == 0o775


def test_restore_copies_never_links(store: SnapshotStore, tree: Path, tmp_path: Path) -> None:
    store.capture("tenant", "one", tree)
    first = tmp_path / "r1"
    store.restore("tenant", "one", first, IDS)
    assert os.stat(first / "sub" / "a.txt").st_nlink == 1
    (first / "sub" / "a.txt").write_text("sandbox wrote this")
    second = tmp_path / "r2"
    store.restore("tenant", "one", second, IDS)
    assert (second / "sub" / "a.txt").read_text() == "hello\n"


def test_restore_refuses_a_folder_that_is_not_empty(
    store: SnapshotStore, tree: Path, tmp_path: Path
) -> None:
    store.capture("tenant", "one", tree)
    target = tmp_path / "full"
    target.mkdir()
    (target / "x").write_text("x")
    with pytest.raises(TargetNotEmpty, match="not empty"):
        store.restore("tenant", "one", target, IDS)
    assert os.listdir(target) == ["x"]


def _store_bytes(store: SnapshotStore) -> bytes:
    data = b""
    for folder, _, files in os.walk(store.root / "tenant" / "objects"):
        for name in files:
            data += Path(folder, name).read_bytes()
    return data


def test_links_are_stored_as_links_not_content(store: SnapshotStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "host-secret").write_text("HOST-SECRET-CONTENT")
    tree = tmp_path / "ws"
    tree.mkdir()
    os.symlink(outside / "host-secret", tree / "file-link")
    os.symlink(outside, tree / "dir-link")
    os.symlink("/etc/passwd", tree / "passwd")
    snap, _ = store.capture("tenant", "one", tree)
    assert snap.files == 0
    assert b"HOST-SECRET" not in _store_bytes(store)
    assert b"root:" not in _store_bytes(store)
    store.restore("tenant", "one", tmp_path / "r", IDS)
    assert os.readlink(tmp_path / "r" / "passwd") == "/etc/passwd"
    assert os.readlink(tmp_path / "r" / "dir-link") == str(outside)


class _SwapOnStat:
    """Stands in for the os module in capture: right after the lstat of `name`, the entry is
    replaced by a link to `to` (the race a running sandbox could win)."""

    def __init__(self, name: str, to: Path) -> None:
        self.name, self.to, self.done = name, to, False

    def __getattr__(self, attr: str) -> Any:
        return getattr(os, attr)

    def stat(self, name: str, *, dir_fd: int, follow_symlinks: bool) -> os.stat_result:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
        if name == self.name and not self.done:
            self.done = True
            moved = f"{name}.moved"
            os.rename(name, moved, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.symlink(self.to, name, dir_fd=dir_fd)
        return info


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_an_entry_swapped_for_a_link_mid_capture_does_not_escape(
    store: SnapshotStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "host-secret").write_text("HOST-SECRET-CONTENT")
    tree = tmp_path / "ws"
    tree.mkdir()
    if kind == "folder":
        (tree / "victim").mkdir()
        (tree / "victim" / "mine").write_text("mine")
        to = outside
    else:
        (tree / "victim").write_text("mine")
        to = outside / "host-secret"
    swap = _SwapOnStat("victim", to)
    monkeypatch.setattr(capture_mod, "os", swap)
    store.capture("tenant", "one", tree)
    monkeypatch.undo()
    assert swap.done
    assert b"HOST-SECRET" not in _store_bytes(store)
    store.restore("tenant", "one", tmp_path / "r", IDS)
    assert os.readlink(tmp_path / "r" / "victim") == str(to)
    assert (outside / "host-secret").read_text() == "HOST-SECRET-CONTENT"


def test_a_hard_link_is_stored_by_content_and_restored_apart(
    store: SnapshotStore, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.write_text("shared inode")
    tree = tmp_path / "ws"
    tree.mkdir()
    os.link(outside, tree / "hard")
    store.capture("tenant", "one", tree)
    assert os.stat(outside).st_nlink == 2  # the store copied, it did not link
    store.restore("tenant", "one", tmp_path / "r", IDS)
    restored = tmp_path / "r" / "hard"
    assert restored.read_text() == "shared inode"
    assert os.stat(restored).st_ino != os.stat(outside).st_ino
    restored.write_text("changed in the sandbox")
    assert outside.read_text() == "shared inode"


def test_ten_snapshots_of_one_percent_changes_dedup(store: SnapshotStore, tmp_path: Path) -> None:
    tree = tmp_path / "ws"
    tree.mkdir()
    files = [tree / f"f{i:03d}" for i in range(200)]
    for i, path in enumerate(files):
        path.write_bytes(os.urandom(16_384 + i))
    one_copy = sum(p.stat().st_size for p in files)
    for n in range(10):
        if n:
            for path in files[n * 2 : n * 2 + 2]:  # 1% of the files
                path.write_bytes(os.urandom(path.stat().st_size))
        settle()  # else the next capture reads these again (written within its racy window)
        _, stats = store.capture("tenant", f"s{n}", tree, lineage="box")
        assert stats.files_read == (200 if n == 0 else 2)
    usage = store.usage("tenant")
    assert usage.count == 10
    assert usage.bytes <= 1.2 * one_copy


def test_a_change_with_its_mtime_set_back_is_still_read(
    store: SnapshotStore, tmp_path: Path
) -> None:
    tree = tmp_path / "ws"
    tree.mkdir()
    path = tree / "f"
    path.write_text("aaaa")
    old = os.stat(path)
    store.capture("tenant", "one", tree, lineage="box")
    path.write_text("bbbb")
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    _, stats = store.capture("tenant", "two", tree, lineage="box")
    assert stats.files_read == 1
    store.restore("tenant", "two", tmp_path / "r", IDS)
    assert (tmp_path / "r" / "f").read_text() == "bbbb"


def test_delete_collects_what_nothing_uses(
    store: SnapshotStore, tree: Path, tmp_path: Path
) -> None:
    store.capture("tenant", "one", tree, lineage="box")
    (tree / "sub" / "a.txt").write_text("only in two")
    store.capture("tenant", "two", tree, lineage="box")
    before = store.usage("tenant")
    freed = store.delete("tenant", "one")
    assert freed > 0
    after = store.usage("tenant")
    assert after.count == 1
    assert after.bytes == before.bytes - freed
    assert b"hello\n" not in _store_bytes(store).replace(b"only in two", b"")
    store.restore("tenant", "two", tmp_path / "r", IDS)
    assert (tmp_path / "r" / "sub" / "a.txt").read_text() == "only in two"
    assert (tmp_path / "r" / "sub" / "deep" / "bin.dat").stat().st_size == 25_600
    store.delete("tenant", "two")
    assert store.usage("tenant").bytes == 0
    assert store.list("tenant") == []


def test_list_get_and_names(store: SnapshotStore, tree: Path) -> None:
    store.capture("tenant", "one", tree, lineage="box")
    store.capture("tenant", "two", tree, lineage="box")
    store.capture("other", "one", tree)
    assert [s.name for s in store.list("tenant")] == ["one", "two"]
    assert store.get("tenant", "two").lineage == "box"
    assert store.usage("other").count == 1
    with pytest.raises(SnapshotExists):
        store.capture("tenant", "one", tree)
    with pytest.raises(SnapshotNotFound):
        store.get("tenant", "three")
    with pytest.raises(SnapshotNotFound):
        store.delete("tenant", "three")
    for bad in ("../x", "", ".hidden", "a/b", "x" * 129):
        with pytest.raises(InvalidRequest):
            store.capture("tenant", bad, tree)
        with pytest.raises(InvalidRequest):
            store.list(bad)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (Limits(max_entries=10), "more than 10 entries"),
        (Limits(max_depth=2), "deeper than 2"),
        (Limits(max_name_bytes=8), "a name longer than the limit"),
        (Limits(max_bytes=1000), "more than 1000 bytes"),
        (Limits(max_link_bytes=5), "a link target longer than the limit"),
    ],
)
def test_bounds_give_clear_errors(tmp_path: Path, tree: Path, limits: Limits, message: str) -> None:
    store = SnapshotStore(tmp_path / "store", limits)
    with pytest.raises(SnapshotTooLarge, match=message):
        store.capture("tenant", "one", tree)
    assert store.list("tenant") == []


def test_a_very_deep_tree_is_refused_not_crashed(store: SnapshotStore, tmp_path: Path) -> None:
    tree = tmp_path / "ws"
    tree.mkdir()
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(300):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
    with pytest.raises(SnapshotTooLarge, match="deeper than 256"):
        store.capture("tenant", "one", tree)


def test_a_crashed_capture_leaves_nothing_counted(store: SnapshotStore, tree: Path) -> None:
    store.capture("tenant", "one", tree)
    stale = store.root / "tenant" / "objects" / "tmp.1.2"
    stale.write_bytes(b"x" * 1000)
    store.delete("tenant", "one")
    assert not stale.exists()
    assert store.usage("tenant").bytes == 0


@pytest.mark.parametrize(
    "name",
    ["plain", 'quote"back\\slash', "tab\tnew\nline\x00\x1f", "é中😀", os.fsdecode(NON_UTF8), ""],
)
def test_an_entry_s_manifest_text_is_json_dumps_own(name: str) -> None:
    """Entry.json_text (a manifest's writer: quicker) writes what json.dumps wrote, for every
    kind and for names and link targets that JSON must escape."""
    import json

    entries = [
        capture_mod.Entry(3, name, "f", 0o1755, -5, "ab" * 32, 7, key=(1, 2, 3, 7, -5)),
        capture_mod.Entry(1, name, "f", 0o644, 10**19, "cd" * 32, 0, key=()),
        capture_mod.Entry(2, name, "l", 0o777, 1, target=name + "/../x"),
        capture_mod.Entry(256, name, "d", 0o700, 0),
    ]
    for entry in entries:
        want = json.dumps(entry.to_json(), ensure_ascii=True, separators=(",", ":"))
        assert entry.json_text() == want
        assert capture_mod.Entry.from_json(json.loads(entry.json_text())) == entry


def test_an_unchanged_file_s_entry_is_taken_over_and_a_moved_one_is_not(
    store: SnapshotStore, tree: Path, tmp_path: Path
) -> None:
    """The next capture takes over the cache's entry of a file whose key, depth and name are
    the same (its manifest text is not made again); a file that moved with its folder to
    another depth keeps its digest but gets its own entry, and the restore is exact."""
    from stockade.supervisor.sandboxes.snapshots.repository import MAIN, keys_of

    (tree / "deep" / "er").mkdir(parents=True)
    (tree / "deep" / "er" / "moved.txt").write_text("moves up")
    settle()
    session = store.begin("t")
    try:
        opener = lambda: os.open(tree, capture_mod.DIR_FLAGS)  # noqa: E731
        first, _ = session.walk({MAIN: opener}, {})
        session.record("one", first, "box")
        cache = keys_of(first[MAIN].entries)
        os.rename(tree / "deep" / "er", tree / "er")
        second, stats = session.walk({MAIN: opener}, cache)
        session.record("two", second, "box")
    finally:
        session.end()
    assert stats.files_read == 0
    before = {id(e) for e in first[MAIN].entries}
    moved = [e for e in second[MAIN].entries if e.name == "moved.txt"]
    assert len(moved) == 1
    assert id(moved[0]) not in before
    assert moved[0].depth == 2
    taken_over = [e for e in second[MAIN].entries if e.kind == "f" and id(e) in before]
    assert len(taken_over) == sum(e.kind == "f" for e in second[MAIN].entries) - 1
    assert all(e.text for e in taken_over), "their manifest text was made once"
    want = tree_of(tree)
    target = tmp_path / "restored"
    store.restore("t", "two", target, IDS)
    assert tree_of(target) == owned(want, IDS)


def _objects_in(store: SnapshotStore) -> set[str]:
    return {p.name for p in (store.root / "t" / "objects").rglob("*") if p.is_file()}


def _transient(store: SnapshotStore, tree: Path, name: str) -> set[str]:
    """Capture `tree` as the transient `name` (a fork's); the content it added."""
    session = store.begin("t")
    try:
        session.capture(name, {"workspace": lambda: os.open(tree, DIR_FLAGS)}, "l", {})
        return set(session.added)
    finally:
        session.end()


def test_a_transient_capture_deleted_by_what_it_added_leaves_what_a_collection_would(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """A fork's capture is deleted reading only the manifests written since it: what it
    added and nothing uses goes, what a later snapshot took over stays, older content is
    not looked at; a full collection afterwards finds nothing more to remove."""
    tree = tmp_path / "w"
    tree.mkdir()
    (tree / "old").write_text("old content")
    store.capture("t", "before", tree)
    (tree / "new-a").write_text("only the transient capture has this")
    (tree / "new-b").write_text("a later snapshot takes this over")
    hold = store.hold_transient("t", "~fork-00aa")  # as a fork holds its capture
    added = _transient(store, tree, "~fork-00aa")
    assert len(added) == 2
    (tree / "new-a").unlink()
    store.capture("t", "after", tree)
    store.delete("t", "~fork-00aa", added=added)
    hold.release()
    digest = hashlib.sha256
    kept = _objects_in(store)
    assert digest(b"only the transient capture has this").hexdigest() not in kept
    assert digest(b"a later snapshot takes this over").hexdigest() in kept
    assert digest(b"old content").hexdigest() in kept
    assert _collect(store.root / "t") == 0
    with pytest.raises(SnapshotNotFound):
        store.delete("t", "~fork-00aa", added=added)


# -- a fork's capture left by a process that died (SnapshotStore.hold_transient) ---------------


def _manifests(store: SnapshotStore) -> set[str]:
    return {p.name for p in (store.root / "t" / "manifests").iterdir()}


def test_a_held_transient_capture_stays_and_an_unheld_one_goes_with_its_content(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """A fork that died after its capture (its lock released, as a process's end releases
    it) leaves a manifest nobody holds: the owner's next operation removes it and the content
    only it used; a live fork's capture, held, is untouched by the same operation."""
    tree = tmp_path / "w"
    tree.mkdir()
    (tree / "shared").write_text("a listed snapshot has this too")
    store.capture("t", "kept", tree)
    (tree / "dead").write_text("only the dead fork's capture has this")
    dead = store.hold_transient("t", "~fork-00dd")
    _transient(store, tree, "~fork-00dd")
    live = store.hold_transient("t", "~fork-00ee")
    _transient(store, tree, "~fork-00ee")
    os.close(dead._fd)  # the process died: its flock is gone, its files are not
    dead._fd = -1
    assert "~fork-00dd.json.gz" in _manifests(store)
    (tree / "dead").unlink()
    store.capture("t", "next", tree)  # any operation that takes the owner's store lock
    assert _manifests(store) == {
        "kept.json.gz", "next.json.gz", "~fork-00ee.json.gz", "~fork-00ee.held",
    }  # fmt: skip
    kept = _objects_in(store)
    digest = hashlib.sha256
    assert digest(b"a listed snapshot has this too").hexdigest() in kept
    assert digest(b"only the dead fork's capture has this").hexdigest() in kept, (
        "the live fork's capture uses it too"
    )
    store.delete("t", "~fork-00ee")
    live.release()
    assert digest(b"only the dead fork's capture has this").hexdigest() not in _objects_in(store)
    assert _manifests(store) == {"kept.json.gz", "next.json.gz"}


def test_a_transient_capture_of_an_older_supervisor_without_a_lock_file_goes(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """Left before forks held their captures (no lock file beside it): nobody holds it."""
    tree = tmp_path / "w"
    tree.mkdir()
    (tree / "f").write_text("only the old fork's capture has this")
    _transient(store, tree, "~fork-00aa")
    assert store.usage("t").bytes > 0
    empty = tmp_path / "empty"
    empty.mkdir()
    store.capture("t", "empty", empty)
    assert _manifests(store) == {"empty.json.gz"}
    assert _objects_in(store) == set()


def test_a_lock_file_left_without_its_manifest_goes_unless_held(store: SnapshotStore) -> None:
    """A fork that died before its capture was written, or between its delete and its
    release: the lock file alone, removed once nobody holds it."""
    dead = store.hold_transient("t", "~fork-0001")
    os.close(dead._fd)
    dead._fd = -1
    live = store.hold_transient("t", "~fork-0002")
    assert _manifests(store) == {"~fork-0002.held"}, "the dead one's went at this open"
    live.release()
    assert _manifests(store) == set()


def test_a_hold_is_refused_for_a_name_held_already_or_not_transient(
    store: SnapshotStore,
) -> None:
    hold = store.hold_transient("t", "~fork-0003")
    with pytest.raises(FileExistsError):
        store.hold_transient("t", "~fork-0003")
    with pytest.raises(InvalidRequest):
        store.hold_transient("t", "../x")
    with pytest.raises(InvalidRequest, match="only a fork's or a diff's capture"):
        store.hold_transient("t", "~ckpt-0001")
    with pytest.raises(InvalidRequest, match="only a fork's or a diff's capture"):
        store.hold_transient("t", "listed")
    hold.release()
    hold.release()  # twice: nothing more happens


def test_a_checkpoint_is_never_taken_for_a_dead_process_s_capture(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """A checkpoint (`~ckpt-`) is kept for undo with nobody holding it: it stays, with its
    content, through the sweep that removes a dead diff's capture beside it."""
    tree = tmp_path / "w"
    tree.mkdir()
    (tree / "f").write_text("a checkpoint's content")
    _transient(store, tree, "~ckpt-00aa")
    _transient(store, tree, "~now-00bb")  # no lock file: left by a process that died
    store.capture("t", "next", tree)
    assert _manifests(store) == {"~ckpt-00aa.json.gz", "next.json.gz"}
    store.delete("t", "next")
    assert hashlib.sha256(b"a checkpoint's content").hexdigest() in _objects_in(store)


def test_a_checkpoint_diff_s_capture_is_held_as_a_fork_s(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """A diff's capture of now (`~now-`, checkpoints.py) whose process died goes with the
    content only it used; a live diff's, held, stays through the same operation."""
    tree = tmp_path / "w"
    tree.mkdir()
    store.capture("t", "kept", tree)
    (tree / "dead").write_text("only the dead diff's capture has this")
    dead = store.hold_transient("t", "~now-00dd")
    _transient(store, tree, "~now-00dd")
    (tree / "dead").unlink()
    (tree / "live").write_text("only the live diff's capture has this")
    live = store.hold_transient("t", "~now-00ee")
    _transient(store, tree, "~now-00ee")
    (tree / "live").unlink()
    os.close(dead._fd)  # the process died: its flock is gone, its files are not
    dead._fd = -1
    store.capture("t", "next", tree)
    assert _manifests(store) == {
        "kept.json.gz", "next.json.gz", "~now-00ee.json.gz", "~now-00ee.held",
    }  # fmt: skip
    kept = _objects_in(store)
    assert hashlib.sha256(b"only the dead diff's capture has this").hexdigest() not in kept
    assert hashlib.sha256(b"only the live diff's capture has this").hexdigest() in kept
    store.delete("t", "~now-00ee")
    live.release()
    assert _manifests(store) == {"kept.json.gz", "next.json.gz"}
    assert hashlib.sha256(b"only the live diff's capture has this").hexdigest() not in (
        _objects_in(store)
    )


def test_a_planted_link_as_a_lock_file_is_not_followed(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """The store is the supervisor's (no sandbox writes there), but a link in the place of a
    lock file is still not opened through: it counts as no lock, and only the link goes."""
    target = tmp_path / "elsewhere"
    target.write_text("not the store's")
    store.hold_transient("t", "~fork-0004").release()  # the owner's folders made
    (store.root / "t" / "manifests" / "~fork-0005.held").symlink_to(target)
    store.hold_transient("t", "~fork-0006").release()
    assert target.read_text() == "not the store's"
    assert _manifests(store) == set()
