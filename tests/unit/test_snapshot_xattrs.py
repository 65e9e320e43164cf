"""A snapshot keeps E2B's file metadata: the `user.e2b.*` extended attributes of files and
folders are captured with their entries and set again by a restore (and so by a fork and an
undo); any other attribute is not kept, a file's are bounded, and the manifest text stays
json.dumps' own. Old manifests (no attributes) still load."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stockade.supervisor.sandboxes.snapshots import capture as capture_mod
from stockade.supervisor.sandboxes.snapshots.capture import XATTR_BYTES, XATTR_PREFIX, Entry
from stockade.supervisor.sandboxes.snapshots.repository import SnapshotStore
from tests.unit.snapshot_trees import IDS


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    try:
        os.setxattr(root, XATTR_PREFIX + "probe", b"1")
        os.removexattr(root, XATTR_PREFIX + "probe")
    except OSError as exc:
        pytest.skip(f"no user extended attributes here: {exc}")
    return root


def xattrs(path: Path) -> dict[str, bytes]:
    return {n: os.getxattr(path, n) for n in sorted(os.listxattr(path))}


def test_user_e2b_attributes_survive_a_snapshot_and_a_later_capture(
    store: SnapshotStore, ws: Path, tmp_path: Path
) -> None:
    (ws / "d").mkdir()
    (ws / "d" / "f").write_text("x")
    (ws / "plain").write_text("y")
    os.setxattr(ws / "d" / "f", XATTR_PREFIX + "author", b"mish")
    os.setxattr(ws / "d" / "f", XATTR_PREFIX + "raw", b"\xff\x00\x01")  # bytes survive
    os.setxattr(ws / "d" / "f", "user.other", b"not E2B's")
    os.setxattr(ws / "d", XATTR_PREFIX + "tag", b"folder")
    store.capture("tenant", "one", ws, lineage="box")
    # a second capture takes the unchanged file from its cache, attributes and all
    store.capture("tenant", "two", ws, lineage="box")
    for name in ("one", "two"):
        target = tmp_path / f"restored-{name}"
        store.restore("tenant", name, target, IDS)
        assert xattrs(target / "d" / "f") == {
            XATTR_PREFIX + "author": b"mish",
            XATTR_PREFIX + "raw": b"\xff\x00\x01",
        }
        assert xattrs(target / "d") == {XATTR_PREFIX + "tag": b"folder"}
        assert xattrs(target / "plain") == {}


def test_a_changed_attribute_is_captured_again(
    store: SnapshotStore, ws: Path, tmp_path: Path
) -> None:
    f = ws / "f"
    f.write_text("x")
    os.setxattr(f, XATTR_PREFIX + "stage", b"one")
    store.capture("tenant", "one", ws, lineage="box")
    os.setxattr(f, XATTR_PREFIX + "stage", b"two")  # its ctime moves: the cache misses
    store.capture("tenant", "two", ws, lineage="box")
    store.restore("tenant", "two", tmp_path / "r", IDS)
    assert xattrs(tmp_path / "r" / "f") == {XATTR_PREFIX + "stage": b"two"}


def test_a_files_attributes_are_bounded(ws: Path) -> None:
    f = ws / "f"
    f.write_text("")
    for i in range(5):
        os.setxattr(f, f"{XATTR_PREFIX}k{i}", b"v" * 700)  # ext4 holds about 4 KB a file
    fd = os.open(f, os.O_RDONLY)
    try:
        kept = capture_mod.xattrs_of(fd)
    finally:
        os.close(fd)
    assert sum(len(n) + len(v) for n, v in kept) <= XATTR_BYTES
    assert [n for n, _ in kept] == [f"{XATTR_PREFIX}k{i}" for i in range(len(kept))]


def test_manifest_text_with_attributes_is_json_dumps_own_and_old_entries_load() -> None:
    pairs = ((XATTR_PREFIX + "a", 'quote"\\ é'), (XATTR_PREFIX + "b", "\udcff"))
    entries = [
        Entry(1, "f", "f", 0o644, 5, "ab" * 32, 3, key=(1, 2, 3, 3, 5), xattrs=pairs),
        Entry(1, "d", "d", 0o755, 5, xattrs=pairs),
        Entry(1, "l", "l", 0o777, 5, target="x"),
    ]
    for entry in entries:
        want = json.dumps(entry.to_json(), ensure_ascii=True, separators=(",", ":"))
        assert entry.json_text() == want
        assert Entry.from_json(json.loads(want)) == entry
    assert Entry.from_json([1, "f", "f", 420, 5, "ab" * 32, 3, [1]]).xattrs == ()
    with pytest.raises(ValueError, match="damaged"):
        Entry.from_json([1, "d", "d", 493, 5, [["trusted.x", "v"]]])
