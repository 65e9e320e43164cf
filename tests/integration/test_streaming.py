"""Streamed calls for real: output arrives while the command runs, large streams arrive
whole with bounded memory, secrets split across chunks are scrubbed, cancelled and timed-out
calls leave nothing behind, and stdin reaches the command.

Streaming is proven causally, not by timing: the command prints a line and then waits for an
acknowledgement that the test sends only after it has received that line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stockade.client import (
    DeadlineExceeded,
    Output,
    Started,
    Stockade,
    StreamEvent,
    ToolResult,
)
from tests.integration.harness import Supervisor

pytestmark = pytest.mark.timeout(300)
MiB = 1024 * 1024
HANDSHAKE = (
    "for i in 1 2 3 4 5; do echo line $i; "
    "while [ ! -e /tmp/ack-$i ]; do sleep 0.05; done; done; echo done"
)


def ack(client: Stockade, key: str, line: str) -> None:
    n = line.split()[-1]
    assert client.sandbox(key).exec(f"touch /tmp/ack-{n}").exit_code == 0


def test_each_line_arrives_while_the_command_runs(
    supervisor: Supervisor, client: Stockade, key: str
) -> None:
    client.sandbox(key).exec("rm -f /tmp/ack-*")
    seen: list[str] = []
    pending = ""
    with supervisor.client() as streamer:
        for event in streamer.call_stream(key, "exec", {"command": HANDSHAKE, "timeout": 60}):
            if isinstance(event, Output):
                pending += event.text
                while "\n" in pending:
                    line, pending = pending.split("\n", 1)
                    seen.append(line)
                    if line.startswith("line "):
                        ack(client, key, line)
            elif isinstance(event, ToolResult):
                result = event
    assert seen == [f"line {i}" for i in range(1, 6)] + ["done"]
    assert result.exit_code == 0
    assert result.stdout == "\n".join(seen) + "\n"


def test_the_cli_streams_too(supervisor: Supervisor, client: Stockade, key: str) -> None:
    client.sandbox(key).exec("rm -f /tmp/ack-*")
    env = {**os.environ, "STOCKADE_ADDR": supervisor.target}
    cmd = [sys.executable, "-m", "stockade.supervisor.cli", "exec", key, "--", HANDSHAKE]
    lines = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("line "):
                ack(client, key, line)
    assert proc.returncode == 0
    assert lines == [f"line {i}" for i in range(1, 6)] + ["done"]


def test_a_100_mib_stream_arrives_whole_with_bounded_memory(
    supervisor: Supervisor, client: Stockade, key: str
) -> None:
    size = 100 * MiB
    command = f"yes {'a' * 99} | head -c {size}"
    received = 0
    for event in client.call_stream(key, "exec", {"command": command, "timeout": 240}):
        if isinstance(event, Output):
            received += len(event.text)
        elif isinstance(event, ToolResult):
            result = event
    assert received == size
    assert result.exit_code == 0
    assert result.data["stdout_bytes"] == size
    assert result.data["stdout_truncated"] is True
    assert supervisor.rss_bytes() < 600 * MiB


def test_a_secret_split_across_chunks_is_scrubbed(client: Stockade, key: str) -> None:
    token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    command = f"printf 'tok: {token[:12]}'; sleep 0.5; printf '{token[12:]}\\n'"
    text = ""
    for event in client.call_stream(key, "exec", {"command": command}):
        if isinstance(event, Output):
            text += event.text
            assert token[:12] not in event.text
        elif isinstance(event, ToolResult):
            result = event
    assert "[REDACTED]" in text
    assert token not in result.for_llm
    assert result.redactions >= 1


def _processes(client: Stockade, key: str) -> list[str]:
    return client.sandbox(key).exec("ps -eo args --no-headers").stdout.splitlines()


def test_cancelling_the_stream_kills_the_process_group(client: Stockade, key: str) -> None:
    command = "sleep 301 & sleep 302; echo never"
    events = client.call_stream(key, "exec", {"command": command, "timeout": 120})
    first = next(iter(events))
    assert isinstance(first, Started)
    events.close()  # type: ignore[attr-defined]
    for _ in range(50):
        left = [p for p in _processes(client, key) if p.startswith("sleep 30")]
        if not left:
            break
    assert left == []


def test_a_passed_deadline_kills_the_command(client: Stockade, key: str) -> None:
    with pytest.raises(DeadlineExceeded):
        for _ in client.call_stream(key, "exec", {"command": "sleep 303"}, deadline=2):
            pass
    for _ in range(50):
        if "sleep 303" not in _processes(client, key):
            break
    assert "sleep 303" not in _processes(client, key)


def test_a_timeout_returns_the_partial_output(client: Stockade, key: str) -> None:
    events: list[StreamEvent] = list(
        client.call_stream(key, "exec", {"command": "echo partial; sleep 304", "timeout": 1})
    )
    result = events[-1]
    assert isinstance(result, ToolResult)
    assert result.error_code == "TIMEOUT"
    assert result.stdout == "partial\n"
    assert [e.text for e in events if isinstance(e, Output)] == ["partial\n"]
    assert "sleep 304" not in _processes(client, key)


def test_stdin_reaches_the_command(supervisor: Supervisor, client: Stockade, key: str) -> None:
    program = "python3 -c 'print(input().upper()); print(input()[::-1])'"
    result = client.call(key, "exec", {"command": program, "stdin": "hello\nabc\n"})
    assert result.stdout == "HELLO\ncba\n"
    env = {**os.environ, "STOCKADE_ADDR": supervisor.target}
    cmd = [sys.executable, "-m", "stockade.supervisor.cli", "exec", "--stdin", key, "--", program]
    done = subprocess.run(cmd, input="from cli\nxyz\n", capture_output=True, text=True, env=env)
    assert (done.returncode, done.stdout) == (0, "FROM CLI\nzyx\n")


def test_non_command_tools_stream_just_the_result(client: Stockade, key: str) -> None:
    client.sandbox(key).write_file("s.txt", "streamed")
    events = list(client.call_stream(key, "read_file", {"path": "s.txt"}))
    assert len(events) == 1
    assert isinstance(events[0], ToolResult)
    assert events[0].data["content"] == "streamed"


def test_bad_key_on_a_stream_is_a_status(client: Stockade) -> None:
    from stockade.client import InvalidArgument

    for bad in ("", "k" * 10_000):
        with pytest.raises(InvalidArgument):
            list(client.call_stream(bad, "exec", {"command": "true"}))
    events = list(client.call_stream("fine-key", "no_such_tool", {}))
    assert isinstance(events[-1], ToolResult)
    assert events[-1].error_code == "NOT_FOUND"
