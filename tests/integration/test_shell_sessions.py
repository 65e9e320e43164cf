"""The shell on real engines: bash by default, sh (dash) when a profile chooses it, and shell
sessions (sandbox_image/agent/shells.py, calls/sessions.py) that keep their folder,
environment, options and aliases across calls and a supervisor restart, are guarded from
their own folder, and end clearly with their container."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.client import InvalidArgument, Sandbox, Stockade
from tests.integration.harness import Supervisor, engine_cli, process
from tests.integration.test_cli import cli
from tests.integration.test_mcp import connected, serving_mcp

pytestmark = pytest.mark.timeout(300)

CONFIG = '[profiles.dash]\nshell = "sh"\n[profiles.login]\nlogin_shell = true\n'

BASHISMS = {
    '[ "$a" == "" ] && echo eq': "eq",
    "test a == a && echo test": "test",
    "a=(x y z); echo ${a[1]} ${#a[@]}": "y 3",
    "echo {a,b}": "a b",
    "[[ abc == a* ]] && echo glob": "glob",
    "printf %s $'tab\\there' | od -c | head -1 | tr -s ' '": "0000000 t a b \\t h e r e",
    "cat <(echo substituted)": "substituted",
    "set -o pipefail; false | true; echo $?": "1",
}


def out(box: Sandbox, command: str, **kw: object) -> str:
    result = box.exec(command, **kw)  # type: ignore[arg-type]  # the keywords exec takes
    assert result.exit_code == 0, (command, result.stdout, result.stderr, result.error_message)
    return result.stdout.strip()


@pytest.mark.parametrize("command", BASHISMS)
def test_bashisms_run_under_the_default_shell(c: Stockade, key: str, command: str) -> None:
    assert out(c.sandbox(key), command) == BASHISMS[command]


def test_sh_is_dash_when_a_profile_chooses_it(c: Stockade, key: str) -> None:
    c.ensure_sandbox(key, profile="dash")
    box = c.sandbox(key)
    assert out(box, "readlink /proc/$$/exe") == "/usr/bin/dash"
    assert box.exec('[ "$a" == "" ]').exit_code == 2
    assert box.exec("echo {a,b}").stdout.strip() == "{a,b}"
    refused = box.exec("pwd", session="s")
    assert refused.error_code == "INVALID_ARGS"
    assert "sessions keep bash's state" in refused.error_message


def test_a_login_profile_runs_bash_as_a_login_shell(c: Stockade, key: str) -> None:
    c.ensure_sandbox(key, profile="login")
    assert out(c.sandbox(key), "shopt -q login_shell && echo login") == "login"
    assert out(c.sandbox(f"{key}-plain"), "shopt -q login_shell || echo plain") == "plain"


ACTIVATE = (
    'export VIRTUAL_ENV="$PWD/.venv"\n_OLD_PATH="$PATH"\nexport PATH="$VIRTUAL_ENV/bin:$PATH"\n'
    'deactivate() { export PATH="$_OLD_PATH"; unset VIRTUAL_ENV; unset -f deactivate; }\n'
)


def a_project(box: Sandbox) -> None:
    """proj/ with a tiny virtualenv: .venv/bin/activate and a program on its PATH."""
    box.write_file("proj/.venv/bin/activate", ACTIVATE)
    box.write_file("proj/.venv/bin/hello", "#!/bin/sh\necho hello from the venv\n")
    assert box.exec("chmod +x proj/.venv/bin/hello").exit_code == 0


def set_up_session(box: Sandbox, name: str) -> None:
    out(box, "cd proj && export GREETING=hi && source .venv/bin/activate", session=name)
    out(box, "set -o pipefail; shopt -s globstar; alias ll='echo aliased'", session=name)


def assert_session_kept(box: Sandbox, name: str) -> None:
    assert out(box, "pwd", session=name) == "/workspace/proj"
    assert out(box, 'echo "$GREETING $VIRTUAL_ENV"', session=name) == "hi /workspace/proj/.venv"
    assert out(box, "hello", session=name) == "hello from the venv"
    assert out(box, "set -o | grep -E '^pipefail' | tr -d ' \t'", session=name) == "pipefailon"
    assert out(box, "shopt -q globstar && ll", session=name) == "aliased"


def test_a_session_keeps_cd_export_source_set_o_and_aliases(c: Stockade, key: str) -> None:
    box = c.sandbox(key)
    a_project(box)
    set_up_session(box, "dev")
    assert_session_kept(box, "dev")
    assert out(box, 'pwd; echo "[$GREETING]"') == "/workspace\n[]", "a plain exec keeps nothing"
    assert out(box, "pwd", session="other") == "/workspace", "sessions are apart"
    assert out(box, "deactivate; cd ..; echo ${VIRTUAL_ENV-gone}", session="dev") == "gone"
    assert out(box, "pwd; type deactivate >/dev/null 2>&1 || echo no-fn", session="dev") == (
        "/workspace\nno-fn"
    )


def test_a_session_call_that_times_out_leaves_the_session_as_it_was(c: Stockade, key: str) -> None:
    box = c.sandbox(key)
    out(box, "mkdir -p a b && cd a", session="s")
    timed_out = box.exec("cd ../b; export LOST=1; sleep 30", session="s", timeout=1)
    assert timed_out.error_code == "TIMEOUT"
    assert out(box, 'pwd; echo "[${LOST-}]"', session="s") == "/workspace/a\n[]"
    assert box.exec("exit 7", session="s").exit_code == 7
    assert out(box, "pwd", session="s") == "/workspace/a"


def test_a_process_starts_in_its_session(c: Stockade, key: str) -> None:
    box = c.sandbox(key)
    out(box, "mkdir -p d && cd d && export MARK=started", session="p")
    started = process(box, "start", command='echo "$PWD $MARK"', session="p")
    log = process(box, "log", id=started["id"])
    for _ in range(50):
        if log.get("data"):
            break
        log = process(box, "log", id=started["id"])
    assert "/workspace/d started" in log["data"]


def test_a_session_is_guarded_from_its_own_folder(c: Stockade, key: str) -> None:
    box = c.sandbox(key)
    out(box, "mkdir -p src/junk && touch keep.txt src/junk/f")
    out(box, "cd src", session="g")
    assert box.exec("rm -rf *", session="g").exit_code == 0, "in src: only src's files"
    assert out(box, "ls; ls src | wc -l") == "keep.txt\nsrc\n0"
    out(box, "cd /", session="g")
    refused = box.exec("rm -rf *", session="g")
    assert refused.error_code == "PERMISSION_DENIED"
    assert "/*" in refused.error_message, refused.error_message
    one_call = box.exec("cd /; rm -rf *", session="fresh")
    assert one_call.error_code == "PERMISSION_DENIED"
    assert out(box, "ls") == "keep.txt\nsrc"


def test_a_session_survives_a_restart_and_ends_with_its_container(
    own_supervisor: Supervisor,
) -> None:
    with own_supervisor.client() as c:
        box = c.sandbox("k")
        a_project(box)
        set_up_session(box, "dev")
        out(box, "cd /", session="root")
    own_supervisor.stop()
    own_supervisor.start()
    with own_supervisor.client() as c:
        box = c.sandbox("k")
        refused = box.exec("rm -rf *", session="root")
        assert "(/*)" in refused.error_message, "judged from the folder its agent kept"
        assert_session_kept(box, "dev")
        old = box.info().container_id
        assert engine_cli(own_supervisor.engine, "kill", old).returncode == 0
        ended = box.exec("pwd", session="dev")
        assert ended.error_code == "SANDBOX_LOST"
        assert "its sandbox was re-created" in ended.error_message
        assert box.info().container_id != old
        assert out(box, 'pwd; echo "[${GREETING-}]"', session="dev") == "/workspace\n[]"


def test_sessions_are_listed_and_ended_through_the_api_and_the_cli(
    sup: Supervisor, c: Stockade, key: str
) -> None:
    assert c.list_sessions(key) == [], "no sandbox: none"
    assert key not in {s.key for s in c.list_sandboxes()}, "and none is made"
    box = c.sandbox(key)
    out(box, "mkdir -p w && cd w", session="one")
    done = cli(sup, "exec", "--session", "two", key, "--", "cd w && export X=cli")
    assert done.returncode == 0, done.stderr
    done = cli(sup, "exec", "--session", "two", key, "--", 'echo "$PWD $X"')
    assert done.stdout == "/workspace/w cli\n"
    listed = {s.name: (s.cwd, s.calls, s.busy) for s in box.sessions()}
    assert listed == {"one": ("/workspace/w", 1, False), "two": ("/workspace/w", 2, False)}
    assert box.end_session("one")
    assert not box.end_session("one")
    assert [s.name for s in box.sessions()] == ["two"]
    assert out(box, "pwd", session="one") == "/workspace", "a new session of that name"
    with pytest.raises(InvalidArgument, match="a session's name"):
        box.end_session("../x")


async def test_an_mcp_sessions_commands_share_its_shell_session(
    engine: str, tmp_path: Path
) -> None:
    with serving_mcp(engine, tmp_path) as served:
        async with connected(served.url, served.token) as client:
            first = await client.call_tool("exec", {"command": "mkdir -p m && cd m"})
            assert not first.is_error
            here = await client.call_tool("exec", {"command": "pwd"})
            assert here.structured_content is not None
            assert here.structured_content["stdout"] == "/workspace/m\n"
            named = await client.call_tool("exec", {"command": "pwd", "session": "mine"})
            assert named.structured_content is not None
            assert named.structured_content["stdout"] == "/workspace\n"
