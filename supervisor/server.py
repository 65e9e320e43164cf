"""The gRPC edge: servicers translate protobuf to domain objects and back; one table maps
domain errors to status codes. Nothing below this module sees protobuf."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from stockade.supervisor import errors
from stockade.supervisor.catalog import TOOLS
from stockade.supervisor.config import Config
from stockade.supervisor.models import CallContext, SandboxInfo, ToolCall, ToolResult
from stockade.supervisor.pipeline import ToolPipeline
from stockade.supervisor.render import wire_json, wire_text
from stockade.supervisor.sandboxes import SandboxManager
from stockade.v1 import sandbox_pb2, sandbox_pb2_grpc, tool_pb2, tool_pb2_grpc

log = logging.getLogger("stockade.server")
REASON_KEY = "stockade-error-reason"
_STATUS = {
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.SandboxNotFound: grpc.StatusCode.NOT_FOUND,
    errors.EngineUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.SandboxBroken: grpc.StatusCode.UNAVAILABLE,
    errors.SandboxLost: grpc.StatusCode.UNAVAILABLE,
    errors.ConfigError: grpc.StatusCode.FAILED_PRECONDITION,
}
SERVICES = (
    "stockade.v1.SandboxService",
    "stockade.v1.ToolService",
    "grpc.health.v1.Health",
)

R = TypeVar("R")
Handler = Callable[[Any, Any, Any], Awaitable[R]]


def status_for(exc: errors.StockadeError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return grpc.StatusCode.INTERNAL


def mapped(handler: Handler[R]) -> Handler[R]:
    """Turn domain errors into gRPC statuses with a stable reason in trailing metadata."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: Any) -> R:
        try:
            return await handler(self, request, context)
        except errors.StockadeError as exc:
            context.set_trailing_metadata(((REASON_KEY, exc.reason),))
            await context.abort(status_for(exc), str(exc))
        except Exception:
            log.exception("internal error in %s", handler.__name__)
            context.set_trailing_metadata(((REASON_KEY, "INTERNAL"),))
            await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the supervisor log")
        raise AssertionError("unreachable")

    return wrapper


def _timestamp(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def sandbox_to_pb(info: SandboxInfo) -> Any:
    return sandbox_pb2.SandboxInfo(
        key=info.key,
        container_id=info.container_id,
        container_name=info.container_name,
        engine=info.engine,
        image=info.image,
        state=sandbox_pb2.SandboxState.Value(f"SANDBOX_STATE_{info.state.value}"),  # type: ignore[arg-type]
        created_at=_timestamp(info.created_at),
        last_used_at=_timestamp(info.last_used_at),
        workspace_path=info.workspace_path,
    )


def result_to_pb(result: ToolResult) -> Any:
    code = "UNSPECIFIED" if result.error_code.value == "NONE" else result.error_code.value
    return tool_pb2.ToolResult(
        for_llm=wire_text(result.for_llm),
        for_user=wire_text(result.for_user),
        is_error=result.is_error,
        error_code=tool_pb2.ToolErrorCode.Value(f"TOOL_ERROR_CODE_{code}"),  # type: ignore[arg-type]
        error_message=wire_text(result.error_message),
        data_json=wire_json(result.data) if result.data is not None else "",
        duration_ms=result.duration_ms,
        truncated=result.truncated,
        redactions=result.redactions,
        request_id=result.request_id,
    )


def context_from_pb(ctx: Any) -> CallContext:
    return CallContext(
        agent_id=ctx.agent_id,
        provider=ctx.provider,
        channel=ctx.channel,
        chat_id=ctx.chat_id,
        peer_kind=ctx.peer_kind,
        subagent_depth=ctx.subagent_depth,
    )


class SandboxServicer(sandbox_pb2_grpc.SandboxServiceServicer):
    def __init__(self, sandboxes: SandboxManager) -> None:
        self._sandboxes = sandboxes

    @mapped
    async def EnsureSandbox(self, request: Any, context: Any) -> Any:
        await self._sandboxes.ensure(request.key)
        return sandbox_to_pb(await self._sandboxes.get(request.key))

    @mapped
    async def GetSandbox(self, request: Any, context: Any) -> Any:
        return sandbox_to_pb(await self._sandboxes.get(request.key))

    @mapped
    async def ListSandboxes(self, request: Any, context: Any) -> Any:
        infos = await self._sandboxes.list()
        return sandbox_pb2.ListSandboxesResponse(sandboxes=[sandbox_to_pb(i) for i in infos])

    @mapped
    async def DestroySandbox(self, request: Any, context: Any) -> Any:
        removed, deleted = await self._sandboxes.destroy(
            request.key, delete_workspace=request.delete_workspace
        )
        return sandbox_pb2.DestroySandboxResponse(removed=removed, workspace_deleted=deleted)


class ToolServicer(tool_pb2_grpc.ToolServiceServicer):
    def __init__(self, pipeline: ToolPipeline) -> None:
        self._pipeline = pipeline

    @mapped
    async def ListTools(self, request: Any, context: Any) -> Any:
        specs = [
            tool_pb2.ToolSpec(
                name=t.name,
                group=t.group,
                description=t.description,
                parameters_json_schema=json.dumps(t.parameters),
                profiles=list(t.profiles),
            )
            for t in TOOLS.values()
        ]
        return tool_pb2.ListToolsResponse(tools=specs)

    @mapped
    async def CallTool(self, request: Any, context: Any) -> Any:
        call = ToolCall(
            sandbox_key=request.sandbox_key,
            tool=request.tool,
            arguments_json=request.arguments_json,
            context=context_from_pb(request.context),
            timeout_ms=request.timeout_ms,
            request_id=request.request_id,
        )
        return result_to_pb(await self._pipeline.call(call))


class Server:
    """The running gRPC server; `port` is the bound TCP port (0 for a unix socket)."""

    def __init__(self, config: Config, sandboxes: SandboxManager) -> None:
        self.config = config
        self.sandboxes = sandboxes
        self.health = HealthServicer()
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", config.max_request_bytes),
                ("grpc.max_send_message_length", config.max_response_bytes),
                ("grpc.so_reuseport", 0),
            ]
        )
        pipeline = ToolPipeline(config, sandboxes)
        sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(
            SandboxServicer(sandboxes), self._server
        )
        tool_pb2_grpc.add_ToolServiceServicer_to_server(ToolServicer(pipeline), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection((*SERVICES, reflection.SERVICE_NAME), self._server)
        self.port = self._server.add_insecure_port(config.listen)
        if self.port == 0 and not config.listen.startswith("unix:"):
            raise errors.ConfigError(f"cannot listen on {config.listen}")

    async def start(self) -> None:
        await self._server.start()
        for name in ("", *SERVICES[:2]):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def wait(self) -> None:
        await self._server.wait_for_termination()

    async def stop(self, grace: float = 5.0) -> None:
        """Graceful: health goes NOT_SERVING, in-flight calls get `grace` seconds."""
        await self.health.enter_graceful_shutdown()
        await self._server.stop(grace)
        await self.sandboxes.close()
