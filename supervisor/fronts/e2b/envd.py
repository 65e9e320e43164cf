"""envd's app for the E2B front: GET /health, GET/POST /files, filesystem.Filesystem/* and
process.Process/*. The server dispatches a request here after checking its X-Access-Token,
with the sandbox's record in scope["state"]["e2b_sandbox"]."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import AsyncIterator
from email.message import Message

from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from stockade.supervisor import errors
from stockade.supervisor.fronts.e2b import connect
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


def _filename(disposition: str) -> str | None:
    """The raw filename of a multipart part (a full path: not basenamed)."""
    msg = Message()
    msg["content-disposition"] = disposition
    name = msg.get_param("filename", header="content-disposition")
    return str(name) if isinstance(name, str) else None


def build_envd_app(ctx: E2bContext) -> Starlette:
    files = Files(ctx)
    processes = Processes(ctx)
    ctx.forgetters.append(processes.forget)
    watches = Watches(ctx)
    ctx.forgetters.append(watches.forget)

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
        except ConnectError as exc:
            return _http_error(exc)
        except errors.StockadeError as exc:
            return _http_error(connect_error(exc))

    async def _parts(request: Request, query_path: str | None, form: FormData) -> list[Json]:
        out: list[Json] = []
        seen: set[str] = set()
        for key, value in form.multi_items():
            if key != "file" or isinstance(value, str):
                continue
            target = query_path or _filename(value.headers.get("content-disposition", ""))
            if not target:
                raise ConnectError("invalid_argument", "a file part needs a filename")
            if target in seen:
                raise ConnectError("invalid_argument", f"two parts write {target}")
            seen.add(target)

            async def chunks(f=value) -> AsyncIterator[bytes]:  # type: ignore[no-untyped-def]
                while data := await f.read(1 << 20):
                    yield data

            out.append(await files.upload(request, target, chunks()))
        if not out:
            raise ConnectError("invalid_argument", "no file part")
        return out

    async def _upload(request: Request) -> list[Json]:
        query_path = request.query_params.get("path")
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind == "multipart/form-data":
            # closed at the end: its parts' spooled files go at once, not when collected
            async with request.form(max_files=1000, max_fields=1000, max_part_size=1 << 20) as form:
                return await _parts(request, query_path, form)
        if not query_path:
            raise ConnectError("invalid_argument", "an octet-stream upload needs ?path=")
        gz = request.headers.get("content-encoding", "").lower() == "gzip"

        async def raw() -> AsyncIterator[bytes]:
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gz else None
            try:
                async for data in request.stream():
                    yield inflate.decompress(data) if inflate else data
                if inflate:
                    yield inflate.flush()
            except zlib.error as exc:
                raise errors.InvalidRequest(f"the body is not valid gzip: {exc}") from None

        return [await files.upload(request, query_path, raw())]

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
        Route(fs + "Stat", connect.unary(_domain(files.stat)), methods=["POST"]),
        Route(fs + "MakeDir", connect.unary(_domain(files.make_dir)), methods=["POST"]),
        Route(fs + "Move", connect.unary(_domain(files.move)), methods=["POST"]),
        Route(fs + "ListDir", connect.unary(_domain(files.list_dir)), methods=["POST"]),
        Route(fs + "Remove", connect.unary(_domain(files.remove)), methods=["POST"]),
        Route(
            fs + "WatchDir",
            connect.server_stream(_domain_stream(watches.watch_dir)),
            methods=["POST"],
        ),
        *(Route(fs + n, connect.unary(_domain(h)), methods=["POST"]) for n, h in watchers.items()),
        *(Route(ps + n, connect.unary(_domain(h)), methods=["POST"]) for n, h in unary.items()),
        *(
            Route(ps + n, connect.server_stream(_domain_stream(h)), methods=["POST"])
            for n, h in streams.items()
        ),
        Route(
            ps + "StreamInput",
            connect.client_stream(_domain_client(processes.stream_input)),
            methods=["POST"],
        ),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
