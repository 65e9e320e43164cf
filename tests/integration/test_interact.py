"""ToolService.Interact for real: input chunks in, output chunks out, optionally on a
pseudo-terminal, through the real server and the agent in the container, on both engines."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from stockade.client import (
    AsyncStockade,
    InvalidArgument,
    Output,
    Sandbox,
    Started,
    Stockade,
    ToolError,
)
from stockade.v1 import tool_pb2, tool_pb2_grpc
from tests.integration.harness import Supervisor, process, running_supervisor

pytestmark = pytest.mark.timeout(300)

GREETER = "python3 -c \"name = input('name? '); print('hello', name)\""
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


def state_of(box: Sandbox, ident: str, *, within: float = 10.0, until: str = "") -> str:
    """The process's state; with `until`, wait (bounded) for it to reach that state."""
    deadline = time.monotonic() + within
    while True:
        state = str(process(box, "poll", id=ident)["state"])
        if not until or state == until or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def test_input_style_program_through_interact(client: Stockade, key: str) -> None:
    with client.sandbox(key).interact(GREETER) as session:
        started = session.started
        assert started.pid > 0
        assert started.process_id.startswith("p")
        assert session.read_until("name? ") == "name? "
        session.send("bob\n")
        assert session.read_until("\n") == "hello bob\n"
        result = session.wait()
    assert not result.is_error, result.error_message
    assert (result.data["state"], result.data["exit_code"]) == ("exited", 0)


def test_a_partial_line_arrives_and_a_token_split_by_a_pause_is_redacted(
    client: Stockade, key: str
) -> None:
    """Output without a line end (a prompt, `printf abc`) arrives while the command waits
    for input (bash's `read -p` prints its prompt only to a terminal, on stderr: printf
    stands in for it); a token written in two pieces, a pause between, is redacted."""
    script = (
        f'printf "name? "; read n; printf abc; read m; printf "token {GITHUB_TOKEN[:9]}"; '
        f'sleep 0.5; printf "{GITHUB_TOKEN[9:]} done\\n"; echo "$n$m"'
    )
    with client.sandbox(key).interact(f"bash -c '{script}'") as session:
        assert session.read_until("name? ") == "name? "
        session.send("ann\n")
        assert session.read_until("abc") == "abc"
        session.send("bob\n")
        rest = session.read_until("annbob\n")
        result = session.wait()
    assert not result.is_error, result.error_message
    assert rest == "token [REDACTED] done\nannbob\n"


def test_one_write_of_the_process_is_one_chunk(client: Stockade, key: str) -> None:
    """`cat` echoes one write of a line and an open end: one Output chunk (issue 28; whole
    lines alone used to go first), and a write of whole lines after it one chunk too."""
    with client.sandbox(key).interact("cat") as session:
        assert session.started.pid > 0
        chunks = (e.text for e in session.events() if isinstance(e, Output))
        session.send("Hello,\nWorld!")
        assert next(chunks) == "Hello,\nWorld!"
        session.send("\none\ntwo\n")
        assert next(chunks) == "\none\ntwo\n"
        session.eof()
        result = session.wait()
    assert not result.is_error, result.error_message


def test_input_style_program_through_exec_stdin(client: Stockade, key: str) -> None:
    result = client.sandbox(key).exec(GREETER, stdin="alice\n")
    assert result.stdout == "name? hello alice\n"


def test_pty_program_sees_a_terminal_of_the_given_size_and_resizes(
    client: Stockade, key: str
) -> None:
    program = (
        "import os, signal, sys\n"
        "signal.signal(signal.SIGWINCH, lambda *_: print('size', *os.get_terminal_size()))\n"
        "print('tty', sys.stdin.isatty(), *os.get_terminal_size())\n"
        "print(input('> ').upper())\n"
    )
    with client.sandbox(key).interact(
        f'python3 -c "{program}"', pty=True, cols=100, rows=30
    ) as session:
        assert session.read_until("\n") == "tty True 100 30\r\n"
        assert session.read_until("> ") == "> "
        session.resize(120, 40)
        session.read_until("size 120 40\r\n")
        session.send("shout\r")  # Enter on a terminal: the line discipline makes it \n
        assert session.read_until("SHOUT") == "shout\r\nSHOUT"
        assert not session.wait().is_error


def test_pty_ctrl_c_and_ctrl_d(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    with box.interact("cat", pty=True) as session:
        session.send("line\n")
        session.read_until("line\r\nline\r\n")  # the terminal's echo, then cat's copy
        session.eof()  # ^D
        assert session.wait().data["exit_code"] == 0
    with box.interact("echo ready; sleep 100", pty=True) as session:
        session.read_until("ready")
        session.send(b"\x03")  # ^C: SIGINT to the terminal's foreground group
        result = session.wait()
    assert result.is_error
    assert result.data["signal"] == "SIGINT"
    assert "process exited with code 130 (SIGINT)" in result.error_message


def test_attach_to_a_started_process_write_signal_and_replay(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    process(box, "start", command="echo before; cat", name="echoer")
    with box.interact(process="echoer") as session:
        assert session.started.process_id == "p1"
        assert session.read_until("before\n") == "before\n"
        session.send("ping\n")
        assert session.read_until("ping\n") == "ping\n"
    assert state_of(box, "echoer") == "running"  # detaching leaves it running
    with box.interact(process="p1", offset=7) as session:
        assert session.read_until("ping\n") == "ping\n"  # the log replayed from byte 7
        session.signal("TERM")
        result = session.wait()
    assert result.is_error
    assert (result.data["exit_code"], result.data["signal"]) == (143, "SIGTERM")


def test_a_process_the_session_started_dies_with_it_unless_kept(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    with box.interact("echo up; sleep 300") as session:
        ident = session.started.process_id
        session.read_until("up")
    assert state_of(box, ident, until="exited") == "exited"
    with box.interact("echo up; sleep 300", keep_running=True) as session:
        kept = session.started.process_id
        session.read_until("up")
    assert state_of(box, kept) == "running"
    process(box, "kill", id=kept, signal="KILL")


def test_output_is_scrubbed_and_the_session_audited(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    with box.interact('read line; echo "token=$line"') as session:
        session.send(GITHUB_TOKEN[:10])
        session.send(GITHUB_TOKEN[10:] + "\n")
        session.read_until("token=")
        result = session.wait()
        text = session.output
    assert GITHUB_TOKEN not in text
    assert "[REDACTED]" in text
    assert result.redactions >= 1
    records = client.list_audit(sandbox_key=key, tool="process")
    sessions = [r for r in records if '"interact"' in r.arguments_json]
    assert len(sessions) == 1
    assert GITHUB_TOKEN not in sessions[0].arguments_json
    assert '"input_bytes": 41' in sessions[0].arguments_json
    assert sessions[0].exit_code == 0


def test_large_and_binary_input_arrives_exactly(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    blob = bytes(range(256)) * 32768  # 8 MiB, every byte value, not UTF-8
    with box.interact("sha256sum") as session:
        session.send(blob[:3_000_000])
        session.send(blob[3_000_000:])
        session.eof()
        result = session.wait()
        text = session.output
    assert not result.is_error, result.error_message
    assert hashlib.sha256(blob).hexdigest() in text


def test_async_client_interacts(supervisor: Supervisor, key: str) -> None:
    async def main() -> str:
        async with AsyncStockade(supervisor.target) as client:
            session = await client.sandbox(key).interact(GREETER)
            async with session:
                started = await session.started()
                assert isinstance(started, Started)
                await session.read_until("name? ")
                await session.send("carol\n")
                line = await session.read_until("\n")
                await session.close_input()
                assert not (await session.wait()).is_error
                return line

    assert asyncio.run(main()) == "hello carol\n"


# refused and wrong


def test_guard_and_unknown_process_end_the_session_with_a_result(
    client: Stockade, key: str
) -> None:
    box = client.sandbox(key)
    with box.interact("rm -rf /") as session, pytest.raises(ToolError) as info:
        _ = session.started
    assert info.value.result.error_code == "PERMISSION_DENIED"
    assert "guard" in info.value.result.error_message
    with box.interact(process="p999") as session:
        result = session.wait()
    assert result.error_code == "INVALID_ARGS"
    assert "no process 'p999'" in result.error_message


def test_bad_inputs_end_the_session_clearly(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    with box.interact("sleep 100") as session:
        session.signal("STOPIT")
        result = session.wait()
    assert result.error_code == "INVALID_ARGS"
    assert "unknown signal 'STOPIT'" in result.error_message
    with box.interact("sleep 100") as session:
        session.resize(80, 24)
        result = session.wait()
    assert "has no terminal" in result.error_message
    with box.interact("sleep 100", pty=True) as session:
        session.resize(0, 24)
        result = session.wait()
    assert "must be 1 to 1000" in result.error_message
    deadline = time.monotonic() + 10
    while any(p["state"] == "running" for p in process(box, "list")["processes"]):
        assert time.monotonic() < deadline, "a refused session left its process running"
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of process_id"),
        ({"command": "true", "process": "p1"}, "exactly one of process_id"),
        ({"process": "p1", "pty": True}, "pty: only for starting a command"),
        ({"command": "true", "cols": 80}, "a window size needs pty"),
        ({"command": "true", "offset": 5}, "offset is for attaching"),
    ],
)
def test_wrong_start_is_invalid_argument(
    client: Stockade, key: str, kwargs: dict[str, Any], message: str
) -> None:
    with client.interact(key, **kwargs) as session, pytest.raises(InvalidArgument) as info:
        session.wait()
    assert message in str(info.value)


def test_wrong_keys_are_invalid_argument(client: Stockade) -> None:
    for key in ("", "k" * 300, "a\x00b"):
        with client.interact(key, "true") as session, pytest.raises(InvalidArgument):
            session.wait()


@pytest.fixture
def stub(supervisor: Supervisor) -> Iterator[tool_pb2_grpc.ToolServiceStub]:
    with grpc.insecure_channel(supervisor.target) as channel:
        yield tool_pb2_grpc.ToolServiceStub(channel)


def raw(stub: tool_pb2_grpc.ToolServiceStub, *messages: Any) -> list[Any]:
    return list(stub.Interact(iter(messages), timeout=60))


def test_raw_protocol_errors(stub: tool_pb2_grpc.ToolServiceStub, key: str) -> None:
    start = tool_pb2.InteractInput(start=tool_pb2.InteractStart(sandbox_key=key, command="cat"))
    cases = [
        ((), "starts with a 'start' message"),
        ((tool_pb2.InteractInput(data=b"x"),), "starts with a 'start' message"),
        ((start, start), "only the first message"),
        ((start, tool_pb2.InteractInput()), "no input"),
    ]
    for messages, message in cases:
        with pytest.raises(grpc.RpcError) as info:
            raw(stub, *messages)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in (info.value.details() or "")


def test_policy_denies_interact_where_process_is_denied(engine: str, key: str) -> None:
    with running_supervisor(engine, '[tools]\ndeny = ["process"]\n') as sup, sup.client() as c:
        with c.interact(key, "cat") as session:
            result = session.wait()
        assert result.error_code == "PERMISSION_DENIED"
        with c.interact(key, process="p1") as session:
            result = session.wait()
        assert result.error_code == "PERMISSION_DENIED"
