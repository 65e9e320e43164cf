"""The E2B process service's request parsing and replies (no sandbox): selectors, base64
input, command lines, PTY sizes, the user header, keepalive intervals and the end event,
with wrong and hostile values each refused as invalid_argument (or unauthenticated)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from starlette.requests import Request

from stockade.supervisor.fronts.e2b import connect
from stockade.supervisor.fronts.e2b import envd_process as ep
from stockade.supervisor.fronts.e2b.connect import ConnectError
from stockade.supervisor.models import ErrorCode, ToolResult


def _request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


def _code(call: Any, *args: Any) -> str:
    with pytest.raises(ConnectError) as caught:
        call(*args)
    return caught.value.code


def test_selectors() -> None:
    assert ep._pid_of({"process": {"pid": 42}}) == 42
    assert ep._pid_of({"process": {"pid": "42"}}) == 42
    assert ep._pid_of({"process": {"tag": "web"}}) == "web"
    for bad in (
        {},
        {"process": None},
        {"process": []},
        {"process": {}},
        {"process": {"pid": 0}},
        {"process": {"pid": -1}},
        {"process": {"pid": 1 << 32}},
        {"process": {"pid": True}},
        {"process": {"pid": "9" * 40}},
        {"process": {"pid": 1.5}},
        {"process": {"tag": ""}},
    ):
        assert _code(ep._pid_of, bad) == "invalid_argument", bad


def test_base64_input() -> None:
    data = bytes(range(256))
    assert ep._b64(base64.b64encode(data).decode(), "input") == data
    assert ep._b64(base64.urlsafe_b64encode(data).decode().rstrip("="), "input") == data
    for bad in (None, 5, ["a"], "not base64!", "\u00e9\u00e9"):
        assert _code(ep._b64, bad, "input") == "invalid_argument", bad


def test_command_lines_are_quoted_argv() -> None:
    config = {"cmd": "/bin/bash", "args": ["-l", "-c", "echo 'hi' && rm x; $(id)"]}
    assert ep.command_line(config) == "/bin/bash -l -c 'echo '\"'\"'hi'\"'\"' && rm x; $(id)'"
    assert ep.command_line({"cmd": "ls"}) == "ls"
    for bad in (
        {},
        {"cmd": ""},
        {"cmd": " "},
        {"cmd": 3},
        {"cmd": "ls", "args": "-l"},
        {"cmd": "ls", "args": [1]},
    ):
        assert _code(ep.command_line, bad) == "invalid_argument", bad


def test_windows_and_env_maps() -> None:
    assert ep._window(None) is None
    assert ep._window({"size": {"cols": 100, "rows": 30}}) == (100, 30)
    assert ep._window({}) == (80, 24)
    assert _code(ep._window, {"size": {"cols": "x"}}) == "invalid_argument"
    assert _code(ep._window, {"size": {"cols": True, "rows": 2}}) == "invalid_argument"
    assert ep._strings(None, "envs") == {}
    assert ep._strings({"A": "1"}, "envs") == {"A": "1"}
    for bad in ([], {"A": 1}, {"A": None}, "A=1"):
        assert _code(ep._strings, bad, "envs") == "invalid_argument", bad


def test_the_default_user_only() -> None:
    ep.check_user(_request({}))
    ep.check_user(_request({"Authorization": "Basic " + base64.b64encode(b"user:").decode()}))
    root = _request({"Authorization": "Basic " + base64.b64encode(b"root:").decode()})
    assert _code(ep.check_user, root) == "permission_denied"
    assert _code(ep.check_user, _request({"Authorization": "Basic !!"})) == "unauthenticated"
    ep.check_user(_request({"Authorization": "Bearer whatever"}))  # not a user: ignored


def test_keepalive_intervals() -> None:
    assert connect.keepalive_interval(_request({})) == connect.KEEPALIVE_S
    assert connect.keepalive_interval(_request({"Keepalive-Ping-Interval": "10"})) == 10
    assert connect.keepalive_interval(_request({"Keepalive-Ping-Interval": "0"})) == 1
    assert (
        connect.keepalive_interval(_request({"Keepalive-Ping-Interval": "999"}))
        == connect.KEEPALIVE_S
    )
    assert (
        connect.keepalive_interval(_request({"Keepalive-Ping-Interval": "-5"}))
        == connect.KEEPALIVE_S
    )
    assert (
        connect.keepalive_interval(_request({"Keepalive-Ping-Interval": "9" * 50}))
        == connect.KEEPALIVE_S
    )


def test_end_events() -> None:
    assert ep.end_event({"exit_code": 0, "signal": None}) == {
        "end": {"exitCode": 0, "exited": True, "status": "exit status 0"}
    }
    assert ep.end_event({"exit_code": 3}) == {
        "end": {"exitCode": 3, "exited": True, "status": "exit status 3", "error": "exit status 3"}
    }
    killed = ep.end_event({"exit_code": 137, "signal": "SIGKILL"})["end"]
    assert (killed["exitCode"], killed["exited"], killed["error"]) == (-1, False, "signal: killed")


def test_tool_errors_become_connect_codes() -> None:
    def code(error: ErrorCode) -> str:
        return ep.error_of(ToolResult("why", "why", True, error, "why")).code

    assert code(ErrorCode.PERMISSION_DENIED) == "permission_denied"
    assert code(ErrorCode.APPROVAL_DENIED) == "permission_denied"
    assert code(ErrorCode.RATE_LIMITED) == "resource_exhausted"
    assert code(ErrorCode.INVALID_PATH) == "invalid_argument"
    assert code(ErrorCode.TIMEOUT) == "deadline_exceeded"
    assert code(ErrorCode.SANDBOX_LOST) == "unavailable"


async def test_keepalives_fill_silences_only() -> None:
    async def events() -> Any:
        yield "a"
        await asyncio.sleep(0.35)
        yield "b"

    got = [item async for item in ep.until_gone(events(), asyncio.Event(), "sbx0", 0.1)]
    assert got[0] == "a"
    assert got[-1] == "b"
    assert 2 <= got.count(None) <= 4


def test_pids_name_the_newest_process_and_stay_bounded() -> None:
    box = ep._Sandbox()
    old, new = ep._Proc("e2b-old", {}, False), ep._Proc("e2b-new", {}, False)
    box.remember(7, old)
    box.remember(7, new)  # the kernel reused pid 7
    assert box.by_pid[7] is new
    for pid in range(100, 100 + ep.MAX_KNOWN + 5):
        box.remember(pid, ep._Proc(f"e2b-{pid}", {}, False))
    assert len(box.by_pid) == ep.MAX_KNOWN
    assert 7 not in box.by_pid  # the oldest went first
    assert 100 + ep.MAX_KNOWN + 4 in box.by_pid


def test_configs_of_processes_the_front_does_not_know() -> None:
    mine = {"name": "e2b-0a1b", "command": "/bin/bash -l -c 'echo hi; sleep 1'"}
    assert ep._config_of(mine) == {
        "cmd": "/bin/bash",
        "args": ["-l", "-c", "echo hi; sleep 1"],
        "envs": {},
    }
    other = {"name": None, "command": "python3 -m http.server"}
    assert ep._config_of(other)["args"] == ["-c", "python3 -m http.server"]
    broken = {"name": "e2b-x", "command": "echo 'unclosed"}
    assert ep._config_of(broken)["cmd"] == "/bin/sh"


def test_where_a_process_runs() -> None:
    assert ep.placed("ls", None) == ("ls", ".", "/home/user")
    assert ep.placed("ls", "/home/user/sub") == ("ls", "sub", "/home/user/sub")
    assert ep.placed("ls", "sub/deeper") == ("ls", "sub/deeper", "/home/user/sub/deeper")
    assert ep.placed("ls", "/workspace/a") == ("ls", "a", "/home/user/a")
    assert ep.placed("ls", "/tmp") == ("cd -- /tmp && exec ls", ".", "/tmp")
    assert ep.placed("ls", "/x y") == ("cd -- '/x y' && exec ls", ".", "/x y")
    assert ep.placed("ls", "/home/username")[0].startswith("cd -- /home/username")
    for bad in ("../..", "sub/../../..", "/tmp\0x"):
        with pytest.raises(ConnectError):
            ep.placed("ls", bad)
