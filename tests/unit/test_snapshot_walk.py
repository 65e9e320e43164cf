"""The capture's walk through statdir (each folder's lstats in C, statdir.c) against the walk by
names in Python: the same entries for every kind of tree, records that stand for an entry only
while they are byte for byte the same, and every limit and race met the same way."""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor.sandboxes.snapshots import statdir
from stockade.supervisor.sandboxes.snapshots.capture import (
    DIR_FLAGS,
    Captured,
    Entry,
    Known,
    Limits,
    SnapshotTooLarge,
    capture,
)
from stockade.supervisor.sandboxes.snapshots.repository import RACY_NS, keys_of
from tests.unit.snapshot_trees import NON_UTF8, make_tree, settle


@pytest.fixture(autouse=True)
def _library() -> None:
    assert statdir.available(), (
        f"{statdir.LIBRARY} is missing: `make statdir` (scripts/setup.sh builds it)"
    )


class Store:
    """A store() that hashes what it is given and counts the files read."""

    def __init__(self) -> None:
        self.read: list[int] = []

    def __call__(self, fd: int) -> tuple[str, int]:
        digest, size = hashlib.sha256(), 0
        while data := os.pread(fd, 1 << 20, size):
            digest.update(data)
            size += len(data)
        self.read.append(os.fstat(fd).st_ino)
        return digest.hexdigest(), size


@pytest.fixture
def root_fd(tmp_path: Path) -> Iterator[int]:
    (tmp_path / "t").mkdir()
    fd = os.open(tmp_path / "t", DIR_FLAGS)
    yield fd
    os.close(fd)


def walk(
    fd: int,
    *,
    native: bool = True,
    known: Known | None = None,
    cached: dict[tuple[int, ...], Entry] | None = None,
    limits: Limits | None = None,
    racy: bool = True,
    store: Store | None = None,
) -> Captured:
    racy_after = time.time_ns() - RACY_NS if racy else 0
    return capture(
        fd, limits or Limits(), cached or {}, store or Store(), racy_after, known, native=native
    )


def paths(entries: list[Entry]) -> dict[bytes, tuple[Any, ...]]:
    """Each entry by its path (rebuilt from the preorder's depths), without its key."""
    out: dict[bytes, tuple[Any, ...]] = {}
    stack: list[bytes] = []
    for e in entries:
        del stack[e.depth - 1 :]
        path = b"/".join([*stack, os.fsencode(e.name)])
        assert path not in out
        out[path] = (e.kind, e.mode, e.mtime_ns, e.digest, e.size, e.target)
        if e.kind == "d":
            stack.append(os.fsencode(e.name))
    return out


def hostile(root: Path) -> None:
    """make_tree's kinds, and names and shapes a walk's parser or loop could trip on."""
    make_tree(root)
    (root / "tab\tnew\nline").write_text("newline in the name")
    (root / "spaces 1 2 3 4 5 6 7").write_text("numbers and spaces like a record's")
    (root / "slash-like \\ back").write_text("x")
    os.mkdir(os.fsencode(root) + b"/\xff\xfe\n")
    with open(os.fsencode(root) + b"/\xff\xfe\n/" + NON_UTF8 + b" 5 6 7", "wb") as f:
        f.write(b"inside")
    os.link(root / "private", root / "hard-link-of-private")
    os.symlink("loop-b", root / "loop-a")
    os.symlink("loop-a", root / "loop-b")
    os.symlink(".", root / "self")
    os.mkfifo(root / "fifo")
    (root / ("x" * 200)).write_text("a long name")


def test_the_records_are_each_entry_s_lstat_sorted_by_name_bytes(
    tmp_path: Path, root_fd: int
) -> None:
    hostile(tmp_path / "t")
    got = statdir.Reader()(root_fd, 3)
    assert got is not None
    names = sorted(os.listdir(os.fsencode(tmp_path / "t")))
    want = [statdir.record(3, os.stat(n, dir_fd=root_fd, follow_symlinks=False), n) for n in names]
    assert got == want
    for record, name in zip(got, names, strict=True):
        parsed_name, fields = statdir.parse(record)
        assert os.fsencode(parsed_name) == name
        info = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
        assert fields == (
            info.st_mode, info.st_dev, info.st_ino, info.st_ctime_ns, info.st_size,
            info.st_mtime_ns,
        )  # fmt: skip


def test_a_folder_past_the_first_buffer_is_read_whole(tmp_path: Path, root_fd: int) -> None:
    for i in range(400):  # ~100 KiB of records: past FIRST_CAP, so the buffer grows
        (tmp_path / "t" / f"{i:04d}{'n' * 240}").write_bytes(b"")
    got = statdir.Reader()(root_fd, 1)
    assert got is not None
    assert len(got) == 400
    assert sum(map(len, got)) > statdir.FIRST_CAP


def test_an_empty_folder_and_a_closed_descriptor(root_fd: int) -> None:
    assert statdir.Reader()(root_fd, 1) == []
    assert statdir.Reader()(-1, 1) is None  # EBADF: the caller reads it itself


@pytest.mark.parametrize("native", [True, False])
def test_both_walks_give_the_same_entries(tmp_path: Path, root_fd: int, native: bool) -> None:
    hostile(tmp_path / "t")
    got = walk(root_fd, native=native)
    assert paths(got.entries) == paths(walk(root_fd, native=False).entries)
    assert sorted(got.skipped) == ["fifo"]
    kinds = {p: v[0] for p, v in paths(got.entries).items()}
    assert kinds[b"loop-a"] == kinds[b"self"] == "l"
    assert kinds[b"\xff\xfe\n/" + NON_UTF8 + b" 5 6 7"] == "f"
    assert not native or got.known, "the native walk keeps its records"
    assert got.files == sum(e.kind == "f" for e in got.entries)
    assert got.bytes == sum(e.size for e in got.entries)


def test_a_known_record_is_its_entry_again_and_nothing_is_read(
    tmp_path: Path, root_fd: int
) -> None:
    hostile(tmp_path / "t")
    settle()
    store = Store()
    first = walk(root_fd, store=store)
    files = sum(e.kind == "f" for e in first.entries)
    assert len(store.read) == files
    second = walk(root_fd, known=first.known, store=store)
    assert len(store.read) == files, "nothing read again"
    assert [id(e) for e in second.entries if e.kind != "l"] == [
        id(e) for e in first.entries if e.kind != "l"
    ]
    assert second.known == first.known
    links = sum(e.kind == "l" for e in first.entries)
    assert len(first.known) == len(first.entries) - links  # every file and folder, no link


def test_a_change_that_keeps_size_and_mtime_is_read_again(tmp_path: Path, root_fd: int) -> None:
    """The record holds the ctime, which the sandbox cannot set back: a file rewritten with
    its old size and mtime put back is a new record, read again."""
    f = tmp_path / "t" / "f"
    f.write_bytes(b"before")
    settle()
    first = walk(root_fd)
    old = f.stat()
    f.write_bytes(b"after!")
    os.utime(f, ns=(old.st_atime_ns, old.st_mtime_ns))
    second = walk(root_fd, known=first.known, cached=keys_of(first.entries))
    assert second.files_read == 1
    assert paths(second.entries)[b"f"][3] == hashlib.sha256(b"after!").hexdigest()


def test_kinds_swapped_between_walks(tmp_path: Path, root_fd: int) -> None:
    """A file replaced by a folder, a folder by a file, a folder by a link to a folder
    elsewhere: each is what it is now, and nothing behind the link is read."""
    t = tmp_path / "t"
    (t / "was-file").write_text("x")
    (t / "was-dir").mkdir()
    (t / "was-dir" / "inside").write_text("y")
    (t / "to-link").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("never read")
    settle()
    first = walk(root_fd)
    (t / "was-file").unlink()
    (t / "was-file").mkdir()
    (t / "was-dir" / "inside").unlink()
    (t / "was-dir").rmdir()
    (t / "was-dir").write_text("now a file")
    (t / "to-link").rmdir()
    os.symlink(tmp_path / "outside", t / "to-link")
    second = walk(root_fd, known=first.known, cached=keys_of(first.entries))
    assert paths(second.entries) == paths(walk(root_fd, native=False).entries)
    kinds = {p: v[0] for p, v in paths(second.entries).items()}
    assert kinds == {b"was-file": "d", b"was-dir": "f", b"to-link": "l"}


def stale_reader(monkeypatch: pytest.MonkeyPatch, records: dict[int, list[bytes]]) -> None:
    """statdir's reader answers the root's listing from `records` (what a walk listed before
    the tree changed, as a race between the listing and the open would)."""
    real = statdir.Reader.__call__

    def reader(self: statdir.Reader, fd: int, depth: int) -> list[bytes] | None:
        return records[depth] if depth in records else real(self, fd, depth)

    monkeypatch.setattr(statdir.Reader, "__call__", reader)


def test_a_folder_swapped_after_its_listing_is_looked_at_again(
    tmp_path: Path, root_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = tmp_path / "t"
    (t / "sub").mkdir()
    (t / "sub" / "a").write_text("old")
    (t / "other").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("never read")
    settle()
    first = walk(root_fd)
    listed = statdir.Reader()(root_fd, 1)
    assert listed is not None
    # after the listing: sub becomes another folder, other a link to a folder outside
    os.rename(t / "sub", t / "gone")
    (t / "sub").mkdir()
    (t / "sub" / "b").write_text("new")
    os.rmdir(t / "other")
    os.symlink(tmp_path / "outside", t / "other")
    stale_reader(monkeypatch, {1: [r for r in listed if b"/gone" not in r]})
    store = Store()
    second = walk(root_fd, known=first.known, store=store)
    got = paths(second.entries)
    assert set(got) == {b"sub", b"sub/b", b"other"}
    assert got[b"other"][0] == "l"
    assert got[b"sub/b"][3] == hashlib.sha256(b"new").hexdigest()
    assert os.stat(tmp_path / "outside" / "secret").st_ino not in store.read


def test_the_c_side_failing_reads_the_folder_in_python(
    tmp_path: Path, root_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile(tmp_path / "t")
    monkeypatch.setattr(statdir, "_func", lambda fd, depth, buf, cap: -errno.EIO)
    assert statdir.Reader()(root_fd, 1) is None
    got = walk(root_fd)
    assert paths(got.entries) == paths(walk(root_fd, native=False).entries)


def test_a_racy_file_gets_no_key_and_no_record(tmp_path: Path, root_fd: int) -> None:
    """A file whose ctime is within the racy window of the walk (a write after the thaw, in
    the same tick of the kernel's coarse clock, could keep its ctime, size and mtime) is
    read again by the next walk: no key, and its record is not kept."""
    t = tmp_path / "t"
    (t / "old").write_text("old")
    settle()
    (t / "new").write_text("new")
    first = walk(root_fd)
    by_name = {e.name: e for e in first.entries}
    assert by_name["old"].key
    assert not by_name["new"].key
    assert [r for r in first.known if r.endswith(b"/new")] == []
    store = Store()
    walk(root_fd, known=first.known, cached=keys_of(first.entries), store=store)
    assert store.read == [os.stat(t / "new").st_ino]


def test_a_walk_without_a_racy_window_keeps_no_records(tmp_path: Path, root_fd: int) -> None:
    (tmp_path / "t" / "f").write_text("x")
    assert walk(root_fd, racy=False).known == {}


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (Limits(max_entries=5), "more than 5 entries"),
        (Limits(max_depth=2), "deeper than 2"),
        (Limits(max_name_bytes=20), "a name longer than the limit"),
        (Limits(max_bytes=100), "bytes of files"),
    ],
)
def test_limits_hold_in_both_walks(
    tmp_path: Path, root_fd: int, native: bool, limits: Limits, message: str
) -> None:
    t = tmp_path / "t"
    (t / "a" / "b" / "c").mkdir(parents=True)
    for i in range(6):
        (t / "a" / f"file-{i}").write_bytes(b"z" * 30)
    (t / ("n" * 30)).write_text("long")
    with pytest.raises(SnapshotTooLarge, match=message):
        walk(root_fd, native=native, limits=limits)


def test_limits_hold_for_known_records(tmp_path: Path, root_fd: int) -> None:
    """Entries taken over from known records still count against the limits."""
    t = tmp_path / "t"
    for i in range(6):
        (t / f"f{i}").write_bytes(b"z" * 30)
    settle()
    first = walk(root_fd)
    with pytest.raises(SnapshotTooLarge, match="more than 5 entries"):
        walk(root_fd, known=first.known, limits=Limits(max_entries=5))
    with pytest.raises(SnapshotTooLarge, match="bytes of files"):
        walk(root_fd, known=first.known, limits=Limits(max_bytes=100))


def test_the_walk_holds_one_descriptor_per_level(
    tmp_path: Path, root_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = tmp_path / "t"
    for i in range(50):
        (t / f"d{i}" / "x").mkdir(parents=True)
    settle()
    first = walk(root_fd)
    before = len(os.listdir("/proc/self/fd"))
    opened: list[int] = []
    real_open = os.open

    def counting(*args: Any, **kwargs: Any) -> int:
        fd = real_open(*args, **kwargs)
        opened.append(len(os.listdir("/proc/self/fd")))
        return fd

    with monkeypatch.context() as patched:
        patched.setattr(os, "open", counting)
        walk(root_fd, known=first.known)
    assert max(opened) <= before + 3
    assert len(os.listdir("/proc/self/fd")) == before
