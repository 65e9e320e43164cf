"""The agent's server: on a unix socket the framed socket alone (frames.py), for the supervisor
on the same host; on a TCP port gRPC with mutual TLS (grpc_server.py, imported only then)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stockade.agent.execute import unignore_signals
from stockade.agent.frames import FRAMES_SUFFIX, serve_frames
from stockade.agent.processes import ProcessTable
from stockade.agent.service import MAX_MESSAGE_BYTES, AgentService

log = logging.getLogger("stockade.agent")


def _use_pidfd_child_watcher() -> None:
    """Python 3.11 waits for each child in a thread of its own; a pidfd watcher needs none
    (3.12 picks it by itself). Not where the kernel lacks pidfd_open (gVisor's of 2022): every
    start of a command would then fail with ENOSYS."""
    if sys.version_info < (3, 12) and hasattr(asyncio, "PidfdChildWatcher") and _has_pidfd():
        watcher = asyncio.PidfdChildWatcher()
        watcher.attach_loop(asyncio.get_running_loop())
        asyncio.set_child_watcher(watcher)


def _has_pidfd() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


@dataclass(frozen=True)
class Listen:
    """A TCP address to serve on with mutual TLS (never without: tls.py)."""

    host: str
    port: int
    credentials: Any
    """grpc.ServerCredentials (tls.server_credentials)."""

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


async def serve(
    endpoint: Path | Listen,
    workspace: Path,
    *,
    max_output_bytes: int,
    max_processes: int = 5,
    process_log_bytes: int = 1 << 20,
) -> None:
    """Serve on a unix socket (a Path: its framed socket, PATH + FRAMES_SUFFIX) or a TCP port
    with mutual TLS until SIGTERM or SIGINT; then kill the background processes."""
    logging.basicConfig(level=logging.INFO, format="agent %(levelname)s %(message)s")
    _use_pidfd_child_watcher()
    unignore_signals()
    processes = ProcessTable(workspace, max_running=max_processes, log_bytes=process_log_bytes)
    service = AgentService(workspace, max_output_bytes, processes)
    if isinstance(endpoint, Listen):
        from stockade.agent import grpc_server

        server = await grpc_server.start(str(endpoint), endpoint.credentials, service)
        where = str(endpoint)
    else:
        where = str(endpoint.with_name(endpoint.name + FRAMES_SUFFIX))
        made = await serve_frames(
            Path(where), service.invoke, MAX_MESSAGE_BYTES, service.invoke_stream, service
        )
        if made is None:
            raise SystemExit(f"agent: cannot serve on {where}")
        framed = made
    log.info("serving on %s, workspace %s", where, workspace)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if isinstance(endpoint, Listen):
        await server.stop(grace=2)
    else:
        framed.close()
    await processes.close()
