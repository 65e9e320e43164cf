"""An owner's store held on the event loop, before any thread waits for it.

The store (repository.py) is blocking: each call that writes an owner's folder takes that
owner's lock in the thread that runs it. A capture holds the lock across several awaited
steps (begin, precopy, walk, record, end), each in a thread of the event loop's shared pool.
Were the calls that wait for the lock (a restore's copy, a delete, a fork's next capture) to
wait in those threads, enough of them would fill the pool, and the holder's next step would
find no thread to run in: nothing would ever end (seen as a fork that never answered when
four fork calls of one source ran at once under load, and every snapshot call after it).

So every such call first takes the owner's asyncio lock here, and waits on the loop, holding
no thread; the store's own lock is then free when its thread takes it (a second process
sharing the folder, through flock, does not need this pool to let go).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Held:
    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, owner: str) -> asyncio.Lock:
        """The owner's lock; taken by whoever will hold the store's lock across awaits."""
        return self._locks.setdefault(owner, asyncio.Lock())

    async def run(
        self, owner: str, call: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`call` (one that takes the owner's store lock) in a thread, once the owner is
        free: while it waits, it holds no thread."""
        async with self.lock(owner):  # kept until the thread ends, even when cancelled
            return await whole(call, *args, **kwargs)


class Ends(Protocol):
    def end(self) -> None: ...


E = TypeVar("E", bound=Ends)


async def whole(call: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`call` in a pooled thread; a cancel (a client's deadline) waits for the thread to end
    before it goes on, so that a capture session's end never overtakes its own step still
    running (a walk writing into the store after the store was given back)."""
    running = asyncio.ensure_future(asyncio.to_thread(call, *args, **kwargs))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await _finished(running)
        raise


async def opened(call: Callable[[], E]) -> E:
    """`call` (one that takes the store's lock and returns what gives it back: a capture
    session) in a pooled thread; cancelled, it gives back what it took once it has ended,
    else the lock would stay taken with no one to end it."""
    running = asyncio.ensure_future(asyncio.to_thread(call))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await _finished(running)
        if not running.cancelled() and running.exception() is None:
            await _finished(asyncio.ensure_future(asyncio.to_thread(running.result().end)))
        raise


async def _finished(running: asyncio.Future[Any]) -> None:
    """Wait for a thread's call to end, whatever cancels meanwhile; its failure is
    retrieved (the cancel is what the caller sees)."""
    while not running.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({running})
    if not running.cancelled():
        running.exception()


@asynccontextmanager
async def acquired(lock: asyncio.Lock, if_waiting: Callable[[], None]) -> AsyncIterator[None]:
    """Hold `lock`; `if_waiting` is called before waiting for it when it cannot be had at
    once (held, or just given back with others queued before this)."""
    taking = asyncio.ensure_future(lock.acquire())
    try:
        await asyncio.sleep(0)  # the acquire's first step runs before this resumes
        if not taking.done():
            if_waiting()
        await taking
    except BaseException:
        if taking.done() and not taking.cancelled() and taking.exception() is None:
            lock.release()
        taking.cancel()
        raise
    try:
        yield
    finally:
        lock.release()
