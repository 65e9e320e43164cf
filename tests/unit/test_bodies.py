"""Request bodies bounded before any work (fronts/bodies.py, fronts/multipart.py): the size
limit declared or streamed, gzip and deflate decoded in bounded pieces with a ratio cap (a
bomb refused after a few MiB of work), truncated and invalid streams refused, encodings not
taken named, JSON nested too deep refused, multipart parts streamed and ended only at their
boundary; and the fronts that use them (the Connect codec, the control plane, MCP)."""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from stockade.supervisor.fronts import bodies, multipart
from stockade.supervisor.fronts.bodies import CHUNK, RATIO_SLACK, BodyRefused, Decoder
from stockade.supervisor.fronts.e2b import connect
from stockade.supervisor.fronts.e2b.connect import Json
from stockade.supervisor.fronts.e2b.wire import ApiError, read_json

TEXT = b"".join(b"line %d of a file that compresses well\n" % i for i in range(20000))


def bomb(size: int = 270 << 20) -> bytes:
    """A gzip of `size` zeros (270 MiB: ~270 KB; the issue's was 97 KB)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    return b"".join(z.compress(block) for _ in range(size >> 20)) + z.flush()


def split(data: bytes, n: int) -> Iterator[bytes]:
    return (data[i : i + n] for i in range(0, len(data), n))


def decode(encoding: str, data: bytes, limit: int | None = None, step: int = 7000) -> bytes:
    d = Decoder(encoding, limit)
    out = b"".join(piece for chunk in split(data, step) for piece in d.feed(chunk))
    d.finish()
    return out


def refusal(fn: Any, *args: Any) -> BodyRefused:
    with pytest.raises(BodyRefused) as caught:
        fn(*args)
    return caught.value


@pytest.mark.parametrize("step", [1, 2, 3, 1000, 1 << 20])
def test_gzip_and_both_deflates_decode_however_chunked(step: int) -> None:
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    raw_deflate = raw.compress(TEXT) + raw.flush()
    assert decode("gzip", gzip.compress(TEXT), step=step) == TEXT
    assert decode("x-gzip", gzip.compress(TEXT), step=step) == TEXT
    assert decode("deflate", zlib.compress(TEXT), step=step) == TEXT
    assert decode("deflate", raw_deflate, step=step) == TEXT
    assert decode("identity", TEXT, step=step) == TEXT
    assert decode("gzip", gzip.compress(b"a") + gzip.compress(b"b"), step=step) == b"ab"


def test_a_gzip_bomb_is_refused_after_bounded_work() -> None:
    data = bomb()
    d = Decoder("gzip", None)
    pieces: list[int] = []

    def feed() -> None:
        for chunk in split(data, 64 << 10):
            pieces.extend(len(p) for p in d.feed(chunk))

    caught = refusal(feed)
    assert caught.status == 413
    assert "100-fold" in caught.message
    assert max(pieces) <= CHUNK
    assert d.decoded <= RATIO_SLACK + CHUNK  # refused after ~4 MiB, not 270 MiB
    deflated = zlib.compress(bytes(64 << 20), 9)
    assert refusal(decode, "deflate", deflated).status == 413


def test_the_size_limit_holds_for_decoded_and_plain_bodies() -> None:
    assert decode("gzip", gzip.compress(TEXT), len(TEXT)) == TEXT
    assert refusal(decode, "gzip", gzip.compress(TEXT), len(TEXT) - 1).status == 413
    assert refusal(decode, "identity", TEXT, len(TEXT) - 1).status == 413


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_truncated_invalid_and_trailing_streams_are_400(encoding: str) -> None:
    whole = gzip.compress(TEXT) if encoding == "gzip" else zlib.compress(TEXT)
    for cut in (1, 10, len(whole) // 3, len(whole) - 1):
        refused = refusal(decode, encoding, whole[:cut])
        assert refused.status == 400
        assert "truncated" in refused.message or "not valid" in refused.message
    refused = refusal(decode, encoding, b"\xff" * 100 + whole)
    assert (refused.status, f"not valid {encoding}" in refused.message) == (400, True)
    assert refusal(decode, encoding, whole + b"junk").status == 400
    assert refusal(decode, encoding, b"").status == 400


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, gzip", "bogus"])
def test_encodings_not_taken_are_415_naming_them(encoding: str) -> None:
    refused = refusal(Decoder, encoding, None)
    assert refused.status == 415
    assert repr(encoding) in refused.message


def test_deep_json_is_refused_clearly() -> None:
    for depth in (65, 1000, 100_000):
        refused = refusal(bodies.loads, b"[" * depth + b"]" * depth)
        assert (refused.status, "nested more than 64" in refused.message) == (400, True)
    assert bodies.loads(b"[" * 64 + b"]" * 64) is not None
    assert bodies.loads(json.dumps({"a": [{"b": 1}] * 1000})) == {"a": [{"b": 1}] * 1000}
    with pytest.raises(ValueError, match="Expecting property name"):
        bodies.loads(b"{nope")


# the ASGI side: Content-Length before any read, client disconnects


async def call(app: Any, headers: dict[str, str], chunks: list[bytes]) -> tuple[int, int]:
    """(status, how many body chunks the app asked for) of one raw ASGI request."""
    asked = 0
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        nonlocal asked
        asked += 1
        if asked > len(chunks):
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": chunks[asked - 1], "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "query_string": b"",
    }
    await app(scope, receive, send)
    return sent[0]["status"], asked


def sink(limit: int | None) -> Starlette:
    async def endpoint(request: Request) -> Response:
        try:
            size = sum([len(p) async for p in bodies.body_stream(request, limit)])
        except BodyRefused as exc:
            return JSONResponse({"message": exc.message}, exc.status)
        return JSONResponse({"size": size})

    return Starlette(routes=[Route("/", endpoint, methods=["POST"])])


async def test_a_declared_length_over_the_limit_is_refused_unread() -> None:
    status, asked = await call(sink(1000), {"content-length": "60000000"}, [b"x" * 100])
    assert (status, asked) == (413, 0)
    status, asked = await call(sink(1000), {"content-encoding": "br"}, [b"x"])
    assert (status, asked) == (415, 0)


async def test_a_streamed_body_is_refused_at_the_limit_and_a_cut_one_is_400() -> None:
    status, asked = await call(sink(1000), {}, [b"x" * 600] * 10)
    assert (status, asked) == (413, 2)
    status, _ = await call(sink(None), {}, [b"x" * 600] * 3)  # then the client goes
    assert status == 400


# multipart, streamed


def form(*parts: tuple[str, str | None, bytes], boundary: str = "b0und") -> bytes:
    out = b""
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        out += data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


async def chunked(data: bytes, n: int) -> AsyncIterator[bytes]:
    for piece in split(data, n):
        yield piece


async def collect(data: bytes, n: int, max_parts: int = 10) -> list[tuple[str | None, bytes]]:
    found = []
    async for part in multipart.parts(chunked(data, n), b"b0und", max_parts):
        if part.param("name") == "skip":
            continue
        found.append((part.param("filename"), b"".join([c async for c in part.data])))
    return found


@pytest.mark.parametrize("step", [1, 5, 64, 1 << 16])
async def test_multipart_parts_stream_in_order(step: int) -> None:
    body = form(("file", "/a b/c.txt", TEXT[:5000]), ("skip", None, b"x"), ("file", "d", b""))
    assert await collect(body, step) == [("/a b/c.txt", TEXT[:5000]), ("d", b"")]


async def test_a_part_cut_short_never_ends_cleanly() -> None:
    body = form(("file", "f", TEXT[:5000]))
    for cut in (30, 100, 3000, len(body) - 12):
        got = bytearray()

        async def read(cut: int = cut, got: bytearray = got) -> None:
            async for part in multipart.parts(chunked(body[:cut], 64), b"b0und", 10):
                async for piece in part.data:
                    got.extend(piece)

        with pytest.raises(BodyRefused, match="truncated") as caught:
            await read()
        assert caught.value.status == 400
        assert TEXT[:5000].startswith(got)


async def test_multipart_limits() -> None:
    with pytest.raises(BodyRefused, match="at most 2 parts"):
        await collect(form(*[("file", str(i), b"x") for i in range(3)]), 100, max_parts=2)
    with pytest.raises(BodyRefused, match="does not parse"):
        await collect(b"--b0und\r\n" + b"X" * 20000 + b"\r\n\r\n", 1000)
    with pytest.raises(BodyRefused, match="boundary"):
        multipart.boundary_of("multipart/form-data")
    assert multipart.boundary_of('multipart/form-data; boundary="b0und"') == b"b0und"


# the fronts


async def echo(request: Request, msg: Json) -> Json:
    return {"got": msg}


async def count(request: Request, msg: Json) -> AsyncIterator[Json]:
    yield msg


def connect_client() -> TestClient:
    app = Starlette(
        routes=[
            Route("/s.S/Echo", connect.unary(echo, 1000), methods=["POST"]),
            Route("/s.S/Count", connect.server_stream(count, 1000), methods=["POST"]),
        ]
    )
    return TestClient(app)


def first_frame(data: bytes) -> Any:
    (size,) = struct.unpack(">I", data[1:5])
    return json.loads(data[5 : 5 + size])


def test_connect_messages_are_held_to_the_limit() -> None:
    unary = {"content-type": "application/json"}
    r = connect_client().post("/s.S/Echo", content=b'{"a":"' + b"x" * 2000 + b'"}', headers=unary)
    assert (r.status_code, r.json()["code"]) == (429, "resource_exhausted")
    r = connect_client().post("/s.S/Echo", content=b"[" * 900, headers=unary)
    assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
    deep = b'{"a":' + b"[" * 100 + b"]" * 100 + b"}"
    r = connect_client().post("/s.S/Echo", content=deep, headers=unary)
    assert (r.status_code, "nested" in r.json()["message"]) == (400, True)
    stream = {"content-type": "application/connect+json"}
    huge = struct.pack(">BI", 0, 60_000_000) + b"{}"  # a 60 MB Start, declared
    r = connect_client().post("/s.S/Count", content=huge, headers=stream)
    end = first_frame(r.content)
    assert end["error"]["code"] == "resource_exhausted"
    assert "60000000" in end["error"]["message"]
    r = connect_client().post("/s.S/Count", content=connect.envelope({"a": 1}), headers=stream)
    assert first_frame(r.content) == {"a": 1}


def control_client(limit: int) -> TestClient:
    async def endpoint(request: Request) -> Response:
        try:
            return JSONResponse(await read_json(request, limit))
        except ApiError as exc:
            return JSONResponse({"message": exc.message}, exc.status)

    return TestClient(Starlette(routes=[Route("/", endpoint, methods=["POST"])]))


def test_control_plane_bodies() -> None:
    c = control_client(1000)
    body = json.dumps({"metadata": {"k": "v"}}).encode()
    assert c.post("/", content=body).json() == {"metadata": {"k": "v"}}
    gz = {"content-encoding": "gzip"}
    assert c.post("/", content=gzip.compress(body), headers=gz).json() == {"metadata": {"k": "v"}}
    assert c.post("/", content=gzip.compress(body)[:-5], headers=gz).status_code == 400
    assert c.post("/", content=b"x" * 1001).status_code == 413
    assert c.post("/", content=gzip.compress(b" " * 5000), headers=gz).status_code == 413
    r = c.post("/", content=body, headers={"content-encoding": "br"})
    assert (r.status_code, "'br'" in r.json()["message"]) == (415, True)
    r = control_client(1 << 20).post("/", content=b"[" * 100_000)
    assert (r.status_code, "nested" in r.json()["message"]) == (400, True)


async def test_plain_only_refuses_encodings_before_the_app() -> None:
    reached: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(True)
        await Response("ok")(scope, receive, send)

    gate = bodies.PlainOnly(app)
    assert await call(gate, {"content-encoding": "gzip"}, [b"x"]) == (415, 0)
    assert not reached
    assert (await call(gate, {"content-encoding": "identity"}, [b""]))[0] == 200
    assert (await call(gate, {}, [b""]))[0] == 200
