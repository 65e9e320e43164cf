"""Every call framed (agent protocol 4: stockade/agent/frames.py's typed frames, the
supervisor's agent_frames.py and AgentConnection): the greeting on the framed socket, Upload,
Download, Inspect and WatchFiles through the real AgentService, and what each end does with a
wrong, cut, oversized or hostile other end. The agent on a unix socket never loads grpc."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from stockade.agent.frames import FRAMES_SUFFIX, serve_frames
from stockade.agent.service import AgentService
from stockade.agent.v1 import agent_pb2, agent_pb2_grpc
from stockade.supervisor.errors import SandboxBroken
from stockade.supervisor.sandboxes.agent_frames import (
    DOWNLOAD,
    HELLO,
    INSPECT,
    TYPED_FLAG,
    UPLOAD,
    WATCH,
)
from stockade.supervisor.sandboxes.agent_link import (
    PROTOCOL_VERSION,
    AgentCallFailed,
    AgentConnection,
)
from tests.unit.test_agent_frames import Answer, hostile

LIMIT = 8 << 20


@contextlib.asynccontextmanager
async def real_agent(tmp_path: Path, typed: bool = True) -> AsyncIterator[tuple[Path, Path]]:
    """The agent's AgentService on its framed socket (typed: protocol 4; else as protocol
    3's, Invoke and InvokeStream only); (the --socket path, the workspace)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    service = AgentService(ws, max_output_bytes=1 << 20)
    sock = tmp_path / "agent.sock"
    server = await serve_frames(
        sock.with_name(sock.name + FRAMES_SUFFIX),
        service.invoke,
        LIMIT,
        service.invoke_stream,
        service if typed else None,
    )
    assert server is not None
    try:
        yield sock, ws
    finally:
        server.close()


@contextlib.asynccontextmanager
async def greeted(sock: Path, timeout: float = 5) -> AsyncIterator[AgentConnection]:
    link = AgentConnection(sock)
    try:
        await link.wait_ready(timeout)
        yield link
    finally:
        await link.close()


async def chunks_of(data: bytes, size: int = 64 << 10) -> AsyncIterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at : at + size]


# -- the real service, every call framed ------------------------------------------------------


async def test_greeted_on_the_framed_socket_and_no_grpc_channel(tmp_path: Path) -> None:
    async with real_agent(tmp_path) as (sock, _), greeted(sock) as link:
        assert link._all_framed
        assert await link.answers()
        assert await link.idle_s() is not None
        reply = await link.invoke("exec", {"command": "echo hi"}, 5, "r")
        assert reply.result is not None
        assert reply.result["stdout"] == "hi\n"
        assert link._channel is None, "no gRPC channel was made"
        assert link.is_ready()


async def test_upload_download_inspect_and_watch_round_trip(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    async with real_agent(tmp_path) as (sock, ws), greeted(sock) as link:
        up = await link.upload("sub/blob", False, 0o640, chunks_of(data), 10)
        assert up.result is not None
        assert up.result["sha256"] == hashlib.sha256(data).hexdigest()
        assert (ws / "sub" / "blob").read_bytes() == data
        got = [c async for c in link.download("sub/blob", False, 10)]
        assert b"".join(c for c in got if isinstance(c, bytes)) == data
        (ws / "fact").write_text("seen\n")
        facts = await link.inspect([str(ws / "fact"), str(ws / "none")], [], "", 5)
        assert facts.files == {str(ws / "fact"): b"seen\n", str(ws / "none"): "ENOENT"}
        events: list[Any] = []

        async def watch() -> None:
            async for event in link.watch_files(".", True):
                events.append(event)

        task = asyncio.create_task(watch())
        await until(lambda: len(events) == 1)
        (ws / "new").write_text("x")
        await until(lambda: any(getattr(e, "name", "") == "new" for e in events))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert link._frames is not None
        assert not link._frames._idle, "the watch's connection closed with it"
        reply = await link.invoke("exec", {"command": "cat new"}, 5, "r")
        assert reply.result is not None
        assert reply.result["stdout"] == "x"


async def test_an_upload_refused_early_reads_its_rest_and_the_connection_serves_on(
    tmp_path: Path,
) -> None:
    async with real_agent(tmp_path) as (sock, _), greeted(sock) as link:
        refused = await link.upload("../out", False, 0o644, chunks_of(b"x", 1), 5)
        assert refused.error_code == "INVALID_PATH"
        refused = await link.upload("../out", False, 0o644, chunks_of(os.urandom(1 << 20)), 5)
        assert refused.error_code == "INVALID_PATH"
        assert link._frames is not None
        assert len(link._frames._idle) == 1
        reply = await link.invoke("exec", {"command": "echo on"}, 5, "r")
        assert reply.result is not None
        assert reply.result["stdout"] == "on\n"
        assert not (tmp_path / "out").exists()


async def test_an_upload_cut_by_its_client_leaves_no_file(tmp_path: Path) -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield b"a" * 1000
        await asyncio.sleep(0.05)
        raise ConnectionResetError("the client went away")

    async with real_agent(tmp_path) as (sock, ws), greeted(sock) as link:
        with pytest.raises(ConnectionResetError):
            await link.upload("part.bin", False, 0o644, failing(), 5)
        await asyncio.sleep(0.2)
        assert sorted(p.name for p in ws.iterdir()) == []
        assert link._frames is not None
        assert not link._frames._idle, "its connection closed"
        assert (await link.invoke("exec", {"command": "true"}, 5, "r")).result is not None


async def test_a_download_left_part_way_closes_its_connection(tmp_path: Path) -> None:
    async with real_agent(tmp_path) as (sock, ws), greeted(sock) as link:
        (ws / "big").write_bytes(os.urandom(8 << 20))
        stream = link.download("big", False, 10)
        assert isinstance(stream, AsyncGenerator)
        first = await anext(stream)
        assert isinstance(first, bytes)
        await stream.aclose()
        assert link._frames is not None
        assert not link._frames._idle
        assert (await link.invoke("exec", {"command": "true"}, 5, "r")).result is not None


async def test_a_typed_stream_that_runs_past_its_timeout_is_a_deadline(tmp_path: Path) -> None:
    async with real_agent(tmp_path) as (sock, ws), greeted(sock) as link:
        (ws / "big").write_bytes(os.urandom(4 << 20))

        async def slowly() -> None:
            async for _ in link.download("big", False, 0.3):
                await asyncio.sleep(0.2)  # a reader slower than the deadline

        with pytest.raises(AgentCallFailed) as caught:
            await slowly()
        assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_a_framed_socket_gone_is_a_failed_call_not_a_fall_back(tmp_path: Path) -> None:
    async with real_agent(tmp_path) as (sock, _), greeted(sock) as link:
        assert link._frames is not None
        link._frames.close()
        link._frames._closed = False
        sock.with_name(sock.name + FRAMES_SUFFIX).unlink()
        with pytest.raises(AgentCallFailed) as caught:
            await link.invoke("exec", {"command": "true"}, 5, "r")
        assert caught.value.code == grpc.StatusCode.UNAVAILABLE
        assert link._channel is None, "gRPC was not tried"
        assert not await link.answers()


# -- a supervisor of protocol 4 and an agent of protocol 3 --------------------------------------


class OldAgent(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self) -> None:
        self.hellos = 0

    async def Hello(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.hellos += 1
        return agent_pb2.HelloResponse(protocol_version=3)


async def test_an_agent_of_protocol_3_is_greeted_over_grpc_and_invoked_framed(
    tmp_path: Path,
) -> None:
    async with real_agent(tmp_path, typed=False) as (sock, _):
        server = grpc.aio.server()
        old = OldAgent()
        agent_pb2_grpc.add_AgentServiceServicer_to_server(old, server)
        server.add_insecure_port(f"unix:{sock}")
        await server.start()
        try:
            async with greeted(sock) as link:
                assert not link._all_framed
                assert old.hellos == 1
                reply = await link.invoke("exec", {"command": "echo framed"}, 5, "r")
                assert reply.result is not None
                assert reply.result["stdout"] == "framed\n"
        finally:
            await server.stop(grace=None)


# -- the agent's end against a wrong supervisor -------------------------------------------------


def typed(call: int, body: bytes) -> bytes:
    return ((len(body) + 1) | TYPED_FLAG).to_bytes(4, "big") + bytes([call]) + body


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


HEADER = agent_pb2.UploadChunk(header=agent_pb2.TransferHeader(path="f")).SerializeToString()
DATA = agent_pb2.UploadChunk(data=b"abc").SerializeToString()


@pytest.mark.parametrize(
    "sent",
    [
        pytest.param(typed(9, b""), id="unknown-call"),
        pytest.param(TYPED_FLAG.to_bytes(4, "big"), id="no-call-byte"),
        pytest.param(((LIMIT + 2) | TYPED_FLAG).to_bytes(4, "big"), id="over-the-limit"),
        pytest.param(typed(HELLO, b"\xff\xff\xff"), id="hello-not-a-message"),
        pytest.param(
            typed(INSPECT, agent_pb2.InspectRequest(files=["/x"] * 100_000).SerializeToString()),
            id="inspect-out-of-range",
        ),
        pytest.param(typed(UPLOAD, DATA), id="upload-without-header"),
        pytest.param(typed(UPLOAD, HEADER) + frame(HEADER), id="upload-header-twice"),
        pytest.param(typed(UPLOAD, HEADER) + (LIMIT + 1).to_bytes(4, "big"), id="upload-big"),
        pytest.param(typed(UPLOAD, HEADER) + frame(b"\xff\xff"), id="upload-not-a-chunk"),
        pytest.param(typed(UPLOAD, HEADER) + frame(DATA) + b"\x00\x00", id="upload-cut"),
        pytest.param(typed(DOWNLOAD, b"\x0a\xff"), id="download-not-a-message"),
        pytest.param(typed(WATCH, b"\x0a\x05ab"), id="watch-cut"),
    ],
)
async def test_the_agent_closes_on_a_wrong_typed_request(tmp_path: Path, sent: bytes) -> None:
    async with real_agent(tmp_path) as (sock, ws):
        reader, writer = await asyncio.open_unix_connection(
            str(sock.with_name(sock.name + FRAMES_SUFFIX))
        )
        writer.write(sent)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5) == b"", "closed, nothing answered"
        writer.close()
        await asyncio.sleep(0.05)
        assert list(ws.iterdir()) == [], "no file of a refused upload"


async def test_an_agent_without_typed_calls_closes_on_them(tmp_path: Path) -> None:
    """What an agent of protocol 3 does with a typed Hello (the supervisor then greets it
    over gRPC)."""
    async with real_agent(tmp_path, typed=False) as (sock, _):
        reader, writer = await asyncio.open_unix_connection(
            str(sock.with_name(sock.name + FRAMES_SUFFIX))
        )
        writer.write(typed(HELLO, b""))
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


# -- the supervisor's end against a hostile framed agent ----------------------------------------


def answering(data: bytes, then_wait: bool = True) -> Answer:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        if then_wait:
            await reader.read()

    return answer


def hello(version: int) -> bytes:
    return frame(agent_pb2.HelloResponse(protocol_version=version).SerializeToString())


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (answering(frame(b"\xff\xff\xff\xff")), "no valid protobuf"),
        (answering(hello(PROTOCOL_VERSION + 1)), "agent speaks protocol"),
        (answering(hello(3)), "a framed Hello with protocol 3"),
        (answering(hello(1)), "agent speaks protocol 1"),
        (answering((0x3FFFFFFF).to_bytes(4, "big") + b"x" * 100), "does not answer"),
        (answering(b""), "does not answer"),  # silence
    ],
)
async def test_a_hostile_greeting_is_a_broken_sandbox(
    tmp_path: Path, answer: Answer, match: str
) -> None:
    async with hostile(tmp_path, answer) as sock:
        link = AgentConnection(sock)
        try:
            with pytest.raises(SandboxBroken, match=match):
                await link.wait_ready(0.5)
        finally:
            await link.close()


# -- the real agent process -----------------------------------------------------------------------


async def test_the_agent_on_a_unix_socket_never_loads_grpc_or_ssl() -> None:
    run_dir = Path(tempfile.mkdtemp(dir="/tmp"))
    ws = Path(tempfile.mkdtemp())
    sock = run_dir / "agent.sock"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-m",
            "stockade.agent",
            "--socket",
            str(sock),
            "--workspace",
            str(ws),
        ]
    )
    try:
        async with greeted(sock, 20) as link:
            reply = await link.invoke("exec", {"command": "echo up"}, 10, "r")
            assert reply.result is not None
            assert reply.result["stdout"] == "up\n"
            assert [c async for c in link.download(".", True, 10)][-1].error_code == ""
        maps = Path(f"/proc/{agent.pid}/maps").read_text()
        assert "grpc" not in maps
        assert "_ssl." not in maps, "nor Python's ssl (nothing there speaks TLS)"
        assert sorted(p.name for p in run_dir.iterdir()) == ["agent.sock.frames"]
    finally:
        agent.terminate()
        await asyncio.to_thread(agent.wait, 20)


def test_the_entry_point_names_the_agent_user_as_identity_does() -> None:
    """__main__ names it before importing identity.py (which loads asyncio, and with it ssl)."""
    from stockade.agent import __main__, identity

    assert f"{identity.AGENT_UID}:{identity.AGENT_UID}" == __main__.AGENT_IDS


async def until(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
