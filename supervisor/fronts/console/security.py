"""What every console response carries and every request must pass: security headers, a
cap on request bodies, and for a change of state a same-origin request with the session's
CSRF token."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 16 << 10
"""The largest request body: a form of a token or a decision (a bigger one is 413)."""
MAX_URL_CHARS = 4096
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make Origin "null" on POSTs
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)
SAFE_METHODS = frozenset({"GET", "HEAD"})


class Guard:
    """ASGI middleware: the security headers on every response; requests with a body over
    MAX_BODY_BYTES (declared or streamed), an overlong URL or a method other than GET, HEAD
    and POST are answered here, before any handler."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k for k, _ in HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k not in names]
                message = {**message, "headers": kept + list(HEADERS)}
            await send(message)

        headers = Headers(scope=scope)
        length = headers.get("content-length", "0")
        refusal = None
        if scope["method"] not in ("GET", "HEAD", "POST"):
            refusal = (405, "method not allowed")
        elif len(scope.get("raw_path", b"")) + len(scope.get("query_string", b"")) > MAX_URL_CHARS:
            refusal = (414, "URL too long")
        elif not length.isdigit() or int(length) > MAX_BODY_BYTES:
            refusal = (413, "request body too large")
        if refusal is not None:
            await _plain(send_with_headers, *refusal)
            return
        seen = 0

        async def bounded_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > MAX_BODY_BYTES:  # a streamed body past the cap: read no more
                    return {"type": "http.disconnect"}
            return message

        await self._app(scope, bounded_receive, send_with_headers)


async def _plain(send: Send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def same_origin(request: Request) -> bool:
    """A state-changing request must come from the console's own pages: its Origin (or,
    without one, its Referer) names this host. Browsers send Origin on every POST."""
    host = request.headers.get("host", "")
    origin = request.headers.get("origin") or request.headers.get("referer")
    if origin is None:
        return False
    scheme, _, rest = origin.partition("://")
    return scheme in ("http", "https") and rest.split("/", 1)[0] == host and bool(host)


def csrf_ok(expected: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(expected.encode(), (given or "").encode())
