"""The supervisor's side of the shell (sandboxes/profiles.py shell_of, calls/sessions.py, the
pipeline): the shell each call is given, the guard following a session's folder, a
re-created sandbox ending its sessions, and the book's bounds against a lying agent."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stockade.supervisor.app import build_policy
from stockade.supervisor.calls.pipeline import CallLease, ToolPipeline
from stockade.supervisor.calls.sessions import MAX_FOLDER_CHARS, SessionBook, SessionEnded
from stockade.supervisor.config import Config, ProfileConfig, SandboxConfig, TenantConfig
from stockade.supervisor.fronts.mcp.convert import with_shell_session
from stockade.supervisor.models import ToolCall
from stockade.supervisor.sandboxes.agent_link import AgentReply
from stockade.supervisor.sandboxes.lease import AgentEvent
from stockade.supervisor.sandboxes.profiles import SandboxShell, shell_of
from stockade.supervisor.sandboxes.replies import ReplyInvalid, ReplyLimits, check_result
from tests.unit.fakes import STATE

pytestmark = pytest.mark.usefixtures("state_dir")


class SessionSandboxes:
    """A sandbox whose agent says the session ended in `cwd`; `generation` is its container."""

    def __init__(self) -> None:
        self.generation = "c1"
        self.cwd: object = "/workspace"
        self.calls: list[dict[str, Any]] = []
        self.listed: list[dict[str, Any]] = []
        """What the agent's session list says (a supervisor asks when it has not seen one)."""
        self.lists = 0

    @contextlib.asynccontextmanager
    async def lease(self, key: str) -> AsyncIterator[SessionSandboxes]:
        yield self

    async def invoke(self, tool: str, args: dict[str, Any], *_: object, **__: object) -> AgentReply:
        if tool == "session":
            self.lists += 1
            return AgentReply("", "", {"sessions": self.listed})
        self.calls.append(args)
        session = {"name": args.get("session"), "cwd": self.cwd, "kept": True}
        data = {"exit_code": 0, "stdout": "", "stderr": "", "session": session}
        return AgentReply("", "", data if "session" in args else data | {"session": None})

    async def stream(self, *_: object, **__: object) -> AsyncIterator[AgentEvent]:
        raise NotImplementedError("not streamed here")
        yield  # an async generator, as the real lease's


def _is_a_lease(fake: SessionSandboxes) -> CallLease:
    """Type-checked only: mypy says here when the fake no longer satisfies CallLease."""
    return fake


def pipeline(config: Config | None = None) -> tuple[ToolPipeline, SessionSandboxes]:
    fake = SessionSandboxes()
    config = config or Config(state_dir=STATE[-1])
    return ToolPipeline(config, fake, build_policy(config)), fake


def exec_call(command: str, key: str = "k", **args: Any) -> ToolCall:
    return ToolCall(key, "exec", json.dumps({"command": command, **args}))


def test_the_shell_is_the_profiles_else_the_tenants_else_the_sandboxs() -> None:
    config = Config(
        sandbox=SandboxConfig(shell="bash", login_shell=True),
        profiles={"dash": ProfileConfig(shell="sh"), "plain": ProfileConfig(login_shell=False)},
        tenants={"acme": TenantConfig(shell="sh"), "lab": TenantConfig(login_shell=False)},
    )
    assert shell_of(config, "", "") == SandboxShell("bash", True)
    assert shell_of(config, "dash", "") == SandboxShell("sh", False), "login is for bash"
    assert shell_of(config, "plain", "") == SandboxShell("bash", False)
    assert shell_of(config, "", "acme") == SandboxShell("sh", False)
    assert shell_of(config, "", "lab") == SandboxShell("bash", False)
    assert shell_of(config, "gone", "acme") == SandboxShell("sh", False)


async def test_each_command_gets_the_keys_shell_which_the_caller_cannot_choose() -> None:
    pipe, fake = pipeline(Config(state_dir=STATE[-1], sandbox=SandboxConfig(shell="sh")))
    await pipe.call(exec_call("true"))
    await pipe.call(ToolCall("k", "process", json.dumps({"action": "start", "command": "x"})))
    await pipe.call(ToolCall("k", "process", json.dumps({"action": "list"})))
    assert [c.get("shell") for c in fake.calls] == ["sh", "sh", None]
    for forged in ({"shell": "bash"}, {"login": True}):
        refused = await pipe.call(exec_call("true", **forged))
        assert refused.error_code.value == "INVALID_ARGS"
    assert len(fake.calls) == 3


async def test_the_guard_follows_the_sessions_folder() -> None:
    pipe, fake = pipeline()
    fake.cwd = "/workspace/src"
    await pipe.call(exec_call("cd src", session="s"))
    assert not (await pipe.call(exec_call("rm -rf *", session="s"))).is_error
    assert (await pipe.call(exec_call("rm -rf *"))).error_code.value == "PERMISSION_DENIED"
    fake.cwd = "/"
    await pipe.call(exec_call("cd /", session="s"))
    refused = await pipe.call(exec_call("rm -rf *", session="s"))
    assert refused.error_code.value == "PERMISSION_DENIED"
    assert "(/*)" in refused.error_message
    assert len(fake.calls) == 3, "the refused ones never reached the sandbox"
    given = await pipe.call(exec_call("rm -rf *", session="s", workdir="src"))
    assert not given.is_error, "a call's own workdir is judged, not the session's"
    other = await pipe.call(exec_call("rm -rf *", key="other", session="s"))
    assert other.error_code.value == "PERMISSION_DENIED", "another key's session is its own"


async def test_a_session_new_to_the_supervisor_is_judged_from_the_agents_folder_once() -> None:
    pipe, fake = pipeline()
    assert not (await pipe.call(exec_call("rm -rf build/*", session="new"))).is_error
    fake.listed = [{"name": "old", "cwd": "/", "calls": 3, "busy": False}]
    refused = await pipe.call(exec_call("rm -rf *", session="old"))
    assert "(/*)" in refused.error_message, "a session from before a restart: its agent's folder"
    await pipe.call(exec_call("true", session="old"))
    assert fake.lists == 2, "asked once per session"
    fake.listed = "not a list"  # type: ignore[assignment]  # a lying agent
    unknown = await pipe.call(exec_call("rm -rf build/*", session="third"))
    assert unknown.error_code.value == "PERMISSION_DENIED", "no folder known: judged unknown"


async def test_a_recreated_sandbox_ends_its_sessions_once() -> None:
    pipe, fake = pipeline()
    await pipe.call(exec_call("cd src", session="s"))
    await pipe.call(exec_call("true", session="t"))
    fake.generation = "c2"
    ended = await pipe.call(exec_call("pwd", session="s"))
    assert ended.error_code.value == "SANDBOX_LOST"
    assert "its sandbox was re-created" in ended.error_message
    assert len(fake.calls) == 2
    assert not (await pipe.call(exec_call("pwd", session="s"))).is_error, "then a new one"
    assert (await pipe.call(exec_call("pwd", session="t"))).error_code.value == "SANDBOX_LOST"


@pytest.mark.parametrize(
    "cwd", ["relative/path", "/" + "a" * MAX_FOLDER_CHARS, 42, None, ["/"]], ids=str
)
def test_a_folder_the_book_cannot_use_is_unknown(cwd: object) -> None:
    book = SessionBook()
    book.enter("k", "s", "c1")
    book.left("k", "s", "c1", {"cwd": cwd})
    assert book.folder("k", "s") is None
    book.left("k", "s", "c1", "not a dict")
    assert book.folder("k", "s") is None


def test_the_book_is_bounded_and_forgets() -> None:
    book = SessionBook(max_entries=2)
    for name in ("a", "b", "c"):
        book.left("k", name, "c1", {"cwd": f"/{name}"})
    assert [book.folder("k", n) for n in ("a", "b", "c")] == [None, "/b", "/c"]
    book.forget("k", "b")
    assert book.folder("k", "b") is None
    book.forget("k")
    assert book.folder("k", "c") is None
    book.enter("k", "c", "c2")  # forgotten: a new session, not an ended one
    book.left("k", "c", "c2", {"cwd": "/"})
    with pytest.raises(SessionEnded):
        book.enter("k", "c", "c3")


@pytest.mark.parametrize(
    "session",
    [
        "not an object",
        {"cwd": "/"},
        {"name": "x" * 65, "cwd": "/"},
        {"name": "s", "cwd": "/" * 5000},
        {"name": "s", "kept": "yes"},
    ],
    ids=str,
)
def test_a_session_reply_out_of_bounds_is_the_agent_misbehaving(session: object) -> None:
    with pytest.raises(ReplyInvalid):
        check_result("exec", {"exit_code": 0, "session": session}, ReplyLimits(1024, 1024))


@pytest.mark.parametrize(
    ("tool", "arguments", "own", "session"),
    [
        ("exec", {"command": "pwd"}, "sid", "mcp"),
        ("process", {"action": "start", "command": "x"}, "sid", "mcp"),
        ("process", {"action": "list"}, "sid", None),
        ("read_file", {"path": "x"}, "sid", None),
        ("exec", {"command": "pwd", "session": "mine"}, "sid", "mine"),
        ("exec", {"command": "pwd"}, None, None),
    ],
)
def test_an_mcp_sessions_commands_run_in_its_shell_session(
    tool: str, arguments: dict[str, Any], own: str | None, session: str | None
) -> None:
    given = with_shell_session(tool, arguments, own)
    assert given is not None
    assert given.get("session") == session
