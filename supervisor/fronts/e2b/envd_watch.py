"""envd's directory watches for the E2B front: filesystem.Filesystem/WatchDir (a server
stream: JS `files.watchDir`, Python async `watch_dir`) and the polling watchers of Python's
sync `watch_dir` (CreateWatcher, GetWatcherEvents, RemoveWatcher).

Both go through the supervisor's one watch (calls/watching.py): read_file policy, scrubbed
names, an audit record per watch, named "e2b", on the sandbox's scoped key. E2B paths map
onto /workspace as for the other file RPCs (envd_files.workspace_path).

A polling watcher runs its watch in a task of its own and buffers the events between polls
(at most MAX_BUFFERED; past that it stops with data_loss rather than grow without bound or
drop events silently). Watchers are dropped when RemoveWatcher comes, when their sandbox is
killed (the front's forgetters), and when nobody polled them for IDLE_S: each holds its
sandbox's lease, which would otherwise keep an abandoned sandbox busy for ever.

A poll sees the front's own writes: after a `files.write` into a polling watcher's folder,
its events travel from the agent's inotify to the buffer while the SDK may already poll
(E2B's sync tests write, then poll at once, and count the events). So the upload tells the
watchers (`wrote`), and the next poll waits, at most SETTLE_S, until each such file's
`write` has arrived; a poll with nothing awaited answers at once.

`include_entry` (envd 0.6.3): each event but a removal carries the entry of its path as Stat
reports it (metadata too), when it is still there. The entries of many events are looked up
together, in one command through the pipeline (envd_files.Files.entries): a polling watcher's
at the poll, a stream's for the events that queued while the previous lookup ran (at most
MAX_BATCH). `allow_network_mounts` (envd 0.6.4) changes nothing: a sandbox has no network
mounts (its workspace is a local folder)."""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

from starlette.requests import Request

from stockade.supervisor import errors
from stockade.supervisor.calls.watching import Change, FileWatches, Started, Watch
from stockade.supervisor.fronts.e2b.connect import (
    ConnectError,
    Json,
    keepalive_interval,
    with_keepalive,
)
from stockade.supervisor.fronts.e2b.context import FRONT, E2bContext
from stockade.supervisor.fronts.e2b.envd_files import (
    caller_of,
    connect_error,
    e2b_path,
    sandbox_of,
    workspace_path,
)
from stockade.supervisor.models import CallContext

MAX_BUFFERED: Final = 10_000
MAX_WATCHERS: Final = 16
"""Polling watchers per sandbox (each is an inotify watch in the agent, which caps them too)."""
IDLE_S: Final = 600.0
"""A watcher nobody polled for this long is dropped."""
SWEEP_S: Final = 30.0
SETTLE_S: Final = 2.0
"""The longest a poll waits for the events of the front's own writes into the folder."""
MAX_BATCH: Final = 256
"""The most events of a WatchDir stream whose entries one lookup fetches."""
Entries = Callable[[Request, list[str]], Awaitable[dict[str, Json]]]
"""E2B paths -> their entries (envd_files.Files.entries)."""
_TYPES: Final = {
    "create": "EVENT_TYPE_CREATE",
    "write": "EVENT_TYPE_WRITE",
    "remove": "EVENT_TYPE_REMOVE",
    "rename": "EVENT_TYPE_RENAME",
    "chmod": "EVENT_TYPE_CHMOD",
}
_OVERFLOW = "the kernel's event queue overflowed: events were lost, the watch ended"


@dataclass
class _Watcher:
    watcher_id: str
    task: asyncio.Task[None] | None = None
    events: list[Json] = field(default_factory=list)
    error: ConnectError | None = None
    ended: bool = False
    polled_at: float = field(default_factory=time.monotonic)
    folder: str = "."
    """The watched folder, relative to the workspace."""
    recursive: bool = False
    awaited: set[str] = field(default_factory=set)
    """Names the front wrote since the last poll whose `write` has not arrived yet."""
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    include_entry: bool = False

    def name_of(self, rel: str) -> str | None:
        """A workspace path's name as this watcher reports it; None when outside its view."""
        if self.folder == ".":
            name = rel
        elif rel.startswith(self.folder + "/"):
            name = rel[len(self.folder) + 1 :]
        else:
            return None
        if not name or name.startswith("../") or ("/" in name and not self.recursive):
            return None
        return name


class Watches:
    def __init__(self, ctx: E2bContext) -> None:
        self._ctx = ctx
        self._watchers: dict[str, dict[str, _Watcher]] = {}
        """E2B sandbox id -> watcher id -> watcher."""
        self._sweeper: asyncio.Task[None] | None = None
        self.entries: Entries | None = None
        """Looks up the entries of events (include_entry); set by the envd app."""

    def _watch(self, request: Request, msg: Json) -> AsyncGenerator[Started | Change, None]:
        rel = workspace_path(str(msg.get("path", "")))
        recursive, caller = bool(msg.get("recursive")), caller_of(request)
        watch = Watch(sandbox_of(request).key, rel, recursive, CallContext(), caller, FRONT)
        return FileWatches(self._ctx.manager, self._ctx.policy).watch(watch)

    # WatchDir
    async def watch_dir(self, request: Request, msg: Json) -> AsyncIterator[Json]:
        """{"start":{}} once the watch is in place, then events, keepalives in silence."""
        events = self._watch(request, msg)
        described: AsyncGenerator[Change | Json, None] | None = None
        try:
            first = await anext(events, None)
            if not isinstance(first, Started):
                raise ConnectError("internal", "the watch ended before it started")
            yield {"start": {}}
            if msg.get("includeEntry") or msg.get("include_entry"):
                folder = e2b_path(workspace_path(str(msg.get("path", ""))))
                described = self._described(request, folder, events)
            ticking = with_keepalive(described or events, keepalive_interval(request))
            try:
                async for item in ticking:
                    if item is None:
                        yield {"keepalive": {}}
                    elif isinstance(item, Change):
                        if item.kind == "overflow":
                            raise ConnectError("data_loss", _OVERFLOW)
                        if item.kind == "gone":
                            return
                        yield {"filesystem": _event(item)}
                    elif isinstance(item, dict):
                        yield {"filesystem": item}
            finally:
                if described is not None:
                    await ticking.aclose()
        finally:
            if described is not None:
                await described.aclose()
            await events.aclose()

    async def _described(
        self, request: Request, folder: str, events: AsyncIterator[Started | Change]
    ) -> AsyncGenerator[Change | Json, None]:
        """The watch's changes as events with their entries (an overflow or the folder's end
        as the Change itself); the changes that queued while a lookup ran are looked up
        together."""
        queue: asyncio.Queue[Change | Exception | None] = asyncio.Queue(MAX_BATCH)

        async def pump() -> None:
            try:
                async for item in events:
                    if isinstance(item, Change):
                        await queue.put(item)
                await queue.put(None)
            except Exception as exc:
                await queue.put(exc)

        task = asyncio.create_task(pump())
        try:
            while True:
                batch = [await queue.get()]
                while not queue.empty() and len(batch) < MAX_BATCH:
                    batch.append(queue.get_nowait())
                changes = [c for c in batch if isinstance(c, Change)]
                found = await self._entries_of(request, folder, [(c.kind, c.name) for c in changes])
                for change in changes:
                    if change.kind in ("overflow", "gone"):
                        yield change
                    else:
                        yield _event(change, found.get(_joined(folder, change.name)))
                end = batch[-1]
                if isinstance(end, Exception):
                    raise end
                if end is None:
                    return
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _entries_of(
        self, request: Request, folder: str, changes: list[tuple[str, str]]
    ) -> dict[str, Json]:
        """The entries of these changes' (kind, name) paths (removals have none), best
        effort: a lookup that fails leaves the events without."""
        paths = sorted(
            {_joined(folder, name) for kind, name in changes if kind in _TYPES and kind != "remove"}
        )
        if not paths or self.entries is None:
            return {}
        try:
            return await self.entries(request, paths)
        except (ConnectError, errors.StockadeError):
            return {}

    # polling watchers
    async def create_watcher(self, request: Request, msg: Json) -> Json:
        sandbox_id = sandbox_of(request).sandbox_id
        mine = self._watchers.setdefault(sandbox_id, {})
        if len(mine) >= MAX_WATCHERS:
            raise ConnectError(
                "resource_exhausted", f"too many watchers in this sandbox (at most {MAX_WATCHERS})"
            )
        folder = posixpath.normpath(workspace_path(str(msg.get("path", ""))))
        watcher = _Watcher(
            secrets.token_hex(8),
            folder=folder,
            recursive=bool(msg.get("recursive")),
            include_entry=bool(msg.get("includeEntry") or msg.get("include_entry")),
        )
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        watcher.task = asyncio.create_task(self._pump(watcher, self._watch(request, msg), started))
        mine[watcher.watcher_id] = watcher
        try:
            await started
        except BaseException:
            self._drop(sandbox_id, watcher.watcher_id)
            raise
        self._start_sweeper()
        return {"watcherId": watcher.watcher_id}

    async def get_watcher_events(self, request: Request, msg: Json) -> Json:
        sandbox_id = sandbox_of(request).sandbox_id
        watcher = self._find(sandbox_id, msg)
        watcher.polled_at = time.monotonic()
        await _settled(watcher)
        events, watcher.events = watcher.events, []
        if not events and watcher.error is not None:
            self._drop(sandbox_id, watcher.watcher_id)
            raise watcher.error
        if watcher.include_entry and events:
            await self._describe(request, watcher, events)
        return {"events": events}

    async def _describe(self, request: Request, watcher: _Watcher, events: list[Json]) -> None:
        """A poll's events with their entries: one lookup for all of them."""
        folder = e2b_path(watcher.folder)
        kinds = {wire: kind for kind, wire in _TYPES.items()}
        changes = [(kinds.get(str(e["type"]), ""), str(e["name"])) for e in events]
        found = await self._entries_of(request, folder, changes)
        for event in events:
            entry = found.get(_joined(folder, str(event["name"])))
            if entry is not None and event["type"] != _TYPES["remove"]:
                event["entry"] = entry

    async def remove_watcher(self, request: Request, msg: Json) -> Json:
        sandbox_id = sandbox_of(request).sandbox_id
        watcher = self._find(sandbox_id, msg)
        self._drop(sandbox_id, watcher.watcher_id)
        return {}

    def wrote(self, sandbox_id: str, rel: str) -> None:
        """The front wrote this file (relative to the workspace): the next poll of a watcher
        that sees it waits for its `write`."""
        for watcher in self._watchers.get(sandbox_id, {}).values():
            name = watcher.name_of(rel)
            if name is not None and not watcher.ended and len(watcher.awaited) < MAX_BUFFERED:
                watcher.awaited.add(name)

    def forget(self, sandbox_id: str) -> None:
        """The sandbox is gone: its watchers with it."""
        for watcher_id in list(self._watchers.get(sandbox_id, {})):
            self._drop(sandbox_id, watcher_id)

    async def close(self) -> None:
        tasks = [w.task for mine in self._watchers.values() for w in mine.values() if w.task]
        for sandbox_id in list(self._watchers):
            self.forget(sandbox_id)
        if self._sweeper is not None:
            self._sweeper.cancel()
            tasks.append(self._sweeper)
        await asyncio.gather(*tasks, return_exceptions=True)

    def _find(self, sandbox_id: str, msg: Json) -> _Watcher:
        watcher_id = str(msg.get("watcherId", msg.get("watcher_id", "")))
        watcher = self._watchers.get(sandbox_id, {}).get(watcher_id)
        if watcher is None:
            raise ConnectError("not_found", f"no watcher {watcher_id!r} in this sandbox")
        return watcher

    def _drop(self, sandbox_id: str, watcher_id: str) -> None:
        mine = self._watchers.get(sandbox_id, {})
        watcher = mine.pop(watcher_id, None)
        if not mine:
            self._watchers.pop(sandbox_id, None)
        if watcher is not None and watcher.task is not None:
            watcher.task.cancel()

    async def _pump(
        self,
        watcher: _Watcher,
        events: AsyncGenerator[Started | Change, None],
        started: asyncio.Future[None],
    ) -> None:
        """The watch's events into the watcher's buffer, until it ends or is dropped."""
        try:
            async for item in events:
                if isinstance(item, Started):
                    started.set_result(None)
                elif item.kind == "overflow":
                    raise ConnectError("data_loss", _OVERFLOW)
                elif item.kind == "gone":
                    return
                elif len(watcher.events) >= MAX_BUFFERED:
                    raise ConnectError(
                        "data_loss",
                        f"more than {MAX_BUFFERED} events between two polls: the watcher "
                        "stopped; poll more often",
                    )
                else:
                    watcher.events.append(_event(item))
                    if item.kind == "write" and item.name in watcher.awaited:
                        watcher.awaited.discard(item.name)
                        watcher.arrived.set()
            if not started.done():
                raise ConnectError("internal", "the watch ended before it started")
        except Exception as exc:
            error = _connect_error(exc)
            if started.done():
                watcher.error = error
            else:
                started.set_exception(error)
        except asyncio.CancelledError:
            if not started.done():
                started.cancel()
            raise
        finally:
            watcher.ended = True
            watcher.arrived.set()
            await events.aclose()

    def _start_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep())

    async def _sweep(self) -> None:
        """Drop watchers nobody polled for IDLE_S; ends when there are none left."""
        while self._watchers:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for sandbox_id, mine in list(self._watchers.items()):
                for watcher_id, watcher in list(mine.items()):
                    if now - watcher.polled_at > IDLE_S:
                        self._drop(sandbox_id, watcher_id)


async def _settled(watcher: _Watcher) -> None:
    """Wait (at most SETTLE_S) until the writes the front made have reached the buffer."""
    deadline = time.monotonic() + SETTLE_S
    while watcher.awaited and not watcher.ended:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        watcher.arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watcher.arrived.wait(), left)
    watcher.awaited.clear()


def _connect_error(exc: Exception) -> ConnectError:
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, errors.StockadeError):
        return connect_error(exc)
    return ConnectError("internal", f"the watch failed: {type(exc).__name__}: {exc}")


def _event(change: Change, entry: Json | None = None) -> Json:
    event: Json = {"name": change.name, "type": _TYPES[change.kind]}
    if entry is not None:
        event["entry"] = entry
    return event


def _joined(folder: str, name: str) -> str:
    return posixpath.join(folder, name)
