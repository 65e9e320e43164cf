"""The E2B front's watch bookkeeping (envd_watch.py) over a scripted supervisor watch: the
WatchDir stream's start, events and keepalives; polling watchers' buffers, their cap, the
idle sweep, and a killed sandbox's watchers ending their watch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from stockade.supervisor import errors
from stockade.supervisor.calls.watching import Change, Started, Watch
from stockade.supervisor.config import Config
from stockade.supervisor.fronts.e2b import envd_watch
from stockade.supervisor.fronts.e2b.connect import ConnectError
from stockade.supervisor.fronts.e2b.envd_watch import Watches
from stockade.supervisor.fronts.e2b.records import Records
from tests.unit.fakes import STATE, e2b_context

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("state_dir")]


class Script:
    """Stands in for FileWatches: each watch yields Started (or raises `fail`), then what
    the test puts in `queue`; `closed` counts watches that ended."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Change] = asyncio.Queue()
        self.fail: errors.StockadeError | None = None
        self.watches: list[Watch] = []
        self.closed = 0

    def __call__(self, manager: Any, policy: Any) -> Script:
        return self

    async def watch(self, w: Watch) -> AsyncGenerator[Started | Change, None]:
        self.watches.append(w)
        try:
            if self.fail is not None:
                raise self.fail
            yield Started(w.path)
            while True:
                yield await self.queue.get()
        finally:
            self.closed += 1


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Script:
    s = Script()
    monkeypatch.setattr(envd_watch, "FileWatches", s)
    return s


def request(sandbox_id: str = "sb1", headers: dict[str, str] | None = None) -> Any:
    record = SimpleNamespace(sandbox_id=sandbox_id, key=f"e2b-{sandbox_id}")
    return SimpleNamespace(
        scope={"state": {"e2b_sandbox": record}}, client=None, headers=headers or {}
    )


def watches() -> Watches:
    """Watches on a context whose manager and policy only Script (FileWatches) is given."""
    return Watches(e2b_context(Config(state_dir=STATE[-1]), Records(None)))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_watch_dir_starts_maps_paths_and_keeps_alive(script: Script) -> None:
    w = watches()
    req = request(headers={"keepalive-ping-interval": "1"})
    stream = w.watch_dir(req, {"path": "/home/user/d", "recursive": True})
    assert await anext(stream) == {"start": {}}
    assert (script.watches[0].path, script.watches[0].recursive) == ("d", True)
    assert script.watches[0].front == "e2b"
    await script.queue.put(Change("write", "a.txt", False))
    assert await anext(stream) == {"filesystem": {"name": "a.txt", "type": "EVENT_TYPE_WRITE"}}
    assert await asyncio.wait_for(anext(stream), 3) == {"keepalive": {}}
    await script.queue.put(Change("overflow", "", False))
    with pytest.raises(ConnectError) as info:
        await anext(stream)
    assert info.value.code == "data_loss"
    assert script.closed == 1


async def test_polling_buffers_between_polls_then_removes(script: Script) -> None:
    w = watches()
    created = await w.create_watcher(request(), {"path": "x"})
    wid = created["watcherId"]
    await script.queue.put(Change("create", "f", False))
    await script.queue.put(Change("remove", "f", False))
    await settle()
    got = await w.get_watcher_events(request(), {"watcherId": wid})
    assert [e["type"] for e in got["events"]] == ["EVENT_TYPE_CREATE", "EVENT_TYPE_REMOVE"]
    assert await w.get_watcher_events(request(), {"watcherId": wid}) == {"events": []}
    with pytest.raises(ConnectError) as other:  # ids are per sandbox
        await w.get_watcher_events(request("sb2"), {"watcherId": wid})
    assert other.value.code == "not_found"
    assert await w.remove_watcher(request(), {"watcherId": wid}) == {}
    await settle()
    assert script.closed == 1
    with pytest.raises(ConnectError):
        await w.get_watcher_events(request(), {"watcherId": wid})


async def test_a_refused_watch_fails_create(script: Script) -> None:
    script.fail = errors.NotFound("path 'nope' does not exist")
    with pytest.raises(ConnectError) as info:
        await watches().create_watcher(request(), {"path": "nope"})
    assert info.value.code == "not_found"


async def test_the_buffer_is_capped(script: Script, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envd_watch, "MAX_BUFFERED", 2)
    w = watches()
    wid = (await w.create_watcher(request(), {"path": "."}))["watcherId"]
    for name in "abc":
        await script.queue.put(Change("create", name, False))
    await settle()
    assert len((await w.get_watcher_events(request(), {"watcherId": wid}))["events"]) == 2
    with pytest.raises(ConnectError) as info:
        await w.get_watcher_events(request(), {"watcherId": wid})
    assert info.value.code == "data_loss"
    assert "poll more often" in info.value.message
    assert script.closed == 1


async def test_forget_and_idle_sweep_end_watches(
    script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(envd_watch, "IDLE_S", 0.05)
    monkeypatch.setattr(envd_watch, "SWEEP_S", 0.05)
    w = watches()
    await w.create_watcher(request("killed"), {"path": "."})
    w.forget("killed")
    await settle()
    assert script.closed == 1
    wid = (await w.create_watcher(request(), {"path": "."}))["watcherId"]
    await asyncio.sleep(0.3)
    assert script.closed == 2
    with pytest.raises(ConnectError):
        await w.get_watcher_events(request(), {"watcherId": wid})
    await w.close()


async def test_watchers_per_sandbox_are_capped(
    script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(envd_watch, "MAX_WATCHERS", 1)
    w = watches()
    await w.create_watcher(request(), {"path": "."})
    with pytest.raises(ConnectError) as info:
        await w.create_watcher(request(), {"path": "."})
    assert info.value.code == "resource_exhausted"
    await w.close()
    assert script.closed == 1


async def test_a_poll_waits_for_the_fronts_own_writes(script: Script) -> None:
    """E2B's sync tests write, then poll at once: the poll answers once the write's events
    are in (not before), and does not wait for writes it cannot see."""
    w = watches()
    wid = (await w.create_watcher(request(), {"path": "/home/user/x"}))["watcherId"]
    w.wrote("sb1", "x/f.txt")
    w.wrote("sb1", "x/sub/deep.txt")  # not recursive: not seen, not awaited
    w.wrote("sb1", "y/f.txt")  # another folder
    w.wrote("sb2", "x/g.txt")  # another sandbox
    poll = asyncio.create_task(w.get_watcher_events(request(), {"watcherId": wid}))
    await script.queue.put(Change("create", "f.txt", False))
    await script.queue.put(Change("chmod", "f.txt", False))
    await settle()
    assert not poll.done()
    await script.queue.put(Change("write", "f.txt", False))
    got = await asyncio.wait_for(poll, 10)
    assert [e["type"] for e in got["events"]] == [
        "EVENT_TYPE_CREATE",
        "EVENT_TYPE_CHMOD",
        "EVENT_TYPE_WRITE",
    ]
    assert await w.get_watcher_events(request(), {"watcherId": wid}) == {"events": []}


async def test_a_recursive_watcher_awaits_deeper_writes(script: Script) -> None:
    w = watches()
    wid = (await w.create_watcher(request(), {"path": "x", "recursive": True}))["watcherId"]
    w.wrote("sb1", "x/sub/deep.txt")
    poll = asyncio.create_task(w.get_watcher_events(request(), {"watcherId": wid}))
    await settle()
    assert not poll.done()
    await script.queue.put(Change("write", "sub/deep.txt", False))
    got = await asyncio.wait_for(poll, 10)
    assert got["events"] == [{"name": "sub/deep.txt", "type": "EVENT_TYPE_WRITE"}]


async def test_a_write_that_never_shows_does_not_hold_the_poll(
    script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(envd_watch, "SETTLE_S", 0.05)
    w = watches()
    wid = (await w.create_watcher(request(), {"path": "."}))["watcherId"]
    w.wrote("sb1", "hidden.txt")
    assert await w.get_watcher_events(request(), {"watcherId": wid}) == {"events": []}
    w.wrote("sb1", "other.txt")  # the watch ends meanwhile: the poll answers at once
    await script.queue.put(Change("gone", "", False))
    monkeypatch.setattr(envd_watch, "SETTLE_S", 3600.0)
    got = await asyncio.wait_for(w.get_watcher_events(request(), {"watcherId": wid}), 10)
    assert got == {"events": []}


async def aclose(stream: AsyncIterator[Any]) -> None:
    """Close a WatchDir stream (an async generator) as its client's leaving does."""
    assert isinstance(stream, AsyncGenerator)
    await stream.aclose()


class Lookups:
    """Stands in for Files.entries: the entry of every path asked for but `missing`, and
    each lookup's paths in `asked`."""

    def __init__(self, missing: tuple[str, ...] = (), fail: bool = False) -> None:
        self.asked: list[list[str]] = []
        self.missing, self.fail = missing, fail

    async def __call__(self, _request: Any, paths: list[str]) -> dict[str, Any]:
        self.asked.append(paths)
        if self.fail:
            raise errors.PolicyDenied("exec is not allowed")
        return {
            p: {"name": p.rsplit("/", 1)[-1], "path": p} for p in paths if p not in self.missing
        }


async def test_include_entry_streams_events_with_entries_looked_up_together(
    script: Script,
) -> None:
    w = watches()
    w.entries = lookups = Lookups(missing=("/home/user/d/gone",))
    stream = w.watch_dir(request(), {"path": "/home/user/d", "includeEntry": True})
    assert await anext(stream) == {"start": {}}
    for change in [
        Change("write", "a", False),
        Change("remove", "b", False),
        Change("create", "gone", False),
        Change("chmod", "a", False),
    ]:
        await script.queue.put(change)
    await settle()
    got = [await anext(stream) for _ in range(4)]
    a = {"name": "a", "path": "/home/user/d/a"}
    assert [g["filesystem"].get("entry") for g in got] == [a, None, None, a]
    assert lookups.asked == [["/home/user/d/a", "/home/user/d/gone"]]  # one lookup, no removal
    await aclose(stream)
    assert script.closed == 1


async def test_include_entry_is_best_effort_and_ends_with_the_watch(script: Script) -> None:
    w = watches()
    w.entries = Lookups(fail=True)
    stream = w.watch_dir(request(), {"path": "d", "includeEntry": True})
    assert await anext(stream) == {"start": {}}
    await script.queue.put(Change("write", "a", False))
    assert await anext(stream) == {"filesystem": {"name": "a", "type": "EVENT_TYPE_WRITE"}}
    await script.queue.put(Change("overflow", "", False))
    with pytest.raises(ConnectError) as info:
        await anext(stream)
    assert info.value.code == "data_loss"
    assert script.closed == 1


async def test_a_stream_batch_is_capped(script: Script, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envd_watch, "MAX_BATCH", 2)
    w = watches()
    w.entries = lookups = Lookups()
    stream = w.watch_dir(request(), {"path": "d", "includeEntry": True})
    await anext(stream)
    for name in "abcde":
        await script.queue.put(Change("create", name, False))
    await settle()
    assert len([await anext(stream) for _ in range(5)]) == 5
    assert max(len(a) for a in lookups.asked) <= 2
    await aclose(stream)


async def test_a_poll_with_include_entry_looks_up_once(script: Script) -> None:
    w = watches()
    w.entries = lookups = Lookups()
    plain = (await w.create_watcher(request(), {"path": "x"}))["watcherId"]
    await script.queue.put(Change("create", "f", False))
    await settle()
    (event,) = (await w.get_watcher_events(request(), {"watcherId": plain}))["events"]
    assert "entry" not in event
    assert lookups.asked == []  # not asked for: nothing looked up
    await w.remove_watcher(request(), {"watcherId": plain})
    wid = (await w.create_watcher(request(), {"path": "x", "includeEntry": True}))["watcherId"]
    for change in [Change("create", "f", False), Change("write", "f", False)]:
        await script.queue.put(change)
    await script.queue.put(Change("remove", "g", False))
    await settle()
    events = (await w.get_watcher_events(request(), {"watcherId": wid}))["events"]
    f = {"name": "f", "path": "/home/user/x/f"}
    assert [e.get("entry") for e in events] == [f, f, None]
    assert lookups.asked == [["/home/user/x/f"]]
