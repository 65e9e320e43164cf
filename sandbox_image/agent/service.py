"""What the agent serves, whatever carries it: Hello, Invoke and the streams beside it, as
protobuf messages in and out. The framed socket (frames.py) carries them for a supervisor on
the same host, gRPC with mutual TLS (grpc_server.py) for one over the network. Imports no
grpc: an agent on a unix socket never loads it (memory and start: docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from stockade.agent import (
    PROTOCOL_VERSION,
    __version__,
    inspect,
    paths,
    tools,
    transfers,
    watch,
)
from stockade.agent.errors import ToolError, from_os_error, wire_text
from stockade.agent.execute import StreamSink
from stockade.agent.processes import ProcessTable
from stockade.agent.v1 import agent_pb2

log = logging.getLogger("stockade.agent")
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
_CODES = {
    "UNKNOWN_TOOL": agent_pb2.AGENT_ERROR_CODE_UNKNOWN_TOOL,
    "INVALID_ARGS": agent_pb2.AGENT_ERROR_CODE_INVALID_ARGS,
    "EXECUTION_FAILED": agent_pb2.AGENT_ERROR_CODE_EXECUTION_FAILED,
    "PERMISSION_DENIED": agent_pb2.AGENT_ERROR_CODE_PERMISSION_DENIED,
    "FILE_NOT_FOUND": agent_pb2.AGENT_ERROR_CODE_FILE_NOT_FOUND,
    "INVALID_PATH": agent_pb2.AGENT_ERROR_CODE_INVALID_PATH,
    "TIMEOUT": agent_pb2.AGENT_ERROR_CODE_TIMEOUT,
}
_CHANGE_KINDS = {
    "create": agent_pb2.FILE_CHANGE_KIND_CREATE,
    "write": agent_pb2.FILE_CHANGE_KIND_WRITE,
    "remove": agent_pb2.FILE_CHANGE_KIND_REMOVE,
    "rename": agent_pb2.FILE_CHANGE_KIND_RENAME,
    "chmod": agent_pb2.FILE_CHANGE_KIND_CHMOD,
    "overflow": agent_pb2.FILE_CHANGE_KIND_OVERFLOW,
    "gone": agent_pb2.FILE_CHANGE_KIND_GONE,
}


class Activity:
    """When the agent last served a call, for Hello's idle_ms: supervisor replicas that share
    a pod cannot see each other's calls, but each can ask the agent."""

    def __init__(self) -> None:
        self._busy = 0
        self._since = time.monotonic()

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1
            self._since = time.monotonic()

    def idle_ms(self) -> int:
        if self._busy:
            return 0
        return int((time.monotonic() - self._since) * 1000)


class AgentService:
    def __init__(
        self, workspace: Path, max_output_bytes: int, processes: ProcessTable | None = None
    ) -> None:
        self._workspace = workspace
        self._max_output_bytes = max_output_bytes
        self._processes = processes
        self.activity = Activity()

    async def hello(self) -> Any:
        """Not a call: a probe does not reset idle_ms."""
        return agent_pb2.HelloResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_version=__version__,
            pid=os.getpid(),
            uid=os.getuid(),
            workspace=str(self._workspace),
            idle_ms=self.activity.idle_ms(),
        )

    async def invoke(self, request: Any) -> Any:
        """Invoke's reply."""
        with self.activity.call():
            return await self._respond(request, None)

    async def invoke_stream(self, request: Any) -> AsyncGenerator[Any, None]:
        """InvokeStream's events."""
        # closed here, not left to the collector: closing it ends what it started
        async with contextlib.aclosing(self._invoke_stream(request)) as inner:
            with self.activity.call():
                async for event in inner:
                    yield event

    async def _invoke_stream(self, request: Any) -> AsyncGenerator[Any, None]:
        """Started and output events while the tool runs, then its result. When the caller
        goes away this generator is closed and the tool's task cancelled (exec then kills
        its process group)."""
        attach = _attach_request(request)
        if attach is not None and self._processes is not None:
            follow = self._follow_start if attach["action"] == "start" else self._attach
            async for event in follow(attach):
                yield event
            return
        sink = StreamSink()
        task = asyncio.create_task(self._respond(request, sink))
        try:
            while True:
                item = asyncio.ensure_future(sink.get())
                await asyncio.wait({item, task}, return_when=asyncio.FIRST_COMPLETED)
                if not item.done():
                    item.cancel()
                    break
                yield _event(*item.result())
            while not sink.queue.empty():
                yield _event(*sink.queue.get_nowait())
            yield agent_pb2.InvokeEvent(result=task.result())
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _attach(self, args: dict[str, Any]) -> AsyncIterator[Any]:
        """Stream a background process's output until it ends (fd 1, or 2 for the stderr of
        a process started with separate_stderr), then its state."""
        assert self._processes is not None
        try:
            async for _, fd, chunk in self._processes.attach(args):
                yield agent_pb2.InvokeEvent(output=agent_pb2.Output(fd=fd, data=chunk))
            state = await self._processes.handle({"action": "poll", "id": args.get("id")})
        except ToolError as exc:
            yield agent_pb2.InvokeEvent(result=_error(exc.code, exc.message))
            return
        yield agent_pb2.InvokeEvent(result=agent_pb2.InvokeResponse(result_json=json.dumps(state)))

    async def _follow_start(self, args: dict[str, Any]) -> AsyncIterator[Any]:
        """`process start` with `follow`: start it, say its pid, then attach to it. Closing
        the stream detaches: the process runs on, as after an attach."""
        assert self._processes is not None
        try:
            started = await self._processes.start_following(args)
        except ToolError as exc:
            yield agent_pb2.InvokeEvent(result=_error(exc.code, exc.message))
            return
        yield agent_pb2.InvokeEvent(started=agent_pb2.Started(pid=int(started["pid"])))
        async for event in self._attach({"action": "attach", "id": started["id"]}):
            if event.WhichOneof("event") == "result" and event.result.result_json:
                state = json.loads(event.result.result_json)
                event = agent_pb2.InvokeEvent(
                    result=agent_pb2.InvokeResponse(result_json=json.dumps({**started, **state}))
                )
            yield event

    async def upload(self, request_iterator: AsyncIterator[Any]) -> Any:
        """UploadChunks (the header first, then data) to the reply."""
        with self.activity.call():
            return await self._upload(request_iterator)

    async def _upload(self, request_iterator: AsyncIterator[Any]) -> Any:
        """The first chunk is the header; the rest is data."""
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("part") != "header":
            return _error("INVALID_ARGS", "an upload starts with its header")
        header = first.header

        async def chunks() -> AsyncIterator[bytes]:
            async for chunk in request_iterator:
                if chunk.WhichOneof("part") == "data":
                    yield chunk.data

        try:
            root = paths.CONTAINER if header.container_wide else self._workspace
            result = await transfers.receive(
                root, header.path, tar=header.tar, mode=header.mode, chunks=chunks()
            )
        except ToolError as exc:
            return _error(exc.code, exc.message)
        except OSError as exc:  # a folder that vanished under a race: the caller's error
            error = from_os_error(exc, header.path)
            return _error(error.code, error.message)
        return agent_pb2.InvokeResponse(result_json=json.dumps(result))

    async def download(self, request: Any) -> AsyncGenerator[Any, None]:
        """DownloadChunks: data, then the result."""
        # closed here, not left to the collector: closing it ends what it started
        async with contextlib.aclosing(self._download(request)) as inner:
            with self.activity.call():
                async for chunk in inner:
                    yield chunk

    async def _download(self, request: Any) -> AsyncGenerator[Any, None]:
        try:
            root = paths.CONTAINER if request.container_wide else self._workspace
            async for item in transfers.send(root, request.path, tar=request.tar):
                if isinstance(item, bytes):
                    yield agent_pb2.DownloadChunk(data=item)
                else:
                    done = agent_pb2.InvokeResponse(result_json=json.dumps(item))
                    yield agent_pb2.DownloadChunk(result=done)
        except ToolError as exc:
            yield agent_pb2.DownloadChunk(result=_error(exc.code, exc.message))
        except OSError as exc:  # a file that vanished under a race: the caller's error
            error = from_os_error(exc, request.path)
            yield agent_pb2.DownloadChunk(result=_error(error.code, error.message))

    async def inspect(self, request: Any) -> Any:
        """Raises ValueError for limits out of range (the carrier's INVALID_ARGUMENT)."""
        limit = inspect.limits(len(request.files) + len(request.links), request.max_file_bytes)
        files = [inspect.read_file(p, limit) for p in request.files]
        links = [inspect.read_link(p) for p in request.links]
        return agent_pb2.InspectResponse(
            files=[
                agent_pb2.FileRead(path=r.path, content=r.content, error=r.error) for r in files
            ],
            links=[
                agent_pb2.LinkRead(
                    path=r.path, target=r.content.decode(errors="replace"), error=r.error
                )
                for r in links
            ],
            root_statvfs_read_only=inspect.root_read_only(),
            write_probe_error=inspect.write_probe(request.write_probe),
        )

    async def watch_files(self, request: Any) -> AsyncGenerator[Any, None]:
        """WatchEvents: started, changes, then a result."""
        # closed here, not left to the collector: closing it ends what it started
        async with contextlib.aclosing(self._watch_files(request)) as inner:
            with self.activity.call():
                async for event in inner:
                    yield event

    async def _watch_files(self, request: Any) -> AsyncGenerator[Any, None]:
        """Started, changes, then a result (see agent.proto). Cancelling the call closes
        the generator, and with it the inotify descriptor."""
        try:
            w = await watch.watch(self._workspace, request.path, request.recursive)
        except ToolError as exc:
            yield agent_pb2.WatchEvent(result=_error(exc.code, exc.message))
            return
        try:
            yield agent_pb2.WatchEvent(started=agent_pb2.WatchStarted(path=wire_text(w.folder)))
            async for change in w.changes():
                kind = _CHANGE_KINDS[change.kind]
                name = wire_text(change.name)
                yield agent_pb2.WatchEvent(
                    change=agent_pb2.FileChange(kind=kind, name=name, is_dir=change.is_dir)
                )
            yield agent_pb2.WatchEvent(result=agent_pb2.InvokeResponse(result_json="{}"))
        except ToolError as exc:  # too many folders, once new ones appear
            yield agent_pb2.WatchEvent(result=_error(exc.code, exc.message))
        finally:
            w.close()

    async def _respond(self, request: Any, sink: StreamSink | None) -> Any:
        try:
            args = json.loads(request.arguments_json or "{}")
        except ValueError as exc:
            return _error("INVALID_ARGS", f"arguments are not valid JSON: {exc}")
        try:
            result = await tools.run(
                request.tool,
                args,
                root=self._workspace,
                max_output_bytes=self._max_output_bytes,
                sink=sink,
                processes=self._processes,
            )
        except ToolError as exc:
            return _error(exc.code, exc.message)
        except Exception as exc:
            log.exception("tool %s failed", request.tool)
            return _error("INTERNAL", f"agent error in {request.tool}: {type(exc).__name__}: {exc}")
        # ASCII-escaped: file names that are not UTF-8 carry lone surrogates, which protobuf
        # strings cannot hold; escaped, they reach the supervisor intact.
        return agent_pb2.InvokeResponse(result_json=json.dumps(result))


def _attach_request(request: Any) -> dict[str, Any] | None:
    """The arguments when the request is `process` action `attach`, or `start` with
    `follow`, else None."""
    if request.tool != "process":
        return None
    try:
        args = json.loads(request.arguments_json or "{}")
    except ValueError:
        return None
    if not isinstance(args, dict):
        return None
    action = args.get("action")
    return args if action == "attach" or (action == "start" and args.get("follow")) else None


def _event(fd: int, data: bytes) -> Any:
    if fd == 0:
        return agent_pb2.InvokeEvent(started=agent_pb2.Started(pid=int(data)))
    return agent_pb2.InvokeEvent(output=agent_pb2.Output(fd=fd, data=data))


def _error(code: str, message: str) -> Any:
    """A failed call's reply; a code outside _CODES is INTERNAL."""
    return agent_pb2.InvokeResponse(
        error_code=_CODES.get(code, agent_pb2.AGENT_ERROR_CODE_INTERNAL),
        error_message=wire_text(message),
    )
