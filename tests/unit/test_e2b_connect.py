"""The Connect codec of the E2B front: unary and streaming envelopes, end-of-stream, errors,
content types exactly as the E2B SDKs require, Connect-Timeout-Ms."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.testclient import TestClient

from stockade.supervisor.fronts.e2b import connect
from stockade.supervisor.fronts.e2b.connect import ConnectError, Json


async def echo(request: Request, msg: Json) -> Json:
    if msg.get("missing"):
        raise ConnectError("not_found", "no such thing")
    if msg.get("slow"):
        await asyncio.sleep(5)
    return {"got": msg}


async def count(request: Request, msg: Json) -> AsyncIterator[Json]:
    for i in range(int(msg.get("n", 0))):
        yield {"i": i}
    if msg.get("fail"):
        raise ConnectError("already_exists", "late failure")


async def total(request: Request, msgs: AsyncIterator[Json]) -> Json:
    return {"sum": sum([int(m.get("v", 0)) async for m in msgs])}


def client() -> TestClient:
    app = Starlette(
        routes=[
            Route("/s.S/Echo", connect.unary(echo), methods=["POST"]),
            Route("/s.S/Count", connect.server_stream(count), methods=["POST"]),
            Route("/s.S/Total", connect.client_stream(total), methods=["POST"]),
        ]
    )
    return TestClient(app)


def frames(data: bytes) -> list[tuple[int, Json]]:
    out = []
    while data:
        flags, size = struct.unpack(">BI", data[:5])
        out.append((flags, json.loads(data[5 : 5 + size])))
        data = data[5 + size :]
    return out


STREAM = {"content-type": "application/connect+json"}


def test_unary_ok_is_json() -> None:
    r = client().post("/s.S/Echo", content=b'{"a":1}', headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"got": {"a": 1}}


def test_unary_empty_body_is_empty_message() -> None:
    r = client().post("/s.S/Echo", content=b"", headers={"content-type": "application/json"})
    assert r.json() == {"got": {}}


def test_unary_error_is_status_and_lowercase_code() -> None:
    r = client().post(
        "/s.S/Echo", content=b'{"missing":true}', headers={"content-type": "application/json"}
    )
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"code": "not_found", "message": "no such thing"}


def test_unary_bad_json_and_wrong_type_are_invalid_argument() -> None:
    c = client()
    r = c.post("/s.S/Echo", content=b"{", headers={"content-type": "application/json"})
    assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
    r = c.post("/s.S/Echo", content=b"[]", headers={"content-type": "application/json"})
    assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
    r = c.post("/s.S/Echo", content=b"{}", headers=STREAM)
    assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")


def test_unary_deadline() -> None:
    r = client().post(
        "/s.S/Echo",
        content=b'{"slow":true}',
        headers={"content-type": "application/json", "connect-timeout-ms": "50"},
    )
    assert (r.status_code, r.json()["code"]) == (504, "deadline_exceeded")


def test_server_stream_envelopes_then_end_stream() -> None:
    body = connect.envelope({"n": 3})
    r = client().post("/s.S/Count", content=body, headers=STREAM)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/connect+json"  # exactly, no charset
    assert frames(r.content) == [(0, {"i": 0}), (0, {"i": 1}), (0, {"i": 2}), (2, {})]


def test_server_stream_error_is_in_end_stream_over_200() -> None:
    r = client().post("/s.S/Count", content=connect.envelope({"n": 1, "fail": 1}), headers=STREAM)
    assert r.status_code == 200
    assert frames(r.content) == [
        (0, {"i": 0}),
        (2, {"error": {"code": "already_exists", "message": "late failure"}}),
    ]


def test_server_stream_split_chunks_and_truncation() -> None:
    body = connect.envelope({"n": 2})

    def pieces() -> object:
        for i in range(len(body)):
            yield body[i : i + 1]

    r = client().post("/s.S/Count", content=pieces(), headers=STREAM)  # type: ignore[arg-type]
    assert [f for _, f in frames(r.content)] == [{"i": 0}, {"i": 1}, {}]
    r = client().post("/s.S/Count", content=body[:-2], headers=STREAM)
    ((flags, end),) = frames(r.content)
    assert flags == 2
    assert end["error"]["code"] == "invalid_argument"


def test_client_stream_reads_every_message() -> None:
    body = b"".join(connect.envelope({"v": v}) for v in (1, 2, 3)) + connect.end_stream()
    r = client().post("/s.S/Total", content=body, headers=STREAM)
    assert r.headers["content-type"] == "application/connect+json"
    assert frames(r.content) == [(0, {"sum": 6}), (2, {})]


def test_connect_error_refuses_unknown_codes() -> None:
    try:
        ConnectError("NOT_FOUND", "x")
    except ValueError:
        return
    raise AssertionError("an upper-case code was accepted")
