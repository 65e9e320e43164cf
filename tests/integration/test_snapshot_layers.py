"""Layered workspaces for real, on both engines (layers.py): a fork's and a restore's into
another key workspace is an overlay over the snapshot, and stays the sandbox's files through
everything a workspace lives through: its container removed and made again, the supervisor
restarted with the mount still there and with it gone (a host's restart), a snapshot taken
while no container runs, a restore into it, its destroy. Inside the sandbox nothing can set
overlayfs's own attributes, and what one fork writes reaches neither its source, nor the
store, nor another fork."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.supervisor.sandboxes import layers, workspaces
from stockade.supervisor.sandboxes.layout import paths_at
from tests.integration.harness import Supervisor, running_supervisor
from tests.integration.snapshot_kit import Snaps, differences, listing

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        bool(layers.probe(Path("/var/tmp"))), reason="this host makes no layered workspaces"
    ),
]

FILES = r"""set -e
mkdir -p tree/deeper && printf 'one\n' > tree/a.txt && printf 'two\n' > tree/deeper/b.txt
head -c 300000 /dev/urandom > blob.bin && chmod 640 blob.bin && ln -s tree/a.txt link
"""


@pytest.fixture
def sup(engine: str) -> Iterator[Supervisor]:
    with running_supervisor(engine) as s:
        yield s


def files_of(path: str | Path) -> dict[bytes, object]:
    """A listing without owners (each sandbox's ids are its own on Podman)."""
    return {p: n._replace(uid=0, gid=0) for p, n in listing(path).items()}


def is_overlay(path: Path) -> bool:
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == str(path) and line.split()[2] == "overlay" for line in mounts)


def test_a_fork_lives_on_its_layers_through_its_lifecycle(sup: Supervisor) -> None:
    with sup.client() as c, Snaps(sup.target) as snaps:
        source = c.sandbox("src")
        assert source.exec(FILES).exit_code == 0
        origin = files_of(sup.workspace("src"))
        snaps.fork("src", ["f"])
        fork = c.sandbox("f")
        folder = paths_at(sup.workspace("f").parent)
        assert is_overlay(folder.workspace)
        assert not differences(origin, files_of(folder.workspace))
        ran = fork.exec("echo more >> tree/a.txt && rm tree/deeper/b.txt && echo new > new.txt")
        assert ran.exit_code == 0, ran.stderr
        # nothing of it in the source, nor in the layers below
        assert source.exec("cat tree/a.txt; ls tree/deeper").stdout == "one\nb.txt\n"
        assert (folder.layers / layers.UPPER / "new.txt").read_text() == "new\n"
        # the container removed (the workspace kept), then made again by the next call
        assert fork.destroy(delete_workspace=False) is True
        assert not folder.workspace.is_mount()
        assert fork.exec("cat tree/a.txt new.txt; ls tree/deeper").stdout == "one\nmore\nnew\n"
        assert is_overlay(folder.workspace)
        # a snapshot while no container runs reads the layers (mounted for it), not the
        # empty folder below the mount point
        assert fork.destroy(delete_workspace=False) is True
        taken = snaps.snapshot("f", "of-fork")
        assert (taken.files, taken.entries) == (3, 6)  # a.txt, blob.bin, new.txt; 2 folders, a link
        assert not folder.workspace.is_mount()
        # a restore into the forked key: layered again, its files the snapshot's
        snaps.restore("f", "of-fork")
        assert is_overlay(folder.workspace)
        assert fork.exec("cat tree/a.txt new.txt").stdout == "one\nmore\nnew\n"
        assert sorted(p.name for p in folder.root.iterdir() if "layers" in p.name) == ["layers"]
        # destroyed with its workspace: unmounted, and its layers gone
        assert fork.destroy(delete_workspace=True) is True
        assert not folder.root.exists()
        assert not [m for m in _mounts() if m.startswith(str(folder.root))]


def test_a_restart_with_the_mount_gone_makes_the_container_again(engine: str) -> None:
    """A host's restart unmounts every layered workspace: the supervisor's restart must not
    adopt a container whose workspace is the empty folder below the mount point."""
    with running_supervisor(engine) as s:
        with s.client() as c, Snaps(s.target) as snaps:
            assert c.sandbox("src").exec(FILES).exit_code == 0
            snaps.fork("src", ["f"])
            before = c.sandbox("f").info().container_id
            assert c.sandbox("f").exec("echo kept > kept.txt").exit_code == 0
        folder = paths_at(s.workspace("f").parent)
        s.stop(signal.SIGKILL)
        workspaces.unmount(folder.workspace)  # what a host's restart does, lazily if held
        s.start()
        with s.client() as c:
            box = c.sandbox("f")
            assert box.exec("cat kept.txt tree/a.txt").stdout == "kept\none\n"
            assert box.info().container_id != before
        assert is_overlay(folder.workspace)


def test_a_restart_with_the_mount_kept_adopts(sup: Supervisor) -> None:
    with sup.client() as c, Snaps(sup.target) as snaps:
        assert c.sandbox("src").exec(FILES).exit_code == 0
        snaps.fork("src", ["f"])
        before = c.sandbox("f").info().container_id
    sup.stop(signal.SIGKILL)
    sup.start()
    with sup.client() as c:
        box = c.sandbox("f")
        assert box.exec("cat tree/a.txt").stdout == "one\n"
        assert box.info().container_id == before


def test_a_restore_into_another_key_is_layered_and_apart(sup: Supervisor) -> None:
    with sup.client() as c, Snaps(sup.target) as snaps:
        assert c.sandbox("src").exec(FILES).exit_code == 0
        snaps.snapshot("src", "s")
        snaps.restore("other", "s")
        snaps.restore("third", "s")
        other = paths_at(sup.workspace("other").parent)
        assert is_overlay(other.workspace)
        assert c.sandbox("other").exec("echo x > tree/a.txt").exit_code == 0
        assert c.sandbox("third").exec("cat tree/a.txt").stdout == "one\n"
        assert c.sandbox("src").exec("cat tree/a.txt").stdout == "one\n"
        snaps.delete("s")  # its objects collected: the layered workspaces keep theirs
        assert c.sandbox("third").exec("cat tree/a.txt; wc -c < blob.bin").stdout == (
            "one\n300000\n"
        )
        # a restore of a snapshot of its own into a layered workspace stays layered
        snaps.snapshot("third", "t")
        assert c.sandbox("third").exec("rm -r tree").exit_code == 0
        snaps.restore("third", "t")
        assert c.sandbox("third").exec("cat tree/deeper/b.txt").stdout == "two\n"
        assert is_overlay(paths_at(sup.workspace("third").parent).workspace)


ATTACK = r"""
for attr in trusted.overlay.redirect trusted.overlay.metacopy trusted.overlay.origin \
            trusted.overlay.upper trusted.overlay.opaque; do
  for f in tree/a.txt blob.bin new; do
    touch "$f"
    python3 -c "import os,sys; os.setxattr(sys.argv[1], sys.argv[2], b'/0')" "$f" "$attr" \
      2>/dev/null && echo "SET $attr $f"
  done
done
mknod wh c 0 0 2>/dev/null && echo MKNOD
cat /proc/self/status | grep CapEff
true
"""


def test_the_sandbox_cannot_reach_overlayfs_attributes(sup: Supervisor) -> None:
    """A forged redirect or metacopy would point a file at another object; a whiteout made
    by hand would hide one. Inside the sandbox none can be made (no CAP_SYS_ADMIN, no
    CAP_MKNOD), and the files read what they did."""
    with sup.client() as c, Snaps(sup.target) as snaps:
        assert c.sandbox("src").exec(FILES).exit_code == 0
        snaps.fork("src", ["f"])
        box = c.sandbox("f")
        ran = box.exec(ATTACK)
        assert "SET" not in ran.stdout, ran.stdout
        assert "MKNOD" not in ran.stdout, ran.stdout
        assert "CapEff:\t0000000000000000" in ran.stdout, ran.stdout
        assert box.exec("cat tree/a.txt; wc -c < blob.bin").stdout == "one\n300000\n"
        assert box.destroy(delete_workspace=False) is True  # mounted again: the same
        assert box.exec("cat tree/a.txt; wc -c < blob.bin").stdout == "one\n300000\n"


def _mounts() -> list[str]:
    with open("/proc/self/mounts") as mounts:
        return [line.split()[1] for line in mounts]
