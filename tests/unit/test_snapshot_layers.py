"""Layered workspaces (layers.py, staging's layered kind): a snapshot staged as overlayfs
layers and mounted reads back exactly as a copy of it would (tree_of, entry by entry);
writes land in the upper layer and never reach the store; the store's collection does not
take what a layered workspace reads; a switch to and from one leaves one workspace or the
other; and the attacks on the layers a sandbox could try: setting overlayfs's own attributes
through the mount, planting a metacopy file or a redirect, a damaged manifest's digest."""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.supervisor.sandboxes import layers, workspaces
from stockade.supervisor.sandboxes.layout import Paths, drop_layers, paths_at
from stockade.supervisor.sandboxes.snapshots import staging
from stockade.supervisor.sandboxes.snapshots.repository import SnapshotStore
from tests.unit.snapshot_trees import make_tree, owned, tree_of

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts overlayfs: needs root")

OTHER_IDS = (5432, 9876)


@pytest.fixture(scope="module")
def supported(tmp_path_factory: pytest.TempPathFactory) -> None:
    why = layers.probe(tmp_path_factory.mktemp("probe"))
    if why:
        pytest.skip(f"no layered workspaces on this host: {why}")


@pytest.fixture
def box(tmp_path: Path, supported: None) -> Iterator[Paths]:
    """A sandbox's folder whose workspace holds make_tree's tree (unmounted after)."""
    paths = paths_at(tmp_path / "box")
    paths.workspace.mkdir(parents=True)
    make_tree(paths.workspace)
    yield paths
    workspaces.unmount_all(tmp_path)


def objects_of(store: SnapshotStore) -> Path:
    return store.root / "t" / "objects"


def layered(store: SnapshotStore, paths: Paths, name: str = "s") -> staging.Staged:
    """Restore snapshot `name` into `paths` as a layered workspace and mount it."""
    staged = staging.stage(store, "t", name, paths, OTHER_IDS, 0, layered=True)
    staged.switch()
    layers.mount(paths.layers, paths.workspace)
    return staged


def test_a_layered_workspace_reads_back_as_a_copy(store: SnapshotStore, box: Paths) -> None:
    want = owned(tree_of(box.workspace), OTHER_IDS)
    store.capture("t", "s", box.workspace, "box")
    layered(store, box)
    assert box.workspace.is_mount()
    got = tree_of(box.workspace)
    assert got == want
    root = os.lstat(box.workspace)
    assert (root.st_uid, root.st_gid) == OTHER_IDS


def test_the_bytes_are_not_copied(store: SnapshotStore, box: Paths) -> None:
    """The data layer holds links to the store's objects (one inode), the metadata layer
    sparse files: no file's content is written again."""
    content = os.urandom(4 << 20)
    (box.workspace / "big").write_bytes(content)
    store.capture("t", "s", box.workspace, "box")
    layered(store, box)
    meta = box.layers / layers.META / "big"
    assert os.lstat(meta).st_blocks == 0  # its attributes in the inode
    stored = [p for p in objects_of(store).rglob("*") if p.is_file() and p.stat().st_size]
    linked = [p for p in (box.layers / layers.DATA).rglob("*") if p.is_file()]
    assert {os.lstat(p).st_ino for p in linked} <= {os.lstat(p).st_ino for p in stored}
    assert len(linked) == len(stored)
    assert (box.workspace / "big").read_bytes() == content


def test_writes_go_to_the_upper_layer_never_the_store(store: SnapshotStore, box: Paths) -> None:
    store.capture("t", "s", box.workspace, "box")
    before = {p: p.read_bytes() for p in objects_of(store).rglob("*") if p.is_file()}
    layered(store, box)
    ws = box.workspace
    with open(ws / "sub" / "a.txt", "ab") as f:
        f.write(b"more\n")
    (ws / "sub" / "deep" / "bin.dat").write_bytes(b"replaced")
    os.truncate(ws / "private", 0)
    (ws / "run.sh").unlink()
    os.rename(ws / "sub", ws / "moved")  # a folder of the lower layer renamed
    os.chmod(ws / "moved" / "deep" / "er", 0o700)
    os.link(ws / "moved" / "deep" / "bin.dat", ws / "hard")
    assert (ws / "moved" / "a.txt").read_bytes() == b"hello\nmore\n"
    assert (ws / "hard").read_bytes() == b"replaced"
    assert not (ws / "sub").exists()
    after = {p: p.read_bytes() for p in objects_of(store).rglob("*") if p.is_file()}
    assert after == before
    # a second workspace of the same snapshot still reads the snapshot's files
    other = paths_at(box.root.parent / "other")
    other.workspace.mkdir(parents=True)
    layered(store, other)
    assert (other.workspace / "sub" / "a.txt").read_bytes() == b"hello\n"
    assert (other.workspace / "run.sh").exists()


def test_a_deleted_snapshot_leaves_a_layered_workspace_whole(
    store: SnapshotStore, box: Paths
) -> None:
    want = owned(tree_of(box.workspace), OTHER_IDS)
    store.capture("t", "s", box.workspace, "box")
    layered(store, box)
    store.delete("t", "s")  # collects every object no manifest names
    assert not [p for p in objects_of(store).rglob("*") if p.is_file()]
    assert tree_of(box.workspace) == want
    workspaces.unmount(box.workspace)  # a host's restart: mounted again from its layers
    layers.mount(box.layers, box.workspace)
    assert tree_of(box.workspace) == want


def test_a_plain_restore_replaces_a_layered_workspace(store: SnapshotStore, box: Paths) -> None:
    store.capture("t", "s", box.workspace, "box")
    (box.workspace / "later").write_text("later\n")
    store.capture("t", "s2", box.workspace, "box")
    layered(store, box)
    (box.workspace / "scribble").write_text("x")
    workspaces.unmount(box.workspace)
    staged = staging.stage(store, "t", "s2", box, OTHER_IDS, 0)
    staged.switch()
    assert not box.layers.exists()
    assert not box.workspace.is_mount()
    assert (box.workspace / "later").read_text() == "later\n"
    assert not (box.workspace / "scribble").exists()
    assert not [p for p in box.root.iterdir() if p.name.startswith("layers")]


def test_a_layered_restore_replaces_a_layered_one(store: SnapshotStore, box: Paths) -> None:
    store.capture("t", "s", box.workspace, "box")
    (box.workspace / "later").write_text("later\n")
    store.capture("t", "s2", box.workspace, "box")
    want = owned(tree_of(box.workspace), OTHER_IDS)
    layered(store, box, "s")
    (box.workspace / "scribble").write_text("x")
    workspaces.unmount(box.workspace)
    layered(store, box, "s2")
    assert tree_of(box.workspace) == want
    assert sorted(p.name for p in box.root.iterdir()) == ["layers", "workspace"]


def test_a_failed_stage_leaves_the_workspace_as_it_was(
    store: SnapshotStore, box: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.capture("t", "s", box.workspace, "box")
    want = tree_of(box.workspace)
    calls = 0

    def failing(fd: int, redirect: bytes) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise OSError(errno.ENOSPC, "full")
        layers_name(fd, redirect)

    layers_name = layers.name_object
    monkeypatch.setattr(layers, "name_object", failing)
    with pytest.raises(OSError, match="full"):
        staging.stage(store, "t", "s", box, OTHER_IDS, 0, layered=True)
    assert tree_of(box.workspace) == want
    assert sorted(p.name for p in box.root.iterdir()) == ["workspace"]


def test_a_crash_after_the_layers_are_in_place_shows_the_new_files(
    store: SnapshotStore, box: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The layers' rename is the switch: a crash before the folders' exchange leaves the
    new workspace, the old files below the mount point, removed by the next stage."""
    (box.workspace / "old-only").write_text("old")
    store.capture("t", "s", box.workspace, "box")
    (box.workspace / "old-only").unlink()
    (box.workspace / "plain").write_text("plain")
    staged = staging.stage(store, "t", "s", box, OTHER_IDS, 0, layered=True)

    def crash(a: Path, b: Path) -> None:
        raise OSError(errno.EIO, "crash")

    monkeypatch.setattr(staging, "_exchange", crash)
    with pytest.raises(OSError, match="crash"):
        staged.switch()
    monkeypatch.undo()
    layers.mount(box.layers, box.workspace)
    assert (box.workspace / "old-only").read_text() == "old"
    assert not (box.workspace / "plain").exists()


def test_overlayfs_attributes_set_through_the_mount_steer_nothing(
    store: SnapshotStore, box: Paths
) -> None:
    """Even root, through the mount (a sandbox has no CAP_SYS_ADMIN for trusted.* at all):
    overlayfs keeps its own attributes' names escaped in the upper layer, so a forged
    metacopy and redirect to another object of the snapshot (the data layer's first ones),
    or out of it, steers nothing, before or after the workspace is mounted again."""
    store.capture("t", "s", box.workspace, "box")
    layered(store, box)
    forged = {"new": b"/0", "empty-file": b"/1", "up": b"/../../../../etc/shadow"}
    for name, redirect in forged.items():
        path = box.workspace / name
        path.touch()
        with open(path, "r+b") as f:
            f.truncate(10)
        for attr, value in ((layers.METACOPY, b""), (layers.REDIRECT, redirect)):
            with contextlib.suppress(PermissionError):  # refused, or kept escaped: below
                os.setxattr(path, attr, value)
    for _ in range(2):
        for name in forged:
            assert (box.workspace / name).read_bytes() == bytes(10)
        workspaces.unmount(box.workspace)
        for name in forged:
            names = os.listxattr(box.layers / layers.UPPER / name)
            assert layers.REDIRECT not in names
            assert layers.METACOPY not in names
        layers.mount(box.layers, box.workspace)


def test_an_unprivileged_user_cannot_set_trusted_attributes(
    store: SnapshotStore, box: Paths
) -> None:
    """What a sandbox user is: no capability at all, in the host's user namespace."""
    store.capture("t", "s", box.workspace, "box")
    layered(store, box)
    path = box.workspace / "mine"
    path.touch()
    os.chown(path, 65534, 65534)
    script = (
        "import os,sys\n"
        "try:\n"
        f"    os.setxattr({str(path)!r}, {layers.REDIRECT!r}, b'/x')\n"
        "except OSError as e:\n"
        "    sys.exit(e.errno)\n"
        "sys.exit(0)\n"
    )
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         "--bounding-set=-all", "/usr/bin/python3", "-c", script],
        capture_output=True,
    )  # fmt: skip
    assert done.returncode in (errno.EPERM, errno.EACCES), done.stderr


def test_a_damaged_digest_is_refused(store: SnapshotStore, box: Paths) -> None:
    """A manifest's digest names a path in data/ and in the store: one that is not 64 hex
    digits (a path out of the store) is refused, nothing mounted."""
    store.capture("t", "s", box.workspace, "box")
    manifest = store.root / "t" / "manifests" / "s.json.gz"
    body = json.loads(gzip.decompress(manifest.read_bytes()))
    entries = body["parts"]["workspace"]["entries"]
    for entry in entries:
        if entry[2] == "f" and entry[5]:
            entry[5] = "../../../../etc/shadow" + "0" * 42
            break
    manifest.write_bytes(gzip.compress(json.dumps(body).encode()))
    with pytest.raises(ValueError, match="damaged manifest"):
        staging.stage(store, "t", "s", box, OTHER_IDS, 0, layered=True)
    assert not box.layers.exists()


def test_drop_layers_unmarks_first(box: Paths, store: SnapshotStore) -> None:
    store.capture("t", "s", box.workspace, "box")
    layered(store, box)
    workspaces.unmount(box.workspace)
    drop_layers(box)
    assert not box.layers.exists()
    assert not (box.root / "layers.old").exists()


def test_the_probe_says_why_not(tmp_path: Path) -> None:
    assert "option separators" in layers.probe(tmp_path / "a,b")
    assert "option separators" in layers.probe(tmp_path / "a:b")


def test_the_metadata_layer_needs_the_store_no_more(store: SnapshotStore, box: Paths) -> None:
    """A fork's keys make their metadata layers with the store let go (stage_meta): the
    snapshot deleted and its content collected between the two halves, the workspace still
    reads back whole, empty files included."""
    want = owned(tree_of(box.workspace), OTHER_IDS)
    store.capture("t", "s", box.workspace, "box")
    planned = staging.stage_data(store, "t", "s", box)
    store.delete("t", "s")
    assert not [p for p in objects_of(store).rglob("*") if p.is_file()]
    staging.stage_meta(planned, OTHER_IDS).switch()
    layers.mount(box.layers, box.workspace)
    assert tree_of(box.workspace) == want
