"""The `stockade` command line against a real supervisor."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.harness import Supervisor

pytestmark = pytest.mark.timeout(300)


def cli(supervisor: Supervisor, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STOCKADE_ADDR": supervisor.target}
    cmd = [sys.executable, "-m", "stockade.supervisor.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_exec_prints_output_and_exits_with_the_command(supervisor: Supervisor, key: str) -> None:
    done = cli(supervisor, "exec", key, "--", "uname", "-a")
    assert done.returncode == 0
    assert done.stdout.startswith("Linux sandbox ")
    done = cli(supervisor, "exec", key, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\n", "err\n")


def test_exec_timeout_exits_124(supervisor: Supervisor, key: str) -> None:
    done = cli(supervisor, "exec", "--timeout", "1", key, "--", "sleep", "30")
    assert done.returncode == 124
    assert "TIMEOUT" in done.stderr


def test_call_prints_the_tool_result_as_json(supervisor: Supervisor, key: str) -> None:
    done = cli(supervisor, "call", key, "write_file", '{"path": "a.txt", "content": "hi"}')
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["is_error"] is False
    assert result["error_code"] == "TOOL_ERROR_CODE_UNSPECIFIED"
    assert json.loads(result["data_json"])["bytes_written"] == 2
    done = cli(supervisor, "call", key, "read_file", '{"path": "missing"}')
    assert done.returncode == 1
    assert json.loads(done.stdout)["error_code"] == "TOOL_ERROR_CODE_FILE_NOT_FOUND"


def test_ls_rm_and_tools(supervisor: Supervisor, key: str) -> None:
    assert cli(supervisor, "exec", key, "--", "true").returncode == 0
    listing = cli(supervisor, "ls")
    assert listing.returncode == 0
    assert any(line.split()[:2] == [key, "RUNNING"] for line in listing.stdout.splitlines())
    removed = cli(supervisor, "rm", key)
    assert removed.stdout.strip() == f"{key}: container removed; workspace kept"
    tools = cli(supervisor, "tools")
    assert [line.split()[0] for line in tools.stdout.splitlines()] == [
        "exec", "process", "read_file", "write_file", "edit_file", "apply_patch", "list_files",
        "glob", "search",
    ]  # fmt: skip


def test_client_errors_exit_2_with_a_message(supervisor: Supervisor) -> None:
    done = cli(supervisor, "rm", "never-made")
    assert done.returncode == 2
    assert "NOT_FOUND" in done.stderr
    env_less = cli(supervisor, "--help")
    assert env_less.returncode == 0


def cli_input(supervisor: Supervisor, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STOCKADE_ADDR": supervisor.target}
    cmd = [sys.executable, "-m", "stockade.supervisor.cli", *args]
    return subprocess.run(cmd, input=text, capture_output=True, text=True, timeout=120, env=env)


def test_shell_pipes_input_and_exits_with_the_command(supervisor: Supervisor, key: str) -> None:
    program = "print('hello', input('name? '))"
    done = cli_input(supervisor, "dave\n", "shell", "--no-pty", key, "--", "python3", "-c", program)
    assert (done.returncode, done.stdout) == (0, "name? hello dave\n"), done.stderr
    done = cli_input(supervisor, "", "shell", "--no-pty", key, "--", "sh", "-c", "exit 3")
    assert done.returncode == 3


def test_shell_runs_on_a_terminal_by_default(supervisor: Supervisor, key: str) -> None:
    done = cli_input(supervisor, "echo typed-$((6*7))\nexit 5\n", "shell", key)
    assert done.returncode == 5, done.stderr
    # bash on a terminal: its prompt, the echo of the input, then the output (text mode
    # reads the terminal's \r\n as \n)
    assert "sandbox@sandbox:/workspace$ echo typed-$((6*7))\n" in done.stdout
    assert "\ntyped-42\n" in done.stdout
    done = cli_input(supervisor, "", "shell", key, "--", "tty")
    assert done.stdout.startswith("/dev/pts/"), done.stdout


def test_attach_follows_a_background_process(supervisor: Supervisor, key: str) -> None:
    started = cli(supervisor, "call", key, "process", '{"action": "start", "command": "cat", '
                  '"name": "copier"}')  # fmt: skip
    assert started.returncode == 0, started.stdout
    done = cli_input(supervisor, "one\ntwo\n", "attach", key, "copier")
    assert (done.returncode, done.stdout) == (0, "one\ntwo\n"), done.stderr
    missing = cli_input(supervisor, "", "attach", key, "nothing")
    assert missing.returncode == 1
    assert "no process 'nothing'" in missing.stderr


def test_keys_and_commands_cannot_forge_lines_or_drive_the_terminal(
    supervisor: Supervisor, key: str
) -> None:
    """Keys are any UTF-8: `ls` and `rm` showed a newline or an escape sequence as is."""
    forged = f"{key}\nfake     RUNNING  podman  000000000000   /\x1b[2J"
    assert cli(supervisor, "exec", forged, "--", "true").returncode == 0
    listing = cli(supervisor, "ls").stdout
    assert "\x1b" not in listing
    shown = f"{key}\\nfake     RUNNING  podman  000000000000   /\\x1b[2J"
    assert not [line for line in listing.splitlines() if line.startswith("fake")]
    assert f"\n{shown} RUNNING " in listing
    removed = cli(supervisor, "rm", "--delete-workspace", forged).stdout
    assert removed == f"{shown}: container removed; workspace deleted\n"
