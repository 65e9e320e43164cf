"""The MCP endpoint's JSON answers (supervisor/fronts/mcp/json_answers.py): an SSE answer whose
first event is the response goes out as one JSON body, anything else as the stream it was
(ASGI messages in, ASGI messages out); a plain call in a session whose client cannot be
asked is answered in the SDK's JSON mode. Served for real in tests/integration/test_mcp.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp_types import CLIENT_CAPABILITIES_META_KEY, PROTOCOL_VERSION_META_KEY
from starlette.types import Message, Receive, Scope, Send

from stockade.supervisor.fronts.mcp.json_answers import (
    PEEK_BYTES,
    JsonAnswers,
    PerRequestJson,
    SessionManager,
    _plain_call,
    first_event,
    peek,
    plain_kind,
    response_data,
)
from tests.unit.fakes import mcp_front_in_process

RESPONSE = b'{"jsonrpc":"2.0","id":7,"result":{"content":[],"isError":false}}'
PROGRESS = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1}}'
SSE_HEAD: Message = {
    "type": "http.response.start",
    "status": 200,
    "headers": [
        (b"cache-control", b"no-cache, no-transform"),
        (b"connection", b"keep-alive"),
        (b"content-type", b"text/event-stream"),
        (b"mcp-session-id", b"abc"),
        (b"x-accel-buffering", b"no"),
    ],
}


def event(data: bytes) -> bytes:
    return b"event: message\r\ndata: " + data + b"\r\n\r\n"


def body(chunk: bytes, more: bool = True) -> Message:
    return {"type": "http.response.body", "body": chunk, "more_body": more}


def scope(method: str = "POST", accept: bytes = b"application/json, text/event-stream") -> Scope:
    return {"type": "http", "method": method, "headers": [(b"accept", accept)]}


async def answered(sent_by_app: list[Message], request: Scope | None = None) -> list[Message]:
    """What the client gets when the wrapped app sends `sent_by_app`."""
    out: list[Message] = []

    async def app(_scope: Scope, _receive: Receive, send: Send) -> None:
        for message in sent_by_app:
            await send(message)

    async def send(message: Message) -> None:
        out.append(message)

    async def receive() -> Message:
        raise AssertionError("not read")

    await JsonAnswers(app)(request or scope(), receive, send)
    return out


def headers_of(message: Message) -> dict[bytes, bytes]:
    return dict(message["headers"])


async def test_a_response_as_the_first_event_is_one_json_body() -> None:
    out = await answered([SSE_HEAD, body(event(RESPONSE)), body(b"", more=False)])
    assert len(out) == 2
    head, content = out
    assert head["status"] == 200
    assert headers_of(head) == {
        b"connection": b"keep-alive",
        b"mcp-session-id": b"abc",
        b"content-type": b"application/json",
        b"content-length": str(len(RESPONSE)).encode(),
    }
    assert content == {"type": "http.response.body", "body": RESPONSE, "more_body": False}
    assert json.loads(content["body"])["id"] == 7


async def test_an_event_in_pieces_is_put_together_first() -> None:
    whole = event(RESPONSE)
    out = await answered([SSE_HEAD, body(whole[:10]), body(whole[10:30]), body(whole[30:])])
    assert out[1]["body"] == RESPONSE
    assert headers_of(out[0])[b"content-type"] == b"application/json"


@pytest.mark.parametrize(
    "first",
    [
        event(PROGRESS),  # a progress notification before the result
        event(b'{"jsonrpc":"2.0","id":0,"method":"elicitation/create","params":{}}'),
        b": ping - 2026-11-25 10:00:00\r\n\r\n",  # sse-starlette's keep-alive of a long call
        b"event: other\r\ndata: " + RESPONSE + b"\r\n\r\n",
        event(b"not json"),
    ],
)
async def test_anything_else_first_is_the_sse_stream_unchanged(first: bytes) -> None:
    sent = [SSE_HEAD, body(first), body(event(RESPONSE)), body(b"", more=False)]
    out = await answered(sent)
    assert out[0] == SSE_HEAD
    assert b"".join(m["body"] for m in out[1:]) == first + event(RESPONSE)
    assert out[-1]["more_body"] is False


async def test_a_first_chunk_with_more_than_the_response_stays_sse() -> None:
    both = event(RESPONSE) + event(PROGRESS)
    out = await answered([SSE_HEAD, body(both), body(b"", more=False)])
    assert out[0] == SSE_HEAD
    assert b"".join(m["body"] for m in out[1:]) == both


async def test_a_stream_that_ends_without_an_event_ends_as_it_was() -> None:
    out = await answered([SSE_HEAD, body(b"event: mess"), body(b"", more=False)])
    assert out == [SSE_HEAD, body(b"event: mess", more=False)]


@pytest.mark.parametrize(
    ("request_scope", "sent"),
    [
        (scope(), [{**SSE_HEAD, "headers": [(b"content-type", b"application/json")]}]),
        (scope(accept=b"text/event-stream"), [SSE_HEAD]),  # a client that takes SSE alone
        (scope(method="GET"), [SSE_HEAD]),  # the standalone stream
    ],
)
async def test_other_answers_pass_untouched(request_scope: Scope, sent: list[Message]) -> None:
    messages = [*sent, body(event(RESPONSE)), body(b"", more=False)]
    assert await answered(messages, request_scope) == messages


def test_first_event_and_its_data() -> None:
    assert first_event(b"data: 1\n\ndata: 2\n\n") == (b"data: 1\n\n", True)
    assert first_event(b"data: 1\r\n") == (b"data: 1\r\n", False)
    assert response_data(event(RESPONSE)) == RESPONSE
    assert response_data(b"id: 5\r\nretry: 10\r\ndata: " + RESPONSE + b"\r\n\r\n") == RESPONSE
    error = b'{"jsonrpc":"2.0","id":"x","error":{"code":-32602,"message":"m"}}'
    assert response_data(event(error)) == error
    two_lines = b'data: {"jsonrpc":"2.0",\ndata: "id":1,"result":{}}\n\n'  # joined by a newline
    assert response_data(two_lines) == b'{"jsonrpc":"2.0",\n"id":1,"result":{}}'
    assert response_data(event(PROGRESS)) is None
    assert response_data(b"event: message\r\n\r\n") is None


def request(method: str, params: dict[str, object] | None = None, **extra: object) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}, **extra}
    ).encode()


def test_which_requests_are_plain() -> None:
    assert plain_kind(request("tools/call", {"name": "exec"})) == "call"
    with_token = {"name": "exec", "_meta": {"progressToken": 5}}
    assert plain_kind(request("tools/call", with_token)) is None  # its progress needs a stream
    assert plain_kind(request("initialize", {"capabilities": {}})) == "opening"
    asking = {"capabilities": {"elicitation": {}}}
    assert plain_kind(request("initialize", asking)) is None  # may be asked during a call
    assert plain_kind(request("tools/list")) is None
    # sessionless (2026-07-28): the client's capabilities come with each request
    assert plain_kind(modern_call({}, {})) == "call"
    assert plain_kind(modern_call({}, {"sampling": {}})) == "call"
    assert plain_kind(modern_call({}, {"elicitation": {}})) is None  # may be asked: a stream
    assert plain_kind(modern_call({}, {"elicitation": {"form": {}}})) is None
    assert plain_kind(modern_call({"progressToken": "p"}, {})) is None
    notification = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
    for other in (notification, b"[" + request("tools/call") + b"]", b"{not json", None):
        assert plain_kind(other) is None


async def test_peek_reads_a_small_body_and_gives_it_again() -> None:
    sent = [
        {"type": "http.request", "body": b'{"a":', "more_body": True},
        {"type": "http.request", "body": b"1}", "more_body": False},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return sent.pop(0)

    small = {"type": "http", "headers": [(b"content-length", b"7")]}
    body, replayed = await peek(small, receive)
    assert body == b'{"a":1}'
    assert await replayed() == {"type": "http.request", "body": b'{"a":1}', "more_body": False}
    assert await replayed() == {"type": "http.disconnect"}


@pytest.mark.parametrize(
    "headers",
    [[(b"content-length", str(PEEK_BYTES + 1).encode())], [], [(b"content-length", b"x")]],
)
async def test_peek_leaves_big_or_unsized_bodies_unread(headers: list[tuple[bytes, bytes]]) -> None:
    async def receive() -> Message:
        raise AssertionError("read")

    body, same = await peek({"type": "http", "headers": headers}, receive)
    assert body is None
    assert same is receive


def test_the_json_switch_is_read_per_request() -> None:
    transport = PerRequestJson(mcp_session_id="s1")
    assert transport.is_json_response_enabled is False
    token = _plain_call.set(True)
    try:
        assert transport.is_json_response_enabled is False  # a session that may be asked
        transport.plain_calls = True
        assert transport.is_json_response_enabled is True
    finally:
        _plain_call.reset(token)
    assert transport.is_json_response_enabled is False  # the next request, not a plain call
    assert PerRequestJson(
        mcp_session_id="s2", is_json_response_enabled=True
    ).is_json_response_enabled


def test_a_session_opened_by_a_plain_call_keeps_the_endpoints_setting() -> None:
    """The manager's switch is on during a plain call; a session it admits meanwhile (only an
    initialize can open one: the SDK refuses the call) gets the endpoint's setting."""
    manager = SessionManager(app=Server("t"))
    token = _plain_call.set(True)
    try:
        assert manager.json_response is True
        transport = manager._admit_session(None)
    finally:
        _plain_call.reset(token)
    assert manager.json_response is False
    assert isinstance(transport, PerRequestJson)
    assert transport.is_json_response_enabled is False


async def test_a_sessions_calls_are_plain_unless_its_client_can_be_asked(tmp_path: Path) -> None:
    """Through the endpoint (no engine): the SDK's client in a session ("legacy": its default
    now goes sessionless) without an elicitation callback opens a session whose calls may be
    JSON; with one, not."""
    async with mcp_front_in_process(tmp_path) as (front, endpoint):
        url = f"http://127.0.0.1:{front.port}/mcp"

        async def ask(_context: object, _params: object) -> types.ElicitResult:
            return types.ElicitResult(action="decline")

        for callback, plain in ((None, True), (ask, False)):
            async with httpx2.AsyncClient() as http:
                transport = streamable_http_client(url, http_client=http)
                async with Client(
                    transport, mode="legacy", elicitation_callback=callback
                ) as client:
                    await client.list_tools()
                    sessions = list(endpoint.sessions._server_instances.values())
                    assert len(sessions) == 1
                    assert isinstance(sessions[0], PerRequestJson)
                    assert sessions[0].plain_calls is plain


MODERN = "2026-07-28"


def modern_call(meta: dict[str, object], capabilities: dict[str, object]) -> bytes:
    """A sessionless tools/call of tool "t": the protocol's envelope in its `_meta`."""
    envelope = {PROTOCOL_VERSION_META_KEY: MODERN, CLIENT_CAPABILITIES_META_KEY: capabilities}
    return request("tools/call", {"name": "t", "_meta": {**envelope, **meta}})


async def test_a_plain_sessionless_call_is_answered_in_the_sdks_json_mode() -> None:
    """The SDK's own reading of the manager's JSON switch (json_answers.SessionManager relies
    on it): a plain sessionless call runs in the SDK's JSON mode, where a notification of its
    handler has no way out (the answer is its response alone, as JSON); one with a progress
    token, or from a client that declared elicitation, in its stream mode (the notification
    comes first, on the SSE stream). Should the SDK stop reading the switch per request, the
    plain call would be a stream too."""

    async def call(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        note = types.LoggingMessageNotificationParams(level="info", data="note")
        await ctx.session.send_notification(
            types.LoggingMessageNotification(params=note), related_request_id=ctx.request_id
        )
        return types.CallToolResult(content=[types.TextContent(type="text", text="done")])

    server: Server[Any] = Server("t", on_call_tool=call, get_tool_input_schema=lambda _: None)
    manager = SessionManager(app=server)
    assert manager.json_response is False
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": MODERN,
        "mcp-method": "tools/call",
        "mcp-name": "t",
    }
    transport = httpx2.ASGITransport(JsonAnswers(StreamableHTTPASGIApp(manager)))
    async with manager.run(), httpx2.AsyncClient(transport=transport) as http:

        async def answer(meta: dict[str, object], capabilities: dict[str, object]) -> Any:
            content = modern_call(meta, capabilities)
            return await http.post("http://127.0.0.1/mcp", content=content, headers=headers)

        plain = await answer({}, {})
        assert plain.status_code == 200
        assert plain.headers["content-type"] == "application/json"
        assert plain.json()["result"]["content"][0]["text"] == "done"
        for meta, capabilities in (({"progressToken": 1}, {}), ({}, {"elicitation": {}})):
            streamed = await answer(meta, capabilities)
            assert streamed.headers["content-type"].startswith("text/event-stream")
            first, *_ = [line for line in streamed.text.splitlines() if line.startswith("data:")]
            assert json.loads(first[5:])["method"] == "notifications/message"
            assert '"text":"done"' in streamed.text
    assert manager.json_response is False  # the switch was on for the plain call alone
