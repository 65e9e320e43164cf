"""Wrong, huge and hostile input: each gets a clear error and nothing on the host changes."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import grpc
import pytest

from stockade.client import CallContext, InvalidArgument, ResourceExhausted, Stockade
from tests.integration.harness import Supervisor

pytestmark = pytest.mark.timeout(300)


def call(client: Stockade, key: str, tool: str, args: object) -> tuple[str, str]:
    result = client.call(key, tool, args)  # type: ignore[arg-type]
    assert result.is_error, result.for_llm
    return result.error_code, result.error_message


def test_unknown_tool(client: Stockade, key: str) -> None:
    code, message = call(client, key, "rm_rf", {})
    assert code == "NOT_FOUND"
    assert "unknown tool 'rm_rf'" in message
    assert "exec" in message


@pytest.mark.parametrize(
    ("tool", "args", "needle"),
    [
        ("write_file", {"path": "a.txt"}, "content"),
        ("exec", {}, "command"),
        ("exec", {"command": 5}, "command"),
        ("exec", {"command": "true", "timeout": "soon"}, "timeout"),
        ("exec", {"command": "true", "timeout": True}, "timeout"),
        ("read_file", {"path": "a", "start_line": "1"}, "start_line"),
        ("read_file", {"path": "a", "bogus": 1}, "bogus"),
        ("exec", {"command": "true", "env": {"A=B": "x"}}, "env"),
        ("edit_file", {"path": "a", "old_text": "", "new_text": "x"}, "old_text"),
    ],
)
def test_missing_or_mistyped_arguments(
    client: Stockade, key: str, tool: str, args: dict[str, object], needle: str
) -> None:
    code, message = call(client, key, tool, args)
    assert code == "INVALID_ARGS"
    assert needle in message


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"str"', "null"])
def test_arguments_that_are_not_a_json_object(client: Stockade, key: str, raw: str) -> None:
    code, message = call(client, key, "exec", raw)
    assert code == "INVALID_ARGS"
    assert "arguments_json" in message


@pytest.mark.parametrize(
    "path", ["../outside.txt", "a/../../x", "/etc/passwd", "/workspace/../etc"]
)
@pytest.mark.parametrize("tool", ["read_file", "write_file", "list_files"])
def test_paths_outside_the_workspace(client: Stockade, key: str, tool: str, path: str) -> None:
    args: dict[str, object] = {"path": path}
    if tool == "write_file":
        args["content"] = "x"
    code, message = call(client, key, tool, args)
    assert code == "INVALID_PATH"
    assert "workspace" in message or ".." in message


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_symlink_to_a_host_file_never_touches_the_host(
    supervisor: Supervisor, client: Stockade, key: str, tmp_path: Path
) -> None:
    canary = tmp_path / "canary.txt"
    canary.write_text("host secret\n")
    before = digest(canary)
    box = client.sandbox(key)
    box.ensure()
    workspace = supervisor.workspace(key)
    os.symlink(canary, workspace / "to-host")
    os.symlink("/etc/passwd", workspace / "to-passwd")
    os.symlink(tmp_path, workspace / "to-host-dir")
    for name in ("to-host", "to-passwd", "to-host-dir/canary.txt"):
        code, _ = call(client, key, "read_file", {"path": name})
        assert code in ("INVALID_PATH", "FILE_NOT_FOUND")
        code, _ = call(client, key, "write_file", {"path": name, "content": "pwned"})
        assert code in ("INVALID_PATH", "FILE_NOT_FOUND")
        code, _ = call(client, key, "edit_file", {"path": name, "old_text": "h", "new_text": "p"})
        assert code in ("INVALID_PATH", "FILE_NOT_FOUND")
    box.exec("echo pwned > to-host; echo pwned > to-host-dir/canary.txt; true")
    assert digest(canary) == before
    assert canary.read_text() == "host secret\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["canary.txt"]


def test_sandbox_cannot_replace_its_agent_socket(client: Stockade, key: str) -> None:
    result = client.sandbox(key).exec(
        "rm -f /run/stockade/agent.sock.frames; ln -sf /var/run/docker.sock /run/stockade/x; "
        "ls -ld /run/stockade /run/stockade/agent.sock.frames"
    )
    assert "Permission denied" in result.stderr
    assert "agent.sock.frames" in result.stdout
    assert client.sandbox(key).exec("echo ok").stdout == "ok\n"


def test_permission_denied_inside_the_sandbox(client: Stockade, key: str) -> None:
    client.sandbox(key).exec("echo x > locked; chmod 000 locked; echo y > ro; chmod 444 ro")
    code, message = call(client, key, "read_file", {"path": "locked"})
    assert (code, "locked" in message) == ("PERMISSION_DENIED", True)
    code, _ = call(client, key, "write_file", {"path": "ro", "content": "z"})
    assert code == "PERMISSION_DENIED"
    code, _ = call(client, key, "write_file", {"path": "/workspace/../etc/x", "content": "z"})
    assert code == "INVALID_PATH"
    assert client.sandbox(key).exec("cat ro").stdout == "y\n"


def test_fifo_where_a_file_is_expected_does_not_hang(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    box.exec("mkfifo pipe")
    code, _ = call(client, key, "read_file", {"path": "pipe"})
    assert code == "INVALID_PATH"


def test_fifty_megabyte_argument_is_refused(client: Stockade, key: str) -> None:
    with pytest.raises(ResourceExhausted) as info:
        client.call(key, "write_file", {"path": "big", "content": "x" * (50 * 1024 * 1024)})
    assert "larger than max" in str(info.value)
    assert (
        client.sandbox(key).exec("ls big 2>&1; true").stdout.endswith("No such file or directory\n")
    )


@pytest.mark.parametrize(("bad_key", "needle"), [("", "empty"), ("k" * 10_000, "10000 bytes")])
def test_bad_keys_are_refused(client: Stockade, bad_key: str, needle: str) -> None:
    for action in (
        lambda: client.call(bad_key, "exec", {"command": "true"}),
        lambda: client.ensure_sandbox(bad_key),
        lambda: client.get_sandbox(bad_key),
        lambda: client.destroy_sandbox(bad_key),
    ):
        with pytest.raises(InvalidArgument) as info:
            action()
        assert needle in str(info.value)
        assert info.value.reason == "INVALID_REQUEST"


def test_odd_but_valid_keys_work(client: Stockade) -> None:
    for key in ("ключ 🔑 with spaces", "a/b:c\nnewline", "x" * 256):
        box = client.sandbox(key)
        box.write_file("k.txt", key)
        assert box.read_file("k.txt") == key
        assert box.info().key == key
        box.destroy(delete_workspace=True)


def test_integer_with_too_many_digits(client: Stockade, key: str) -> None:
    code, message = call(client, key, "exec", '{"command": "true", "timeout": ' + "9" * 5000 + "}")
    assert code == "INVALID_ARGS"
    assert message == "arguments_json holds an integer of more than 4300 digits"


def test_lone_surrogates_are_refused_and_the_sandbox_lives_on(client: Stockade, key: str) -> None:
    """A lone surrogate U+DCFF stands for the byte 0xff of a name that is not UTF-8; the agent's
    errors naming such a path failed to serialize, and the supervisor took that for a broken
    agent: SANDBOX_LOST, the container re-created, background processes gone."""
    box = client.sandbox(key)
    started = box.call("process", {"action": "start", "command": "sleep 600", "name": "bg"})
    assert not started.is_error, started.error_message
    container = box.info().container_id
    missing: list[tuple[str, dict[str, object]]] = [
        ("read_file", {"path": "\udcff"}),
        ("list_files", {"path": "sub/\udcff"}),
        ("edit_file", {"path": "\udcff", "old_text": "a", "new_text": "b"}),
        ("exec", {"command": "true", "workdir": "\udcff"}),
    ]
    for tool, args in missing:
        code, message = call(client, key, tool, args)
        assert (code, "\ufffd" in message) == ("FILE_NOT_FOUND", True), message
    no_bytes: list[tuple[str, dict[str, object], str]] = [
        ("exec", {"command": "echo \ud800"}, "command"),
        ("exec", {"command": "true", "env": {"A": "\ud800"}}, "env.A"),
        ("exec", {"command": "cat", "stdin": "x\udbff"}, "stdin"),
        ("process", {"action": "start", "command": "echo \ud800"}, "command"),
    ]
    for tool, args, name in no_bytes:
        code, message = call(client, key, tool, args)
        assert code == "INVALID_ARGS"
        assert f"argument '{name}' holds a lone surrogate" in message
    assert box.info().container_id == container
    listed = box.call("process", {"action": "list"}).data["processes"]
    assert [(p["name"], p["state"]) for p in listed] == [("bg", "running")]
    assert box.exec("echo ok").stdout == "ok\n"


def test_the_audit_log_survives_a_lone_surrogate(client: Stockade, key: str) -> None:
    """The audit writer thread used to die on the first record holding one (SQLite cannot
    encode it): every later call went unaudited, its record kept in memory for ever."""
    box = client.sandbox(key)
    code, _ = call(client, key, "exec", {"command": "echo \ud800"})
    assert code == "INVALID_ARGS"
    assert box.exec("echo after").stdout == "after\n"
    records = client.list_audit(sandbox_key=key)
    assert [json.loads(r.arguments_json)["command"] for r in records] == [
        "echo after",
        "echo \ud800",
    ]


def raw_call(target: str, method: str, payload: bytes) -> grpc.RpcError:
    with grpc.insecure_channel(target) as channel:
        rpc = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            rpc(payload, timeout=30)
    return info.value


def string_field(number: int, data: bytes) -> bytes:
    assert number < 16
    assert len(data) < 128
    return bytes([number << 3 | 2, len(data)]) + data


@pytest.mark.parametrize(
    ("method", "payload", "needle"),
    [
        ("/stockade.v1.SandboxService/GetSandbox", string_field(1, b"k\xff"), "bad UTF-8"),
        ("/stockade.v1.SandboxService/EnsureSandbox", string_field(1, b"\xc0\xaf"), "bad UTF-8"),
        ("/stockade.v1.ToolService/CallTool", string_field(2, b"\xed\xa0\x80"), "bad UTF-8"),
        ("/stockade.v1.ToolService/CallToolStream", string_field(3, b"{\xff}"), "bad UTF-8"),
        ("/stockade.v1.ToolService/CallTool", b"\xff\xff\xff\xff", "corrupt"),
    ],
)
def test_a_request_that_does_not_parse_is_invalid_argument(
    supervisor: Supervisor, method: str, payload: bytes, needle: str
) -> None:
    """Not UNKNOWN with a Python class name, as gRPC answers by itself."""
    error = raw_call(supervisor.target, method, payload)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("malformed request: ")
    assert needle in error.details()
    assert "<class" not in error.details()
    assert ("stockade-error-reason", "INVALID_REQUEST") in (error.trailing_metadata() or ())


@pytest.mark.parametrize(
    ("request_id", "context", "needle"),
    [
        ("r" * 257, None, "request_id is 257 bytes"),
        ("é" * 129, None, "request_id is 258 bytes"),
        ("", CallContext(agent_id="a" * 300), "context.agent_id is 300 bytes"),
        ("", CallContext(chat_id="c" * 10_000), "context.chat_id is 10000 bytes"),
    ],
)
def test_oversized_request_ids_and_contexts_are_refused(
    client: Stockade, key: str, request_id: str, context: CallContext | None, needle: str
) -> None:
    """They are echoed in every log line, reply and audit record: 16 MiB each, unchecked."""
    with pytest.raises(InvalidArgument) as info:
        client.call(key, "exec", {"command": "true"}, request_id=request_id, context=context)
    assert needle in str(info.value)
    result = client.call(key, "exec", {"command": "true"}, request_id="é" * 128)
    assert (result.is_error, result.request_id) == (False, "é" * 128)


def test_arguments_with_a_million_members_are_refused_at_once(client: Stockade, key: str) -> None:
    """Validating, rendering and auditing them held the supervisor's event loop (every other
    caller, the health check) for seconds."""
    members = json.dumps({"command": "true", **{f"a{i}": 0 for i in range(1_000_000)}})
    code, message = call(client, key, "exec", members)
    assert (code, message) == ("INVALID_ARGS", "arguments_json holds more than 10000 values")
    env = {"command": "true", "env": {f"V{i}": "x" for i in range(500_000)}}
    assert call(client, key, "exec", env) == (code, message)


@pytest.mark.parametrize("name", ["pattern", "glob"])
def test_a_search_pattern_too_long_for_a_command_line(
    client: Stockade, key: str, name: str
) -> None:
    """It was EXECUTION_FAILED 'cannot run ripgrep: Argument list too long'."""
    args = {"pattern": "x", name: "a" * 200_000}
    code, message = call(client, key, "search", args)
    assert (code, message) == (
        "INVALID_ARGS",
        f"argument '{name}' is 200000 bytes; the limit is 65536",
    )
