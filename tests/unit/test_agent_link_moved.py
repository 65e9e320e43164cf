"""A warm-pool container taken by a key keeps its agent link (pool.take, AgentConnection.
moved_to): its folder is renamed to the key's, the link's greeted connections stay open, and
the connections it makes later go to the socket's new path. The control: a link that was not
moved cannot dial once the folder is renamed. A link that cannot follow (closed, greeted over
gRPC, a path too long for a socket) says so and is replaced. Through the real agent service on
its framed socket."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from stockade.agent.frames import FRAMES_SUFFIX, serve_frames
from stockade.agent.service import AgentService
from stockade.agent.v1 import agent_pb2_grpc
from stockade.supervisor.engines.addresses import MAX_SOCKET_PATH
from stockade.supervisor.errors import SandboxBroken
from stockade.supervisor.sandboxes.agent_link import AgentCallFailed, AgentConnection
from tests.unit.test_agent_frames_typed import LIMIT, OldAgent, greeted, real_agent

TWO_AT_ONCE = "sleep 0.2; echo done"
"""Two such calls at once: one takes the kept connection, the other dials the socket."""


async def two_calls(link: AgentConnection) -> list[str]:
    replies = await asyncio.gather(
        *(link.invoke("exec", {"command": TWO_AT_ONCE}, 5, f"r{i}") for i in range(2))
    )
    return [r.result["stdout"] if r.result else r.error_message for r in replies]


def folders(tmp_path: Path) -> tuple[Path, Path]:
    pool, key = tmp_path / "pool-0123", tmp_path / "key"
    pool.mkdir()
    return pool, key


@contextlib.asynccontextmanager
async def pooled_agent(run: Path, workspace: Path) -> AsyncIterator[Path]:
    """The agent's service on its framed socket in `run` (the folder the pool renames), its
    workspace elsewhere, as the container's bind mounts are; the socket's path."""
    workspace.mkdir()
    service = AgentService(workspace, max_output_bytes=1 << 20)
    sock = run / "agent.sock"
    server = await serve_frames(
        sock.with_name(sock.name + FRAMES_SUFFIX), service.invoke, LIMIT,
        service.invoke_stream, service,
    )  # fmt: skip
    assert server is not None
    try:
        yield sock
    finally:
        server.close()


async def test_a_moved_link_keeps_its_connection_and_dials_the_new_path(tmp_path: Path) -> None:
    pool, key = folders(tmp_path)
    async with pooled_agent(pool, tmp_path / "ws") as sock, greeted(sock) as link:
        assert link._frames is not None
        kept = list(link._frames._idle)
        assert len(kept) == 1, "the greeting's connection is kept"
        pool.rename(key)
        assert link.moved_to(key / sock.name)
        assert link._frames._idle == kept, "no connection was closed or made by the move"
        assert link.is_ready()
        assert await two_calls(link) == ["done\n", "done\n"]
        assert str(link.address) == str(key / sock.name)
        assert link._channel is None, "no gRPC channel was made"


async def test_a_link_not_moved_cannot_dial_after_the_rename(tmp_path: Path) -> None:
    """The control: without moved_to, the second connection goes to a path that is gone."""
    pool, key = folders(tmp_path)
    async with pooled_agent(pool, tmp_path / "ws") as sock, greeted(sock) as link:
        pool.rename(key)
        with pytest.raises(AgentCallFailed) as caught:
            await two_calls(link)
        assert caught.value.code == grpc.StatusCode.UNAVAILABLE


async def test_a_move_to_the_same_address_keeps_the_link(tmp_path: Path) -> None:
    async with real_agent(tmp_path) as (sock, _), greeted(sock) as link:
        assert link.moved_to(sock)
        assert (await link.invoke("exec", {"command": "echo x"}, 5, "r")).result is not None


async def test_a_closed_link_does_not_move(tmp_path: Path) -> None:
    pool, key = folders(tmp_path)
    async with real_agent(pool) as (sock, _), greeted(sock) as link:
        await link.close()
        pool.rename(key)
        assert not link.moved_to(key / sock.name)
        assert not link.moved_to(sock)


async def test_a_link_that_was_never_greeted_does_not_move(tmp_path: Path) -> None:
    """Not yet greeted: whether it will be framed or gRPC is not known; a new link is made."""
    pool, key = folders(tmp_path)
    async with real_agent(pool) as (sock, _):
        link = AgentConnection(sock)
        pool.rename(key)
        assert not link.moved_to(key / sock.name)
        await link.close()


async def test_a_link_greeted_over_grpc_does_not_move(tmp_path: Path) -> None:
    """An agent of protocol 3 was greeted over a gRPC channel, which names the old path."""
    pool, key = folders(tmp_path)
    async with real_agent(pool, typed=False) as (sock, _):
        server = grpc.aio.server()
        agent_pb2_grpc.add_AgentServiceServicer_to_server(OldAgent(), server)
        server.add_insecure_port(f"unix:{sock}")
        await server.start()
        try:
            async with greeted(sock) as link:
                assert link._channel is not None
                pool.rename(key)
                assert not link.moved_to(key / sock.name)
        finally:
            await server.stop(grace=None)


async def test_a_path_too_long_for_a_socket_is_refused_and_the_link_unchanged(
    tmp_path: Path,
) -> None:
    async with real_agent(tmp_path) as (sock, _), greeted(sock) as link:
        long = tmp_path / ("k" * MAX_SOCKET_PATH) / sock.name
        with pytest.raises(SandboxBroken, match="longer than"):
            link.moved_to(long)
        assert str(link.address) == str(sock)
        assert (await link.invoke("exec", {"command": "echo x"}, 5, "r")).result is not None
