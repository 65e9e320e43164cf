"""The E2B front's directory watches through the real `stockade serve` on both engines, driven
by the unmodified e2b SDK: sync `watch_dir` (polling watchers: CreateWatcher,
GetWatcherEvents, RemoveWatcher) and async `watch_dir` (the WatchDir stream) see files made
by a command and by files.write; a missing folder is not found; a stopped watcher is gone;
killing a sandbox with a watcher open does not hang; each watch is audited as "e2b"."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from e2b import AsyncSandbox, FilesystemEvent, FilesystemEventType, NotFoundException, Sandbox

from tests.integration.test_e2b_control import E2bServed

pytestmark = pytest.mark.timeout(300)


def pairs(events: list[FilesystemEvent]) -> list[tuple[FilesystemEventType, str]]:
    return [(e.type, e.name) for e in events]


def watch_records(served: E2bServed, sandbox_id: str, timeout: float = 20) -> list[Any]:
    """The audit records of the sandbox's ended watches (once there is at least one)."""
    deadline = time.monotonic() + timeout
    with served.sup.client(token=served.token) as client:
        while True:
            found = [
                r
                for r in client.list_audit(tool="watch_files", limit=100)
                if sandbox_id in r.sandbox_key
            ]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)


def test_watch_dir_sync_polls_events(served: E2bServed) -> None:
    sbx = Sandbox.create(timeout=120, **served.opts())
    try:
        sbx.files.make_dir("/home/user/w")
        handle = sbx.files.watch_dir("/home/user/w")
        sbx.commands.run("echo hi > /home/user/w/made.txt && rm /home/user/w/made.txt")
        sbx.files.write("/home/user/w/written.txt", "x")
        seen: list[FilesystemEvent] = []
        deadline = time.monotonic() + 30
        while (FilesystemEventType.CREATE, "written.txt") not in pairs(seen):
            assert time.monotonic() < deadline, pairs(seen)
            seen += handle.get_new_events()
            time.sleep(0.1)
        got = pairs(seen)
        made = [kind for kind, name in got if name == "made.txt"]
        assert made[:3] == [
            FilesystemEventType.CREATE,
            FilesystemEventType.WRITE,
            FilesystemEventType.REMOVE,
        ]
        assert got.index((FilesystemEventType.REMOVE, "made.txt")) < got.index(
            (FilesystemEventType.CREATE, "written.txt")
        )
        handle.stop()  # the watch ends in the supervisor: its audit record comes then
        (record,) = watch_records(served, sbx.sandbox_id)
        assert record.front == "e2b"
        assert json.loads(record.arguments_json)["events"] >= 4
        assert not record.is_error
        with pytest.raises(NotFoundException):
            sbx.files.watch_dir("/home/user/no/such/dir")
    finally:
        sbx.kill()


def test_kill_with_a_watcher_open_does_not_hang(served: E2bServed) -> None:
    sbx = Sandbox.create(timeout=120, **served.opts())
    handle = sbx.files.watch_dir("/home/user")
    started = time.monotonic()
    assert sbx.kill() is True
    assert time.monotonic() - started < 30
    assert handle  # its watch ended with the sandbox:
    assert len(watch_records(served, sbx.sandbox_id)) == 1


async def test_watch_dir_async_streams_events(served: E2bServed) -> None:
    sbx = await AsyncSandbox.create(timeout=120, **served.opts())
    try:
        await sbx.files.make_dir("/home/user/aw/sub")
        seen: list[FilesystemEvent] = []
        exits: list[Exception | None] = []
        handle = await sbx.files.watch_dir(
            "/home/user/aw", on_event=seen.append, on_exit=exits.append, recursive=True
        )
        await sbx.commands.run("touch /home/user/aw/sub/deep.txt")
        await sbx.files.write("aw/top.txt", "y")
        deadline = time.monotonic() + 30
        while (FilesystemEventType.CREATE, "top.txt") not in pairs(seen):
            assert time.monotonic() < deadline, pairs(seen)
            await asyncio.sleep(0.1)
        assert (FilesystemEventType.CREATE, "sub/deep.txt") in pairs(seen)
        await handle.stop()
        assert exits == [None]
        with pytest.raises(NotFoundException):
            await sbx.files.watch_dir("/home/user/nope", on_event=seen.append)
    finally:
        await sbx.kill()


def test_write_over_a_file_is_seen_as_envd_s_write(served: E2bServed) -> None:
    """files.write over an existing file: a WRITE of that name, as E2B's SDK tests wait for;
    a new file: CREATE, CHMOD, WRITE (envd's open, chown, write: E2B's sync tests count three);
    never the upload's temporary file."""
    sbx = Sandbox.create(timeout=120, **served.opts())
    try:
        sbx.files.write("/home/user/ww/old.txt", "old")
        handle = sbx.files.watch_dir("/home/user/ww")
        sbx.files.write("/home/user/ww/old.txt", "new content")
        sbx.files.write("/home/user/ww/new.txt", "x")
        seen: list[FilesystemEvent] = []
        deadline = time.monotonic() + 30
        while (FilesystemEventType.WRITE, "new.txt") not in pairs(seen):
            assert time.monotonic() < deadline, pairs(seen)
            seen += handle.get_new_events()
            time.sleep(0.1)
        handle.stop()
        assert pairs(seen) == [
            (FilesystemEventType.WRITE, "old.txt"),
            (FilesystemEventType.CREATE, "new.txt"),
            (FilesystemEventType.CHMOD, "new.txt"),
            (FilesystemEventType.WRITE, "new.txt"),
        ]
        assert sbx.files.read("/home/user/ww/old.txt") == "new content"
    finally:
        sbx.kill()


async def test_write_is_seen_by_an_async_watch(served: E2bServed) -> None:
    sbx = await AsyncSandbox.create(timeout=120, **served.opts())
    try:
        await sbx.files.write("aw2/nested/f.txt", "one")
        seen: list[FilesystemEvent] = []
        handle = await sbx.files.watch_dir("aw2", on_event=seen.append, recursive=True)
        await sbx.files.write("aw2/nested/f.txt", "two")
        deadline = time.monotonic() + 30
        while (FilesystemEventType.WRITE, "nested/f.txt") not in pairs(seen):
            assert time.monotonic() < deadline, pairs(seen)
            await asyncio.sleep(0.1)
        await handle.stop()
        assert pairs(seen) == [(FilesystemEventType.WRITE, "nested/f.txt")]
    finally:
        await sbx.kill()
