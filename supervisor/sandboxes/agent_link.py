"""The supervisor's end of the agent protocol, to an address the host kind chooses: a unix
socket in a bind-mounted folder (containers on this host), spoken as frames (agent_frames.py;
from protocol 4 every call, and no gRPC channel is ever made), or gRPC over TCP with mutual TLS
(an agent reached over the network, such as a pod's IP). An agent of protocol 3 or older on a
unix socket is greeted over gRPC and takes Invoke (and from 3 InvokeStream) framed, the rest
over gRPC. Everything above the link is the same code for all of them.

Nothing the agent sends is trusted (it runs as the same uid as the code in the sandbox): the
channel refuses messages over ReplyLimits.max_message_bytes, every reply is checked
(replies.py), streams must keep their order (at most one Started; output chunks of at most
MAX_CHUNK_BYTES; a result last), and a violation raises AgentMisbehaved.

AgentLink is what the rest of the supervisor may call on such a channel (AgentConnection is
the real one; tests put fakes that satisfy it in its place)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import grpc
from google.protobuf.message import DecodeError

from stockade.agent.v1 import agent_pb2, agent_pb2_grpc
from stockade.supervisor.engines.addresses import AgentAddress, UnixAddress
from stockade.supervisor.errors import AgentMisbehaved, SandboxBroken, SandboxLost
from stockade.supervisor.sandboxes.agent_frames import (
    DOWNLOAD,
    FRAMES_SUFFIX,
    HELLO,
    INSPECT,
    WATCH,
    FrameDeadline,
    FramedInvoke,
    FramedStream,
    FrameLost,
    FramesAbsent,
    FrameTooLarge,
)
from stockade.supervisor.sandboxes.replies import (
    MAX_CHUNK_BYTES,
    MAX_ERROR_MESSAGE,
    MAX_PID,
    ReplyInvalid,
    ReplyLimits,
    check_result,
    parse_result,
)

PROTOCOL_VERSION = 4
"""2: exec and process start take shell, login and session; the session tool. 3: InvokeStream
over the framed socket too. 4: every call framed (Hello first), no gRPC on a unix socket."""
OLDEST_PROTOCOL = 2
"""Agents from here to PROTOCOL_VERSION are served (an older image's, adopted after a restart,
streams over gRPC)."""
FRAMED_STREAMS = 3
"""The first protocol whose agent takes InvokeStream on its framed socket."""
ALL_FRAMED = 4
"""The first protocol whose agent takes every call on its framed socket (greeted there)."""
MAX_SEND_BYTES = 128 * 1024 * 1024
MAX_FACT_BYTES = 1 << 20
_MESSAGE = "protobuf (UTF-8)"
_CLOSED = "the sandbox was destroyed or replaced while the call ran"
_OPTIONS = [
    # each channel its own connections: from the global pool, a new channel to a recreated
    # sandbox could reuse a live connection to the socket that was there before
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_send_message_length", MAX_SEND_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 20),
    ("grpc.min_reconnect_backoff_ms", 20),
    ("grpc.max_reconnect_backoff_ms", 500),
]
MAX_NAME_CHARS = 4096
_CHANGE_KINDS = {
    agent_pb2.FILE_CHANGE_KIND_CREATE: "create",
    agent_pb2.FILE_CHANGE_KIND_WRITE: "write",
    agent_pb2.FILE_CHANGE_KIND_REMOVE: "remove",
    agent_pb2.FILE_CHANGE_KIND_RENAME: "rename",
    agent_pb2.FILE_CHANGE_KIND_CHMOD: "chmod",
    agent_pb2.FILE_CHANGE_KIND_OVERFLOW: "overflow",
    agent_pb2.FILE_CHANGE_KIND_GONE: "gone",
}
_AGENT_CODES = {
    agent_pb2.AGENT_ERROR_CODE_OK: "",
    agent_pb2.AGENT_ERROR_CODE_UNKNOWN_TOOL: "NOT_FOUND",
    agent_pb2.AGENT_ERROR_CODE_INVALID_ARGS: "INVALID_ARGS",
    agent_pb2.AGENT_ERROR_CODE_EXECUTION_FAILED: "EXECUTION_FAILED",
    agent_pb2.AGENT_ERROR_CODE_PERMISSION_DENIED: "PERMISSION_DENIED",
    agent_pb2.AGENT_ERROR_CODE_FILE_NOT_FOUND: "FILE_NOT_FOUND",
    agent_pb2.AGENT_ERROR_CODE_INVALID_PATH: "INVALID_PATH",
    agent_pb2.AGENT_ERROR_CODE_TIMEOUT: "TIMEOUT",
    agent_pb2.AGENT_ERROR_CODE_INTERNAL: "EXECUTION_FAILED",
}


class AgentCallFailed(Exception):
    """The RPC to the agent failed (connection lost, deadline, oversized reply)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


_PROBE_FAILURES = (
    grpc.aio.AioRpcError,
    grpc.aio.UsageError,
    SandboxLost,
    AgentCallFailed,
    FramesAbsent,
)
"""What leaves a probe's Hello unanswered (AgentCallFailed: a framed one's failure)."""


@dataclass(frozen=True)
class AgentStarted:
    pid: int


@dataclass(frozen=True)
class AgentOutput:
    fd: int
    data: bytes


@dataclass(frozen=True)
class AgentWatchStarted:
    path: str
    """The watched folder, relative to the workspace."""


@dataclass(frozen=True)
class AgentFileChange:
    kind: str
    """create, write, remove, rename, chmod, overflow or gone (the last two end the watch)."""
    name: str
    is_dir: bool


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


AgentWatchEvent: TypeAlias = AgentWatchStarted | AgentFileChange | AgentReply


class AgentLink(Protocol):
    """What the sandboxes' code calls on the link to a sandbox's agent."""

    def is_ready(self) -> bool: ...

    async def wait_ready(self, timeout: float) -> None: ...

    async def answers(self, timeout: float = 0.5) -> bool: ...

    async def idle_s(self, timeout: float = 2.0) -> float | None: ...

    async def invoke(
        self, tool: str, arguments: dict[str, Any], timeout: float, request_id: str
    ) -> AgentReply: ...

    def invoke_stream(
        self, tool: str, arguments: dict[str, Any], timeout: float, request_id: str
    ) -> AsyncIterator[AgentStarted | AgentOutput | AgentReply]: ...

    async def upload(
        self,
        path: str,
        tar: bool,
        mode: int,
        chunks: AsyncIterator[bytes],
        timeout: float,
        wide: bool = False,
    ) -> AgentReply: ...

    def download(
        self, path: str, tar: bool, timeout: float, wide: bool = False
    ) -> AsyncIterator[bytes | AgentReply]: ...

    def watch_files(self, path: str, recursive: bool) -> AsyncIterator[AgentWatchEvent]: ...

    async def inspect(
        self, files: list[str], links: list[str], write_probe: str, timeout: float
    ) -> AgentFacts: ...

    def moved_to(self, address: AgentAddress | Path) -> bool: ...

    async def close(self) -> None: ...


class AgentConnection:
    def __init__(self, address: AgentAddress | Path, limits: ReplyLimits | None = None) -> None:
        """A Path is a unix socket (UnixAddress)."""
        self.address = UnixAddress(address) if isinstance(address, Path) else address
        self.limits = limits or ReplyLimits()
        self._options = [
            *_OPTIONS,
            ("grpc.max_receive_message_length", self.limits.max_message_bytes),
        ]
        self._channel: grpc.aio.Channel | None = None
        """Made at the first gRPC call: never for an agent that takes every call framed."""
        self._grpc_stub: Any = None
        self._all_framed = False
        """Whether the agent answered Hello on its framed socket (ALL_FRAMED): every call goes
        there, and a framed socket gone is an agent gone, not a reason to try gRPC."""
        self._closed = False
        self._frames: FramedInvoke | None = None
        """Unary Invoke over the agent's framed socket, on this host (agent_frames.py);
        None over TCP, and once the agent turned out to have none."""
        self._framed_streams = False
        """Whether the agent's Hello said it takes InvokeStream framed too (FRAMED_STREAMS):
        decided before any stream, never by trying one (a retry could run it twice)."""
        if isinstance(self.address, UnixAddress):
            path = self.address.path
            self.address.check(len(FRAMES_SUFFIX))
            self._frames = FramedInvoke(
                path.with_name(path.name + FRAMES_SUFFIX), self.limits.max_message_bytes
            )

    @property
    def _stub(self) -> Any:
        """The gRPC stub, its channel made at the first use."""
        if self._grpc_stub is None:
            self._channel = self.address.channel(self._options)
            self._grpc_stub = agent_pb2_grpc.AgentServiceStub(self._channel)
        return self._grpc_stub

    def is_ready(self) -> bool:
        """The channel is connected, or a framed connection is (calls that go framed leave
        the channel without RPCs: gRPC lets it go idle after 30 minutes)."""
        if self._frames is not None and not self._closed and self._frames.connected():
            return True
        if self._channel is None:
            return False
        return bool(self._channel.get_state() == grpc.ChannelConnectivity.READY)

    async def wait_ready(self, timeout: float) -> None:
        """Wait for the agent to answer Hello with our protocol version: on its framed socket
        (ALL_FRAMED), else, for an older agent or one over TCP, over gRPC."""
        deadline = time.monotonic() + timeout
        if self._frames is not None and not self._closed:
            hello = await self._framed_greeting(self._frames, deadline, timeout)
            if hello is not None:
                if hello.protocol_version < ALL_FRAMED:
                    raise SandboxBroken(
                        f"agent answered a framed Hello with protocol {hello.protocol_version}"
                    )
                self._all_framed = self._framed_streams = True
                return
        while not self.address.present():
            if time.monotonic() > deadline:
                raise SandboxBroken(f"agent did not create its socket within {timeout:.0f} s")
            await asyncio.sleep(0.003)
        try:
            with self._closing():
                hello = await self._stub.Hello(
                    agent_pb2.HelloRequest(),
                    timeout=max(deadline - time.monotonic(), 0.1),
                    wait_for_ready=True,
                )
        except grpc.aio.AioRpcError as exc:
            raise SandboxBroken(f"agent does not answer: {exc.details()}") from exc
        except SandboxLost as exc:
            raise SandboxBroken(f"agent does not answer: {exc}") from exc
        self._check_protocol(hello)
        self._framed_streams = hello.protocol_version >= FRAMED_STREAMS

    def _check_protocol(self, hello: Any) -> None:
        if hello is None:
            raise SandboxBroken(f"agent answered Hello with no valid {_MESSAGE} message")
        if not OLDEST_PROTOCOL <= hello.protocol_version <= PROTOCOL_VERSION:
            raise SandboxBroken(
                f"agent speaks protocol {hello.protocol_version}, supervisor {PROTOCOL_VERSION}; "
                "rebuild the sandbox image with `stockade image build`"
            )

    async def _framed_greeting(
        self, frames: FramedInvoke, deadline: float, timeout: float
    ) -> Any | None:
        """Hello on the framed socket once the agent made it, its protocol checked; None when
        the agent is older (it closed the connection on the typed frame, or made only a gRPC
        socket)."""
        while True:
            if os.path.lexists(frames.path):
                try:
                    left = max(deadline - time.monotonic(), 0.1)
                    hello = await self._framed_hello(left, sealed=False)
                    self._check_protocol(hello)
                    return hello
                except FramesAbsent:  # made, not yet listening; or not a socket to trust
                    pass
                except AgentCallFailed as exc:
                    if exc.code == grpc.StatusCode.UNAVAILABLE:
                        return None  # closed on the typed frame: protocol 3 or older
                    raise SandboxBroken(f"agent does not answer: {exc.details}") from exc
                except SandboxLost as exc:
                    raise SandboxBroken(f"agent does not answer: {exc}") from exc
            if self.address.present():
                return None  # a gRPC socket, and no framed one to use
            if time.monotonic() > deadline:
                raise SandboxBroken(f"agent did not create its socket within {timeout:.0f} s")
            await asyncio.sleep(0.003)

    async def _framed_hello(self, timeout: float, sealed: bool = True) -> Any | None:
        """The agent's HelloResponse over the framed socket (None: bytes that are not one).
        `sealed` False at the greeting: the agent's folder is sealed once it answered."""
        assert self._frames is not None
        with self._frame_failures():
            data = await self._frames.call(b"", timeout, HELLO, sealed)
        return _parsed(agent_pb2.HelloResponse(), data)

    async def _hello(self, timeout: float) -> Any | None:
        """A probe's Hello, framed or over gRPC as the agent was greeted."""
        if self._all_framed:
            return await self._framed_hello(timeout)
        return await self._stub.Hello(agent_pb2.HelloRequest(), timeout=timeout)

    async def answers(self, timeout: float = 0.5) -> bool:
        """True if the agent answers Hello now (the container and its agent live); False
        too once this connection is closed (the sandbox was discarded meanwhile)."""
        if self._closed:
            return False
        try:
            with self._closing():
                hello = await self._hello(timeout)
        except _PROBE_FAILURES:  # SandboxLost: closed meanwhile
            return False
        # grpc.aio hands on a message it cannot decode as None, an answer all the same
        return hello is not None or not self._all_framed

    async def idle_s(self, timeout: float = 2.0) -> float | None:
        """Seconds since the agent last served any supervisor a call (0 while one is in
        flight, and from an agent too old to say), or None when it does not answer."""
        if self._closed:
            return None
        try:
            with self._closing():
                hello = await self._hello(timeout)
        except _PROBE_FAILURES:
            return None
        return hello.idle_ms / 1000.0 if hello is not None else None

    async def invoke(
        self, tool: str, arguments: dict[str, Any], timeout: float, request_id: str
    ) -> AgentReply:
        request = agent_pb2.InvokeRequest(
            tool=tool, arguments_json=json.dumps(arguments), request_id=request_id
        )
        if self._frames is not None and not self._closed:
            try:
                return self._reply(tool, await self._framed(self._frames, request, timeout))
            except FramesAbsent:
                self._frames = None  # an agent older than its framed socket: gRPC from now on
        with self._failures():
            reply = await self._stub.Invoke(request, timeout=timeout)
        return self._reply(tool, reply)

    async def _framed(self, frames: FramedInvoke, request: Any, timeout: float) -> Any | None:
        """The reply over the framed socket (None: bytes that are not an InvokeResponse, as
        grpc.aio hands on such a message); its failures as a gRPC call's would be."""
        with self._frame_failures():
            data = await frames.call(request.SerializeToString(), timeout)
        return _parsed(agent_pb2.InvokeResponse(), data)

    async def invoke_stream(
        self, tool: str, arguments: dict[str, Any], timeout: float, request_id: str
    ) -> AsyncIterator[AgentStarted | AgentOutput | AgentReply]:
        """Started and output events as the tool runs; the reply last."""
        request = agent_pb2.InvokeRequest(
            tool=tool, arguments_json=json.dumps(arguments), request_id=request_id
        )
        if self._frames is not None and self._framed_streams and not self._closed:
            try:
                with self._frame_failures():
                    stream = await self._frames.stream(request.SerializeToString(), timeout)
            except FramesAbsent:  # nothing was sent: gRPC from now on
                self._frames = None
            else:
                async for parsed in self._framed_stream(tool, stream):
                    yield parsed
                return
        call = self._stub.InvokeStream(request, timeout=timeout)
        order = _StreamOrder()
        try:
            with self._failures():
                async for event in call:
                    parsed = self._event(tool, event, order)
                    yield parsed
                    if isinstance(parsed, AgentReply):
                        return
            raise _misbehaved("its stream ended without a result")
        finally:
            call.cancel()

    async def _framed_stream(
        self, tool: str, stream: FramedStream
    ) -> AsyncIterator[AgentStarted | AgentOutput | AgentReply]:
        """InvokeStream's events over the framed socket, through the same checks as over
        gRPC; the connection is kept only once the result was read and passed them."""
        order = _StreamOrder()
        try:
            while True:
                with self._frame_failures():
                    data = await stream.next()
                event: Any = agent_pb2.InvokeEvent()
                try:
                    event.ParseFromString(data)
                except DecodeError:
                    event = None
                parsed = self._event(tool, event, order)
                if isinstance(parsed, AgentReply):
                    stream.end()
                yield parsed
                if isinstance(parsed, AgentReply):
                    return
        finally:
            stream.close()

    async def upload(
        self,
        path: str,
        tar: bool,
        mode: int,
        chunks: AsyncIterator[bytes],
        timeout: float,
        wide: bool = False,
    ) -> AgentReply:
        header = agent_pb2.TransferHeader(path=path, tar=tar, mode=mode, container_wide=wide)
        if self._all_framed and self._frames is not None:

            async def serialized() -> AsyncIterator[bytes]:
                async for data in chunks:
                    yield agent_pb2.UploadChunk(data=data).SerializeToString()

            first = agent_pb2.UploadChunk(header=header).SerializeToString()
            with self._frame_failures():
                data = await self._frames.upload(first, serialized(), timeout)
            return self._reply("transfer", _parsed(agent_pb2.InvokeResponse(), data))

        async def requests() -> AsyncIterator[Any]:
            yield agent_pb2.UploadChunk(header=header)
            async for data in chunks:
                yield agent_pb2.UploadChunk(data=data)

        with self._failures():
            reply = await self._stub.Upload(requests(), timeout=timeout)
        return self._reply("transfer", reply)

    async def download(
        self, path: str, tar: bool, timeout: float, wide: bool = False
    ) -> AsyncIterator[bytes | AgentReply]:
        """Data chunks, then the reply."""
        request = agent_pb2.DownloadRequest(path=path, tar=tar, container_wide=wide)
        call = self._typed_stream(request, timeout, DOWNLOAD, agent_pb2.DownloadChunk)
        if call is None:
            call = self._stub.Download(request, timeout=timeout)
        try:
            with self._failures():
                async for chunk in call:
                    if chunk is None:
                        raise _misbehaved(
                            f"a download chunk that is not a valid {_MESSAGE} message"
                        )
                    part = chunk.WhichOneof("part")
                    if part == "data":
                        yield _chunk(chunk.data)
                    elif part == "result":
                        reply = self._reply("transfer", chunk.result)
                        if isinstance(call, _TypedStream):
                            call.end()
                        yield reply
                        return
                    else:
                        raise _misbehaved("it sent an empty download chunk")
            raise _misbehaved("its download ended without a result")
        finally:
            call.cancel()

    async def watch_files(self, path: str, recursive: bool) -> AsyncIterator[AgentWatchEvent]:
        """Started, changes, then the reply; no deadline: the watch lasts until the caller
        stops iterating (which cancels the call, and the agent closes its inotify fd)."""
        request = agent_pb2.WatchFilesRequest(path=path, recursive=recursive)
        call = self._typed_stream(request, None, WATCH, agent_pb2.WatchEvent)
        if call is None:
            call = self._stub.WatchFiles(request)
        started = False
        try:
            with self._failures():
                try:
                    async for event in call:
                        kind = event.WhichOneof("event") if event is not None else None
                        if kind == "result":
                            reply = self._reply("watch_files", event.result)
                            if isinstance(call, _TypedStream):
                                call.end()
                            yield reply
                            return
                        if kind == "started" and not started:
                            started = True
                            yield AgentWatchStarted(str(event.started.path)[:MAX_NAME_CHARS])
                        elif kind == "change" and started:
                            yield _change(event.change)
                        else:
                            raise _misbehaved(f"it sent a watch event out of order ({kind})")
                except grpc.aio.AioRpcError as exc:
                    _unless_unknown(exc, "WatchFiles")
                    raise
            raise _misbehaved("its watch ended without a result")
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
        if self._all_framed and self._frames is not None:
            with self._frame_failures():
                data = await self._frames.call(request.SerializeToString(), timeout, INSPECT)
            reply = _parsed(agent_pb2.InspectResponse(), data)
            if reply is None:
                raise _misbehaved(f"Inspect: a reply that is not a valid {_MESSAGE} message")
        else:
            with self._failures():
                try:
                    reply = await self._stub.Inspect(request, timeout=timeout)
                except grpc.aio.AioRpcError as exc:
                    _unless_unknown(exc, "Inspect")
                    raise
        wanted_files, wanted_links = set(files), set(links)
        read: dict[str, bytes | str] = {}
        for f in reply.files:
            if f.path in wanted_files:
                read[f.path] = bytes(f.content[:MAX_FACT_BYTES]) if not f.error else f.error[:64]
        targets = {k.path: k.target[:4096] for k in reply.links if k.path in wanted_links}
        return AgentFacts(
            read, targets, bool(reply.root_statvfs_read_only), reply.write_probe_error[:64]
        )

    def _typed_stream(
        self, request: Any, timeout: float | None, typed: int, message: Any
    ) -> _TypedStream | None:
        """A Download's or WatchFiles' frames when the agent takes every call framed, else
        None (the caller uses gRPC)."""
        if not self._all_framed or self._frames is None:
            return None
        return _TypedStream(
            self, self._frames, request.SerializeToString(), timeout, typed, message
        )

    def moved_to(self, address: AgentAddress | Path) -> bool:
        """Keep this link for the agent whose socket folder was renamed (a warm-pool
        container taken by a key: pool.take): its open connections stay open (a connected
        socket does not follow its path), later ones go to `address`. False when it cannot
        follow (closed, an agent not greeted on its framed socket, or a gRPC channel made
        to the old path): the caller makes a new link then."""
        moved = UnixAddress(address) if isinstance(address, Path) else address
        if self._closed:
            return False
        if moved == self.address:
            return True
        if not (self._all_framed and self._channel is None and self._frames is not None):
            return False
        if not isinstance(moved, UnixAddress):
            return False
        moved.check(len(FRAMES_SUFFIX))
        self.address = moved
        self._frames.path = moved.path.with_name(moved.path.name + FRAMES_SUFFIX)
        return True

    async def close(self) -> None:
        """Close the channel and the framed connections; calls still in flight end with
        SandboxLost."""
        self._closed = True
        if self._frames is not None:
            self._frames.close()
        if self._channel is not None:
            await self._channel.close()

    @contextlib.contextmanager
    def _failures(self) -> Iterator[None]:
        """A failed RPC as AgentCallFailed; a call cut short by close() (its sandbox destroyed
        or replaced meanwhile) as SandboxLost, whatever status grpc gave it (CANCELLED, or for
        a stream on some grpcio releases UNAVAILABLE). grpc.aio may also cancel such calls by
        raising CancelledError in the task awaiting them, which a server handler would pass on
        as its own cancellation: its caller would then wait for a status that never comes."""
        try:
            with self._closing():
                yield
        except grpc.aio.AioRpcError as exc:
            if self._closed:
                raise SandboxLost(_CLOSED) from exc
            raise AgentCallFailed(exc.code(), exc.details() or "") from exc

    @contextlib.contextmanager
    def _frame_failures(self) -> Iterator[None]:
        """A framed call's failures as a gRPC call's would be."""
        try:
            with self._closing():
                yield
        except FrameDeadline as exc:
            raise AgentCallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc)) from exc
        except FrameTooLarge as exc:
            raise AgentCallFailed(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from exc
        except FrameLost as exc:
            if self._closed:
                raise SandboxLost(_CLOSED) from exc
            raise AgentCallFailed(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        except FramesAbsent as exc:
            # an agent greeted framed has no gRPC socket: its socket gone is the call failed;
            # an older one's calls go through gRPC from now on (the callers' fallback)
            if self._all_framed:
                raise AgentCallFailed(
                    grpc.StatusCode.UNAVAILABLE, f"the agent's socket: {exc}"
                ) from exc
            raise

    @contextlib.contextmanager
    def _closing(self) -> Iterator[None]:
        """A call cut short by close() that grpc.aio ended by cancelling the task awaiting
        it (not a cancellation of the task itself) as SandboxLost. Every call on this
        channel goes through here: in a server handler the stray CancelledError would end
        the handler as cancelled, and its caller would wait for a status that never comes
        (a GetSandbox whose health probe met a max-age replacement hung so)."""
        try:
            yield
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and task is not None and not task.cancelling():
                raise SandboxLost(_CLOSED) from None
            raise

    def _reply(self, tool: str, reply: Any) -> AgentReply:
        if reply is None:  # grpc.aio hands on a message it cannot decode as None
            raise _misbehaved(f"{tool}: a reply that is not a valid {_MESSAGE} message")
        try:
            return _parse_reply(tool, reply, self.limits)
        except ReplyInvalid as exc:
            raise _misbehaved(f"{tool}: {exc}") from exc

    def _event(
        self, tool: str, event: Any, order: _StreamOrder
    ) -> AgentStarted | AgentOutput | AgentReply:
        if event is None:
            raise _misbehaved(f"{tool}: an event that is not a valid {_MESSAGE} message")
        kind = event.WhichOneof("event")
        if kind == "result":
            return self._reply(tool, event.result)
        if kind == "started":
            return order.started(int(event.started.pid))
        if kind == "output":
            return order.output(int(event.output.fd), event.output.data)
        raise _misbehaved("it sent an empty event")


class _TypedStream:
    """A typed stream's messages (None: bytes that are not one), iterated and cancelled as
    grpc.aio's stream call is; `end` once its result was read (the connection is kept)."""

    def __init__(
        self,
        link: AgentConnection,
        frames: FramedInvoke,
        request: bytes,
        timeout: float | None,
        typed: int,
        message: Any,
    ) -> None:
        self._link, self._frames = link, frames
        self._request, self._timeout, self._typed = request, timeout, typed
        self._message = message
        self._stream: FramedStream | None = None

    def __aiter__(self) -> _TypedStream:
        return self

    async def __anext__(self) -> Any:
        with self._link._frame_failures():
            if self._stream is None:
                self._stream = await self._frames.stream(self._request, self._timeout, self._typed)
            data = await self._stream.next()
        return _parsed(self._message(), data)

    def end(self) -> None:
        if self._stream is not None:
            self._stream.end()

    def cancel(self) -> None:
        if self._stream is not None:
            self._stream.close()


def _parsed(message: Any, data: bytes) -> Any | None:
    """`message` parsed from `data`; None when they are not one (as grpc.aio hands on a
    message it cannot decode)."""
    try:
        message.ParseFromString(data)
    except DecodeError:
        return None
    return message


@dataclass
class _StreamOrder:
    """At most one Started (it may follow the first output: the agent's pipes can deliver
    before it learns the pid); output only on fd 1 and 2, in bounded chunks; the result ends
    the stream (the caller reads nothing after it)."""

    seen_started: bool = False

    def started(self, pid: int) -> AgentStarted:
        if self.seen_started:
            raise _misbehaved("it sent Started twice")
        if not 0 < pid <= MAX_PID:
            raise _misbehaved(f"it sent Started with pid {pid}")
        self.seen_started = True
        return AgentStarted(pid)

    def output(self, fd: int, data: bytes) -> AgentOutput:
        if fd not in (1, 2):
            raise _misbehaved(f"it sent output for fd {fd}")
        return AgentOutput(fd, _chunk(data))


def _unless_unknown(exc: grpc.aio.AioRpcError, rpc: str) -> None:
    """An agent that does not know `rpc` is older than this supervisor: SandboxBroken saying
    how to renew it."""
    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
        raise SandboxBroken(
            f"the sandbox's agent predates {rpc}; rebuild the image "
            "(`stockade image build`) and recreate the sandbox (`stockade rm KEY`)"
        ) from exc


def _change(change: Any) -> AgentFileChange:
    kind = _CHANGE_KINDS.get(change.kind)
    if kind is None:
        raise _misbehaved(f"it sent a file change of kind {change.kind}")
    name = str(change.name)
    if len(name) > MAX_NAME_CHARS:
        raise _misbehaved(f"it sent a file change for a name of {len(name)} characters")
    return AgentFileChange(kind, name, bool(change.is_dir))


def _chunk(data: bytes) -> bytes:
    if len(data) > MAX_CHUNK_BYTES:
        raise _misbehaved(f"it sent a chunk of {len(data)} bytes (at most {MAX_CHUNK_BYTES})")
    return bytes(data)


def _misbehaved(what: str) -> AgentMisbehaved:
    return AgentMisbehaved(f"the sandbox's agent broke the protocol: {what}")


def _parse_reply(tool: str, reply: Any, limits: ReplyLimits) -> AgentReply:
    """Nothing the agent says is trusted: check every field before use."""
    code = _AGENT_CODES.get(reply.error_code)
    if code is None:
        raise ReplyInvalid(f"unknown error code {reply.error_code}")
    result: dict[str, Any] | None = None
    if reply.result_json:
        result = parse_result(reply.result_json)
        check_result(tool, result, limits)
    if not code and result is None:
        raise ReplyInvalid("neither a result nor an error")
    # a message may quote what it could not take (a patch's context lines): cut, not refused
    return AgentReply(code, str(reply.error_message)[:MAX_ERROR_MESSAGE], result)
