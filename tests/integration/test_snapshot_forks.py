"""Forks for real, on both engines, through the real supervisor (issue 16, done-when 3): ten
forks of one sandbox, in one ForkSandbox call and in concurrent ones, each start with the
source's files, then live apart: a change in one is seen in no other nor in the source, and
all run side by side as containers of their own while the source runs on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from stockade.client import AsyncStockade, NotFound, Stockade
from stockade.supervisor.sandboxes import layers
from stockade.v1 import sandbox_pb2
from tests.integration.harness import Supervisor, backend
from tests.integration.snapshot_kit import Node, Snaps, differences, listing, tenants_supervisor

pytestmark = pytest.mark.timeout(300)

SOURCE = r"""set -e
printf 'base\n' > shared.txt
mkdir -p tree/empty && chmod 750 tree && printf 'deep\n' > tree/deep.txt
ln -s tree/deep.txt link && head -c 1048576 /dev/urandom > blob.bin
"""


@pytest.fixture(scope="module")
def supervisor(engine: str) -> Iterator[Supervisor]:
    with tenants_supervisor(engine, ("acme",)) as (sup, _tokens):
        yield sup


LAYERED = not layers.probe(Path("/var/tmp"))
"""Whether this host makes a fork's workspace layered (layers.py), as the supervisor does."""


def fs_type(path: str) -> str:
    """The file system `path` is on: its mount's, from /proc/self/mountinfo's longest match."""
    best, kind = "", ""
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[4].replace("\\040", " ")
            after = fields[fields.index("-") + 1]
            below = path == point or path.startswith(point.rstrip("/") + "/")
            if below and len(point) >= len(best):
                best, kind = point, after
    return kind


def files_only(tree: dict[bytes, Node]) -> dict[bytes, Node]:
    """A listing without owners: each sandbox's files belong to its own sandbox user's host
    ids (Podman gives each sandbox a user namespace of its own)."""
    return {path: n._replace(uid=0, gid=0) for path, n in tree.items()}


def check_forks(supervisor: Supervisor, source: str, forks: list[str]) -> None:
    """Each fork has the source's files; a change made in each (all at once) stays its own;
    all run side by side, the source too. Then they are destroyed with their workspaces."""
    with supervisor.client() as c:
        origin = files_only(listing(c.sandbox(source).info().workspace_path))
        infos = [c.sandbox(k).info() for k in forks]
        for info in infos:
            assert (fs_type(info.workspace_path) == "overlay") == LAYERED, info
            tree = listing(info.workspace_path)
            assert not differences(origin, files_only(tree)), (info.key, tree)
            root = Path(info.workspace_path).stat()
            assert {(n.uid, n.gid) for n in tree.values()} == {(root.st_uid, root.st_gid)}

    async def change_all() -> list[str]:
        async with AsyncStockade(supervisor.target, token=supervisor.token) as ac:

            async def change(i: int, k: str) -> None:
                ran = await ac.sandbox(k).exec(
                    f"echo {i} >> shared.txt && echo mine > own-{i}.txt && rm tree/deep.txt"
                )
                assert ran.exit_code == 0, ran.stderr

            await asyncio.gather(*(change(i, k) for i, k in enumerate(forks)))
            seen = await asyncio.gather(
                *(ac.sandbox(k).exec("cat shared.txt; ls own-* tree") for k in forks)
            )
            states = await asyncio.gather(*(ac.get_sandbox(k) for k in [source, *forks]))
            assert {s.state for s in states} == {"RUNNING"}, states
            ids = [s.container_id for s in states]
            assert len(set(ids)) == len(ids), "each fork is a container of its own"
            return [r.stdout for r in seen]

    seen = asyncio.run(change_all())
    assert seen == [f"base\n{i}\nown-{i}.txt\n\ntree:\nempty\n" for i in range(len(forks))]
    with supervisor.client() as c:
        box = c.sandbox(source)
        assert box.exec("cat shared.txt tree/deep.txt; ls").stdout == (
            "base\ndeep\nblob.bin\nlink\nshared.txt\ntree\n"
        )
        running = [c.sandbox(k).info() for k in forks]
        be = backend(supervisor.engine)
        try:
            for info in running:
                found = be.inspect(info.container_id)
                assert found is not None, info.key
                assert found.running, info.key
        finally:
            be.close()
        for info in running:
            assert c.sandbox(info.key).destroy(delete_workspace=True) is True
            assert not Path(info.workspace_path).exists()
            with pytest.raises(NotFound):
                c.sandbox(info.key).info()


def start_source(c: Stockade, key: str) -> tuple[str, str]:
    """The source sandbox with its files and a background process; (container id, its id)."""
    box = c.sandbox(key)
    ran = box.exec(SOURCE)
    assert ran.exit_code == 0, ran.stderr
    started = box.call("process", {"action": "start", "command": "sleep 4243"})
    assert not started.is_error, started.error_message
    return box.info().container_id, started.data["id"]


def source_runs_on(c: Stockade, key: str, container: str, process: str) -> None:
    info = c.sandbox(key).info()
    assert (info.state, info.container_id) == ("RUNNING", container)
    polled = c.sandbox(key).call("process", {"action": "poll", "id": process})
    assert polled.data["state"] == "running", polled


def test_ten_forks_in_one_call(supervisor: Supervisor, snaps: Snaps, key: str) -> None:
    with supervisor.client() as c:
        container, sleeper = start_source(c, key)
        forks = [f"{key}-fork-{i}" for i in range(10)]
        reply = snaps.fork(key, forks)
        assert [s.key for s in reply.sandboxes] == forks
        assert {s.state for s in reply.sandboxes} == {sandbox_pb2.SANDBOX_STATE_RUNNING}
        assert len({s.container_id for s in reply.sandboxes} | {container}) == 11
        capture = reply.capture
        assert (capture.name, capture.source_key, capture.files) == ("", key, 3)
        assert 0 < capture.frozen_seconds < 30
        assert snaps.names() == [], "a fork's capture is not kept"
        assert snaps.list_snapshots().bytes == 0
        source_runs_on(c, key, container, sleeper)
    check_forks(supervisor, key, forks)


def test_concurrent_fork_calls(supervisor: Supervisor, snaps: Snaps, key: str) -> None:
    with supervisor.client() as c:
        container, sleeper = start_source(c, key)
    groups = [[f"{key}-c{i}-a", f"{key}-c{i}-b"] for i in range(4)]
    with ThreadPoolExecutor(len(groups)) as pool:
        replies = list(pool.map(lambda keys: snaps.fork(key, keys), groups))
    for keys, reply in zip(groups, replies, strict=True):
        assert [s.key for s in reply.sandboxes] == keys
    with supervisor.client() as c:
        source_runs_on(c, key, container, sleeper)
    check_forks(supervisor, key, [k for keys in groups for k in keys])
    left = sorted(p.name for p in (supervisor.state_dir / "snapshots").rglob("~*"))
    assert left == [], "each fork's capture and its lock file went, none took another's"


def test_two_forks_racing_for_one_key_make_one_sandbox(
    supervisor: Supervisor, snaps: Snaps, key: str
) -> None:
    with supervisor.client() as c:
        start_source(c, key)
    contested = f"{key}-contested"
    groups = [[contested, f"{key}-left"], [contested, f"{key}-right"]]
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(snaps.fork, key, keys) for keys in groups]
        outcomes: list[object] = []
        for future in futures:
            try:
                outcomes.append(future.result())
            except grpc.RpcError as exc:
                outcomes.append(exc.code())
    winners = [o for o in outcomes if isinstance(o, sandbox_pb2.ForkSandboxResponse)]
    assert len(winners) == 1, outcomes
    assert grpc.StatusCode.ALREADY_EXISTS in outcomes, outcomes
    won = [s.key for s in winners[0].sandboxes]
    lost = next(k for keys in groups for k in keys if k not in won)
    with supervisor.client() as c:
        keys = {s.key for s in c.list_sandboxes()}
        assert set(won) <= keys
        assert lost not in keys, "all or nothing: the losing call's other key is not made"
        for k in won:
            c.sandbox(k).destroy(delete_workspace=True)


def test_a_fork_takes_tmp_on_request(supervisor: Supervisor, snaps: Snaps, key: str) -> None:
    with supervisor.client() as c:
        ran = c.sandbox(key).exec("echo scratch > /tmp/scratch.txt && echo w > w.txt")
        assert ran.exit_code == 0, ran.stderr
        with_tmp, without = f"{key}-tmp", f"{key}-notmp"
        assert snaps.fork(key, [with_tmp], include_tmp=True).capture.includes_tmp
        assert not snaps.fork(key, [without]).capture.includes_tmp
        assert c.sandbox(with_tmp).exec("cat /tmp/scratch.txt w.txt").stdout == "scratch\nw\n"
        assert c.sandbox(without).exec("ls -A /tmp; cat w.txt").stdout == "w\n"
        assert c.sandbox(key).exec("cat /tmp/scratch.txt").stdout == "scratch\n"
        for k in (with_tmp, without):
            c.sandbox(k).destroy(delete_workspace=True)
