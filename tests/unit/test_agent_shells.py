"""The agent's shells and shell sessions (sandbox_image/agent/shells.py), run for real with
bash and dash on a temporary workspace: what a session keeps, and each of its limits
attacked (oversized, too many, busy, forged, cut short, a bad name, a vanished folder)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from stockade.agent import execute, shells
from stockade.agent.errors import ToolError

pytestmark = pytest.mark.skipif(not Path("/bin/bash").exists(), reason="needs bash")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "ws" / "src").mkdir(parents=True)
    return tmp_path / "ws"


@pytest.fixture
def table(tmp_path: Path) -> shells.Sessions:
    return shells.Sessions(tmp_path / "sessions", max_sessions=3)


async def run(ws: Path, table: shells.Sessions, command: str, **args: Any) -> dict[str, Any]:
    return await execute.exec_command(ws, {"command": command, **args}, sessions=table)


async def out(ws: Path, table: shells.Sessions, command: str, **args: Any) -> str:
    result = await run(ws, table, command, **args)
    assert result["exit_code"] == 0, result
    return str(result["stdout"])


async def test_bash_is_the_default_and_sh_and_login_are_asked_for(
    ws: Path, table: shells.Sessions
) -> None:
    assert await out(ws, table, "a=(x y); echo ${a[1]} {a,b}") == "y a b\n"
    dash = await run(ws, table, "[ a == a ]", shell="sh")
    assert dash["exit_code"] == 2
    assert await out(ws, table, "shopt -q login_shell && echo l", login=True) == "l\n"
    for bad, message in (
        ({"shell": "zsh"}, "bash or sh"),
        ({"shell": "sh", "login": True}, "for bash"),
    ):
        with pytest.raises(ToolError, match=message):
            await run(ws, table, "true", **bad)


async def test_a_session_keeps_folder_environment_options_functions_and_aliases(
    ws: Path, table: shells.Sessions
) -> None:
    setup = "cd src; export A=1; set -o pipefail; f() { echo fn; }; alias ll='echo LL'; exit 3"
    first = await run(ws, table, setup, session="s")
    assert first["exit_code"] == 3, "exit keeps its status, and the state is taken all the same"
    assert first["session"] == {"name": "s", "cwd": f"{ws}/src", "kept": True}
    kept = "pwd; echo $A; f; ll; set -o | grep pipefail | tr -d ' \t'; cd -"
    assert await out(ws, table, kept, session="s") == f"{ws}/src\n1\nfn\nLL\npipefailon\n{ws}\n"
    assert await out(ws, table, "unset A; echo ${A-unset}", session="s") == "unset\n"
    assert await out(ws, table, "echo ${A-unset} $SHLVL", session="s") == (
        f"unset {int(os.environ.get('SHLVL', '0')) + 1}\n"
    ), "an unset variable stays unset, and SHLVL does not pile up"
    assert await out(ws, table, "pwd", session="s", workdir="src") == f"{ws}/src\n"


async def test_set_x_traces_the_command_alone(ws: Path, table: shells.Sessions) -> None:
    await out(ws, table, "set -x", session="x")
    result = await run(ws, table, "echo hi", session="x")
    assert result["stderr"] == "++ echo hi\n"


async def test_a_call_cut_short_leaves_the_session_as_it_was(
    ws: Path, table: shells.Sessions
) -> None:
    await out(ws, table, "cd src", session="t")
    timed_out = await run(ws, table, "cd ..; export LOST=1; sleep 10", session="t", timeout=0.3)
    assert timed_out["timed_out"]
    assert timed_out["session"]["kept"] is False
    assert await out(ws, table, "pwd; echo ${LOST-none}", session="t") == f"{ws}/src\nnone\n"
    cancelled = asyncio.ensure_future(run(ws, table, "cd ..; sleep 10", session="t"))
    await asyncio.sleep(0.2)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert await out(ws, table, "pwd", session="t") == f"{ws}/src\n"
    assert list(table.folder.iterdir()) == [], "no call's files are left (nor a state: no defs)"


async def test_a_forged_or_missing_state_is_not_taken(ws: Path, table: shells.Sessions) -> None:
    await out(ws, table, "cd src", session="f")
    forged = 'trap - EXIT; ln -s /etc/hostname "$__stockade_out"; cd /'
    assert (await run(ws, table, forged, session="f"))["session"]["kept"] is False
    fifo = 'trap - EXIT; mkfifo "$__stockade_out"; cd /'
    assert (await run(ws, table, fifo, session="f"))["session"]["kept"] is False
    record = r'''printf '/\0\0\0\0\0declare -x A="x"y"\n' >"$__stockade_out"'''
    assert (await run(ws, table, f"trap - EXIT; {record}", session="f"))["session"]["kept"] is False
    short = r'''printf '/\0\0' >"$__stockade_out"'''
    assert (await run(ws, table, f"trap - EXIT; {short}", session="f"))["session"]["kept"] is False
    assert await out(ws, table, "pwd", session="f") == f"{ws}/src\n"


async def test_an_oversized_state_is_not_taken(ws: Path, table: shells.Sessions) -> None:
    big = f"export BIG=$(head -c {shells.MAX_STATE_BYTES + 1} /dev/zero | tr '\\0' x); cd src"
    assert (await run(ws, table, big, session="o"))["session"]["kept"] is False
    assert await out(ws, table, "pwd; echo ${#BIG}", session="o") == f"{ws}\n0\n"
    deep = "d=$(printf 'a%.0s' {1..250}); for i in $(seq 20); do mkdir $d; cd $d; done"
    assert (await run(ws, table, deep, session="o"))["session"]["kept"] is False


async def test_too_many_sessions_busy_ones_and_bad_names_are_refused(
    ws: Path, table: shells.Sessions
) -> None:
    for name in ("a", "b", "c"):
        await out(ws, table, "true", session=name)
    with pytest.raises(ToolError, match="keeps 3 sessions, the most"):
        await run(ws, table, "true", session="d")
    assert table.end("a")
    assert not table.end("a")
    await out(ws, table, "true", session="d")
    slow = asyncio.ensure_future(run(ws, table, "sleep 0.5", session="b"))
    await asyncio.sleep(0.1)
    with pytest.raises(ToolError, match="running another call"):
        await run(ws, table, "true", session="b")
    await slow
    for bad in ("", "../x", ".hidden", "a/b", "x" * 65, "new\nline"):
        with pytest.raises(ToolError, match="argument 'session'"):
            await run(ws, table, "true", session=bad)
    with pytest.raises(ToolError, match="sessions keep bash's state"):
        await run(ws, table, "true", session="e", shell="sh")


async def test_a_vanished_folder_is_said_and_the_call_runs_at_the_root(
    ws: Path, table: shells.Sessions
) -> None:
    await out(ws, table, "mkdir gone && cd gone", session="v")
    (ws / "gone").rmdir()
    result = await run(ws, table, "pwd", session="v")
    assert result["stdout"] == f"{ws}\n"
    assert f"the session's folder {ws}/gone is gone" in result["stderr"]


async def test_the_session_tool_lists_and_ends(ws: Path, table: shells.Sessions) -> None:
    await out(ws, table, "cd src", session="l")
    listed = await shells.session_tool(ws, {"action": "list"}, table)
    assert listed == {"sessions": [{"name": "l", "cwd": f"{ws}/src", "calls": 1, "busy": False}]}
    assert await shells.session_tool(ws, {"action": "end", "session": "l"}, table) == {
        "ended": True
    }
    assert await out(ws, table, "pwd", session="l") == f"{ws}\n", "a new session"
    with pytest.raises(ToolError, match="list or end"):
        await shells.session_tool(ws, {"action": "drop"}, table)


def test_options_come_back_by_known_names_only() -> None:
    restore = shells.restoring(
        "braceexpand:interactive-comments:noexec:onecmd:pipefail:xtrace",
        "extglob:login_shell:cmdhist:x;touch /tmp/p",
    )
    lines = restore.splitlines()
    assert lines[-1] == "set +o hashall -o pipefail -o xtrace", "set last, known names only"
    assert "shopt -s cmdhist extglob" in lines
    assert "x;touch" not in restore
    assert "login_shell" not in restore


async def test_noexec_does_not_stop_a_session_for_good(ws: Path, table: shells.Sessions) -> None:
    await run(ws, table, "set -o verbose", session="n")
    assert (await run(ws, table, "true", session="n"))["stderr"] == "", "verbose is not kept"
    await run(ws, table, "set -o noexec", session="n")
    assert await out(
        ws, table, "echo alive; set -o | grep -c 'noexec *on' || true", session="n"
    ) == ("alive\n0\n")


WEIRD = {
    "NL": "a\nb",
    "QUOTES": "q\"$`\\e'",
    "BYTES": "\udcff\x01é\t",
    "EMPTY": "",
    "SPACES": " lead and trail ",
}


@pytest.mark.parametrize("posix", [False, True])
async def test_the_environment_comes_back_byte_for_byte(
    ws: Path, table: shells.Sessions, posix: bool
) -> None:
    """export -p's quoting (double quotes, $'...', POSIX mode's `export`) parsed back."""
    mode = "set -o posix; " if posix else ""
    await run(ws, table, mode + "declare -ax ARR=(1 2); export HALF", env=WEIRD, session="e")
    session = table._table["e"]
    assert session.env is not None
    assert {k: session.env[k] for k in WEIRD} == WEIRD
    assert "ARR" not in session.env
    assert "HALF" not in session.env
    script = 'for v in NL QUOTES BYTES EMPTY SPACES; do printf "%s=%s|" "$v" "${!v}"; done'
    printed = (await run(ws, table, script, session="e"))["stdout"]
    assert printed == "".join(f"{k}={v}|" for k, v in WEIRD.items()).encode(
        "utf-8", "surrogateescape"
    ).decode("utf-8", "replace")


def test_a_line_export_p_would_not_print_is_refused() -> None:
    for bad in (b'declare -x A="x"y"', b"rm -rf /", b"declare -x A=$'\\q'", b"declare -x 1A"):
        with pytest.raises(ValueError, match=r"unknown shape|bare quote|does not print"):
            shells.exported(bad + b"\n")
    assert shells.exported(b"") == {}


async def test_a_calls_env_wins_and_stays(ws: Path, table: shells.Sessions) -> None:
    await out(ws, table, "export A=session B=kept", session="c")
    assert await out(ws, table, "echo $A $B", session="c", env={"A": "call"}) == "call kept\n"
    assert await out(ws, table, "echo $A", session="c") == "call\n"
