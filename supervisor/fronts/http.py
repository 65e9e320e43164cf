"""What the HTTP fronts (MCP, E2B, the console) share: a listening socket bound at start
(so a taken or refused address is a configuration error before anything serves), and
uvicorn run in the supervisor's own event loop without its signal handlers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn

from stockade.supervisor import errors
from stockade.supervisor.config import split_host_port


class Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: the supervisor's own stop the front."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listening_socket(listen: str, setting: str, what: str, backlog: int = 128) -> socket.socket:
    """A non-blocking TCP socket bound and listening at `listen` (host:port); ConfigError
    naming `what` when it cannot be. IPPROTO_TCP is named: asyncio sets TCP_NODELAY only on
    sockets whose proto says TCP (an accepted one inherits it); with proto 0, Nagle held a
    response's body back for the client's delayed ACK, ~40 ms a request on a kept-alive
    connection."""
    host, port = split_host_port(listen, setting)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise errors.ConfigError(f"cannot serve {what} on {listen}: {exc}") from exc
    sock.setblocking(False)
    return sock


async def serve(server: Uvicorn, sock: socket.socket, what: str) -> asyncio.Task[None]:
    """Start serving on the socket; returns once uvicorn has started (ConfigError naming
    `what` if it ended instead)."""
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            raise errors.ConfigError(f"{what} did not start")
        await asyncio.sleep(0.01)
    return task
