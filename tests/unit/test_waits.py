"""observe/waits.py: where each suspended chain of awaits waits, for a hang (SIGUSR2)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator

import pytest

from stockade.supervisor.observe import waits


async def _holder(lock: asyncio.Lock, release: asyncio.Event) -> None:
    async with lock:
        await _holding(release)


async def _holding(release: asyncio.Event) -> None:
    await release.wait()


async def _stuck_behind(lock: asyncio.Lock) -> None:
    async with lock:
        pass


async def _stream(release: asyncio.Event) -> AsyncIterator[int]:
    await release.wait()
    yield 1


async def test_each_chain_names_its_places_outermost_first() -> None:
    lock, release = asyncio.Lock(), asyncio.Event()
    holder = asyncio.create_task(_holder(lock, release))
    stuck = asyncio.create_task(_stuck_behind(lock))
    gen = _stream(release)
    following = asyncio.create_task(gen.__anext__())
    await asyncio.sleep(0.01)
    try:
        listed = waits.chains()
        names = [[place.rsplit(" ", 1)[-1] for place in chain] for chain in listed]
        held = next(c for c in names if c[0] == "_holder")
        assert held[:3] == ["_holder", "_holding", "wait"], held
        assert held[-1].startswith("<"), "it ends at what it waits on (the event's future)"
        stuck_at = next(c for c in names if c[0] == "_stuck_behind")
        assert stuck_at[:3] == ["_stuck_behind", "__aenter__", "acquire"], stuck_at
        assert any(c[0] == "_stream" for c in names), names
        ours = [c[0] for c in listed if c[0].endswith((" _holder", " _stuck_behind", " _stream"))]
        assert len(ours) == 3, listed
        assert all(place.startswith(f"{__file__}:") for place in ours), ours
        assert not any(c[0] == "_holding" for c in names), "an awaited one starts no chain"
    finally:
        release.set()
        await asyncio.gather(holder, stuck, following)
        await gen.aclose()


async def test_the_signal_logs_the_report_and_a_failure_never_raises(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR2, waits.log_report)
    release = asyncio.Event()
    waiting = asyncio.create_task(_holding(release))
    try:
        with caplog.at_level(logging.WARNING, logger="stockade.waits"):
            os.kill(os.getpid(), signal.SIGUSR2)
            await asyncio.sleep(0.05)
        [record] = [r for r in caplog.records if r.name == "stockade.waits"]
        assert "chain(s) of suspended awaits" in record.getMessage()
        assert "_holding" in record.getMessage()

        def broken() -> list[list[str]]:
            raise RuntimeError("gc said no")

        monkeypatch.setattr(waits, "chains", broken)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="stockade.waits"):
            waits.log_report()
        assert "no report of suspended awaits: RuntimeError('gc said no')" in caplog.text
    finally:
        loop.remove_signal_handler(signal.SIGUSR2)
        release.set()
        await waiting
