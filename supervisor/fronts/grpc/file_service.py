"""FileService: upload a file or a tar into a sandbox (a header chunk, then data chunks),
download one (data chunks, then the file's info), and watch a folder's changes."""

from __future__ import annotations

from collections.abc import AsyncIterator

from stockade.supervisor import errors
from stockade.supervisor.calls.transfers import FileTransfers, Transfer
from stockade.supervisor.calls.watching import FileWatches, Started, Watch
from stockade.supervisor.fronts.grpc.convert import context_from_pb, info_to_pb, scoped
from stockade.supervisor.fronts.grpc.status import Context, mapped, mapped_stream
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.v1 import file_pb2, file_pb2_grpc


class FileServicer(file_pb2_grpc.FileServiceServicer):
    def __init__(
        self, transfers: FileTransfers, watches: FileWatches, scrubber: Scrubber | None = None
    ) -> None:
        self._transfers = transfers
        self._watches = watches
        self.scrubber = scrubber

    @mapped
    async def UploadFile(
        self, request_iterator: AsyncIterator[file_pb2.FileChunk], context: Context
    ) -> file_pb2.FileInfo:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("part") != "header":
            raise errors.InvalidRequest("an upload starts with a FileChunk carrying the header")
        h = first.header
        transfer = Transfer(
            scoped(h.sandbox_key), h.path, h.tar, context_from_pb(h.context), context.peer(), h.mode
        )

        async def chunks() -> AsyncIterator[bytes]:
            async for chunk in request_iterator:
                if chunk.WhichOneof("part") != "data":
                    raise errors.InvalidRequest("after the header an upload carries only data")
                yield chunk.data

        return info_to_pb(await self._transfers.upload(transfer, chunks()))

    @mapped_stream
    async def DownloadFile(
        self, request: file_pb2.DownloadFileRequest, context: Context
    ) -> AsyncIterator[file_pb2.FileChunk]:
        key, context_ = scoped(request.sandbox_key), context_from_pb(request.context)
        transfer = Transfer(key, request.path, request.tar, context_, context.peer())
        async for item in self._transfers.download(transfer):
            if isinstance(item, bytes):
                yield file_pb2.FileChunk(data=item)
            else:
                yield file_pb2.FileChunk(info=info_to_pb(item))

    @mapped_stream
    async def WatchFiles(
        self, request: file_pb2.WatchFilesRequest, context: Context
    ) -> AsyncIterator[file_pb2.FileEvent]:
        key, context_ = scoped(request.sandbox_key), context_from_pb(request.context)
        watch = Watch(key, request.path, request.recursive, context_, context.peer())
        events = self._watches.watch(watch)
        try:
            async for item in events:
                if isinstance(item, Started):
                    yield file_pb2.FileEvent(started=file_pb2.WatchStarted(path=item.path))
                else:
                    change = file_pb2.FileChange(
                        type=_TYPES[item.kind], name=item.name, is_dir=item.is_dir
                    )
                    yield file_pb2.FileEvent(change=change)
        finally:
            await events.aclose()  # the watch ends in the agent now, not when collected


_TYPES = {
    "create": file_pb2.FILE_EVENT_TYPE_CREATE,
    "write": file_pb2.FILE_EVENT_TYPE_WRITE,
    "remove": file_pb2.FILE_EVENT_TYPE_REMOVE,
    "rename": file_pb2.FILE_EVENT_TYPE_RENAME,
    "chmod": file_pb2.FILE_EVENT_TYPE_CHMOD,
    "overflow": file_pb2.FILE_EVENT_TYPE_OVERFLOW,
    "gone": file_pb2.FILE_EVENT_TYPE_GONE,
}
