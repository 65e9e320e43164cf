"""envd's app for the E2B front: GET /health, GET/POST /files, filesystem.Filesystem/* and
process.Process/*. The server dispatches a request here after checking its X-Access-Token,
with the sandbox's record in scope["state"]["e2b_sandbox"].

Bodies are bounded before any work (fronts/bodies.py): every Connect message by the
configured max_request_bytes; a `/files` upload is decoded as it streams (gzip, deflate; a
bomb refused by its ratio), held to the workspace's size cap when one is set, and each file,
octet-stream or multipart part, goes straight to the sandbox's transfer as it arrives
(nothing spooled on the host). A body that ends short, does not decode or is refused cancels
that file's transfer: the file it would have replaced is left as it was. An upload's
`X-Metadata-*` headers are checked before its body is read, and kept on the files written
(file_metadata.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from stockade.supervisor import errors
from stockade.supervisor.fronts import bodies, multipart
from stockade.supervisor.fronts.e2b import connect, file_metadata
from stockade.supervisor.fronts.e2b.connect import (
    ClientStream,
    ConnectError,
    Json,
    ServerStream,
    Unary,
)
from stockade.supervisor.fronts.e2b.context import E2bContext
from stockade.supervisor.fronts.e2b.envd_files import Files, connect_error
from stockade.supervisor.fronts.e2b.envd_process import Processes
from stockade.supervisor.fronts.e2b.envd_watch import Watches

_HTTP = {"not_found": 404, "invalid_argument": 400, "permission_denied": 403}
MAX_PARTS = 1000
"""The most parts of a multipart `/files` upload."""


def _domain(handler: Unary) -> Unary:
    async def wrapped(request: Request, msg: Json) -> Json:
        try:
            return await handler(request, msg)
        except errors.StockadeError as exc:
            raise connect_error(exc) from None

    return wrapped


def _domain_stream(handler: ServerStream) -> ServerStream:
    async def wrapped(request: Request, msg: Json) -> AsyncIterator[Json]:
        try:
            async for item in handler(request, msg):
                yield item
        except errors.StockadeError as exc:
            raise connect_error(exc) from None

    return wrapped


def _domain_client(handler: ClientStream) -> ClientStream:
    async def wrapped(request: Request, messages: AsyncIterator[Json]) -> Json:
        try:
            return await handler(request, messages)
        except errors.StockadeError as exc:
            raise connect_error(exc) from None

    return wrapped


def _http_error(exc: ConnectError) -> Response:
    status = _HTTP.get(exc.code, connect.HTTP_STATUS[exc.code])
    return JSONResponse({"code": status, "message": exc.message}, status_code=status)


def _refused(exc: bodies.BodyRefused) -> Response:
    return JSONResponse({"code": exc.status, "message": exc.message}, status_code=exc.status)


def build_envd_app(ctx: E2bContext) -> Starlette:
    files = Files(ctx)
    processes = Processes(ctx)
    ctx.forgetters.append(processes.forget)
    ctx.pausers.append(processes.drop)
    watches = Watches(ctx)
    ctx.forgetters.append(watches.forget)
    files.wrote = watches.wrote
    watches.entries = files.entries
    limit = ctx.config.max_request_bytes
    quota_mb = ctx.config.sandbox.workspace_size_mb
    upload_limit = quota_mb << 20 if quota_mb else None

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await processes.close()
            await watches.close()

    async def health(request: Request) -> Response:
        return Response(status_code=204)

    async def get_files(request: Request) -> Response:
        path = request.query_params.get("path", "")
        try:
            stream = files.download(request, path)
            first = await anext(aiter(stream), b"")
        except ConnectError as exc:
            return _http_error(exc)
        except errors.StockadeError as exc:
            return _http_error(connect_error(exc))

        async def body() -> AsyncIterator[bytes]:
            yield first
            async for chunk in stream:
                yield chunk

        return StreamingResponse(body(), media_type="application/octet-stream")

    async def post_files(request: Request) -> Response:
        try:
            return JSONResponse(await _upload(request))
        except bodies.BodyRefused as exc:
            bodies.tell(request, exc)
            return _refused(exc)
        except ConnectError as exc:
            return _http_error(exc)
        except errors.StockadeError as exc:
            return _http_error(connect_error(exc))

    async def _upload(request: Request) -> list[Json]:
        metadata = file_metadata.from_headers(request.scope["headers"])
        written = await _write(request)
        if metadata:
            await files.set_metadata(request, [str(e["path"]) for e in written], metadata)
        return [file_metadata.attach(e, metadata) for e in written]

    async def _write(request: Request) -> list[Json]:
        query_path = request.query_params.get("path")
        content_type = request.headers.get("content-type", "")
        body = bodies.body_stream(request, upload_limit)
        if content_type.split(";")[0].strip().lower() != "multipart/form-data":
            if not query_path:
                raise ConnectError("invalid_argument", "an octet-stream upload needs ?path=")
            return [await files.upload(request, query_path, body)]
        boundary = multipart.boundary_of(content_type)
        out: list[Json] = []
        seen: set[str] = set()
        async for part in multipart.parts(body, boundary, MAX_PARTS):
            filename = part.param("filename")
            if part.param("name") != "file" or filename is None:
                continue  # a form field, not a file: skipped as envd does
            target = query_path or filename
            if not target:
                raise ConnectError("invalid_argument", "a file part needs a filename")
            if target in seen:
                raise ConnectError("invalid_argument", f"two parts write {target}")
            seen.add(target)
            out.append(await files.upload(request, target, part.data))
        if not out:
            raise ConnectError("invalid_argument", "no file part")
        return out

    fs, ps = "/filesystem.Filesystem/", "/process.Process/"
    unary = {
        "List": processes.list,
        "SendInput": processes.send_input,
        "CloseStdin": processes.close_stdin,
        "SendSignal": processes.send_signal,
        "Update": processes.update,
    }
    streams = {"Start": processes.start, "Connect": processes.connect}
    watchers = {
        "CreateWatcher": watches.create_watcher,
        "GetWatcherEvents": watches.get_watcher_events,
        "RemoveWatcher": watches.remove_watcher,
    }
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/files", get_files, methods=["GET"]),
        Route("/files", post_files, methods=["POST"]),
        Route(fs + "Stat", connect.unary(_domain(files.stat), limit), methods=["POST"]),
        Route(fs + "MakeDir", connect.unary(_domain(files.make_dir), limit), methods=["POST"]),
        Route(fs + "Move", connect.unary(_domain(files.move), limit), methods=["POST"]),
        Route(fs + "ListDir", connect.unary(_domain(files.list_dir), limit), methods=["POST"]),
        Route(fs + "Remove", connect.unary(_domain(files.remove), limit), methods=["POST"]),
        Route(
            fs + "WatchDir",
            connect.server_stream(_domain_stream(watches.watch_dir), limit),
            methods=["POST"],
        ),
        *(
            Route(fs + n, connect.unary(_domain(h), limit), methods=["POST"])
            for n, h in watchers.items()
        ),
        *(
            Route(ps + n, connect.unary(_domain(h), limit), methods=["POST"])
            for n, h in unary.items()
        ),
        *(
            Route(ps + n, connect.server_stream(_domain_stream(h), limit), methods=["POST"])
            for n, h in streams.items()
        ),
        Route(
            ps + "StreamInput",
            connect.client_stream(_domain_client(processes.stream_input), limit),
            methods=["POST"],
        ),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
