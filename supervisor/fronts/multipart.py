"""multipart/form-data bodies parsed as they stream (python-multipart's push parser): each part
is handed on with its headers as soon as they have arrived, and its data as it arrives, so a
part of any size goes straight where it is going and nothing is spooled on the host. A part's
data ends only at the boundary after it: a body cut short in a part ends that part's data
with BodyRefused (400), never with a clean end that would commit a partial file."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from email.message import Message
from typing import Any

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser

from stockade.supervisor.fronts.bodies import BodyRefused

MAX_HEADER_BYTES = 8 << 10
"""The longest header line of a part."""
MAX_HEADERS = 16
"""The most headers a part may have."""


@dataclass
class Part:
    headers: dict[str, str]
    """Lowercase names; a repeated header keeps its last value."""
    data: AsyncIterator[bytes]

    def param(self, name: str) -> str | None:
        """A parameter of the part's Content-Disposition (`name`, `filename`), raw."""
        msg = Message()
        msg["content-disposition"] = self.headers.get("content-disposition", "")
        value = msg.get_param(name, header="content-disposition")
        return value if isinstance(value, str) else None


def boundary_of(content_type: str) -> bytes:
    msg = Message()
    msg["content-type"] = content_type
    boundary = msg.get_param("boundary")
    if not isinstance(boundary, str) or not 0 < len(boundary) <= 70:
        raise BodyRefused(400, "a multipart body needs a boundary of 1 to 70 characters")
    return boundary.encode("latin-1", "replace")


class _Events:
    """The parser's callbacks as a queue of (kind, value): "headers" (dict), "data" (bytes),
    "end" (a part's), "done" (the closing boundary)."""

    def __init__(self, boundary: bytes) -> None:
        self.queue: deque[tuple[str, Any]] = deque()
        self.done = False
        self._field, self._value = bytearray(), bytearray()
        self._headers: dict[str, str] = {}
        callbacks: Any = {
            "on_part_begin": self._headers.clear,
            "on_header_field": lambda d, s, e: self._field.extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._value.extend(d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": lambda: self.queue.append(("headers", dict(self._headers))),
            "on_part_data": lambda d, s, e: self.queue.append(("data", bytes(d[s:e]))),
            "on_part_end": lambda: self.queue.append(("end", None)),
            "on_end": self._end,
        }
        self._parser = MultipartParser(
            boundary, callbacks, max_header_count=MAX_HEADERS, max_header_size=MAX_HEADER_BYTES
        )

    def _header_end(self) -> None:
        name = self._field.decode("latin-1").strip().lower()
        self._headers[name] = self._value.decode("latin-1").strip()
        self._field.clear()
        self._value.clear()

    def _end(self) -> None:
        self.done = True
        self.queue.append(("done", None))

    def write(self, chunk: bytes) -> None:
        try:
            self._parser.write(chunk)
        except MultipartParseError as exc:
            message = f"the multipart body does not parse: {exc}"
            raise BodyRefused(400, message, "the multipart body does not parse") from None


async def parts(body: AsyncIterator[bytes], boundary: bytes, max_parts: int) -> AsyncIterator[Part]:
    """The parts of a multipart body, in order. Each part's data must be read (or left) before
    the next part is asked for; a part left unread is skipped."""
    events = _Events(boundary)

    async def next_event() -> tuple[str, Any]:
        while not events.queue:
            chunk = await anext(body, None)
            if chunk is None:
                raise BodyRefused(400, "the multipart body is truncated")
            events.write(chunk)
        return events.queue.popleft()

    async def data() -> AsyncIterator[bytes]:
        while True:
            kind, value = await next_event()
            if kind == "end":
                return
            if kind != "data":
                raise BodyRefused(400, "the multipart body does not parse")
            yield value

    count = 0
    while True:
        kind, value = await next_event()
        if kind == "done":
            return
        if kind != "headers":
            continue
        count += 1
        if count > max_parts:
            raise BodyRefused(413, f"a multipart body may have at most {max_parts} parts")
        stream = data()
        yield Part(value, stream)
        async for _ in stream:  # what the consumer left of the part
            pass
