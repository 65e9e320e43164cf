"""One egress proxy listener for many sandboxes, each known by the address it connects from.

A host sandbox reaches its own proxy through a link of its own (links.py), so the socket
says whose a connection is. A pod reaches the supervisors through the cluster network and a
Service, all pods to one port: here the connection's source address says whose it is (the
pod IP; a ClusterIP Service rewrites the destination, not the source). `identify` maps that
address to the sandbox (its scoped key and allowlist) or to a refusal; the connection is then
served by that sandbox's EgressProxy exactly as a host sandbox's is (the same checks, the
same decisions recorded), or refused with 403 before a byte of it is read as a request.

Each sandbox's EgressProxy is kept while it has connections (its per-sandbox cap counts
them), and made again for the next connection after that, so a changed allowlist is used
from the next connection on."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from stockade.supervisor.config.allowlist import Allowlist
from stockade.supervisor.network.proxy import MAX_HEAD, EgressProxy

log = logging.getLogger("stockade.egress")

MAX_IDENTIFYING = 256
"""Connections whose source is being looked up at once; more are refused (503) at once."""
LOG_EVERY_S = 10.0
"""A source refused again within this time is not logged again (a pod that keeps trying
must not flood the log); its refusals are still recorded under its key."""
MAX_LOGGED = 4096
DISCARD_S = 2.0
"""How long a refused connection's request is read (and thrown away) after the answer, so
that closing it does not reset it before the client has read why."""


@dataclass(frozen=True)
class Client:
    """The sandbox a connection comes from."""

    key: str
    """Its scoped key (the audit's sandbox_key, as for a host sandbox)."""
    allowlist: Allowlist


@dataclass(frozen=True)
class Refusal:
    """Why a connection is not served; `key` when the source is a sandbox (then the refusal
    is recorded as its egress decision), "" when it is no sandbox at all (logged only)."""

    status: int
    reason: str
    key: str = ""


Identify = Callable[[str], Awaitable[Client | Refusal]]
MakeProxy = Callable[[str, Allowlist], EgressProxy]
RecordRefusal = Callable[[str, str], None]
"""(scoped key, reason): a sandbox's connection refused before it asked for anything."""


def source_address(peer: object) -> str:
    """The client's IP from a socket's peer name, an IPv4-mapped IPv6 address as IPv4 (a
    listener on "::" sees IPv4 pods so); "" when there is none."""
    if not isinstance(peer, tuple) or not peer:
        return ""
    try:
        address = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return ""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


class SharedEgressListener:
    def __init__(self, identify: Identify, make_proxy: MakeProxy, refused: RecordRefusal) -> None:
        self._identify = identify
        self._make_proxy = make_proxy
        self._refused = refused
        self._server: asyncio.Server | None = None
        self._proxies: dict[tuple[str, tuple[str, ...]], EgressProxy] = {}
        self._identifying = 0
        self._logged_at: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        """The port served on (once started)."""

    async def start(self, host: str, port: int) -> int:
        """Serve on host:port; the port bound (port 0: one the kernel picks, for tests)."""
        self._server = await asyncio.start_server(
            self._accept, host or None, port, limit=MAX_HEAD, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for proxy in list(self._proxies.values()):
            await proxy.close()
        self._proxies.clear()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def proxies(self) -> int:
        """Sandboxes with a connection open now."""
        return len(self._proxies)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            found = await self._who(source_address(writer.get_extra_info("peername")))
            if isinstance(found, Refusal):
                await _refuse(reader, writer, found)
                return
            await self._serve(found, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _who(self, address: str) -> Client | Refusal:
        if not address:
            return self._logged(Refusal(403, "the connection has no source address"), address)
        if self._identifying >= MAX_IDENTIFYING:
            reason = f"too many connections being identified at once ({MAX_IDENTIFYING})"
            return self._logged(Refusal(503, reason), address)
        self._identifying += 1
        try:
            found = await self._identify(address)
        except Exception as exc:  # a lookup that breaks refuses the connection, never serves it
            log.exception("egress: looking up %s failed", address)
            found = Refusal(503, f"the sandbox of {address} cannot be looked up: {exc}")
        finally:
            self._identifying -= 1
        return found if isinstance(found, Client) else self._logged(found, address)

    def _logged(self, refusal: Refusal, address: str) -> Refusal:
        now = time.monotonic()
        if now - self._logged_at.get(address, -LOG_EVERY_S) >= LOG_EVERY_S:
            if len(self._logged_at) >= MAX_LOGGED:
                self._logged_at.clear()
            self._logged_at[address] = now
            log.warning("egress deny from %s: %s", address or "?", refusal.reason)
        if refusal.key:
            self._refused(refusal.key, refusal.reason)
        return refusal

    async def _serve(
        self, client: Client, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """The sandbox's proxy serves the connection (its cap counts it); the proxy is
        dropped once it has no connection left."""
        which = (client.key, client.allowlist.patterns)
        proxy = self._proxies.get(which)
        if proxy is None:
            proxy = self._proxies[which] = self._make_proxy(client.key, client.allowlist)
        try:
            await proxy.serve_connection(reader, writer)
        finally:
            if proxy.open_connections == 0 and self._proxies.get(which) is proxy:
                del self._proxies[which]


async def _refuse(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, refusal: Refusal
) -> None:
    phrases = {403: "Forbidden", 503: "Service Unavailable"}
    body = f"stockade egress proxy: {refusal.reason}\n".encode()
    head = (
        f"HTTP/1.1 {refusal.status} {phrases.get(refusal.status, 'Error')}\r\n"
        f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
    with contextlib.suppress(TimeoutError, ConnectionError):
        await asyncio.wait_for(_drain_input(reader), DISCARD_S)


async def _drain_input(reader: asyncio.StreamReader) -> None:
    read = 0
    while read < MAX_HEAD:
        data = await reader.read(MAX_HEAD)
        if not data:
            return
        read += len(data)
