"""File watches for real (FileService.WatchFiles): what a command does in the sandbox comes
back as events, paths outside the workspace are refused, policy and audit apply, and a
cancelled watch leaves no inotify descriptor behind in the agent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.client import (
    AsyncStockade,
    CallContext,
    FileEvent,
    FileWatch,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Stockade,
    StockadeError,
)
from stockade.supervisor.engines.backends.base import LABEL_KEY
from tests.integration.harness import (
    Supervisor,
    engine_url,
    instance_containers,
)

pytestmark = pytest.mark.timeout(300)


class Collector:
    """A sync watch's events, read by a thread while the test acts."""

    def __init__(self, watch: FileWatch) -> None:
        self.watch = watch
        self.events: list[FileEvent] = []
        self.error: StockadeError | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self.watch:
                self.events.append(event)
        except StockadeError as exc:
            self.error = exc

    def pairs(self) -> list[tuple[str, str]]:
        return [(e.type, e.name) for e in self.events]

    def until(self, kind: str, name: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while (kind, name) not in self.pairs():
            assert time.monotonic() < deadline, f"no {kind} {name!r} in {self.pairs()}"
            time.sleep(0.02)

    def close(self) -> None:
        self.watch.close()
        self._thread.join(10)
        assert not self._thread.is_alive()


@pytest.fixture
def watched(client: Stockade, key: str) -> Iterator[Collector]:
    client.sandbox(key).exec("mkdir -p w")
    collector = Collector(client.watch_files(key, "w"))
    yield collector
    collector.close()


def test_create_write_rename_remove_by_exec(client: Stockade, key: str, watched: Collector) -> None:
    assert watched.watch.path == "w"
    result = client.sandbox(key).exec("echo hi > w/a.txt && mv w/a.txt w/b.txt && rm w/b.txt")
    assert result.exit_code == 0, result.stderr
    watched.until("remove", "b.txt")
    assert watched.pairs() == [
        ("create", "a.txt"),
        ("write", "a.txt"),
        ("rename", "a.txt"),
        ("create", "b.txt"),
        ("remove", "b.txt"),
    ]


def test_recursive_sees_new_folders(client: Stockade, key: str) -> None:
    client.sandbox(key).exec("mkdir -p r/old")
    collector = Collector(client.watch_files(key, "r", recursive=True))
    try:
        client.sandbox(key).exec("touch r/old/f && mkdir -p r/x/y && touch r/x/y/z")
        collector.until("create", "old/f")
        collector.until("create", "x/y/z")
        assert ("create", "x") in collector.pairs()
    finally:
        collector.close()


def test_removing_the_folder_ends_the_watch(client: Stockade, key: str) -> None:
    client.sandbox(key).exec("mkdir -p gone")
    collector = Collector(client.watch_files(key, "gone"))
    client.sandbox(key).exec("rmdir gone")
    collector._thread.join(20)
    assert not collector._thread.is_alive()
    assert collector.pairs()[-1] == ("gone", "")


@pytest.mark.parametrize("path", ["/etc", "../..", "out"])
def test_outside_the_workspace_is_refused(client: Stockade, key: str, path: str) -> None:
    client.sandbox(key).exec("ln -sfn /etc out")
    with pytest.raises(InvalidArgument):
        client.watch_files(key, path)


def test_a_missing_folder_is_not_found(client: Stockade, key: str) -> None:
    with pytest.raises(NotFound):
        client.watch_files(key, "no/such/folder")


def inotify_fds(pid: int) -> int:
    """inotify descriptors of a process on this host (the tests run as root: commands in the
    sandbox cannot read the agent's /proc/PID/fd, which is the point of its identity)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd) == "anon_inode:inotify"
    return count


def agent_pid(engine: str, supervisor: Supervisor, key: str) -> int:
    """The agent: the child of the container's main process (tini)."""
    (box,) = [
        c
        for c in instance_containers(engine, engine_url(engine), supervisor)
        if c.labels.get(LABEL_KEY) == key
    ]
    children = Path(f"/proc/{box.pid}/task/{box.pid}/children").read_text().split()
    agents = [
        int(c) for c in children if b"stockade.agent" in Path(f"/proc/{c}/cmdline").read_bytes()
    ]
    assert len(agents) == 1, children
    return agents[0]


def test_cancelling_ends_the_watch_in_the_agent(
    engine: str, supervisor: Supervisor, client: Stockade, key: str
) -> None:
    client.sandbox(key).exec("mkdir -p c")
    agent = agent_pid(engine, supervisor, key)
    before = inotify_fds(agent)
    watch = client.watch_files(key, "c")
    assert inotify_fds(agent) == before + 1
    watch.close()
    deadline = time.monotonic() + 20
    while inotify_fds(agent) != before:
        assert time.monotonic() < deadline, "the agent kept the watch's inotify descriptor"
        time.sleep(0.1)


def test_async_client(supervisor: Supervisor, key: str) -> None:
    async def run() -> list[tuple[str, str]]:
        async with AsyncStockade(supervisor.target) as c:
            await c.sandbox(key).exec("mkdir -p aw")
            seen: list[tuple[str, str]] = []
            async with await c.watch_files(key, "aw") as watch:
                await c.sandbox(key).exec("touch aw/one")
                async for event in watch:
                    seen.append((event.type, event.name))
                    if event.name == "one":
                        break
            return seen

    assert asyncio.run(asyncio.wait_for(run(), 60)) == [("create", "one")]


CONFIG = """
[agents.blind.tools]
deny = ["read_file"]
"""


def test_policy_scrubbing_and_audit(policy_sup: Supervisor) -> None:
    with policy_sup.client() as c:
        c.sandbox("k").exec("mkdir -p p")
        with pytest.raises(PermissionDenied):
            c.watch_files("k", "p", context=CallContext(agent_id="blind"))
        collector = Collector(c.watch_files("k", "p"))
        token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
        c.sandbox("k").exec(f"touch p/x p/{token}")
        collector.until("create", "x")
        collector.until("create", "[REDACTED]")
        assert not any(token in name for _, name in collector.pairs())
        collector.close()
        deadline = time.monotonic() + 20
        while True:
            records = [r for r in c.list_audit(sandbox_key="k") if r.tool == "watch_files"]
            if len(records) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert len(records) == 2, records
    done, denied = records
    assert denied.policy_step != "allowed"
    assert json.loads(done.arguments_json)["events"] >= 1
    assert done.front == "grpc"


def test_destroying_the_sandbox_ends_the_watch(client: Stockade, key: str) -> None:
    client.sandbox(key).exec("mkdir -p d")
    collector = Collector(client.watch_files(key, "d"))
    assert client.sandbox(key).destroy() is True
    collector._thread.join(20)
    assert not collector._thread.is_alive()
    assert collector.error is not None
    assert collector.error.reason == "SANDBOX_LOST", collector.error
