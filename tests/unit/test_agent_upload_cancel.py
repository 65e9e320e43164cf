"""An upload cancelled while a write is under way in its worker thread (the supervisor refused
its body, or its caller left) closes its file only after that write returned: closing it
under the thread let the thread write into, or a second close end, the descriptor another
upload had been given the same number for (seen as "Bad file descriptor" in a concurrent
upload of gzip bombs, tests/integration/test_e2b_bodies.py)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stockade.agent import transfers
from tests.unit.fakes import make_folder


async def test_a_cancelled_upload_waits_for_its_write_before_closing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = make_folder(tmp_path / "ws")
    writing, release = threading.Event(), threading.Event()
    seen: list[str] = []
    real = transfers._write_all

    def slow_write(fd: int, data: bytes, digest: Any) -> None:
        writing.set()
        release.wait(10)
        try:
            os.fstat(fd)  # still this upload's file
            seen.append("open")
        except OSError as exc:
            seen.append(f"closed under the write: {exc}")
        real(fd, data, digest)

    monkeypatch.setattr(transfers, "_write_all", slow_write)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * 1024

    upload = asyncio.create_task(transfers.receive(ws, "f.bin", tar=False, mode=0, chunks=chunks()))
    await asyncio.to_thread(writing.wait, 10)
    upload.cancel()
    await asyncio.sleep(0.05)
    assert not upload.done(), "the cancellation waits for the write under way"
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await upload
    assert seen == ["open"]
    assert sorted(p.name for p in ws.iterdir()) == []  # no temporary file left, no f.bin


async def test_concurrent_uploads_one_cancelled_leave_the_others_whole(tmp_path: Path) -> None:
    ws = make_folder(tmp_path / "ws")
    data = os.urandom(256 << 10)

    async def chunks(n: int) -> AsyncIterator[bytes]:
        for _ in range(n):
            yield data
            await asyncio.sleep(0)

    for _ in range(20):
        cancelled = [
            asyncio.create_task(
                transfers.receive(ws, f"c{i}", tar=False, mode=0, chunks=chunks(50))
            )
            for i in range(4)
        ]
        kept = [
            asyncio.create_task(transfers.receive(ws, f"k{i}", tar=False, mode=0, chunks=chunks(4)))
            for i in range(4)
        ]
        await asyncio.sleep(0.01)
        for task in cancelled:
            task.cancel()
        done = await asyncio.gather(*kept)
        assert [d["size"] for d in done] == [4 * len(data)] * 4
        for i in range(4):
            assert (ws / f"k{i}").read_bytes() == data * 4
        await asyncio.gather(*cancelled, return_exceptions=True)
    assert not [p.name for p in ws.iterdir() if p.name.startswith(".stockade-upload-")]
