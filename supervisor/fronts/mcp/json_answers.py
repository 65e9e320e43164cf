"""Answers as one JSON body where nothing but the response can come: an ASGI middleware in
front of the SDK's streamable-HTTP transport, and that transport with its JSON switch read
per request.

The SDK answers every request POST with an SSE stream (its JSON-response mode is one switch
for the whole endpoint, and would leave nothing to carry progress notifications or an
elicitation). A client reads such a stream up to the response event and then closes it
before its end, so its HTTP connection cannot be reused: the mcp SDK's client opened a new
TCP connection for every call. The spec lets the server choose per request (a request's
answer is either `text/event-stream` or one `application/json` object, and clients must
take both). Two ways here:

- JSON mode for the request. A `tools/call` without a progress token, from a client that
  declared no elicitation capability (in a session: at its `initialize`; sessionless,
  2026-07-28: in the request's own `_meta`), has nothing to carry but its response: the
  middleware marks it (a context variable), and the SDK answers it in its own JSON-response
  mode, without the stream's machinery: a session's call through its transport
  (`PerRequestJson`), a sessionless one through the session manager's switch
  (`SessionManager`), where the SDK's stream mode would also run a task group per request.
  Such a call is answered at its end, as one body: no keep-alive pings meanwhile, and a
  client that goes away does not end it: it runs to its end (the SDK's JSON mode watches
  no disconnect; a stream's does).
- JSON from the stream. For any other request POST, the middleware holds back the SSE
  response's head until the stream's first event: when that event is the JSON-RPC response
  itself (nothing came before it: no progress, no elicitation, no keep-alive ping of a call
  that ran long), it sends that message alone as `application/json` with a Content-Length;
  anything else (a notification, a server request, a comment, a stream that ends with no
  event, a client that does not accept JSON) goes out as the SSE stream it was, from its
  head on, unchanged.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import pydantic_core
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import CLIENT_CAPABILITIES_META_KEY
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SSE = b"text/event-stream"
FIELDS = (b"event", b"id", b"retry")
"""The SSE fields besides data that a response event may carry."""
JSON = b"application/json"
DROPPED_HEADERS = frozenset(
    {b"content-type", b"content-length", b"cache-control", b"x-accel-buffering"}
)
"""Headers of the SSE answer that do not describe a JSON body (its type, length, the
stream's no-caching and no-buffering hints)."""
PEEK_BYTES = 64 * 1024
"""A request body is read ahead (to see its method) only when its Content-Length is at most
this: bigger ones (a large file written) go their way unread, as streams."""

_plain_call: ContextVar[bool] = ContextVar("stockade_mcp_plain_call", default=False)
"""Set while a `tools/call` without a progress token is served."""
_opening_plain: ContextVar[bool] = ContextVar("stockade_mcp_opening_plain", default=False)
"""Set while an `initialize` whose client declared no elicitation is served."""


class PerRequestJson(StreamableHTTPServerTransport):
    """The SDK's transport with its JSON-response switch read per request: on for a plain
    call (see `_plain_call`) in a session whose client cannot be asked anything
    (`plain_calls`), else the endpoint's setting. The transport reads the switch in the
    request's task (Accept check, the request's metadata, the answer's form) and in its
    message router, which runs in the context of the session's opening request (never a
    call): there it is the endpoint's setting, so messages tied to a request are routed, not
    dropped."""

    plain_calls = False
    """Whether this session's calls may be answered in JSON mode."""

    @property
    def is_json_response_enabled(self) -> bool:
        if _plain_call.get() and self.plain_calls:
            return True
        return bool(self.__dict__.get("is_json_response_enabled", False))

    @is_json_response_enabled.setter
    def is_json_response_enabled(self, value: bool) -> None:
        self.__dict__["is_json_response_enabled"] = value


class SessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, its sessions' transports `PerRequestJson`, and its own
    JSON switch read per request: on for a plain call (see `_plain_call`), else the
    endpoint's setting. It decides the form of a sessionless (2026-07-28) request's answer:
    the SDK (2.3) reads `json_response` in `_handle_request` for each request and hands it to
    its private `_streamable_http_modern.handle_modern_request`, which in JSON mode runs the
    handler in the request's own task and answers its result as one JSON body, where its
    stream mode runs a task group (the handler, a watch for the client's disconnect) and a
    channel for notifications. Covered by test_mcp_json_answers (a plain sessionless call is
    answered in JSON mode, one with a progress token as a stream), which fails if the SDK
    stops reading it so. Its other readers: `_admit_session`, whose transport gets the
    endpoint's setting here whatever request opens the session (a plain call without a
    session id is refused there, by the SDK, but not in JSON mode for good), and the
    manager's stateless mode, which is off."""

    @property
    def json_response(self) -> bool:
        if _plain_call.get():
            return True
        return bool(self.__dict__.get("json_response", False))

    @json_response.setter
    def json_response(self, value: bool) -> None:
        self.__dict__["json_response"] = value

    def _admit_session(self, requestor: Any) -> StreamableHTTPServerTransport | None:
        transport = super()._admit_session(requestor)
        if transport is not None:
            transport.__class__ = PerRequestJson  # the same object, the switch read per request
            assert isinstance(transport, PerRequestJson)
            transport.is_json_response_enabled = bool(self.__dict__.get("json_response", False))
            transport.plain_calls = _opening_plain.get()
        return transport


class JsonAnswers:
    """Wraps the MCP endpoint's ASGI app (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not accepts_json(scope):
            await self.app(scope, receive, send)
            return
        body, receive = await peek(scope, receive)
        kind = plain_kind(body)
        mark = _plain_call if kind == "call" else _opening_plain if kind == "opening" else None
        token = mark.set(True) if mark is not None else None
        try:
            await self.app(scope, receive, _FirstEvent(send))
        finally:
            if mark is not None and token is not None:
                mark.reset(token)


async def peek(scope: Scope, receive: Receive) -> tuple[bytes | None, Receive]:
    """The request's body when its Content-Length is small (None otherwise), and a receive
    that gives the app the same body first, then what the original gives."""
    length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
    try:
        size = int(length) if length is not None else -1
    except ValueError:
        size = -1
    if not 0 <= size <= PEEK_BYTES:
        return None, receive
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # a disconnect: the app sees it as it comes
            return None, _replay([*_as_requests(chunks), message], receive)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    return body, _replay([{"type": "http.request", "body": body, "more_body": False}], receive)


def _as_requests(chunks: list[bytes]) -> list[Message]:
    return [{"type": "http.request", "body": c, "more_body": True} for c in chunks]


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def plain_kind(body: bytes | None) -> str | None:
    """What kind of plain request `body` is: "call", a `tools/call` without a progress
    token; "opening", an `initialize` whose client declared no elicitation; else None."""
    if body is None:
        return None
    try:
        request: Any = pydantic_core.from_json(body)
    except ValueError:
        return None
    if not isinstance(request, dict) or "id" not in request:
        return None
    params = request.get("params")
    params = params if isinstance(params, dict) else {}
    if request.get("method") == "tools/call":
        meta = params.get("_meta")
        meta = meta if isinstance(meta, dict) else {}
        if "progressToken" in meta or _may_ask(meta.get(CLIENT_CAPABILITIES_META_KEY)):
            return None
        return "call"
    if request.get("method") == "initialize":
        return None if _may_ask(params.get("capabilities")) else "opening"
    return None


def _may_ask(capabilities: Any) -> bool:
    """Whether these client capabilities (an `initialize`'s, or a 2026-07-28 request's own,
    in its `_meta`) declare elicitation: a call of that client may have a question for it."""
    return isinstance(capabilities, dict) and capabilities.get("elicitation") is not None


def accepts_json(scope: Scope) -> bool:
    return any(
        name == b"accept" and (JSON in value or b"*/*" in value) for name, value in scope["headers"]
    )


class _FirstEvent:
    """The `send` of one request: the SSE head held back until the first event decides."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._head: Message | None = None
        self._body = b""
        self._state = "waiting"
        """waiting (for the head or the first event), passing (SSE as it comes), answered
        (sent as JSON: the stream's remains are dropped)."""

    async def __call__(self, message: Message) -> None:
        if self._state == "passing":
            await self._send(message)
        elif self._state == "waiting":
            await self._waiting(message)
        # answered: the rest of the stream (its end) has nobody to go to

    async def _waiting(self, message: Message) -> None:
        if message["type"] == "http.response.start" and self._head is None:
            if _header(message, b"content-type").startswith(SSE):
                self._head = message
                return
            await self._pass(message)
            return
        if message["type"] != "http.response.body" or self._head is None:
            await self._pass(message)
            return
        self._body += message.get("body", b"")
        more = bool(message.get("more_body", False))
        event, complete = first_event(self._body)
        if not complete and more:
            return  # the first event is not all here yet
        rest = self._body[len(event) :]
        data = response_data(event) if complete and not rest.strip() else None
        if data is None:
            await self._pass({"type": "http.response.body", "body": b"", "more_body": more})
            return
        headers = [(k, v) for k, v in self._head["headers"] if k.lower() not in DROPPED_HEADERS]
        headers += [(b"content-type", JSON), (b"content-length", str(len(data)).encode())]
        self._state = "answered"
        await self._send({**self._head, "headers": headers})
        await self._send({"type": "http.response.body", "body": data, "more_body": False})

    async def _pass(self, message: Message) -> None:
        """From now on the answer is the SSE stream: what was held back, then `message`
        (a body message's bytes are in what was held back already)."""
        self._state = "passing"
        if self._head is not None:
            await self._send(self._head)
        if message["type"] == "http.response.body":
            await self._send({**message, "body": self._body})
            return
        if self._body:
            await self._send({"type": "http.response.body", "body": self._body, "more_body": True})
        await self._send(message)


def _header(message: Message, name: bytes) -> bytes:
    for key, value in message.get("headers", ()):
        if key.lower() == name:
            return bytes(value).lower()
    return b""


def first_event(body: bytes) -> tuple[bytes, bool]:
    """The stream's first event with its blank line, and whether it is complete."""
    for blank in (b"\r\n\r\n", b"\n\n", b"\r\r"):
        end = body.find(blank)
        if end >= 0:
            return body[: end + len(blank)], True
    return body, False


def response_data(event: bytes) -> bytes | None:
    """The event's data when the event is a JSON-RPC response or error (a message with an id
    and a result or an error); None for anything else."""
    data: list[bytes] = []
    for line in event.splitlines():
        if not line:  # the blank line that ends the event
            continue
        field, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if field == b"data":
            data.append(value)
        # a comment (a ping), a line of no field, an event of another type
        elif field not in FIELDS or (field == b"event" and value != b"message"):
            return None
    if not data:
        return None
    joined = b"\n".join(data)
    try:
        parsed: Any = pydantic_core.from_json(joined)
    except ValueError:
        return None
    if isinstance(parsed, dict) and "id" in parsed and ("result" in parsed or "error" in parsed):
        return joined
    return None
