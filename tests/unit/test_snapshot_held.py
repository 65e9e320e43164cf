"""An owner's store is waited for on the event loop, never in a thread of the shared pool
(snapshots/held.py). Seen in a fresh clone's make test: four ForkSandbox calls of one source
at once on Docker, under load, never answered, nor did any snapshot call after them: each
fork's restores waited for the store's lock in pooled threads while the next fork's capture
held it, and that capture's next step found no free thread. Reproduced in the integration
test with a pool of three threads before the fix."""

from __future__ import annotations

import ast
import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stockade.supervisor.sandboxes.snapshots.capture import DIR_FLAGS
from stockade.supervisor.sandboxes.snapshots.held import Held, acquired, opened, whole
from stockade.supervisor.sandboxes.snapshots.repository import (
    MAIN,
    CaptureSession,
    SnapshotStore,
)

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "supervisor" / "sandboxes" / "snapshots"


async def test_waiters_hold_no_thread_while_a_session_steps_through_the_pool(
    store: SnapshotStore, tree: Path
) -> None:
    """Two pooled threads, eight calls waiting for the owner while a capture holds it across
    four awaited steps: every one ends (a wait in a pooled thread would end none)."""
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(2)
    loop.set_default_executor(pool)
    held = Held()
    opener = {MAIN: lambda: os.open(tree, DIR_FLAGS)}
    for i in range(8):
        await asyncio.to_thread(store.capture, "t", f"old-{i}", tree)

    async def capture() -> None:
        lock = held.lock("t")
        await lock.acquire()
        try:
            session = await asyncio.to_thread(store.begin, "t")
            try:
                await asyncio.sleep(0.05)  # the waiters queue up meanwhile
                cached = await asyncio.to_thread(session.cache, "")
                got, _ = await asyncio.to_thread(session.walk, opener, cached, None)
                await asyncio.to_thread(session.record, "new", got, "box")
            finally:
                await asyncio.to_thread(session.end)
        finally:
            lock.release()

    taking = asyncio.create_task(capture())
    await asyncio.sleep(0.01)
    deletes = [held.run("t", store.delete, "t", f"old-{i}") for i in range(8)]
    await asyncio.wait_for(asyncio.gather(taking, *deletes), 30)
    assert [s.name for s in store.list("t")] == ["new"]
    pool.shutdown()


async def test_run_gives_the_owner_back_when_its_call_fails(store: SnapshotStore) -> None:
    held = Held()
    with pytest.raises(Exception, match="no snapshot"):
        await held.run("t", store.delete, "t", "missing")
    assert not held.lock("t").locked()
    assert held.lock("t") is held.lock("t")
    assert held.lock("u") is not held.lock("t")


LOCK_TAKERS = {"begin", "delete", "restore", "relink", "capture", "stage", "switch", "collect"}
IN_A_THREAD = {"to_thread": 0, "run_in_executor": 1, "whole": 0, "opened": 0}


def _unheld_calls(path: Path) -> list[str]:
    """Calls of the store's lock-takers handed to a pooled thread directly (asyncio.to_thread,
    run_in_executor, held.whole, held.opened): each must go through Held.run, or hold its
    owner's held.lock first (a capture session's begin)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in IN_A_THREAD or len(node.args) <= IN_A_THREAD[name]:
            continue
        target = node.args[IN_A_THREAD[name]]
        if isinstance(target, ast.Call) and target.args:  # functools.partial(f, ...)
            target = target.args[0]
        if ast.unparse(target).rsplit(".", 1)[-1] in LOCK_TAKERS:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)[:90]}")
    return found


def test_no_lock_taking_store_call_waits_in_a_pooled_thread() -> None:
    """Every call in the supervisor that takes an owner's store lock waits on the loop first;
    the one exception, a capture session's begin, comes after its owner's held lock."""
    found = [c for p in sorted((ROOT / "supervisor").rglob("*.py")) for c in _unheld_calls(p)]
    begin = "supervisor/sandboxes/snapshots/operations.py"
    assert [c for c in found if not c.startswith(begin)] == [], found
    assert len(found) == 1, found
    assert "self.store.begin" in found[0], found
    lines = (ROOT / begin).read_text().splitlines()
    at = int(found[0].split(":")[1].split()[0]) - 1
    assert "await held_by.acquire()" in "\n".join(lines[at - 3 : at]), lines[at - 3 : at + 1]


async def test_a_cancelled_step_returns_only_once_its_thread_has_ended() -> None:
    """A client's deadline cancels a capture part way: its session must not end (give the
    store back) while its walk still runs in a thread."""
    started, ended = threading.Event(), threading.Event()

    def walk() -> None:
        started.set()
        time.sleep(0.3)
        ended.set()

    step = asyncio.create_task(whole(walk))
    await asyncio.to_thread(started.wait)
    step.cancel()
    await asyncio.sleep(0)
    step.cancel()  # a second cancel changes nothing
    with pytest.raises(asyncio.CancelledError):
        await step
    assert ended.is_set()


async def test_a_begin_cancelled_gives_the_store_back(store: SnapshotStore) -> None:
    """Cancelled while its thread takes the store's lock, a session's begin ends the session
    it made: the next begin is not left waiting for ever."""
    slow = threading.Event()

    def begin() -> CaptureSession:
        slow.wait(5)
        return store.begin("t")

    began = asyncio.create_task(opened(begin))
    await asyncio.sleep(0.05)
    began.cancel()
    slow.set()
    with pytest.raises(asyncio.CancelledError):
        await began
    session = await asyncio.wait_for(asyncio.to_thread(store.begin, "t"), 5)
    session.end()


async def test_a_run_cancelled_keeps_the_owner_until_its_thread_ends(store: SnapshotStore) -> None:
    held, inside = Held(), threading.Event()

    def slow_call() -> None:
        inside.set()
        time.sleep(0.3)

    running = asyncio.create_task(held.run("t", slow_call))
    await asyncio.to_thread(inside.wait)
    running.cancel()
    assert held.lock("t").locked()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert not held.lock("t").locked()


async def test_a_ledger_taken_at_once_leaves_the_gate_shut() -> None:
    """A checkpoint's manifest waits for its ledger entry (the call's quick write first)
    unless the ledger cannot be had at once: its holder may be waiting for the store the
    manifest holds (an undo's capture, a collect), a circle seen as calls and undos of one
    key that never answered."""
    lock, opened_gate = asyncio.Lock(), asyncio.Event()
    async with acquired(lock, opened_gate.set):
        assert lock.locked()
    assert not lock.locked()
    assert not opened_gate.is_set()


async def test_a_ledger_held_opens_the_gate_before_the_wait() -> None:
    lock, gate = asyncio.Lock(), asyncio.Event()
    await lock.acquire()
    entered = asyncio.Event()

    async def enter() -> None:
        async with acquired(lock, gate.set):
            entered.set()

    waiting = asyncio.create_task(enter())
    await asyncio.wait_for(gate.wait(), 5)  # opened while the lock is still held
    assert not entered.is_set()
    lock.release()
    await asyncio.wait_for(waiting, 5)
    assert entered.is_set()
    assert not lock.locked()


async def test_a_ledger_just_given_back_to_a_queued_waiter_opens_the_gate() -> None:
    """Free but promised to a waiter queued first: `async with lock` would wait there too."""
    lock, gate, order = asyncio.Lock(), asyncio.Event(), []
    await lock.acquire()

    async def first() -> None:
        async with lock:
            order.append("first")
            await asyncio.sleep(0.01)

    queued = asyncio.create_task(first())
    await asyncio.sleep(0)
    lock.release()  # not locked now, but `first` is woken to take it
    assert not lock.locked()
    async with acquired(lock, gate.set):
        order.append("second")
    await queued
    assert gate.is_set()
    assert order == ["first", "second"]


async def test_a_ledger_wait_cancelled_takes_nothing() -> None:
    lock, gate = asyncio.Lock(), asyncio.Event()
    await lock.acquire()

    async def enter() -> None:
        async with acquired(lock, gate.set):
            raise AssertionError("never entered")

    waiting = asyncio.create_task(enter())
    await gate.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    lock.release()
    assert not lock.locked()
    async with acquired(lock, gate.set):
        assert lock.locked()
