"""What a key's taking of a warm-pool container costs it (pool.take): the link whose probe just
answered is the key's (moved with the renamed folder, not closed for a new one that must be
greeted again), and the pool makes no container until REFILL_AFTER_S after a take, so the
key's first calls do not share the CPU with an engine's create and start. Through the real
sandbox manager with a fake engine."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from stockade.supervisor.config import Config
from stockade.supervisor.sandboxes import pool as pool_module
from stockade.supervisor.sandboxes.manager import SandboxManager
from tests.unit.fakes import FakeAgent, FakeBackend, fake_manager, quiet_housekeeping


def manager(tmp_path: Path, backend: FakeBackend) -> SandboxManager:
    config = Config(
        state_dir=tmp_path,
        sandbox=Config().sandbox.__class__(user="1000:1000", network="none"),
        housekeeping=quiet_housekeeping(warm_pool=2),
    )
    return fake_manager(config, backend)


async def started(tmp_path: Path, backend: FakeBackend) -> SandboxManager:
    """The manager started, housekeeping on, its pool of 2 made."""
    mgr = manager(tmp_path, backend)
    await mgr.start()
    mgr.start_housekeeping()
    await until_pooled(mgr, 2)
    return mgr


async def until_pooled(mgr: SandboxManager, n: int) -> None:
    async with asyncio.timeout(10):
        while len(mgr.pool.ready) != n:
            await asyncio.sleep(0.01)


async def test_the_key_keeps_the_probed_link_moved_to_its_folder(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = await started(tmp_path, backend)
    try:
        links = {c.info.id: c.agent for c in mgr.pool.ready}
        sandbox = await mgr.ensure("k")
        agent = sandbox.container.agent
        assert agent is links[sandbox.info.id], "the pool container's own link"
        assert isinstance(agent, FakeAgent)
        assert str(agent.address).startswith(str(mgr.layout.of("k").root))
        assert agent.is_ready()
        assert (await agent.invoke("exec", {"command": "true"}, 5, "r")).error_code == ""
    finally:
        await mgr.close()


async def test_a_link_that_cannot_move_is_replaced_and_greeted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = FakeBackend()
    monkeypatch.setattr(FakeAgent, "moved_to", lambda self, address: False)
    mgr = await started(tmp_path, backend)
    try:
        links = {c.info.id: c.agent for c in mgr.pool.ready}
        sandbox = await mgr.ensure("k")
        assert sandbox.info.id in links, "still the pool's container"
        old, new = links[sandbox.info.id], sandbox.container.agent
        assert new is not old
        assert isinstance(old, FakeAgent)
        assert not old.ready, "the old link was closed"
        assert new.is_ready(), "the new link was greeted"
    finally:
        await mgr.close()


async def test_the_pool_waits_after_a_take_before_it_makes_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lower bound only: the filler sleeps at least the wait (sweeps' want() included)."""
    backend = FakeBackend()
    monkeypatch.setattr(pool_module, "REFILL_AFTER_S", 1.0)
    mgr = await started(tmp_path, backend)
    try:
        runs = backend.runs
        taken = time.monotonic()
        await mgr.ensure("k")
        while backend.runs == runs:
            mgr.pool.want()  # as each sweep does
            await asyncio.sleep(0.01)
        assert time.monotonic() - taken >= 1.0
        await until_pooled(mgr, 2)
    finally:
        await mgr.close()


async def test_close_ends_the_wait_after_a_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = FakeBackend()
    monkeypatch.setattr(pool_module, "REFILL_AFTER_S", 3600.0)
    mgr = await started(tmp_path, backend)
    await mgr.ensure("k")
    await asyncio.sleep(0.05)
    async with asyncio.timeout(10):  # not the hour, nor close's own limit for a filler
        await mgr.close()
    assert not mgr.pool.ready
