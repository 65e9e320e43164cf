"""An approval that carries the diff (approvals.files, calls/previews.py): the file read
through the agent, diffed against what the call would write, scrubbed and bounded, carried to
gRPC, the console and `approvals watch`; asked and read only when an approver will decide."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from stockade.supervisor.app import build_policy
from stockade.supervisor.calls import previews
from stockade.supervisor.calls.pipeline import ToolPipeline
from stockade.supervisor.calls.streaming import AgentEvent
from stockade.supervisor.cli import approver
from stockade.supervisor.config import ApprovalsConfig, Config, ScrubConfig
from stockade.supervisor.errors import CallTimedOut, ConfigError
from stockade.supervisor.fronts.console import approvals as console
from stockade.supervisor.fronts.console.html import diff_block
from stockade.supervisor.fronts.grpc.convert import pending_to_pb
from stockade.supervisor.fronts.mcp.elicit import message_of
from stockade.supervisor.models import CallContext, ErrorCode, ToolCall, ToolResult
from stockade.supervisor.policy.approvals import Decision, Pending
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.sandboxes.agent_link import AgentReply
from stockade.supervisor.sandboxes.lease import Deadline
from tests.unit.fakes import STATE

pytestmark = pytest.mark.usefixtures("state_dir")

SECRET = "sk-live-" + "Zq8Lm2Vx7Rt4Np1Kw9Hs"
"""In the file now, and given to [scrub] secrets: it must never reach the approver."""
OLD = f"name = 'app'\napi_key = '{SECRET}'\nport = 8080\n"
WRITTEN = AgentReply("", "", {"path": "app.toml", "bytes_written": 1, "created": False})


class Workspace:
    """A sandbox of one file: read_file gives it (or FILE_NOT_FOUND), writes are recorded."""

    def __init__(self, files: dict[str, str] | None = None, truncated: bool = False) -> None:
        self.files = {"app.toml": OLD} if files is None else files
        self.truncated = truncated
        self.calls: list[tuple[str, dict[str, Any]]] = []

    generation = "g1"

    @contextlib.asynccontextmanager
    async def lease(self, key: str, /) -> AsyncIterator[Workspace]:
        yield self

    async def invoke(
        self,
        tool: str,
        args: dict[str, Any],
        timeout: float,
        request_id: str,
        /,
        *,
        deadline: Deadline = "caller",
    ) -> AgentReply:
        self.calls.append((tool, args))
        if tool != "read_file":
            return WRITTEN
        text = self.files.get(args["path"])
        if text is None:
            return AgentReply("FILE_NOT_FOUND", f"no such file: {args['path']}", None)
        result = {"content": text, "truncated": self.truncated, "binary": "\0" in text}
        return AgentReply("", "", result)

    async def stream(
        self,
        tool: str,
        args: dict[str, Any],
        timeout: float,
        request_id: str,
        /,
        *,
        deadline: Deadline = "caller",
    ) -> AsyncIterator[AgentEvent]:
        """No file call streams."""
        raise NotImplementedError
        yield


ALL = ("write_file", "edit_file", "apply_patch")


def pipeline(ws: Workspace, files: tuple[str, ...] = ALL, **cfg: Any) -> ToolPipeline:
    approvals = ApprovalsConfig(files=files, **cfg)
    config = Config(approvals=approvals, scrub=ScrubConfig(secrets=(SECRET,)), state_dir=STATE[-1])
    return ToolPipeline(config, ws, build_policy(config))


async def asked(
    p: ToolPipeline, tool: str, args: dict[str, Any], decision: Decision = "allow-once"
) -> tuple[list[Pending], ToolResult]:
    """The call, decided by its caller (the `ask` hook) as an approver would: the requests
    it was shown, and the result."""
    seen: list[Pending] = []

    async def ask(request: Pending) -> tuple[Decision, str]:
        seen.append(request)
        return decision, "tester"

    call = ToolCall("t1/k", tool, json.dumps(args), CallContext())
    return seen, await p.call(call, ask=ask)


async def test_a_write_shows_its_diff_with_the_secret_masked() -> None:
    ws = Workspace()
    new = OLD.replace("8080", "9090")
    seen, result = await asked(pipeline(ws), "write_file", {"path": "app.toml", "content": new})
    assert result.error_code == ErrorCode.NONE
    (request,) = seen
    assert request.command == "write_file app.toml"
    assert "-port = 8080\n+port = 9090\n" in request.diff
    assert request.diff.startswith("--- a/app.toml\n+++ b/app.toml\n")
    assert SECRET not in request.diff
    assert "[REDACTED]" in request.diff
    assert [c[0] for c in ws.calls] == ["read_file", "write_file"]  # read first, then written


async def test_a_secret_in_the_new_contents_is_masked_too() -> None:
    ws = Workspace({})
    content = f"token: {SECRET}\n"
    seen, _ = await asked(pipeline(ws), "write_file", {"path": "new.txt", "content": content})
    assert seen[0].diff.startswith("--- /dev/null\n+++ b/new.txt\n")
    assert SECRET not in seen[0].diff


async def test_an_edit_shows_the_edit_the_agent_will_make() -> None:
    ws = Workspace()
    args = {"path": "app.toml", "old_text": "'app'", "new_text": "'shop'"}
    seen, _ = await asked(pipeline(ws), "edit_file", args)
    assert "-name = 'app'\n+name = 'shop'\n" in seen[0].diff
    missing = {"path": "app.toml", "old_text": "nowhere", "new_text": "x"}
    seen, _ = await asked(pipeline(ws), "edit_file", missing)
    assert seen[0].diff == "app.toml: old_text is found 0 times: the edit will fail\n"


async def test_a_patch_is_shown_as_given_and_named_by_its_paths() -> None:
    patch = f"*** Begin Patch\n*** Update File: a.py\n@@\n-x = 1\n+x = '{SECRET}'\n*** End Patch\n"
    ws = Workspace()
    seen, _ = await asked(pipeline(ws), "apply_patch", {"input": patch})
    assert seen[0].command == "apply_patch a.py"
    assert "+x = '[REDACTED]'" in seen[0].diff
    assert [c[0] for c in ws.calls] == ["apply_patch"]  # nothing read for a patch


async def test_a_huge_file_is_named_not_diffed_and_a_long_diff_is_cut() -> None:
    huge = "line\n" * 100_000  # 500 KB
    ws = Workspace({"big.txt": huge})
    seen, _ = await asked(pipeline(ws), "write_file", {"path": "big.txt", "content": "short\n"})
    assert seen[0].diff == (
        "big.txt: 500000 bytes now, 6 bytes after: too large to diff "
        f"(at most {previews.MAX_SIDE_BYTES} bytes a side)\n"
    )
    long_new = "".join(f"new line {n}\n" for n in range(15_000))  # ~220 KB, under a side's limit
    seen, _ = await asked(pipeline(Workspace({})), "write_file", {"path": "n", "content": long_new})
    diff = seen[0].diff
    assert len(diff.encode()) <= previews.MAX_DIFF_BYTES + 100
    assert diff.splitlines()[-1].startswith("... the diff is cut at ")
    assert diff.splitlines()[-2].startswith("+new line ")  # cut at a line's end


async def test_a_file_the_agent_reads_only_in_part_or_binary_is_said_so() -> None:
    ws = Workspace(truncated=True)
    seen, _ = await asked(pipeline(ws), "write_file", {"path": "app.toml", "content": "x"})
    assert "larger than the agent reads" in seen[0].diff
    assert SECRET not in seen[0].diff
    seen, _ = await asked(
        pipeline(Workspace({"b": "\0\1"})), "write_file", {"path": "b", "content": ""}
    )
    assert seen[0].diff == "b: a binary file; no diff is shown\n"


async def test_denied_means_not_written() -> None:
    ws = Workspace()
    _, result = await asked(pipeline(ws), "write_file", {"path": "app.toml", "content": ""}, "deny")
    assert result.error_code == ErrorCode.APPROVAL_DENIED
    assert "file change not approved" in result.error_message
    assert [c[0] for c in ws.calls] == ["read_file"]


async def test_no_approver_no_read_and_the_fallback_applies() -> None:
    ws = Workspace()
    call = ToolCall("t1/k", "write_file", json.dumps({"path": "a", "content": ""}), CallContext())
    result = await pipeline(ws).call(call)  # no approver, no ask: approvals.no_approver (deny)
    assert result.error_code == ErrorCode.APPROVAL_DENIED
    assert ws.calls == []  # the file was not even read
    allowed = await pipeline(ws, no_approver="allow").call(call)
    assert allowed.error_code == ErrorCode.NONE
    assert [c[0] for c in ws.calls] == ["write_file"]


async def test_only_the_named_tools_are_asked_and_allow_always_holds_for_the_same_path() -> None:
    ws = Workspace()
    p = pipeline(ws, files=("apply_patch",))
    seen, result = await asked(p, "write_file", {"path": "app.toml", "content": "x"})
    assert seen == []
    assert result.error_code == ErrorCode.NONE
    p = pipeline(ws, files=("write_file",))
    seen, _ = await asked(p, "write_file", {"path": "a", "content": "x"}, "allow-always")
    assert len(seen) == 1
    seen, _ = await asked(p, "write_file", {"path": "a", "content": "y"})
    assert seen == []  # the same change, allowed always (per tenant)
    seen, _ = await asked(p, "write_file", {"path": "b", "content": "y"})
    assert len(seen) == 1


def test_config_refuses_an_unknown_file_tool() -> None:
    with pytest.raises(ConfigError, match=r"approvals\.files: unknown"):
        Config(approvals=ApprovalsConfig(files=("exec",)))


def request(diff: str) -> Pending:
    now = datetime.now(UTC)
    return Pending("id1", "t1/k", "", "write_file", "write_file a", "asked", now, now, "r", diff)


def test_grpc_carries_the_diff_scrubbed_again() -> None:
    scrubber = Scrubber((SECRET,))
    message = pending_to_pb(request(f"+{SECRET}\n"), scrubber)
    assert message.diff == "+[REDACTED]\n"


def test_the_console_shows_the_diff_folded_with_its_size() -> None:
    small = diff_block("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n")
    assert '<details class="diff" open>' in small
    assert "38 B" in small
    assert '<span class="add">+new</span>' in small
    assert '<span class="del">-old</span>' in small
    long = diff_block("".join(f"+{n}\n" for n in range(100)))
    assert '<details class="diff">' in long  # folded: opened by a click
    assert diff_block("") == ""
    hostile = diff_block("+\u202eexe.jpg <script>\n")
    assert "<script>" not in hostile
    assert 'class="ctl"' in hostile
    cells = console.pending_cells(
        {"id": "1", "tenant": "t", "key": "k", "agent": "", "command": "write_file a",
         "reason": "r", "marks": [], "expires_at": 0.0, "diff": "+x\n"},
        _session(),
    )  # fmt: skip
    assert '<pre class="diff">' in cells[3]


def _session() -> Any:
    return SimpleNamespace(csrf="c", who="w", operator=False, tenant="t")


def test_approvals_watch_prints_the_diff_line_by_line_cut() -> None:
    shown = approver._diff_lines("+a\n-\x1b[2Jb\n")
    assert shown == "  | +a\n  | -\\x1b[2Jb\n"
    many = approver._diff_lines("".join(f"+{n}\n" for n in range(approver.DIFF_LINES + 5)))
    assert many.splitlines()[-1] == "  | ... 5 more lines of the diff not shown"
    assert approver._diff_lines("") == ""


def test_an_mcp_client_asked_about_its_own_change_sees_the_diff() -> None:
    message = message_of(request(f"-old\n+{SECRET}\n"), Scrubber((SECRET,)))
    assert "What it changes:\n-old\n+[REDACTED]\n" in message
    assert SECRET not in message
    assert "What it changes" not in message_of(request(""), None)


def test_the_change_is_named_within_its_bound() -> None:
    named = previews.change_of("write_file", {"path": "p" * 5000, "content": ""})
    assert len(named) == previews.MAX_CHANGE_CHARS + 3
    assert named.endswith("...")


class Stuck(Workspace):
    """An agent whose read never answers in time: the lease raises the call's fault."""

    async def invoke(
        self,
        tool: str,
        args: dict[str, Any],
        timeout: float,
        request_id: str,
        /,
        *,
        deadline: Deadline = "caller",
    ) -> AgentReply:
        self.calls.append((tool, args))
        if tool == "read_file":
            assert timeout == previews.READ_TIMEOUT_S
            raise CallTimedOut("the agent did not answer in time")
        return WRITTEN


async def test_a_file_that_cannot_be_read_in_time_is_said_so_and_still_asked() -> None:
    ws = Stuck()
    seen, result = await asked(pipeline(ws), "write_file", {"path": "app.toml", "content": "x"})
    assert seen[0].diff == "app.toml: the file could not be read (CallTimedOut); no diff is shown\n"
    assert result.error_code == ErrorCode.NONE
