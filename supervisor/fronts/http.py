"""What the HTTP fronts (MCP, E2B, the console) share: a listening socket bound at start
(so a taken or refused address is a configuration error before anything serves), and
uvicorn run in the supervisor's own event loop without its signal handlers, every
connection held to [http]'s limits (listener.py) and every failed authentication slowed
per client address (backoff.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from collections.abc import Iterator
from typing import Literal

import uvicorn
from starlette.types import ASGIApp

from stockade.supervisor import errors
from stockade.supervisor.config import HttpConfig, split_host_port
from stockade.supervisor.fronts.backoff import Presented, Throttled, throttled
from stockade.supervisor.fronts.listener import Listener

log = logging.getLogger("stockade.http")


class Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: the supervisor's own stop the front. `listener`
    holds its connections' counts, `throttle` its back-off."""

    listener: Listener
    throttle: Throttled

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def http_server(
    app: ASGIApp,
    limits: HttpConfig,
    front: str,
    presented: Presented,
    lifespan: Literal["on", "off"] = "on",
) -> Uvicorn:
    """A front's uvicorn: its app behind the back-off (credentials are presented when
    `presented` says so), every connection through a Listener of its own."""
    throttle = throttled(app, limits, front, presented)
    listener = Listener(limits)
    server = Uvicorn(
        uvicorn.Config(
            throttle,
            lifespan=lifespan,
            log_config=None,
            access_log=False,
            http=listener.protocol(),  # httptools (a C parser; h11, pure Python, costs more)
            # no proxy headers: X-Forwarded-For from a local client would otherwise replace
            # the peer the audit log records ([http] trusted_proxies serve the back-off)
            proxy_headers=False,
        )
    )
    server.listener, server.throttle = listener, throttle
    return server


def raise_open_files_limit() -> int:
    """Raise the soft limit of open files to the hard one (every HTTP front holds up to
    [http] max_connections sockets); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft


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
    raise_open_files_limit()
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            raise errors.ConfigError(f"{what} did not start")
        await asyncio.sleep(0.01)
    return task
