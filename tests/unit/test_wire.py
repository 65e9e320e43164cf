"""wire.problem: why a request's bytes do not parse, named by field (the supervisor answers
INVALID_ARGUMENT "malformed request: ..." with it; test_bad_input does it through the server)."""

from __future__ import annotations

import pytest
from google.protobuf import struct_pb2
from google.protobuf.descriptor import Descriptor
from hypothesis import given
from hypothesis import strategies as st

from stockade.supervisor.fronts.grpc import wire
from stockade.v1 import sandbox_pb2, tool_pb2

CALL = tool_pb2.CallToolRequest.DESCRIPTOR


def field(number: int, data: bytes) -> bytes:
    """A length-delimited field (short ones: one-byte key and length)."""
    return bytes([number << 3 | 2, len(data)]) + data


@pytest.mark.parametrize(
    ("descriptor", "data", "message"),
    [
        (sandbox_pb2.GetSandboxRequest.DESCRIPTOR, field(1, b"k\xff"), "field 'key'"),
        (CALL, field(2, b"\xed\xa0\x80"), "field 'tool'"),  # a surrogate
        (CALL, field(2, b"\xc0\xaf"), "field 'tool'"),  # an overlong '/'
        (CALL, field(1, b"ok") + field(3, b"{\xff}"), "field 'arguments_json'"),
        (CALL, field(4, field(1, b"\xff")), "field 'context.agent_id'"),
    ],
)
def test_a_string_that_is_not_utf8_is_named_by_its_path(
    descriptor: Descriptor, data: bytes, message: str
) -> None:
    assert wire.problem(descriptor, data) == f"{message} is not valid UTF-8 (bad UTF-8)"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\xff\xff\xff\xff", "a varint is cut off or longer than 10 bytes"),
        (b"\x12\x10abc", "field 2 runs past the end of the message"),
        (b"\x10", "a varint is cut off or longer than 10 bytes"),
        (b"\x0d\x01\x02", "field 1 runs past the end of the message"),
        (b"\x1b", "field 3 has wire type 3, which proto3 never sends"),
        (b"\x02\x00", "field number 0 at byte 1"),
    ],
)
def test_anything_else_is_corrupt_and_says_what_broke(data: bytes, why: str) -> None:
    assert wire.problem(CALL, data) == f"corrupt stockade.v1.CallToolRequest message: {why}"


def long_field(number: int, data: bytes) -> bytes:
    length, size = b"", len(data)
    while size > 0x7F:
        length, size = length + bytes([size & 0x7F | 0x80]), size >> 7
    return bytes([number << 3 | 2]) + length + bytes([size]) + data


def test_nesting_past_protobufs_limit_is_corrupt() -> None:
    """google.protobuf.Value nests itself (list_value.values); ours do not, but the walk is
    bounded all the same."""
    data = b""
    for _ in range(60):  # each round: a ListValue in a Value, two levels
        data = long_field(6, long_field(1, data))
    assert wire.problem(struct_pb2.Value.DESCRIPTOR, data) == (
        "corrupt google.protobuf.Value message: nested deeper than 100 levels"
    )


def test_bytes_that_parse_get_a_plain_sentence_and_unknown_fields_are_left_alone() -> None:
    assert wire.problem(CALL, field(2, b"exec")) == (
        "the bytes do not parse as a stockade.v1.CallToolRequest message"
    )
    assert wire.problem(CALL, field(15, b"\xff")).startswith("the bytes do not parse")


@given(st.binary(max_size=300))
def test_any_bytes_give_a_sentence_and_never_raise(data: bytes) -> None:
    assert wire.problem(CALL, data)
