"""`Sandbox.fork(count)` and snapshots (create, list, delete, a sandbox made from one) through
the E2B front with the unmodified e2b SDK, sync and async, on both engines (issue 28): files
only (the workspace and /tmp), on Stockade's forks and snapshots; each limit attacked (count,
another tenant's sandbox and snapshot, memory snapshots, the per-tenant cap, bad paging)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import AsyncSandbox, Sandbox
from e2b.exceptions import SandboxException, SandboxNotFoundException

from tests.integration.e2b_kit import E2bServed, rest, serving_e2b

pytestmark = pytest.mark.timeout(300)
CAP = 6


@pytest.fixture(scope="module")
def served(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2bServed]:
    folder = tmp_path_factory.mktemp("e2bsnap")
    with serving_e2b(engine, folder, e2b=f"max_sandboxes_per_tenant = {CAP}\n") as served:
        yield served


def test_a_fork_has_the_files_of_its_source_and_lives_apart(served: E2bServed) -> None:
    sbx = Sandbox.create(metadata={"job": "7"}, **served.opts())
    try:
        sbx.files.write("/home/user/state.txt", "before the fork")
        sbx.commands.run("echo in-tmp > /tmp/scratch")
        (fork,) = sbx.fork()
        assert isinstance(fork, Sandbox)
        try:
            assert fork.sandbox_id != sbx.sandbox_id
            assert sbx.is_running()
            assert fork.is_running()
            assert fork.files.read("/home/user/state.txt") == "before the fork"
            assert fork.commands.run("cat /tmp/scratch").stdout == "in-tmp\n"
            assert fork.get_info().metadata == {"job": "7"}
            fork.files.write("/home/user/state.txt", "changed in the fork")
            assert sbx.files.read("/home/user/state.txt") == "before the fork"
        finally:
            assert fork.kill() is True
    finally:
        sbx.kill()


def test_several_forks_each_their_own(served: E2bServed) -> None:
    sbx = Sandbox.create(**served.opts())
    try:
        forks = Sandbox.fork(sbx.sandbox_id, count=2, timeout=60, **served.opts())
        made = [f for f in forks if isinstance(f, Sandbox)]
        try:
            assert len(made) == 2
            ids = {f.sandbox_id for f in made}
            assert len(ids) == 2
            assert sbx.sandbox_id not in ids
            assert all(f.is_running() for f in made)
        finally:
            for fork in made:
                fork.kill()
    finally:
        sbx.kill()


def test_forks_past_the_tenants_cap_fail_each_and_make_nothing(served: E2bServed) -> None:
    sbx = Sandbox.create(**served.opts())
    try:
        before = len(Sandbox.list(**served.opts()).next_items())
        forks = sbx.fork(count=CAP)  # the source plus CAP: past the cap
        assert len(forks) == CAP
        assert all(isinstance(f, Exception) for f in forks)
        assert all("max_sandboxes_per_tenant" in str(f) for f in forks)
        assert len(Sandbox.list(**served.opts()).next_items()) == before
    finally:
        sbx.kill()


def test_forks_of_what_is_not_the_callers_are_refused(served: E2bServed) -> None:
    sbx = Sandbox.create(**served.opts())
    gone = Sandbox.create(**served.opts())
    gone.kill()
    try:
        with pytest.raises(SandboxNotFoundException):
            gone.fork()
        with pytest.raises(SandboxNotFoundException):
            Sandbox.fork(sbx.sandbox_id, **served.opts(token=served.other))
        for count in (0, 21, "2", True, -1):  # what the SDK would not send
            status, body = rest(
                served, "POST", f"/sandboxes/{sbx.sandbox_id}/fork", {"count": count}
            )
            assert status == 400, count
            assert "count must be" in body["message"]
    finally:
        sbx.kill()


def test_snapshots_create_list_make_and_delete(served: E2bServed) -> None:
    sbx = Sandbox.create(**served.opts())
    try:
        sbx.files.make_dir("/home/user/app")
        sbx.files.write("/home/user/app/config.json", '{"env": "test"}')
        snapshot = sbx.create_snapshot()
        named = Sandbox.create_snapshot(sbx.sandbox_id, name="snap-named-1", **served.opts())
        assert snapshot.snapshot_id
        assert named.names == ["snap-named-1"]
        try:
            listed = Sandbox.list_snapshots(**served.opts()).next_items()
            assert {snapshot.snapshot_id, named.snapshot_id} <= {s.snapshot_id for s in listed}
            mine = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id, **served.opts()).next_items()
            assert {s.snapshot_id for s in mine} == {snapshot.snapshot_id, named.snapshot_id}
            by_name = Sandbox.list_snapshots(name="snap-named-1", **served.opts()).next_items()
            assert [s.snapshot_id for s in by_name] == [named.snapshot_id]
            assert Sandbox.list_snapshots(name="nope-1", **served.opts()).next_items() == []
            one = Sandbox.create(snapshot.snapshot_id, **served.opts())
            two = Sandbox.create(snapshot.snapshot_id, **served.opts())
            try:
                assert one.files.exists("/home/user/app")
                assert one.files.read("/home/user/app/config.json") == '{"env": "test"}'
                one.files.write("/home/user/app/config.json", "changed")
                assert two.files.read("/home/user/app/config.json") == '{"env": "test"}'
            finally:
                one.kill()
                two.kill()
        finally:
            assert Sandbox.delete_snapshot(snapshot.snapshot_id, **served.opts()) is True
            assert Sandbox.delete_snapshot(named.snapshot_id, **served.opts()) is True
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **served.opts()) is False
        with pytest.raises(SandboxException, match="not found"):  # the SDK's 404 on create
            Sandbox.create(snapshot.snapshot_id, **served.opts())
    finally:
        sbx.kill()


def test_a_snapshot_is_its_tenants_and_files_only(served: E2bServed) -> None:
    sbx = Sandbox.create(**served.opts())
    try:
        snapshot = sbx.create_snapshot()
        theirs = served.opts(token=served.other)
        try:
            assert Sandbox.delete_snapshot(snapshot.snapshot_id, **theirs) is False
            with pytest.raises(SandboxException, match="not found"):
                Sandbox.create(snapshot.snapshot_id, **theirs)
            listed = Sandbox.list_snapshots(**theirs).next_items()
            assert snapshot.snapshot_id not in {s.snapshot_id for s in listed}
            with pytest.raises(SandboxNotFoundException):
                Sandbox.create_snapshot(sbx.sandbox_id, **theirs)
            with pytest.raises(SandboxException, match="memory"):
                sbx.create_snapshot(mode="full")
            with pytest.raises(SandboxException, match="template already"):
                sbx.create_snapshot(name="base")
            with pytest.raises(SandboxException, match="snapshot name"):
                sbx.create_snapshot(name="../escape")
            for query in ("limit=0", "limit=x", "nextToken=-1"):
                status, _ = rest(served, "GET", f"/snapshots?{query}")
                assert status == 400, query
        finally:
            assert Sandbox.delete_snapshot(snapshot.snapshot_id, **served.opts()) is True
    finally:
        sbx.kill()


async def test_fork_and_snapshot_async(served: E2bServed) -> None:
    sbx = await AsyncSandbox.create(**served.opts())
    try:
        await sbx.files.write("/home/user/a.txt", "async")
        (fork,) = await sbx.fork()
        assert isinstance(fork, AsyncSandbox)
        try:
            assert await fork.files.read("/home/user/a.txt") == "async"
        finally:
            await fork.kill()
        snapshot = await sbx.create_snapshot()
        try:
            made = await AsyncSandbox.create(snapshot.snapshot_id, **served.opts())
            try:
                assert await made.files.read("/home/user/a.txt") == "async"
            finally:
                await made.kill()
        finally:
            assert await AsyncSandbox.delete_snapshot(snapshot.snapshot_id, **served.opts())
    finally:
        await sbx.kill()
