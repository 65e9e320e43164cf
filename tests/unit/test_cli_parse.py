"""The command line: options of `exec` and `shell` written after KEY are options, not the
command."""

from __future__ import annotations

import pytest

from stockade.supervisor.cli.main import _command_line, parse


@pytest.mark.parametrize(
    ("argv", "no_pty", "command"),
    [
        (["shell", "demo"], False, ""),
        (["shell", "demo", "--no-pty"], True, ""),
        (["shell", "--no-pty", "demo"], True, ""),
        (["shell", "demo", "--no-pty", "--", "python3", "-i"], True, "python3 -i"),
        (["shell", "demo", "--", "--no-pty"], False, "--no-pty"),
        (["shell", "demo", "--", "bash", "--no-pty"], False, "bash --no-pty"),
    ],
)
def test_shell_options_after_the_key(argv: list[str], no_pty: bool, command: str) -> None:
    ns = parse(argv)
    assert ns.key == "demo"
    assert ns.no_pty is no_pty
    assert _command_line(ns) == command


@pytest.mark.parametrize(
    ("argv", "timeout", "command"),
    [
        (["exec", "demo", "--", "uname", "-a"], None, "uname -a"),
        (["exec", "demo", "ls"], None, "ls"),
        (["exec", "demo", "ls", "-la"], None, "ls -la"),
        (["exec", "demo", "--timeout", "5", "--", "ls", "-la"], 5.0, "ls -la"),
        (["exec", "--timeout", "5", "demo", "--", "ls"], 5.0, "ls"),
        (["exec", "demo", "--", "--timeout", "5"], None, "--timeout 5"),
    ],
)
def test_exec_options_after_the_key(argv: list[str], timeout: float | None, command: str) -> None:
    ns = parse(argv)
    assert ns.key == "demo"
    assert ns.timeout == timeout
    assert _command_line(ns) == command


def test_an_unknown_option_after_the_key_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse(["shell", "demo", "--no-such-flag"])
    assert caught.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err
