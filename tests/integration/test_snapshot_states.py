"""Snapshots across a sandbox's states and the supervisor's life, on both engines, through
the real supervisor without authentication (callers of no tenant): a paused sandbox stays
paused through a snapshot and a restore brings it back running; snapshots outlive a restart;
a size-capped workspace is restored into a file system of its own, and a snapshot that does
not fit leaves the sandbox as it was; a tree too deep is refused and nothing is kept; a fork
past the tenant's sandbox limit makes nothing; every operation is audited."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from stockade.client import Stockade
from tests.integration.harness import Supervisor, running_supervisor
from tests.integration.snapshot_kit import (
    Snaps,
    differences,
    listing,
    refused,
    tenants_supervisor,
)

pytestmark = pytest.mark.timeout(300)

Code = grpc.StatusCode
CAPPED = "[sandbox]\nworkspace_size_mb = 32\n"


def ok(c: Stockade, key: str, command: str) -> str:
    ran = c.sandbox(key).exec(command, timeout=120)
    assert ran.exit_code == 0, f"{command!r}: {ran.stderr} {ran.error_message}"
    return ran.stdout


def leftovers(workspace: str) -> list[str]:
    """What a restore may leave beside the workspace (staged or retired copies)."""
    found = (p.name for p in Path(workspace).parent.iterdir())
    return sorted(name for name in found if ".restoring" in name or name.endswith(".old"))


def test_a_paused_sandbox_stays_paused_and_a_restore_runs_it_again(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    with supervisor.client() as c:
        ok(c, key, "echo paused > p.txt")
        box = c.sandbox(key)
        assert box.pause() is True
        container = box.info().container_id
        taken = snaps.snapshot(key, f"{key}-p")
        assert (taken.files, taken.frozen_seconds) == (1, 0.0), "it was frozen already"
        info = box.info()
        assert (info.state, info.container_id) == ("PAUSED", container)
        with_tmp = snaps.snapshot(key, f"{key}-pt", include_tmp=True)
        assert with_tmp.includes_tmp
        assert box.info().state == "PAUSED"
        restored = snaps.restore(key, f"{key}-p")
        after = box.info()
        assert (after.state, after.paused_at) == ("RUNNING", None)
        assert after.container_id != container
        assert restored.sandbox.container_id == after.container_id
        assert ok(c, key, "cat p.txt") == "paused\n"
        assert leftovers(after.workspace_path) == []
        steps = [r.policy_step for r in c.list_audit(sandbox_key=key, tool="housekeeping")]
        assert any(s.startswith(f"housekeeping: snapshot: {key}-p: SnapshotSandbox") for s in steps)
        assert any(s.startswith(f"housekeeping: restore: {key}-p: RestoreSandbox") for s in steps)


def test_include_tmp_needs_a_container(supervisor: Supervisor, snaps: Snaps, key: str) -> None:
    with supervisor.client() as c:
        ok(c, key, "echo w > w.txt")
        assert c.sandbox(key).destroy() is True
        code, details = refused(lambda: snaps.snapshot(key, f"{key}-t", include_tmp=True))
        assert code == Code.FAILED_PRECONDITION, details
        assert f"{key}-t" not in snaps.names()
        assert snaps.snapshot(key, f"{key}-w").files == 1


def test_a_tree_too_deep_is_refused_and_nothing_is_kept(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    deep = 'python3 -c \'import os\nfor _ in range(300): os.mkdir("d"); os.chdir("d")\''
    with supervisor.client() as c:
        ok(c, key, deep)
        before = snaps.list_snapshots()
        code, details = refused(lambda: snaps.snapshot(key, f"{key}-deep"))
        assert code == Code.INVALID_ARGUMENT, details
        after = snaps.list_snapshots()
        assert (after.count, after.bytes) == (before.count, before.bytes)
        assert c.sandbox(key).info().state == "RUNNING", "the freeze was undone"
        assert ok(c, key, "echo alive") == "alive\n"


def test_a_fork_past_the_tenant_sandbox_limit_makes_nothing(engine: str) -> None:
    config = '[tenants."*"]\nmax_sandboxes = 3\n'
    with (
        tenants_supervisor(engine, ("acme",), config) as (sup, _tokens),
        sup.client() as c,
        Snaps(sup.target, sup.token) as s,
    ):
        ok(c, "src", "echo s > s.txt")
        folders = sorted(p.name for p in (sup.state_dir / "sandboxes").iterdir())
        code, details = refused(lambda: s.fork("src", ["a", "b", "c"]))
        assert code == Code.RESOURCE_EXHAUSTED, details
        assert [x.key for x in c.list_sandboxes()] == ["src"]
        assert sorted(p.name for p in (sup.state_dir / "sandboxes").iterdir()) == folders
        made = s.fork("src", ["a", "b"])
        assert [x.key for x in made.sandboxes] == ["a", "b"]
        assert ok(c, "b", "cat s.txt") == "s\n"
        code, details = refused(lambda: s.fork("src", ["c"]))
        assert code == Code.RESOURCE_EXHAUSTED, details


def test_snapshots_outlive_a_restart(engine: str) -> None:
    with running_supervisor(engine) as sup:
        with sup.client() as c, Snaps(sup.target) as s:
            ok(c, "kept", "mkdir -p a && echo before > a/f.txt")
            taken = s.snapshot("kept", "survivor")
            ok(c, "kept", "echo after > a/f.txt")
        sup.stop()
        sup.start()
        with sup.client() as c, Snaps(sup.target) as s:
            listed = s.list_snapshots()
            assert [x.name for x in listed.snapshots] == ["survivor"]
            assert listed.snapshots[0].files == taken.files
            assert listed.snapshots[0].created_at == taken.created_at
            s.restore("kept", "survivor")
            assert ok(c, "kept", "cat a/f.txt") == "before\n"
            again = s.snapshot("kept", "after-restart")
            assert again.files_read_frozen <= again.files


def test_a_capped_workspace_is_restored_into_a_file_system_of_its_own(engine: str) -> None:
    with running_supervisor(engine, CAPPED) as sup, sup.client() as c, Snaps(sup.target) as s:
        ok(c, "cap", "mkdir -p d/e && echo one > d/e/f.txt && head -c 8388608 /dev/zero > z")
        workspace = c.sandbox("cap").info().workspace_path
        before = listing(workspace)
        s.snapshot("cap", "capped")
        ok(c, "cap", "rm -r d && echo two > new.txt")
        s.restore("cap", "capped")
        changed = differences(before, listing(workspace))
        assert not changed, changed
        assert os.path.ismount(workspace)
        assert Path(workspace).parent.joinpath("workspace.img").exists()
        assert leftovers(workspace) == []
        full = c.sandbox("cap").exec("head -c 40000000 /dev/zero > fill")
        assert full.exit_code != 0, "the cap holds after the restore"
        assert "No space left" in full.stderr


def test_a_snapshot_too_big_for_the_cap_leaves_the_sandbox_as_it_was(engine: str) -> None:
    """Two supervisors share one store ([snapshots] dir): the uncapped one takes a snapshot
    of 40 MiB, the capped one (32 MiB) cannot restore it."""
    store = Path("/tmp") / f"stksnapstore-{os.getpid()}-{engine}"
    shared = f'[snapshots]\ndir = "{store}"\n'
    try:
        with (
            running_supervisor(engine, shared) as wide,
            wide.client() as c,
            Snaps(wide.target) as s,
        ):
            ok(c, "big", "head -c 41943040 /dev/urandom > big.bin")
            assert s.snapshot("big", "too-big").bytes == 40 << 20
        with (
            running_supervisor(engine, CAPPED + shared) as sup,
            sup.client() as c,
            Snaps(sup.target) as s,
        ):
            ok(c, "small", "echo mine > mine.txt")
            info = c.sandbox("small").info()
            before = listing(info.workspace_path)
            code, details = refused(lambda: s.restore("small", "too-big"))
            assert code == Code.INVALID_ARGUMENT, details
            assert "does not fit" in details
            after = c.sandbox("small").info()
            assert (after.state, after.container_id) == ("RUNNING", info.container_id)
            assert not differences(before, listing(info.workspace_path))
            assert ok(c, "small", "cat mine.txt") == "mine\n"
            assert leftovers(info.workspace_path) == []
    finally:
        shutil.rmtree(store, ignore_errors=True)


@pytest.fixture(scope="module")
def supervisor(engine: str) -> Iterator[Supervisor]:
    with running_supervisor(engine) as sup:
        yield sup
