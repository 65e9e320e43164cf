"""The agent's gRPC service: AgentService (service.py) served by grpc.aio on a TCP port with
mutual TLS (tls.py), for a supervisor that reaches the agent over the network (a pod's).
Imported only then: an agent on a unix socket speaks frames alone (frames.py) and never loads
grpc."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from stockade.agent import tls
from stockade.agent.service import MAX_MESSAGE_BYTES, AgentService
from stockade.agent.v1 import agent_pb2_grpc


class GrpcAgent(agent_pb2_grpc.AgentServiceServicer):
    """Each RPC as the service's method of the same name."""

    def __init__(self, service: AgentService) -> None:
        self.service = service

    async def Hello(self, request: Any, context: Any) -> Any:
        return await self.service.hello()

    async def Invoke(self, request: Any, context: Any) -> Any:
        return await self.service.invoke(request)

    async def InvokeStream(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async with contextlib.aclosing(self.service.invoke_stream(request)) as events:
            async for event in events:
                yield event

    async def Upload(self, request_iterator: Any, context: Any) -> Any:
        return await self.service.upload(request_iterator)

    async def Download(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async with contextlib.aclosing(self.service.download(request)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def Inspect(self, request: Any, context: Any) -> Any:
        try:
            return await self.service.inspect(request)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def WatchFiles(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async with contextlib.aclosing(self.service.watch_files(request)) as events:
            async for event in events:
                yield event


async def start(address: str, credentials: Any, service: AgentService) -> grpc.aio.Server:
    """A started grpc.aio server on `address` with `credentials` (tls.server_credentials),
    admitting supervisors only (tls.SupervisorsOnly)."""
    server = grpc.aio.server(
        interceptors=[tls.SupervisorsOnly()],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # the port is the agent's alone: with SO_REUSEPORT, code in the pod (the same
            # uid) could bind it too and take a share of the supervisor's connections
            ("grpc.so_reuseport", 0),
        ],
    )
    agent_pb2_grpc.add_AgentServiceServicer_to_server(GrpcAgent(service), server)
    server.add_secure_port(address, credentials)
    await server.start()
    return server
