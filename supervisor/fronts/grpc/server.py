"""The gRPC server: assembly of the servicers on a grpc.aio server (auth and drain as
interceptors, health checking, reflection), its port, and graceful shutdown. The servicers
live beside it, one module per service; status.py maps domain errors to status codes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from stockade.supervisor import errors
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.calls.interact import Interaction
from stockade.supervisor.calls.lifecycle import Lifecycle
from stockade.supervisor.calls.pipeline import HostPolicy, ToolPipeline
from stockade.supervisor.calls.transfers import FileTransfers
from stockade.supervisor.calls.watching import FileWatches
from stockade.supervisor.config import AuthConfig, Config
from stockade.supervisor.fronts.grpc.approval_service import ApprovalServicer
from stockade.supervisor.fronts.grpc.audit_service import AuditServicer
from stockade.supervisor.fronts.grpc.file_service import FileServicer
from stockade.supervisor.fronts.grpc.interceptor import REASON_KEY, AuthInterceptor
from stockade.supervisor.fronts.grpc.quarantine_service import QuarantineServicer
from stockade.supervisor.fronts.grpc.sandbox_service import SandboxServicer
from stockade.supervisor.fronts.grpc.tool_service import ToolServicer
from stockade.supervisor.observe.alarms import AlarmHub
from stockade.supervisor.observe.telemetry import Observer
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.v1 import (
    approval_pb2_grpc,
    audit_pb2_grpc,
    file_pb2_grpc,
    quarantine_pb2_grpc,
    sandbox_pb2_grpc,
    tool_pb2_grpc,
)

log = logging.getLogger("stockade.server")
SERVICES = (
    "stockade.v1.SandboxService",
    "stockade.v1.ToolService",
    "stockade.v1.ApprovalService",
    "stockade.v1.AuditService",
    "stockade.v1.FileService",
    "stockade.v1.QuarantineService",
    "grpc.health.v1.Health",
)


def _add_port(server: Any, auth: AuthConfig, listen: str) -> int:
    """Bind `listen`: TLS when a certificate is configured, requiring a client certificate
    signed by client_ca when one is set (gRPC can only require it or not ask)."""
    if not auth.tls_cert:
        return int(server.add_insecure_port(listen))
    try:
        chain, key = Path(auth.tls_cert).read_bytes(), Path(auth.tls_key).read_bytes()
        ca = Path(auth.client_ca).read_bytes() if auth.client_ca else None
    except OSError as exc:
        raise errors.ConfigError(f"auth: cannot read a TLS file: {exc}") from exc
    credentials = grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=ca, require_client_auth=ca is not None
    )
    return int(server.add_secure_port(listen, credentials))


class Drain(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Graceful shutdown at the edge: once draining, every new call except health checks and
    reflection gets UNAVAILABLE; calls in flight are counted so that stop() can wait for
    them. An approver's watch stream is not counted (it would hold the drain open to its
    end) but stays open until the server stops, so a call in flight can still be approved;
    nor is a file watch, which lasts until its client stops it."""

    _EXEMPT = ("/grpc.health.v1.Health/", "/grpc.reflection.")
    _UNCOUNTED = (
        "/stockade.v1.ApprovalService/WatchApprovals",
        "/stockade.v1.FileService/WatchFiles",
    )

    def __init__(self) -> None:
        self.draining = False
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or details.method.startswith(self._EXEMPT):
            return handler
        counted = details.method not in self._UNCOUNTED
        kinds = {
            "unary_unary": (grpc.unary_unary_rpc_method_handler, self._unary),
            "stream_unary": (grpc.stream_unary_rpc_method_handler, self._unary),
            "unary_stream": (grpc.unary_stream_rpc_method_handler, self._stream),
            "stream_stream": (grpc.stream_stream_rpc_method_handler, self._stream),
        }
        for attribute, (make, wrap) in kinds.items():
            behavior = getattr(handler, attribute)
            if behavior is not None:
                return make(
                    wrap(behavior, counted),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler

    def _unary(self, behavior: Any, counted: bool) -> Any:
        async def run(request: Any, context: Any) -> Any:
            await self._admit(context)
            with self._counting(counted):
                return await behavior(request, context)

        return run

    def _stream(self, behavior: Any, counted: bool) -> Any:
        async def run(request: Any, context: Any) -> AsyncIterator[Any]:
            await self._admit(context)
            with self._counting(counted):
                async for item in behavior(request, context):
                    yield item

        return run

    async def _admit(self, context: Any) -> None:
        if self.draining:
            context.set_trailing_metadata(((REASON_KEY, "SHUTTING_DOWN"),))
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                "the supervisor is shutting down; retry when it has started again",
            )

    @contextlib.contextmanager
    def _counting(self, counted: bool) -> Iterator[None]:
        if not counted:
            yield
            return
        self._active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the counted calls to end; whether they all did."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True


FLUSH_S = 1.0
"""After the drain: time for replies just produced to reach their callers."""


class Server:
    """The running gRPC server; `port` is the bound TCP port (0 for a unix socket)."""

    def __init__(
        self,
        config: Config,
        sandboxes: SandboxManager,
        policy: HostPolicy,
        authenticator: Authenticator | None = None,
        observers: tuple[Observer, ...] = (),
        alarms: AlarmHub | None = None,
    ) -> None:
        """alarms: the supervisor's AlarmHub (app.py makes it); one of its own if none."""
        self.config = config
        self.alarms = alarms or AlarmHub(policy.audit, None, sandboxes.quarantine, config)
        self.sandboxes = sandboxes
        self.policy = policy
        self.health = HealthServicer()
        self._drain = Drain()
        self._server = grpc.aio.server(
            interceptors=[self._drain, AuthInterceptor(authenticator, policy.refusals)],
            options=[
                ("grpc.max_receive_message_length", config.max_request_bytes),
                ("grpc.max_send_message_length", config.max_response_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        pipeline = self.pipeline = ToolPipeline(
            config, sandboxes, policy, observers, alarm=self.alarms.sound,
            shells=sandboxes.shell_of, checkpoint=sandboxes.checkpoints.before_call,
        )  # fmt: skip
        """The one pipeline of this supervisor's calls: other fronts (fronts/mcp) use it too."""
        server = self._server
        lifecycle = Lifecycle(sandboxes, policy.audit, self.alarms.sound)
        sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(
            SandboxServicer(lifecycle, policy.scrubber, pipeline.sessions), server
        )
        interaction = Interaction(pipeline, sandboxes, policy.scrubber)
        tool_pb2_grpc.add_ToolServiceServicer_to_server(
            ToolServicer(pipeline, policy, interaction), server
        )
        approval_pb2_grpc.add_ApprovalServiceServicer_to_server(
            ApprovalServicer(policy.approvals, policy.scrubber), server
        )
        audit_pb2_grpc.add_AuditServiceServicer_to_server(
            AuditServicer(
                policy.audit,
                policy.scrubber,
                frozenset(config.console.operators) if authenticator is not None else None,
                policy.approvals.allow_always,
                tuple(tool.name for tool in config.custom_tools),
            ),
            server,
        )
        transfers = FileTransfers(config, sandboxes, policy)
        file_pb2_grpc.add_FileServiceServicer_to_server(
            FileServicer(transfers, FileWatches(sandboxes, policy), policy.scrubber), server
        )
        quarantine_pb2_grpc.add_QuarantineServiceServicer_to_server(
            QuarantineServicer(lifecycle, self.alarms, policy.audit, policy.scrubber), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection((*SERVICES, reflection.SERVICE_NAME), self._server)
        self.port = _add_port(self._server, config.auth, config.listen)
        if self.port == 0 and not config.listen.startswith("unix:"):
            raise errors.ConfigError(f"cannot listen on {config.listen}")

    async def start(self) -> None:
        await self._server.start()
        for name in ("", *SERVICES[:-1]):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def wait(self) -> None:
        await self._server.wait_for_termination()

    async def stop(self, grace: float = 5.0) -> None:
        """Graceful: health goes NOT_SERVING and new calls get UNAVAILABLE at once, calls in
        flight get `grace` seconds to finish; then the server stops (ending what is left)
        and the sandbox manager closes (containers keep running for the next start)."""
        self._drain.draining = True
        await self.health.enter_graceful_shutdown()
        await self.alarms.close()  # alarm watchers' streams end (reactions under way finish)
        if not await self._drain.wait_idle(grace):
            log.warning("shutdown: calls still in flight after %g s are ended", grace)
        await self._server.stop(FLUSH_S)
        await self.sandboxes.close()
        if self.policy.audit is not None:
            await asyncio.to_thread(self.policy.audit.close)
