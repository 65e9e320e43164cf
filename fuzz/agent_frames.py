"""The supervisor's end of the agent's framed socket (sandboxes/agent_frames.py and
AgentConnection, agent protocol 4) against a hostile agent: whatever bytes it writes back.

An input: byte 0 picks the call (0: Invoke, 1: InvokeStream, 2: the greeting, 3: Inspect,
4: Download, 5: WatchFiles, 6: Upload), the rest is what the agent writes on the connection
after reading the request, before it closes it. The agent stand-in listens on a framed socket
in a folder of root's (as a sealed run folder), answers the greeting properly unless the input
is for the greeting, and is kept for every input. Every call must end in a clean refusal or a
checked reply: a reply over the limit, bytes that are no message, out of order or out of
bounds, a connection cut; never another exception, and never a hang (every call but the watch
has a timeout; the agent closing ends the watch)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fuzz import run
from stockade.agent.v1 import agent_pb2
from stockade.supervisor.errors import AgentMisbehaved, SandboxBroken, SandboxLost
from stockade.supervisor.sandboxes.agent_frames import FRAMES_SUFFIX, HELLO, TYPED_FLAG
from stockade.supervisor.sandboxes.agent_link import (
    PROTOCOL_VERSION,
    AgentCallFailed,
    AgentConnection,
)
from stockade.supervisor.sandboxes.replies import ReplyLimits

INSTRUMENT = ("stockade",)
REFUSALS: tuple[type[BaseException], ...] = (
    AgentCallFailed,
    AgentMisbehaved,
    SandboxBroken,
    SandboxLost,
)
LIMITS = ReplyLimits(max_output_bytes=64 << 10, process_log_bytes=64 << 10)
TIMEOUT_S = 2.0
"""Every call's (the fuzz runner's own is 20 s an input)."""
_HELLO = agent_pb2.HelloResponse(protocol_version=PROTOCOL_VERSION).SerializeToString()


class _Agent:
    """The stand-in: a framed socket whose connections get the current input's answer."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="stockade-fuzz-agent-"))
        os.chmod(self.folder, 0o755)
        self.socket = self.folder / "agent.sock"
        self.answer = b""
        self.greet = True
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        if self.server is None:
            path = str(self.socket.with_name(self.socket.name + FRAMES_SUFFIX))
            self.server = await asyncio.start_unix_server(self._serve, path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            try:
                while True:
                    size = int.from_bytes(await reader.readexactly(4), "big")
                    body = await reader.readexactly(size & ~(TYPED_FLAG | 1 << 31))
                    greeting = size & TYPED_FLAG and body[:1] == bytes([HELLO])
                    if greeting and self.greet:
                        writer.write(len(_HELLO).to_bytes(4, "big") + _HELLO)
                        await writer.drain()
                        continue
                    if size & TYPED_FLAG and body[:1] == b"\x03":  # an upload: to its end
                        while chunk := int.from_bytes(await reader.readexactly(4), "big"):
                            await reader.readexactly(chunk)
                    writer.write(self.answer)
                    await writer.drain()
                    return
            finally:
                writer.close()


_agent = _Agent()


async def _chunks() -> AsyncIterator[bytes]:
    yield b""


async def _call(kind: int, link: AgentConnection) -> Any:
    if kind == 0:
        return await link.invoke("exec", {"command": "true"}, TIMEOUT_S, "fuzz")
    if kind == 1:
        return [e async for e in link.invoke_stream("exec", {}, TIMEOUT_S, "fuzz")]
    if kind == 3:
        return await link.inspect(["/etc/hostname"], ["/proc/self/exe"], "", TIMEOUT_S)
    if kind == 4:
        return [c async for c in link.download("f", False, TIMEOUT_S)]
    if kind == 5:
        async with asyncio.timeout(TIMEOUT_S):
            return [e async for e in link.watch_files(".", True)]
    return await link.upload("f", False, 0o644, _chunks(), TIMEOUT_S)


async def _answer(data: bytes) -> None:
    kind = data[0] % 7 if data else 0
    await _agent.start()
    _agent.answer, _agent.greet = data[1:], kind != 2
    link = AgentConnection(_agent.socket, LIMITS)
    try:
        # an answer the greeting takes for an older agent's leaves it waiting for a gRPC
        # socket that never comes: a short wait, for the fuzzer's pace
        await link.wait_ready(TIMEOUT_S if kind != 2 else 0.2)
        if kind != 2:
            await _call(kind, link)
    finally:
        await link.close()


def one(data: bytes) -> None:
    run(_answer(data))
