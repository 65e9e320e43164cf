"""Snapshots and restores for real, on both engines, through the real supervisor (issue 16,
done-when 2): a restore gives back exactly the snapshot's files, read from the host.

What "exactly" means here, entry by entry below the workspace and for its root (Node in
snapshot_kit): kind, content (size and SHA-256), mode bits (permissions and the sticky bit;
set-user-ID is dropped by design), owner (the sandbox user's host ids), link targets (never
followed: relative, absolute, dangling, to a folder), empty folders, names that are not
UTF-8, and the mtimes of files, folders and links. Not kept, by design: hard links (a pair
comes back as two files with the same content) and atimes.

Also: /tmp captured on request (include_tmp) and not otherwise; a snapshot taken while a
writer appends is a prefix of what it wrote (no torn line) and the writer runs on."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.client import Sandbox
from stockade.v1 import sandbox_pb2
from tests.integration.harness import Supervisor, backend, process
from tests.integration.snapshot_kit import Snaps, differences, listing, tenants_supervisor

pytestmark = pytest.mark.timeout(300)

BUILD = r"""set -e
printf 'secret\n' > private.txt && chmod 600 private.txt
printf '#!/bin/sh\necho hi\n' > run.sh && chmod 755 run.sh
printf 'for the group\n' > shared.txt && chmod 640 shared.txt
printf 'read only\n' > readonly.txt && chmod 444 readonly.txt
: > empty.txt
head -c 4194304 /dev/urandom > big.bin
mkdir -p empty/nested/deeper
mkdir private.d && chmod 700 private.d && printf 'inside\n' > private.d/inside.txt
mkdir group.d && chmod 750 group.d && printf 'g\n' > group.d/g.txt
mkdir sticky && chmod 1777 sticky && printf 'note\n' > sticky/note
ln -s private.txt rel-link
ln -s /workspace/shared.txt abs-link
ln -s does-not-exist dangling
ln -s empty/nested dir-link
printf 'twins\n' > hard-a && ln hard-a hard-b
printf 'spaced\n' > 'with space.txt'
printf 'two lines\n' > "$(printf 'new\nline')"
touch -d '2001-02-03 04:05:06.789' empty/old-file
"""
"""Made by the sandbox user, through exec."""
CHANGE = r"""set -e
printf 'changed\n' >> private.txt
rm -f readonly.txt shared.txt
rm -r group.d
chmod 700 run.sh sticky
rm rel-link && printf 'a file now\n' > rel-link
rm dangling && ln -s elsewhere dangling
mkdir -p added/folder && printf 'new\n' > added/folder/new.txt
head -c 1000 /dev/urandom > big.bin
rmdir empty/nested/deeper
"""
SLEEPER = "sleep 4242"
PROCESSES = r"for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $f; echo; done"
"""Every process's command line (the command itself holds no sleeper's)."""
CAFE, NOT_UTF8, SETUID = b"caf\xe9", b"\xff\xfe", b"setuid-tool"


@pytest.fixture(scope="module")
def supervisor(engine: str) -> Iterator[Supervisor]:
    with tenants_supervisor(engine, ("acme",)) as (sup, _tokens):
        yield sup


def ok(box: Sandbox, command: str, timeout: float = 60) -> str:
    ran = box.exec(command, timeout=timeout)
    assert ran.exit_code == 0, f"{command!r}: {ran.stdout} {ran.stderr} {ran.error_message}"
    return ran.stdout


def place_on_host(workspace: Path) -> None:
    """Entries exec makes awkward, written from the host as the workspace's owner."""
    owner = os.stat(workspace)
    root = os.fsencode(workspace)
    files = {CAFE: b"accent\n", SETUID: b"#!/bin/sh\n"}
    for name, content in files.items():
        path = os.path.join(root, name)
        with open(path, "wb") as file:
            file.write(content)
        os.chown(path, owner.st_uid, owner.st_gid)
    os.chmod(os.path.join(root, CAFE), 0o644)
    os.chmod(os.path.join(root, SETUID), 0o4755)
    folder = os.path.join(root, NOT_UTF8)
    os.mkdir(folder)
    inner = os.path.join(folder, b"\xfe-inside")
    with open(inner, "wb") as file:
        file.write(b"\x00binary\xff\n")
    link = os.path.join(root, b"link-to-caf\xe9")
    os.symlink(CAFE, link)
    for path in (folder, inner):
        os.chown(path, owner.st_uid, owner.st_gid)
    os.chown(link, owner.st_uid, owner.st_gid, follow_symlinks=False)


def change_on_host(workspace: Path) -> None:
    root = os.fsencode(workspace)
    with open(os.path.join(root, CAFE), "ab") as file:
        file.write(b"more\n")
    os.unlink(os.path.join(root, NOT_UTF8, b"\xfe-inside"))
    os.rmdir(os.path.join(root, NOT_UTF8))


def test_a_restore_gives_back_exactly_the_snapshots_files(
    supervisor: Supervisor, snaps: Snaps, engine: str, key: str
) -> None:
    with supervisor.client() as c:
        box = c.sandbox(key)
        ok(box, BUILD)
        info = box.info()
        workspace = Path(info.workspace_path)
        place_on_host(workspace)
        before = listing(workspace)
        kinds = [n.kind for n in before.values()]
        assert (kinds.count("l"), kinds.count("d")) == (5, 8), before  # "." is a folder
        assert before[b"hard-a"].sha256 == before[b"hard-b"].sha256
        assert os.stat(workspace / "hard-a").st_nlink == 2
        assert before[b"sticky"].mode == 0o1777
        assert before[b"big.bin"].size == 4 << 20
        sleeper = process(box, "start", command=SLEEPER, name="sleeper")

        taken = snaps.snapshot(key, "tree-1")
        assert not differences(before, listing(workspace)), "a snapshot changed the files"
        files = [n for p, n in before.items() if n.kind == "f"]
        assert (taken.name, taken.source_key) == ("tree-1", key)
        assert (taken.files, taken.entries) == (len(files), len(before) - 1)
        assert taken.bytes == sum(n.size for n in files)
        assert (taken.includes_tmp, taken.includes_memory, list(taken.skipped)) == (
            False,
            False,
            [],
        )
        assert 0 < taken.frozen_seconds < 30
        same = box.info()
        assert (same.state, same.container_id) == ("RUNNING", info.container_id)
        assert process(box, "poll", id=sleeper["id"])["state"] == "running"

        ok(box, CHANGE)
        change_on_host(workspace)
        assert differences(before, listing(workspace)), "the changes changed nothing"

        restored = snaps.restore(key, "tree-1")
        after = listing(workspace)
        expected = {path: n._replace(mode=n.mode & 0o1777) for path, n in before.items()}
        assert expected[SETUID].mode == 0o755, "set-user-ID is never restored"
        assert not differences(expected, after), differences(expected, after)
        assert restored.replaced
        assert (restored.snapshot.name, restored.snapshot.files) == ("tree-1", taken.files)
        assert restored.sandbox.state == sandbox_pb2.SANDBOX_STATE_RUNNING
        assert os.stat(workspace / "hard-b").st_nlink == 1, "hard links come back as files"

        now = box.info()
        assert now.state == "RUNNING"
        assert now.container_id
        assert now.container_id != info.container_id
        assert restored.sandbox.container_id == now.container_id
        be = backend(engine)
        try:
            assert be.inspect(info.container_id) is None, "the old container is gone"
        finally:
            be.close()
        gone = box.call("process", {"action": "poll", "id": sleeper["id"]})
        assert gone.is_error, gone.data
        assert SLEEPER not in ok(box, PROCESSES)

        # the sandbox user reads and writes what was restored, from inside
        assert ok(box, "cat private.txt rel-link abs-link") == "secret\nsecret\nfor the group\n"
        ok(box, "echo more >> private.txt && echo in >> private.d/inside.txt")
        ok(box, "echo new > private.d/new.txt && echo n > sticky/mine && ls dir-link/deeper")
        ok(box, "echo x >> \"$(printf 'caf\\351')\" && ls \"$(printf '\\377\\376')\"")
        assert ok(box, "cat hard-a private.d/inside.txt") == "twins\ninside\nin\n"
        ok(box, "echo one >> hard-a")
        assert ok(box, "cat hard-b") == "twins\n", "the pair are two files now"
        assert ok(box, "./run.sh") == "hi\n"
        refused = box.exec("echo no >> readonly.txt")
        assert refused.exit_code != 0, "0444 is read only for its owner too"


def test_a_snapshot_restores_into_a_new_key_and_the_source_is_untouched(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    with supervisor.client() as c:
        box = c.sandbox(key)
        ok(box, "mkdir -p a/b && echo one > a/b/f.txt && ln -s a/b up")
        snaps.snapshot(key, f"{key}-s")
        ok(box, "echo two > a/b/f.txt")
        fresh = f"{key}-new"
        made = snaps.restore(fresh, f"{key}-s")
        assert not made.replaced
        assert made.sandbox.state == sandbox_pb2.SANDBOX_STATE_RUNNING
        assert ok(c.sandbox(fresh), "cat up/f.txt") == "one\n"
        assert ok(box, "cat a/b/f.txt") == "two\n"
        source = listing(box.info().workspace_path)
        copy = listing(made.sandbox.workspace_path)
        assert source[b"a/b/f.txt"].sha256 != copy[b"a/b/f.txt"].sha256
        assert source[b"up"].target == copy[b"up"].target == b"a/b"
        assert made.sandbox.container_id != box.info().container_id
        c.sandbox(fresh).destroy(delete_workspace=True)


def test_a_sandbox_with_only_its_workspace_is_captured_and_restored(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    with supervisor.client() as c:
        box = c.sandbox(key)
        ok(box, "echo kept > kept.txt")
        assert box.destroy() is True  # the workspace stays
        taken = snaps.snapshot(key, f"{key}-absent")
        assert (taken.files, taken.frozen_seconds) == (1, 0.0)
        made = snaps.restore(key, f"{key}-absent")
        assert made.replaced
        assert ok(box, "cat kept.txt") == "kept\n"


def test_include_tmp_captures_tmp_and_its_absence_does_not(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    with supervisor.client() as c:
        box = c.sandbox(key)
        ok(box, "mkdir -p /tmp/deep/er && echo t > /tmp/deep/er/t.txt && echo w > w.txt")
        ok(box, "chmod 700 /tmp/deep && echo top > /tmp/top.txt")
        with_tmp = snaps.snapshot(key, f"{key}-tmp", include_tmp=True)
        without = snaps.snapshot(key, f"{key}-notmp")
        assert (with_tmp.includes_tmp, without.includes_tmp) == (True, False)
        assert with_tmp.files == without.files == 1, "files counts the workspace's"
        ok(box, "rm -r /tmp/deep /tmp/top.txt w.txt")

        snaps.restore(key, f"{key}-tmp")
        assert ok(box, "cat /tmp/deep/er/t.txt /tmp/top.txt w.txt") == "t\ntop\nw\n"
        assert ok(box, "stat -c '%a %u' /tmp/deep /tmp/top.txt") == "700 65532\n644 65532\n"
        ok(box, "echo again >> /tmp/top.txt && touch /tmp/new")  # the sandbox user's still
        assert ok(box, "stat -c '%a' /tmp") == "1777\n"

        snaps.restore(key, f"{key}-notmp")
        assert ok(box, "cat w.txt") == "w\n"
        assert ok(box, "ls -A /tmp") == "", "a snapshot without /tmp gives a fresh /tmp"


WRITER = """python3 -c '
import os, time
fd = os.open("log.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
n = 0
while True:
    os.write(fd, b"%09d " % n + b"x" * 4085 + b"\\n")
    n += 1
    if n % 8 == 0:
        time.sleep(0.01)
'"""
LINE = 4096
"""Each write of the writer: one line of 4 KiB, numbered (a torn one shows)."""


def test_a_snapshot_while_a_writer_appends_is_a_prefix_and_the_writer_runs_on(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    with supervisor.client() as c:
        box = c.sandbox(key)
        writer = process(box, "start", command=WRITER, name="writer")
        log = Path(box.info().workspace_path) / "log.txt"
        deadline = time.monotonic() + 30
        while (log.stat().st_size if log.exists() else 0) < 4 << 20:
            assert time.monotonic() < deadline, "the writer does not write"
            time.sleep(0.1)
        container = box.info().container_id
        taken = snaps.snapshot(key, f"{key}-busy")
        assert taken.files == 1
        grown = log.stat().st_size
        time.sleep(0.5)
        assert log.stat().st_size > grown, "the writer writes on after the snapshot"
        assert process(box, "poll", id=writer["id"])["state"] == "running"
        info = box.info()
        assert (info.state, info.container_id) == ("RUNNING", container)

        copy = f"{key}-copy"
        made = snaps.restore(copy, f"{key}-busy")
        data = (Path(made.sandbox.workspace_path) / "log.txt").read_bytes()
        assert len(data) == taken.bytes
        assert len(data) % LINE == 0, f"a torn line: {len(data)} bytes"
        lines = data.split(b"\n")[:-1]
        assert len(lines) == len(data) // LINE
        for n, line in enumerate(lines):
            assert line == b"%09d " % n + b"x" * 4085, f"line {n} is not what was written"
        process(box, "kill", id=writer["id"], signal="KILL")
        c.sandbox(copy).destroy(delete_workspace=True)


RANDOM_WRITER = """python3 -c '
import os, time
fd = os.open("random.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
while True:
    os.write(fd, os.urandom(32768))
    time.sleep(0.005)
'"""
"""Content no other test's files have: what it leaves in the store is its own."""


def test_the_store_keeps_only_what_its_snapshots_hold(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    """A file that changes between the first pass (the sandbox running) and the frozen one
    is stored twice while the capture runs; the first copy is the snapshot's no more and must
    not stay in the store, counted against the tenant's bytes, until some later delete."""
    with supervisor.client() as c:
        box = c.sandbox(key)
        ok(box, "head -c 2097152 /dev/urandom > steady.bin")
        writer = process(box, "start", command=RANDOM_WRITER, name="writer")
        log = Path(box.info().workspace_path) / "random.log"
        deadline = time.monotonic() + 30
        while (log.stat().st_size if log.exists() else 0) < 4 << 20:
            assert time.monotonic() < deadline, "the writer does not write"
            time.sleep(0.1)
        before = snaps.list_snapshots().bytes
        taken = snaps.snapshot(key, f"{key}-churn")
        process(box, "kill", id=writer["id"], signal="KILL")
        grown = snaps.list_snapshots().bytes - before
        assert grown <= taken.bytes + (256 << 10), (
            f"the store grew by {grown} bytes for a snapshot of {taken.bytes} bytes of files"
        )
        snaps.delete(f"{key}-churn")
        assert snaps.list_snapshots().bytes == before
