"""The agent's file watch (inotify), on a temporary workspace on the host, directly and
through the agent service's WatchFiles stream."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stockade.agent import watch
from stockade.agent.errors import ToolError
from stockade.agent.service import AgentService
from stockade.agent.v1 import agent_pb2
from tests.unit.fakes import make_folder

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "ws", dirs=("sub/deep",))


class Seen:
    """A watch's changes, collected by a task while the test acts."""

    def __init__(self, w: watch.Watch) -> None:
        self.watch = w
        self.changes: list[watch.Change] = []
        self.error: ToolError | None = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for change in self.watch.changes():
                self.changes.append(change)
        except ToolError as exc:
            self.error = exc

    def pairs(self) -> list[tuple[str, str]]:
        return [(c.kind, c.name) for c in self.changes]

    async def until(self, kind: str, name: str) -> None:
        for _ in range(200):
            if (kind, name) in self.pairs():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"no {kind} {name!r} in {self.pairs()}")


@contextlib.asynccontextmanager
async def watching(root: Path, path: str, recursive: bool = False) -> AsyncIterator[Seen]:
    w = await watch.watch(root, path, recursive)
    seen = Seen(w)
    try:
        yield seen
    finally:
        seen.task.cancel()
        await asyncio.gather(seen.task, return_exceptions=True)
        w.close()


async def test_create_write_rename_chmod_remove(ws: Path) -> None:
    async with watching(ws, ".") as seen:
        (ws / "a.txt").write_text("one")
        await seen.until("write", "a.txt")
        (ws / "a.txt").rename(ws / "b.txt")
        (ws / "b.txt").chmod(0o600)
        (ws / "b.txt").unlink()
        await seen.until("remove", "b.txt")
    assert seen.pairs() == [
        ("create", "a.txt"),
        ("write", "a.txt"),
        ("rename", "a.txt"),
        ("create", "b.txt"),
        ("chmod", "b.txt"),
        ("remove", "b.txt"),
    ]
    assert watch.active() == 0


async def test_names_are_relative_to_the_watched_folder(ws: Path) -> None:
    async with watching(ws, "sub") as seen:
        assert seen.watch.folder == "sub"
        (ws / "sub" / "x").write_text("")
        (ws / "sub" / "newdir").mkdir()
        await seen.until("create", "newdir")
    assert ("create", "x") in seen.pairs()
    assert [c.is_dir for c in seen.changes if c.name == "newdir"] == [True]


async def test_not_recursive_sees_nothing_below(ws: Path) -> None:
    async with watching(ws, ".") as seen:
        (ws / "sub" / "deep" / "f").write_text("x")
        (ws / "marker").write_text("")
        await seen.until("create", "marker")
    assert all(not c.name.startswith("sub/") for c in seen.changes)


async def test_recursive_sees_existing_and_new_folders(ws: Path) -> None:
    async with watching(ws, ".", recursive=True) as seen:
        (ws / "sub" / "deep" / "f").write_text("x")
        await seen.until("write", "sub/deep/f")
        (ws / "n1" / "n2").mkdir(parents=True)
        await seen.until("create", "n1")
        await asyncio.sleep(0.05)
        (ws / "n1" / "n2" / "g").write_text("y")
        await seen.until("write", "n1/n2/g")
    # n2 was made before n1's watch could be added: found by the walk, reported as created
    assert ("create", "n1/n2") in seen.pairs()


async def test_a_folder_moved_out_is_no_longer_watched(ws: Path, tmp_path: Path) -> None:
    async with watching(ws, ".", recursive=True) as seen:
        (ws / "sub").rename(tmp_path / "moved")
        await seen.until("rename", "sub")
        (tmp_path / "moved" / "f").write_text("x")
        (ws / "marker").write_text("")
        await seen.until("create", "marker")
    assert not any(name.endswith("/f") or name == "f" for _, name in seen.pairs())


async def test_removing_the_watched_folder_ends_with_gone(ws: Path) -> None:
    async with watching(ws, "sub") as seen:
        shutil.rmtree(ws / "sub")
        await asyncio.wait_for(seen.task, 5)
    assert seen.changes[-1] == watch.Change("gone", "")


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("missing", "FILE_NOT_FOUND"),
        ("../ws", "INVALID_PATH"),
        ("/etc", "INVALID_PATH"),
        ("file.txt", "INVALID_PATH"),
        ("out", "INVALID_PATH"),
    ],
)
async def test_refused(ws: Path, tmp_path: Path, path: str, code: str) -> None:
    (ws / "file.txt").write_text("")
    (ws / "out").symlink_to(tmp_path)
    with pytest.raises(ToolError) as info:
        await watch.watch(ws, path, False)
    assert info.value.code == code, info.value.message
    assert watch.active() == 0


async def test_too_many_folders_refused_at_start(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "MAX_FOLDERS", 2)
    (ws / "sub" / "more").mkdir()
    with pytest.raises(ToolError, match="too many folders") as info:
        await watch.watch(ws, ".", True)
    assert "without recursive" in info.value.message
    assert watch.active() == 0


async def test_too_many_folders_later_ends_the_watch(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch, "MAX_FOLDERS", 3)
    async with watching(ws, ".", recursive=True) as seen:
        (ws / "a").mkdir()
        await asyncio.wait_for(seen.task, 5)
    assert seen.error is not None
    assert "too many folders" in seen.error.message


async def test_the_number_of_watches_is_capped(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "MAX_WATCHES", 1)
    async with watching(ws, "."):
        with pytest.raises(ToolError, match="too many watches"):
            await watch.watch(ws, "sub", False)


def inotify_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    return count


async def test_service_stream_and_cancel_frees_the_descriptor(ws: Path) -> None:
    service = AgentService(ws, max_output_bytes=1 << 20)
    before = inotify_fds()
    stream = service.watch_files(agent_pb2.WatchFilesRequest(path="sub", recursive=True))
    first = await anext(stream)
    assert first.started.path == "sub"
    assert inotify_fds() == before + 1
    (ws / "sub" / "deep" / "n.txt").write_text("x")
    event = await asyncio.wait_for(anext(stream), 5)
    assert event.change.kind == agent_pb2.FILE_CHANGE_KIND_CREATE
    assert event.change.name == "deep/n.txt"
    await stream.aclose()  # what grpc does when the caller cancels
    assert inotify_fds() == before
    assert watch.active() == 0


async def test_service_refusal_is_a_result_alone(ws: Path) -> None:
    service = AgentService(ws, max_output_bytes=1 << 20)
    request = agent_pb2.WatchFilesRequest(path="nope")
    events: list[Any] = [e async for e in service.watch_files(request)]
    assert len(events) == 1
    assert events[0].result.error_code == agent_pb2.AGENT_ERROR_CODE_FILE_NOT_FOUND


async def test_service_gone_ends_with_a_result(ws: Path) -> None:
    service = AgentService(ws, max_output_bytes=1 << 20)
    stream = service.watch_files(agent_pb2.WatchFilesRequest(path="sub"))
    await anext(stream)
    shutil.rmtree(ws / "sub")
    events = [e async for e in stream]
    kinds = [e.change.kind for e in events if e.HasField("change")]
    assert kinds[-1] == agent_pb2.FILE_CHANGE_KIND_GONE
    assert events[-1].HasField("result")
    assert not events[-1].result.error_code


async def test_a_caller_gone_while_the_watch_opens_leaves_nothing_open(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    release, opened = threading.Event(), threading.Event()
    real_open = watch.Watch.open

    def slow_open(self: watch.Watch) -> None:
        release.wait(5)
        real_open(self)
        opened.set()

    monkeypatch.setattr(watch.Watch, "open", slow_open)
    before = inotify_fds()
    task = asyncio.create_task(watch.watch(ws, ".", True))
    await asyncio.sleep(0.05)
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(opened.wait, 5)
    for _ in range(100):  # the close runs on the loop once the thread is done
        if watch.active() == 0 and inotify_fds() == before:
            break
        await asyncio.sleep(0.01)
    assert watch.active() == 0
    assert inotify_fds() == before
