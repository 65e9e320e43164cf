"""The supervisor's end of the agent protocol: one gRPC channel per sandbox, over a unix socket."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from stockade.agent.v1 import agent_pb2, agent_pb2_grpc
from stockade.supervisor.errors import SandboxBroken

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
MAX_SOCKET_PATH = 107
MAX_FACT_BYTES = 1 << 20
_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 20),
    ("grpc.min_reconnect_backoff_ms", 20),
    ("grpc.max_reconnect_backoff_ms", 500),
]
_AGENT_CODES = {
    agent_pb2.AGENT_ERROR_CODE_OK: "",
    agent_pb2.AGENT_ERROR_CODE_UNKNOWN_TOOL: "NOT_FOUND",
    agent_pb2.AGENT_ERROR_CODE_INVALID_ARGS: "INVALID_ARGS",
    agent_pb2.AGENT_ERROR_CODE_EXECUTION_FAILED: "EXECUTION_FAILED",
    agent_pb2.AGENT_ERROR_CODE_PERMISSION_DENIED: "PERMISSION_DENIED",
    agent_pb2.AGENT_ERROR_CODE_FILE_NOT_FOUND: "FILE_NOT_FOUND",
    agent_pb2.AGENT_ERROR_CODE_INVALID_PATH: "INVALID_PATH",
    agent_pb2.AGENT_ERROR_CODE_TIMEOUT: "TIMEOUT",
}


class AgentCallFailed(Exception):
    """The RPC to the agent failed (connection lost, deadline, oversized reply)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


@dataclass(frozen=True)
class AgentStarted:
    pid: int


@dataclass(frozen=True)
class AgentOutput:
    fd: int
    data: bytes


@dataclass(frozen=True)
class AgentFacts:
    """The agent's answer to Inspect: raw bytes and strings, not yet parsed or trusted."""

    files: dict[str, bytes | str]
    """path -> content, or the errno name (a str) when it could not be read."""
    links: dict[str, str]
    """path -> target ("" when it could not be read)."""
    root_read_only: bool
    write_probe_error: str


@dataclass(frozen=True)
class AgentReply:
    error_code: str
    """Empty on success, else an ErrorCode name."""
    error_message: str
    result: dict[str, Any] | None


class AgentConnection:
    def __init__(self, socket_path: Path) -> None:
        if len(str(socket_path)) > MAX_SOCKET_PATH:
            raise SandboxBroken(
                f"agent socket path {socket_path} is longer than {MAX_SOCKET_PATH} bytes; "
                "use a shorter state_dir"
            )
        self.socket_path = socket_path
        self._channel = grpc.aio.insecure_channel(f"unix:{socket_path}", options=_OPTIONS)
        self._stub = agent_pb2_grpc.AgentServiceStub(self._channel)

    def is_ready(self) -> bool:
        return bool(self._channel.get_state() == grpc.ChannelConnectivity.READY)

    async def wait_ready(self, timeout: float) -> None:
        """Wait for the agent to answer Hello with our protocol version."""
        deadline = time.monotonic() + timeout
        while not self.socket_path.exists():
            if time.monotonic() > deadline:
                raise SandboxBroken(f"agent did not create its socket within {timeout:.0f} s")
            await asyncio.sleep(0.003)
        try:
            hello = await self._stub.Hello(
                agent_pb2.HelloRequest(),
                timeout=max(deadline - time.monotonic(), 0.1),
                wait_for_ready=True,
            )
        except grpc.aio.AioRpcError as exc:
            raise SandboxBroken(f"agent does not answer: {exc.details()}") from exc
        if hello.protocol_version != PROTOCOL_VERSION:
            raise SandboxBroken(
                f"agent speaks protocol {hello.protocol_version}, supervisor {PROTOCOL_VERSION}; "
                "rebuild the sandbox image with `stockade image build`"
            )

    async def answers(self, timeout: float = 0.5) -> bool:
        """True if the agent answers Hello now (the container and its agent live)."""
        try:
            await self._stub.Hello(agent_pb2.HelloRequest(), timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
        return True

    async def invoke(
        self, tool: str, arguments: dict[str, Any], timeout: float, request_id: str
    ) -> AgentReply:
        request = agent_pb2.InvokeRequest(
            tool=tool, arguments_json=json.dumps(arguments), request_id=request_id
        )
        try:
            reply = await self._stub.Invoke(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise AgentCallFailed(exc.code(), exc.details() or "") from exc
        return _parse_reply(reply)

    async def invoke_stream(
        self, tool: str, arguments: dict[str, Any], timeout: float, request_id: str
    ) -> AsyncIterator[AgentStarted | AgentOutput | AgentReply]:
        """Started and output events as the tool runs; the reply last."""
        request = agent_pb2.InvokeRequest(
            tool=tool, arguments_json=json.dumps(arguments), request_id=request_id
        )
        call = self._stub.InvokeStream(request, timeout=timeout)
        try:
            async for event in call:
                parsed = _parse_event(event)
                yield parsed
                if isinstance(parsed, AgentReply):
                    return
            raise SandboxBroken("the agent's stream ended without a result")
        except grpc.aio.AioRpcError as exc:
            raise AgentCallFailed(exc.code(), exc.details() or "") from exc
        finally:
            call.cancel()

    async def upload(
        self, path: str, tar: bool, mode: int, chunks: AsyncIterator[bytes], timeout: float
    ) -> AgentReply:
        async def requests() -> AsyncIterator[Any]:
            header = agent_pb2.TransferHeader(path=path, tar=tar, mode=mode)
            yield agent_pb2.UploadChunk(header=header)
            async for data in chunks:
                yield agent_pb2.UploadChunk(data=data)

        try:
            reply = await self._stub.Upload(requests(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise AgentCallFailed(exc.code(), exc.details() or "") from exc
        return _parse_reply(reply)

    async def download(
        self, path: str, tar: bool, timeout: float
    ) -> AsyncIterator[bytes | AgentReply]:
        """Data chunks, then the reply."""
        call = self._stub.Download(agent_pb2.DownloadRequest(path=path, tar=tar), timeout=timeout)
        try:
            async for chunk in call:
                if chunk.WhichOneof("part") == "data":
                    yield bytes(chunk.data)
                else:
                    yield _parse_reply(chunk.result)
                    return
            raise SandboxBroken("the agent's download ended without a result")
        except grpc.aio.AioRpcError as exc:
            raise AgentCallFailed(exc.code(), exc.details() or "") from exc
        finally:
            call.cancel()

    async def inspect(
        self, files: list[str], links: list[str], write_probe: str, timeout: float
    ) -> AgentFacts:
        """Raw facts from inside; only the paths asked for are kept, each at most
        MAX_FACT_BYTES (a hostile agent may answer anything)."""
        request = agent_pb2.InspectRequest(
            files=files, links=links, write_probe=write_probe, max_file_bytes=MAX_FACT_BYTES
        )
        try:
            reply = await self._stub.Inspect(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise SandboxBroken(
                    "the sandbox's agent predates Inspect; rebuild the image "
                    "(`stockade image build`) and recreate the sandbox (`stockade rm KEY`)"
                ) from exc
            raise AgentCallFailed(exc.code(), exc.details() or "") from exc
        wanted_files, wanted_links = set(files), set(links)
        read: dict[str, bytes | str] = {}
        for f in reply.files:
            if f.path in wanted_files:
                read[f.path] = bytes(f.content[:MAX_FACT_BYTES]) if not f.error else f.error[:64]
        targets = {k.path: k.target[:4096] for k in reply.links if k.path in wanted_links}
        return AgentFacts(
            read, targets, bool(reply.root_statvfs_read_only), reply.write_probe_error[:64]
        )

    async def close(self) -> None:
        await self._channel.close()


def _parse_event(event: Any) -> AgentStarted | AgentOutput | AgentReply:
    kind = event.WhichOneof("event")
    if kind == "started":
        return AgentStarted(int(event.started.pid))
    if kind == "output":
        if event.output.fd not in (1, 2):
            raise SandboxBroken(f"agent sent output for fd {event.output.fd}")
        return AgentOutput(int(event.output.fd), bytes(event.output.data))
    if kind == "result":
        return _parse_reply(event.result)
    raise SandboxBroken("agent sent an empty event")


def _parse_reply(reply: Any) -> AgentReply:
    """Nothing the agent says is trusted: check every field before use."""
    code = _AGENT_CODES.get(reply.error_code)
    if code is None:
        code = "EXECUTION_FAILED"
    result: dict[str, Any] | None = None
    if reply.result_json:
        try:
            parsed = json.loads(reply.result_json)
        except ValueError as exc:
            raise SandboxBroken(f"agent sent a result that is not JSON: {exc}") from exc
        if not isinstance(parsed, dict):
            raise SandboxBroken("agent sent a result that is not a JSON object")
        result = parsed
    if not code and result is None:
        raise SandboxBroken("agent sent neither a result nor an error")
    return AgentReply(code, str(reply.error_message)[:65536], result)
