"""Wrong, huge and hostile input: each gets a clear error and nothing on the host changes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from stockade.client import InvalidArgument, ResourceExhausted, Stockade
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
        "rm -f /run/stockade/agent.sock; ln -sf /var/run/docker.sock /run/stockade/x; "
        "ls -ld /run/stockade /run/stockade/agent.sock"
    )
    assert "Permission denied" in result.stderr
    assert "agent.sock" in result.stdout
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
