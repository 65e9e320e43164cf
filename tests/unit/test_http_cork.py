"""The HTTP fronts' cork (fronts/listener.py Corked): what an answer writes in one turn of the
event loop goes out as one write (uvicorn writes a head and its body apart), held no longer
than that turn and never past CORK_BYTES; closing, a half close and an abort keep their
meaning. Checked on a transport that records its writes, and through the real protocol every
HTTP front serves with."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from stockade.supervisor.config import load_config
from stockade.supervisor.fronts.listener import CORK_BYTES, Corked, Listener


class Recording(asyncio.Transport):
    """A transport that keeps what is written to it, in the calls it came in."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = self.eof = self.aborted = False
        self.reading = True

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )


async def a_turn() -> None:
    """Let the event loop run what is ready now (the cork's flush among it)."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_one_turns_writes_go_out_as_one() -> None:
    real = Recording()
    corked = Corked(real, asyncio.get_running_loop())
    corked.write(b"HTTP/1.1 200 OK\r\n\r\n")
    corked.write(b"")
    corked.writelines([b"body", bytearray(b"-more")])
    assert real.writes == []
    assert corked.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\n\r\nbody-more")
    await a_turn()
    assert real.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody-more"]
    corked.write(b"next")
    await a_turn()
    assert real.writes[1:] == [b"next"]
    assert corked.get_write_buffer_size() == 0


async def test_a_large_or_fast_writer_is_not_held() -> None:
    """Past CORK_BYTES the cork writes at once, so that a producer that writes a lot in one
    turn meets the transport's flow control (pause_writing) as without the cork."""
    real = Recording()
    corked = Corked(real, asyncio.get_running_loop())
    corked.write(b"x" * (CORK_BYTES - 1))
    assert real.writes == []
    corked.write(b"y")
    assert [len(w) for w in real.writes] == [CORK_BYTES]
    corked.write(b"z" * (16 * CORK_BYTES))  # one huge write: at once, whole
    assert [len(w) for w in real.writes] == [CORK_BYTES, 16 * CORK_BYTES]
    await a_turn()
    assert len(real.writes) == 2  # nothing was left held for the flush


async def test_close_and_half_close_send_what_is_held_and_abort_drops_it() -> None:
    loop = asyncio.get_running_loop()
    real = Recording()
    corked = Corked(real, loop)
    corked.write(b"last words")
    corked.write_eof()
    assert (real.writes, real.eof) == ([b"last words"], True)
    corked.write(b"bye")
    corked.close()
    assert real.writes[-1] == b"bye"
    assert real.closed
    corked.write(b"after the close")  # held, then dropped: the transport is closing
    await a_turn()
    assert real.writes[-1] == b"bye"

    real = Recording()
    corked = Corked(real, loop)
    corked.write(b"never sent")
    corked.abort()
    await a_turn()
    assert (real.writes, real.aborted) == ([], True)


async def test_the_rest_is_the_transports() -> None:
    real = Recording()
    corked = Corked(real, asyncio.get_running_loop())
    assert corked.get_extra_info("peername") == ("127.0.0.1", 40000)
    assert corked.can_write_eof()
    corked.pause_reading()
    assert not real.reading
    corked.resume_reading()
    assert real.reading
    assert not corked.is_closing()


async def json_app(scope: Scope, receive: Receive, send: Send) -> None:
    await JSONResponse({"ok": True})(scope, receive, send)


@pytest.mark.parametrize("pipelined", [1, 3])
async def test_a_served_answer_is_one_write(pipelined: int) -> None:
    """Through the protocol every HTTP front serves with (uvicorn's, held to the Listener's
    limits): each answer, head and body, is one write, also for requests pipelined on one
    connection."""
    listener = Listener(load_config(None, {}).http)
    protocol = listener.protocol()
    config = uvicorn.Config(json_app, http=protocol, lifespan="off", log_config=None)
    config.load()
    conn = protocol(config=config, server_state=ServerState(), app_state={})
    real = Recording()
    conn.connection_made(real)
    conn.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * pipelined)
    for _ in range(50):  # a bounded wait for the answers (no clock)
        if len(real.writes) == pipelined:
            break
        await asyncio.sleep(0)
    assert len(real.writes) == pipelined
    for written in real.writes:
        assert written.startswith(b"HTTP/1.1 200 OK\r\n")
        assert written.endswith(b'\r\n\r\n{"ok":true}')
    conn.connection_lost(None)
