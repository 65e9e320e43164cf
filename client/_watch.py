"""File watches (FileService.WatchFiles), sync and asyncio.

`watch_files` returns once the watch is in place (the server's `started` came), so a change
made after it returns is seen; then iterate for FileEvents until overflow or gone, or close
the watch (or leave its `with` block), which ends it inside the sandbox too."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import grpc

from stockade.client import _core
from stockade.v1 import file_pb2

EventType = Literal["create", "write", "remove", "rename", "chmod", "overflow", "gone"]
_TYPES: dict[int, EventType] = {
    file_pb2.FILE_EVENT_TYPE_CREATE: "create",
    file_pb2.FILE_EVENT_TYPE_WRITE: "write",
    file_pb2.FILE_EVENT_TYPE_REMOVE: "remove",
    file_pb2.FILE_EVENT_TYPE_RENAME: "rename",
    file_pb2.FILE_EVENT_TYPE_CHMOD: "chmod",
    file_pb2.FILE_EVENT_TYPE_OVERFLOW: "overflow",
    file_pb2.FILE_EVENT_TYPE_GONE: "gone",
}


@dataclass(frozen=True)
class FileEvent:
    type: EventType
    """overflow (events were lost) and gone (the folder was removed) end the watch."""
    name: str
    """Relative to the watched folder; "" for overflow and gone."""
    is_dir: bool = False


def watch_request(
    key: str, path: str, recursive: bool, context: _core.CallContext | None
) -> file_pb2.WatchFilesRequest:
    return file_pb2.WatchFilesRequest(
        sandbox_key=key, path=path, recursive=recursive, context=_core.context_pb(context)
    )


def _started(message: Any) -> str:
    if message is None or message.WhichOneof("event") != "started":
        raise _core.StockadeError("the watch did not start with its started event")
    return str(message.started.path)


def _event(message: Any) -> FileEvent:
    change = message.change
    return FileEvent(_TYPES.get(change.type, "overflow"), change.name, change.is_dir)


class FileWatch:
    """A watch in place (sync): iterate for events; close() ends it."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        try:
            self.path = _started(next(stream, None))
            """The watched folder, relative to the workspace."""
        except grpc.RpcError as exc:
            raise _core.error_from_rpc(exc) from None
        except BaseException:
            stream.cancel()
            raise

    def __enter__(self) -> FileWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[FileEvent]:
        try:
            for message in self._stream:
                yield _event(message)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise _core.error_from_rpc(exc) from None

    def close(self) -> None:
        self._stream.cancel()


class AsyncFileWatch:
    """A watch in place (asyncio): `async for` the events; close() ends it."""

    def __init__(self, stream: Any, path: str) -> None:
        self._stream = stream
        self.path = path
        """The watched folder, relative to the workspace."""

    @classmethod
    async def start(cls, stream: Any) -> AsyncFileWatch:
        try:
            first = await anext(aiter(stream), None)
            return cls(stream, _started(first))
        except grpc.RpcError as exc:
            raise _core.error_from_rpc(exc) from None
        except BaseException:
            stream.cancel()
            raise

    async def __aenter__(self) -> AsyncFileWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def __aiter__(self) -> AsyncIterator[FileEvent]:
        try:
            async for message in self._stream:
                yield _event(message)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise _core.error_from_rpc(exc) from None

    def close(self) -> None:
        self._stream.cancel()
