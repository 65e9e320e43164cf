"""Snapshot calls that must be refused, and hostile workspaces, on both engines through the
real supervisor: bad names and keys, unknown and duplicate snapshots, forks into keys that
exist, include_memory, a link to /etc/shadow and a fifo, another tenant's snapshots, the
count and byte quotas and the [snapshots] operations policy. Each refusal is checked to have
left nothing behind."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import grpc
import pytest

from stockade.client import Stockade
from tests.integration.harness import Supervisor
from tests.integration.snapshot_kit import Snaps, listing, refused, tenants_supervisor

pytestmark = pytest.mark.timeout(300)

Code = grpc.StatusCode
BAD_NAMES = ("../x", "x" * 129, "a" * 200, "a/b", "\x00", "é", "snap shot", ".hidden", "-x")
BAD_NAMES_TOO = ("~fork-0123", "café", "a\nb", "/abs")
LIMITED = """[snapshots]
operations = ["snapshot"]
max_count = 2
max_mb = 1
[tenants.full]
snapshot_operations = ["snapshot", "restore", "fork", "delete"]
max_snapshots = 0
max_snapshot_mb = 0
"""


@pytest.fixture(scope="module")
def tenanted(engine: str) -> Iterator[tuple[Supervisor, dict[str, str]]]:
    with tenants_supervisor(engine, ("acme", "other")) as both:
        yield both


@pytest.fixture
def supervisor(tenanted: tuple[Supervisor, dict[str, str]]) -> Supervisor:
    return tenanted[0]


def made(c: Stockade, key: str, command: str = "echo x > x.txt") -> str:
    ran = c.sandbox(key).exec(command)
    assert ran.exit_code == 0, ran.stderr
    return c.sandbox(key).info().container_id


def sandbox_keys(c: Stockade) -> set[str]:
    return {s.key for s in c.list_sandboxes()}


def sandbox_folders(sup: Supervisor) -> set[str]:
    return {p.name for p in (sup.state_dir / "sandboxes").iterdir()}


def stored_files(sup: Supervisor) -> list[Path]:
    return sorted(p for p in (sup.state_dir / "snapshots").rglob("*") if p.is_file())


def test_bad_names_and_keys_are_invalid(supervisor: Supervisor, snaps: Snaps, key: str) -> None:
    with supervisor.client() as c:
        made(c, key)
    snaps.snapshot(key, "good")
    stored = stored_files(supervisor)
    calls: tuple[Callable[[], object], ...]
    call: Callable[[], object]
    for name in (*BAD_NAMES, *BAD_NAMES_TOO):
        calls = (
            partial(snaps.snapshot, key, name),
            partial(snaps.restore, key, name),
            partial(snaps.delete, name),
        )
        for call in calls:
            code, details = refused(call)
            assert code == Code.INVALID_ARGUMENT, (name, code, details)
    for call in (partial(snaps.restore, key, ""), partial(snaps.delete, "")):
        assert refused(call)[0] == Code.INVALID_ARGUMENT
    for bad_key in ("", "k" * 300, "a\x00b"):
        calls = (
            partial(snaps.snapshot, bad_key, "n"),
            partial(snaps.restore, bad_key, "good"),
            partial(snaps.fork, key, [bad_key]),
            partial(snaps.fork, bad_key, ["new-one"]),
        )
        for call in calls:
            assert refused(call)[0] == Code.INVALID_ARGUMENT, (bad_key, call)
    assert snaps.names() == ["good"]
    assert stored_files(supervisor) == stored, "a refused call stored nothing"
    longest = "a" * 128
    assert snaps.snapshot(key, longest).name == longest
    generated = snaps.snapshot(key, "")
    assert generated.name.startswith("snap-"), generated.name
    assert snaps.names() == ["good", longest, generated.name]
    for name in snaps.names():
        snaps.delete(name)


def test_unknown_and_duplicate_snapshots(supervisor: Supervisor, snaps: Snaps, key: str) -> None:
    with supervisor.client() as c:
        container = made(c, key, "echo first > f.txt")
        assert refused(lambda: snaps.restore(key, "never-taken"))[0] == Code.NOT_FOUND
        assert refused(lambda: snaps.delete("never-taken"))[0] == Code.NOT_FOUND
        assert c.sandbox(key).info().container_id == container, "a refused restore did nothing"
        snaps.snapshot(key, f"{key}-dup")
        made(c, key, "echo second > f.txt")
        code, details = refused(lambda: snaps.snapshot(key, f"{key}-dup"))
        assert code == Code.ALREADY_EXISTS, details
        assert snaps.names(key) == [f"{key}-dup"]
        snaps.restore(key, f"{key}-dup")
        assert c.sandbox(key).exec("cat f.txt").stdout == "first\n", "the first one is kept"
        assert snaps.delete(f"{key}-dup").freed_bytes > 0
        assert refused(lambda: snaps.delete(f"{key}-dup"))[0] == Code.NOT_FOUND
        for call in (
            lambda: snaps.snapshot("never-made", "n"),
            lambda: snaps.fork("never-made", ["never-forked"]),
        ):
            assert refused(call)[0] == Code.NOT_FOUND
        assert "never-forked" not in sandbox_keys(c)


def test_forks_into_keys_that_exist_or_repeat_make_nothing(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    with supervisor.client() as c:
        made(c, key)
        running, retired = f"{key}-running", f"{key}-retired"
        made(c, running)
        made(c, retired)
        assert c.sandbox(retired).destroy() is True  # its workspace stays
        keys, folders = sandbox_keys(c), sandbox_folders(supervisor)
        fresh = f"{key}-fresh"
        cases = [
            ([fresh, running], Code.ALREADY_EXISTS),
            ([fresh, retired], Code.ALREADY_EXISTS),
            ([key], Code.ALREADY_EXISTS),
            ([fresh, key], Code.ALREADY_EXISTS),
            ([fresh, fresh], Code.INVALID_ARGUMENT),
            ([], Code.INVALID_ARGUMENT),
            ([f"{key}-{i}" for i in range(65)], Code.INVALID_ARGUMENT),
        ]
        for new_keys, want in cases:
            code, details = refused(partial(snaps.fork, key, new_keys))
            assert code == want, (new_keys[:3], code, details)
            assert sandbox_keys(c) == keys
            assert sandbox_folders(supervisor) == folders, "nothing was made"
        for include_tmp in (False, True):
            memory = partial(snaps.fork, key, [fresh], include_memory=True, include_tmp=include_tmp)
            code, details = refused(memory)
            assert code == Code.UNIMPLEMENTED, details
        code, details = refused(lambda: snaps.snapshot(key, "memory", include_memory=True))
        assert code == Code.UNIMPLEMENTED, details
        assert "memory" not in snaps.names()
        assert sandbox_keys(c) == keys
        assert sandbox_folders(supervisor) == folders
        assert c.sandbox(retired).exec("cat x.txt").stdout == "x\n", "its workspace untouched"


HOSTILE = r"""set -e
ln -s /etc/shadow shadow-link
ln -s / root-link
ln -s ../../../../../../etc escape
mkfifo pipe && mkdir sub && mkfifo sub/pipe2
python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("sock")'
echo plain > plain.txt
"""


def test_links_are_stored_as_links_and_fifos_are_skipped(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    shadow = Path("/etc/shadow").read_bytes()
    shadow_digest = hashlib.sha256(shadow).hexdigest()
    with supervisor.client() as c:
        made(c, key, HOSTILE)
        taken = snaps.snapshot(key, f"{key}-hostile")
        assert sorted(taken.skipped) == ["pipe", "sock", "sub/pipe2"]
        assert (taken.files, taken.entries) == (1, 5)  # plain.txt, sub and three links
        objects = [p for p in stored_files(supervisor) if "objects" in p.parts]
        assert shadow_digest not in {p.name for p in objects}
        assert all(p.read_bytes() != shadow for p in objects), "the link was followed"
        copy = f"{key}-copy"
        restored = snaps.restore(copy, f"{key}-hostile")
        tree = listing(restored.sandbox.workspace_path)
        assert {p: (n.kind, n.target) for p, n in tree.items() if n.kind == "l"} == {
            b"shadow-link": ("l", b"/etc/shadow"),
            b"root-link": ("l", b"/"),
            b"escape": ("l", b"../../../../../../etc"),
        }
        assert sorted(tree) == [b".", b"escape", b"plain.txt", b"root-link", b"shadow-link", b"sub"]
        assert Path("/etc/shadow").read_bytes() == shadow
        inside = c.sandbox(copy).exec("cat shadow-link")
        assert inside.exit_code != 0, "the sandbox user cannot read the container's shadow"
        assert os.readlink(Path(restored.sandbox.workspace_path) / "escape").startswith("..")


def test_another_tenant_cannot_see_or_use_my_snapshots(
    tenanted: tuple[Supervisor, dict[str, str]], snaps: Snaps, key: str
) -> None:
    sup, tokens = tenanted
    with sup.client() as c:
        made(c, key, "echo acme > mine.txt")
    snaps.snapshot(key, f"{key}-mine")
    mine = snaps.list_snapshots()
    with Snaps(sup.target, tokens["other"]) as theirs, sup.client(tokens["other"]) as oc:
        assert f"{key}-mine" not in theirs.names()
        assert theirs.list_snapshots().bytes == 0
        for call in (
            lambda: theirs.restore(key, f"{key}-mine"),
            lambda: theirs.restore("their-key", f"{key}-mine"),
            lambda: theirs.delete(f"{key}-mine"),
            lambda: theirs.snapshot(key, "stolen"),
            lambda: theirs.fork(key, ["their-fork"]),
        ):
            code, details = refused(call)
            assert code == Code.NOT_FOUND, details
        assert {s.key for s in oc.list_sandboxes()} == set()
        assert theirs.names() == []
        made(oc, key, "echo other > theirs.txt")  # their own sandbox of that name
        assert theirs.snapshot(key, f"{key}-mine").name == f"{key}-mine"  # their own name
        theirs.restore(key, f"{key}-mine")
        assert oc.sandbox(key).exec("cat theirs.txt; ls").stdout == "other\ntheirs.txt\n"
        theirs.delete(f"{key}-mine")
    assert snaps.list_snapshots().snapshots == mine.snapshots
    snaps.restore(key, f"{key}-mine")
    with sup.client() as c:
        assert c.sandbox(key).exec("cat mine.txt").stdout == "acme\n"


@pytest.fixture(scope="module")
def limited(engine: str) -> Iterator[tuple[Supervisor, dict[str, str]]]:
    with tenants_supervisor(engine, ("count", "bytes", "policy", "full"), LIMITED) as both:
        yield both


def test_the_count_quota_refuses_the_third_and_keeps_two(
    limited: tuple[Supervisor, dict[str, str]],
) -> None:
    sup, tokens = limited
    with sup.client(tokens["count"]) as c, Snaps(sup.target, tokens["count"]) as s:
        made(c, "k")
        s.snapshot("k", "one")
        s.snapshot("k", "two")
        code, details = refused(lambda: s.snapshot("k", "three"))
        assert code == Code.RESOURCE_EXHAUSTED, details
        listed = s.list_snapshots()
        assert [x.name for x in listed.snapshots] == ["one", "two"]
        assert (listed.count, listed.max_count, listed.max_bytes) == (2, 2, 1 << 20)


def test_the_byte_quota_refuses_a_big_snapshot_and_keeps_nothing_of_it(
    limited: tuple[Supervisor, dict[str, str]],
) -> None:
    sup, tokens = limited
    with sup.client(tokens["bytes"]) as c, Snaps(sup.target, tokens["bytes"]) as s:
        made(c, "k", "echo small > small.txt")
        s.snapshot("k", "small")
        before = s.list_snapshots()
        stored = stored_files(sup)
        made(c, "k", "head -c 3145728 /dev/urandom > big.bin")
        code, details = refused(lambda: s.snapshot("k", "big"))
        assert code == Code.RESOURCE_EXHAUSTED, details
        after = s.list_snapshots()
        assert [x.name for x in after.snapshots] == ["small"]
        assert (after.count, after.bytes) == (before.count, before.bytes)
        assert stored_files(sup) == stored, "the refused capture's files were removed"


def test_operations_policy_lets_snapshot_and_refuses_the_rest(
    limited: tuple[Supervisor, dict[str, str]],
) -> None:
    sup, tokens = limited
    with sup.client(tokens["policy"]) as c, Snaps(sup.target, tokens["policy"]) as s:
        container = made(c, "p")
        name = s.snapshot("p", "allowed").name
        for call in (
            lambda: s.restore("p", name),
            lambda: s.restore("brand-new", name),
            lambda: s.fork("p", ["p-fork"]),
            lambda: s.delete(name),
        ):
            code, details = refused(call)
            assert code == Code.PERMISSION_DENIED, details
            assert "[snapshots] operations" in details
        assert name in s.names()
        assert c.sandbox("p").info().container_id == container
        assert {x.key for x in c.list_sandboxes()} == {"p"}
    with sup.client(tokens["full"]) as c, Snaps(sup.target, tokens["full"]) as s:
        made(c, "f", "echo f > f.txt")
        for i in range(3):  # no count limit of its own
            s.snapshot("f", f"full-{i}")
        s.restore("f", "full-0")
        reply = s.fork("f", ["f-fork"])
        assert c.sandbox("f-fork").exec("cat f.txt").stdout == "f\n"
        assert reply.sandboxes[0].key == "f-fork"
        assert s.delete("full-1").freed_bytes > 0
        assert s.names() == ["full-0", "full-2"]
