"""The console's port: plain HTTP on a loopback address (uvicorn in the supervisor's event
loop, as the E2B front), off unless [console] listen is set."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.types import Scope

from stockade.supervisor import errors
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.calls.pipeline import HostPolicy, ToolPipeline
from stockade.supervisor.config import Config
from stockade.supervisor.fronts.console.app import build_app
from stockade.supervisor.fronts.console.context import ConsoleContext, ConsoleSandboxes, Undoing
from stockade.supervisor.fronts.console.overview import trends_of
from stockade.supervisor.fronts.http import http_server, listening_socket, serve
from stockade.supervisor.observe.alarms import AlarmHub
from stockade.supervisor.observe.metrics import Metrics

log = logging.getLogger("stockade.console")


def _signs_in(scope: Scope) -> bytes | None:
    """The console's credentials are presented by the sign-in form (in its body: b"", whose
    refusals the back-off does not count)."""
    return b"" if scope.get("method") == "POST" and scope.get("path") == "/login" else None


class ConsoleFront:
    """The running console; `port` is the bound TCP port."""

    def __init__(self, ctx: ConsoleContext) -> None:
        listen = ctx.config.console.listen
        self.ctx = ctx
        self._socket = listening_socket(listen, "console.listen", "the console", 128)
        self.port: int = self._socket.getsockname()[1]
        app = build_app(ctx)
        self._server = http_server(app, ctx.config.http, "console", _signs_in, lifespan="off")
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = await serve(self._server, self._socket, "the console")
        trends = trends_of(self.ctx)
        if trends is not None:  # the overview's first read finds the last week folded
            trends.catch_up()

    async def stop(self, grace: float) -> None:
        """Stop taking requests; open pages' streams end (the browser retries)."""
        if self.ctx.trends is not None:
            await asyncio.to_thread(self.ctx.trends.stop)
        if self._task is None:
            self._socket.close()
            return
        self._server.config.timeout_graceful_shutdown = max(1, int(min(grace, 5)))
        self._server.should_exit = True
        self._server.force_exit = True  # event streams never end on their own
        with contextlib.suppress(Exception):
            await self._task
        self._socket.close()


async def start_console(
    config: Config,
    policy: HostPolicy,
    authenticator: Authenticator | None,
    manager: ConsoleSandboxes,
    metrics: Metrics | None,
    alarms: AlarmHub | None = None,
    pipeline: ToolPipeline | None = None,
    undo: Undoing | None = None,
) -> ConsoleFront | None:
    """The console when [console] listen is set (None otherwise), serving already."""
    if not config.console.listen:
        return None
    if authenticator is None:
        raise errors.ConfigError(
            "the console signs in with the API's bearer tokens: set [auth] tokens_file "
            "(or leave [console] listen unset)"
        )
    ctx = ConsoleContext(config, policy, authenticator, manager, metrics, alarms, pipeline, undo)
    front = ConsoleFront(ctx)
    await front.start()
    log.info("console on http://%s/ (operators: %s)", config.console.listen,
             ", ".join(config.console.operators) or "none")  # fmt: skip
    return front
