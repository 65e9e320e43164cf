"""Quick answers as one JSON body: an ASGI middleware in front of the SDK's streamable-HTTP
transport.

The SDK answers every request POST with an SSE stream (its JSON-response mode is one switch
for the whole endpoint, and would leave nothing to carry progress notifications or an
elicitation). A client reads such a stream up to the response event and then closes it
before its end, so its HTTP connection cannot be reused: the mcp SDK's client opened a new
TCP connection for every call. The spec lets the server choose per request (a request's
answer is either `text/event-stream` or one `application/json` object, and clients must
take both). So this middleware holds back the SSE response's head until the stream's first
event: when that event is the JSON-RPC response itself (the request is answered and nothing
came before it: no progress, no elicitation, no keep-alive ping of a call that ran long), it
sends that message alone as `application/json` with a Content-Length; anything else (a
notification, a server request, a comment, a stream that ends with no event, a client that
does not accept JSON) goes out as the SSE stream it was, from its head on, unchanged.
"""

from __future__ import annotations

from typing import Any

import pydantic_core
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


class JsonAnswers:
    """Wraps the MCP endpoint's ASGI app (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not accepts_json(scope):
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _FirstEvent(send))


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
