"""Why a request's bytes do not parse as its message, in words a caller can act on.

protobuf's own DecodeError says little in some releases ("Error parsing message with type
X"), so the supervisor walks the wire format itself when a request fails to parse: a string
field that is not UTF-8 is named by its path, anything else is reported as corrupt with what
broke. Only called for requests that already failed; the walk is bounded by their size."""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor

_MAX_DEPTH = 100
"""protobuf's own recursion limit; deeper nesting is corrupt for our messages anyway."""


class _Corrupt(Exception):
    pass


def problem(descriptor: Descriptor, data: bytes) -> str:
    """What is wrong with `data` as a `descriptor` message: "field 'a.b' is not valid UTF-8
    (bad UTF-8)" or "corrupt message: ..."; a generic sentence when the walk finds nothing."""
    try:
        found = _walk(descriptor, memoryview(data), "", 0)
    except _Corrupt as exc:
        return f"corrupt {descriptor.full_name} message: {exc}"
    return found or f"the bytes do not parse as a {descriptor.full_name} message"


def _walk(descriptor: Descriptor, data: memoryview, prefix: str, depth: int) -> str | None:
    if depth > _MAX_DEPTH:
        raise _Corrupt(f"nested deeper than {_MAX_DEPTH} levels")
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise _Corrupt(f"field number 0 at byte {pos}")
        if wire_type == 0:
            _, pos = _varint(data, pos)
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
        elif wire_type == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise _Corrupt(f"field {number} runs past the end of the message")
            found = _field(descriptor, number, data[pos : pos + length], prefix, depth)
            if found:
                return found
            pos += length
        else:
            raise _Corrupt(f"field {number} has wire type {wire_type}, which proto3 never sends")
        if pos > len(data):
            raise _Corrupt(f"field {number} runs past the end of the message")
    return None


def _field(
    descriptor: Descriptor, number: int, chunk: memoryview, prefix: str, depth: int
) -> str | None:
    field = descriptor.fields_by_number.get(number)
    if field is None:
        return None  # an unknown field: protobuf keeps those
    path = f"{prefix}{field.name}"
    if field.type == FieldDescriptor.TYPE_STRING:
        try:
            str(chunk, "utf-8")
        except UnicodeDecodeError:
            return f"field '{path}' is not valid UTF-8 (bad UTF-8)"
    elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
        return _walk(field.message_type, chunk, f"{path}.", depth + 1)
    return None


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise _Corrupt("a varint is cut off or longer than 10 bytes")
