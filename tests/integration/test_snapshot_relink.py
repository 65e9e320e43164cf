"""Restores that link (issue 30), on both engines through the real supervisor: a restore into
the sandbox a snapshot was taken of links the files its workspace still holds unchanged
(the same inode afterwards) and copies the others, and gives back exactly what a copy does
(snapshot_kit's listing: kinds, content, modes, owners, link targets, mtimes) whatever the
sandbox did in between: a file rewritten with its size and mtime put back (touch -d), a file
written in the same second as the snapshot, a hard-linked pair, a new hard link to a kept
file, a file replaced by a link, extended attributes. Never shared: the inodes of another
key restored from the snapshot, or of a fork. A staged folder of links left by a crash
changes nothing of the live files; a size-capped workspace copies."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.client import Sandbox
from tests.integration.harness import Supervisor, running_supervisor
from tests.integration.snapshot_kit import (
    Node,
    Snaps,
    differences,
    listing,
    tenants_supervisor,
)

pytestmark = pytest.mark.timeout(300)

BUILD = r"""set -e
mkdir -p many/a many/b empty/inner && chmod 750 many/b
for i in $(seq 1 30); do head -c 5000 /dev/urandom > many/a/f$i; done
for i in $(seq 1 10); do printf 'b%s\n' $i > many/b/g$i; done
printf 'twins\n' > hard-a && ln hard-a hard-b
printf 'kept\n' > kept.txt && chmod 640 kept.txt
printf 'to be a link\n' > swapped
ln -s many/a/f1 link-to-f1
touch -d '2001-02-03 04:05:06.789' many/b/g1
"""
CHANGE = r"""set -e
head -c 5000 /dev/urandom > many/a/f2
rm many/a/f3 swapped && ln -s /etc/passwd swapped
ln many/b/g2 many/b/g2-twin
printf 'new\n' > many/new
rmdir empty/inner
"""
SETTLE_S = 1.2
"""A file whose ctime is within a second of the snapshot's walk is always copied: older here."""
CAPPED = "[sandbox]\nworkspace_size_mb = 32\n"


@pytest.fixture(scope="module")
def supervisor(engine: str) -> Iterator[Supervisor]:
    with tenants_supervisor(engine, ("acme",)) as (sup, _tokens):
        yield sup


def ok(box: Sandbox, command: str) -> str:
    ran = box.exec(command, timeout=120)
    assert ran.exit_code == 0, f"{command!r}: {ran.stdout} {ran.stderr} {ran.error_message}"
    return ran.stdout


def inodes(workspace: Path) -> dict[bytes, int]:
    """Each regular file's inode, by its path below the workspace."""
    out = {}
    for folder, _, names in os.walk(os.fsencode(workspace)):
        for name in names:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                out[os.path.relpath(path, os.fsencode(workspace))] = info.st_ino
    return out


def anyones(nodes: dict[bytes, Node]) -> dict[bytes, Node]:
    """A listing without owners (another key may have other host ids: user namespaces)."""
    return {path: node._replace(uid=-1, gid=-1) for path, node in nodes.items()}


def built(box: Sandbox) -> Path:
    ok(box, BUILD)
    time.sleep(SETTLE_S)
    return Path(box.info().workspace_path)


def test_a_restore_links_what_did_not_change_and_copies_the_rest(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    with supervisor.client() as c:
        box = c.sandbox(key)
        workspace = built(box)
        os.setxattr(workspace / "kept.txt", "user.mark", b"a copy would not have it")
        time.sleep(SETTLE_S)
        before, was = listing(workspace), inodes(workspace)
        snaps.snapshot(key, f"{key}-s")
        ok(box, CHANGE)
        touched = workspace / "many" / "a" / "f4"  # same size, mtime put back: ctime tells
        old = os.stat(touched)
        touched.write_bytes(os.urandom(5000))
        os.utime(touched, ns=(old.st_atime_ns, old.st_mtime_ns))
        snaps.restore(key, f"{key}-s")
        after, now = listing(workspace), inodes(workspace)
        changed = differences(before, after)
        assert not changed, changed
        assert os.listxattr(workspace / "kept.txt") == []
        same = {p for p in was if now.get(p) == was[p]}
        copied = {b"many/a/f2", b"many/a/f3", b"many/a/f4", b"swapped", b"kept.txt"}
        copied |= {b"many/b/g2"}  # a new link to it moved its ctime
        assert copied.isdisjoint(same)
        pair = {b"hard-a", b"hard-b"}
        assert len(same & pair) == 1, "a pair comes back as two files, one of them linked"
        assert same - pair == set(was) - copied - pair
        assert {os.lstat(workspace / os.fsdecode(p)).st_nlink for p in now} == {1}
        assert ok(box, "cat many/b/g5") == "b5\n"  # the new container sees the linked files


def test_a_file_written_in_the_same_second_as_the_snapshot_is_copied(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    with supervisor.client() as c:
        box = c.sandbox(key)
        workspace = built(box)
        ok(box, "printf AAAA > hot")
        before = listing(workspace)
        snaps.snapshot(key, f"{key}-hot")
        hot = workspace / "hot"
        mtime, ino = os.stat(hot).st_mtime_ns, os.stat(hot).st_ino
        with open(hot, "r+b") as f:  # within the second: the ctime may not have moved
            f.write(b"BBBB")
        os.utime(hot, ns=(mtime, mtime))
        snaps.restore(key, f"{key}-hot")
        changed = differences(before, listing(workspace))
        assert not changed, changed
        assert hot.read_bytes() == b"AAAA"
        assert os.stat(hot).st_ino != ino


def test_another_key_and_a_fork_share_no_inode(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    with supervisor.client() as c:
        box = c.sandbox(key)
        workspace = built(box)
        before = listing(workspace)
        snaps.snapshot(key, f"{key}-x")
        other, forked = f"{key}-other", f"{key}-fork"
        snaps.restore(other, f"{key}-x")
        snaps.fork(key, [forked])
        source = set(inodes(workspace).values())
        for new in (other, forked):
            path = Path(c.sandbox(new).info().workspace_path)
            assert source.isdisjoint(inodes(path).values()), new
            changed = differences(anyones(before), anyones(listing(path)))  # ids: its own
            assert not changed, changed
            c.sandbox(new).destroy(delete_workspace=True)


def test_links_left_by_a_crash_before_the_switch_change_nothing(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    """A supervisor that died after linking, before the switch, leaves workspace.restoring
    holding links to the live files; the sandbox runs on, and the next restore removes it."""
    with supervisor.client() as c:
        box = c.sandbox(key)
        workspace = built(box)
        before = listing(workspace)
        snaps.snapshot(key, f"{key}-c")
        staged = workspace.parent / "workspace.restoring"
        staged.mkdir()
        os.link(workspace / "kept.txt", staged / "kept.txt")
        ok(box, "printf 'written after\\n' >> kept.txt")  # through the link too: it is one file
        snaps.restore(key, f"{key}-c")
        changed = differences(before, listing(workspace))
        assert not changed, changed
        assert not staged.exists()
        assert os.stat(workspace / "kept.txt").st_nlink == 1


def test_a_capped_workspace_copies_and_is_exact(engine: str) -> None:
    with running_supervisor(engine, CAPPED) as sup, sup.client() as c, Snaps(sup.target) as s:
        box = c.sandbox("capped")
        workspace = built(box)
        before, was = listing(workspace), inodes(workspace)
        s.snapshot("capped", "capped")
        ok(box, CHANGE)
        s.restore("capped", "capped")
        changed = differences(before, listing(workspace))
        assert not changed, changed
        assert os.path.ismount(workspace)
        now = inodes(workspace)
        assert now.keys() == was.keys()
