"""A sandbox's files, background processes and CPU/memory trend on the console: each read
is a tool call through the pipeline (its tool, key, front and caller checked here on a
recording stand-in; the real pipeline and agent are tests/integration/test_console_browser.py),
only of a running sandbox of the session's tenant, its output scrubbed, escaped and cut.
The fixtures and the sandbox manager's stand-in are test_console.py's."""

from __future__ import annotations

import dataclasses
import json
import os
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.testclient import TestClient

from stockade.supervisor.engines.cgroups import CgroupSample
from stockade.supervisor.errors import InvalidRequest
from stockade.supervisor.fronts.console import workspace
from stockade.supervisor.fronts.console.context import ConsoleContext
from stockade.supervisor.keys import scope
from stockade.supervisor.models import ErrorCode, SandboxState, ToolCall, ToolResult
from stockade.supervisor.sandboxes.quarantine import Quarantine
from tests.unit.test_console import ALICE, OPS, login, stand_in
from tests.unit.test_console import client as client  # the fixtures
from tests.unit.test_console import ctx as ctx

SECRET = "ghp_RealSecretValue0123456789abcdefXYZ"


class Pipeline:
    """Stands in for the ToolPipeline: the calls it was given, a canned result per tool."""

    def __init__(self) -> None:
        self.calls: list[tuple[ToolCall, str]] = []
        self.results: dict[str, ToolResult] = {}

    async def call(self, call: ToolCall, caller: str = "") -> ToolResult:
        self.calls.append((call, caller))
        if call.tool not in self.results:
            raise InvalidRequest(f"no {call.tool} here")
        return self.results[call.tool]


def ok(data: dict[str, Any]) -> ToolResult:
    return ToolResult(for_llm=json.dumps(data), for_user="", data=data)


@pytest.fixture
def pipeline(ctx: ConsoleContext) -> Pipeline:
    fake = Pipeline()
    ctx.pipeline = fake
    return fake


def test_a_directory_is_listed_through_the_pipeline(
    client: TestClient, ctx: ConsoleContext, pipeline: Pipeline
) -> None:
    pipeline.results["list_files"] = ok(
        {
            "entries": [
                {"name": "b.txt", "is_dir": False, "size": 1234},
                {"name": "<img src=x onerror=alert(1)>", "is_dir": False, "size": 1},
                {"name": "invoice-\u202egpj.exe", "is_dir": False, "size": 2},
                {"name": "src", "is_dir": True},
            ]
        }
    )
    login(client, ALICE)
    page = client.get("/sandbox/files?key=a1&path=sub")
    assert page.status_code == 200, page.text
    [(call, caller)] = pipeline.calls
    assert (call.tool, call.sandbox_key, call.front) == (
        "list_files",
        scope("alice", "a1"),
        "console",
    )
    assert json.loads(call.arguments_json) == {"path": "sub"}
    assert caller.startswith("console:tenant:alice@")
    assert call.context.agent_id == "console"
    text = page.text
    assert text.index(">src/</a>") < text.index(">b.txt</a>")  # directories first
    assert 'href="/sandbox/files?tenant=alice&amp;key=a1&amp;path=sub%2Fsrc"' in text
    assert 'href="/sandbox/file?tenant=alice&amp;key=a1&amp;path=sub%2Fb.txt"' in text
    assert "1,234" in text
    assert "<img src=x" not in text
    assert "\u202e" not in text  # the override is shown as its escape
    assert "invoice-" in text
    assert "\\u202e" in text


def test_a_file_is_scrubbed_escaped_and_cut(
    client: TestClient, ctx: ConsoleContext, pipeline: Pipeline
) -> None:
    content = f"token={SECRET}\n<script>alert(1)</script>\n" + "x" * (workspace.MAX_SHOWN + 10)
    pipeline.results["read_file"] = ok({"content": content})
    login(client, ALICE)
    text = client.get("/sandbox/file?key=a1&path=notes.txt").text
    assert json.loads(pipeline.calls[0][0].arguments_json) == {"path": "notes.txt"}
    assert SECRET not in text
    assert "<script>alert" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert f"Only the first {workspace.MAX_SHOWN:,} of" in text
    assert text.count("x") < workspace.MAX_SHOWN + 10


def test_a_refused_read_says_why(client: TestClient, pipeline: Pipeline) -> None:
    pipeline.results["read_file"] = ToolResult(
        for_llm="", for_user="", is_error=True, error_code=ErrorCode.PERMISSION_DENIED,
        error_message="tool policy: read_file is denied for this tenant",
    )  # fmt: skip
    login(client, ALICE)
    text = client.get("/sandbox/file?key=a1&path=x").text
    assert "PERMISSION_DENIED: tool policy: read_file is denied" in text


def test_hostile_reads_are_refused_before_any_call(
    client: TestClient, ctx: ConsoleContext, pipeline: Pipeline
) -> None:
    login(client, ALICE)
    for path, status in (
        ("/sandbox/files?key=a1&path=" + "a" * 1025, 400),  # longer than MAX_PATH
        ("/sandbox/file?key=a1&path=a%00b", 400),
        ("/sandbox/files?key=a%00", 400),
        ("/sandbox/files?tenant=bob&key=b1", 404),  # alice's b1: none (bob's is not hers)
        ("/sandbox/processes?tenant=bob&key=b1", 404),
    ):
        assert client.get(path).status_code == status, path
    manager = stand_in(ctx)
    a1 = scope("alice", "a1")
    manager.infos[a1] = dataclasses.replace(manager.infos[a1], state=SandboxState.PAUSED)
    assert client.get("/sandbox/files?key=a1").status_code == 409  # only a running one
    manager.infos[a1] = dataclasses.replace(manager.infos[a1], state=SandboxState.RUNNING)
    manager.quarantines.held[a1] = Quarantine(a1, 0.0)
    assert client.get("/sandbox/processes?key=a1").status_code == 409
    assert pipeline.calls == []  # nothing asked, nothing audited


def test_a_call_the_pipeline_refuses_is_a_refusal(client: TestClient, pipeline: Pipeline) -> None:
    login(client, ALICE)
    answer = client.get("/sandbox/files?key=a1")
    assert answer.status_code == 409
    assert "no list_files here" in answer.text


def test_without_a_pipeline_nothing_is_offered(client: TestClient, ctx: ConsoleContext) -> None:
    assert ctx.pipeline is None
    login(client, OPS)
    assert 'id="files-link"' not in client.get("/sandbox?tenant=bob&key=b1").text
    assert client.get("/sandbox/files?tenant=bob&key=b1").status_code == 404


def test_background_processes_come_from_the_agent(
    client: TestClient, ctx: ConsoleContext, pipeline: Pipeline
) -> None:
    pipeline.results["process"] = ok(
        {
            "processes": [
                {"id": "p1", "name": "web", "pid": 42, "state": "running",
                 "command": f"serve --token {SECRET} <b>"},
                {"id": "p2", "name": "", "pid": 43, "state": "exited", "exit_code": 1,
                 "command": "make"},
            ]
        }
    )  # fmt: skip
    login(client, OPS)
    page = client.get("/sandbox?tenant=bob&key=b1").text
    assert 'id="files-link"' in page
    assert 'id="processes-link"' in page
    text = client.get("/sandbox/processes?tenant=bob&key=b1").text
    [(call, _caller)] = pipeline.calls
    assert (call.tool, json.loads(call.arguments_json)) == ("process", {"action": "list"})
    assert call.sandbox_key == scope("bob", "b1")
    assert SECRET not in text
    assert "&lt;b&gt;" in text
    assert "exited (1)" in text


def test_the_usage_trend_follows_the_samples(
    client: TestClient, ctx: ConsoleContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    a1 = scope("alice", "a1")
    container = SimpleNamespace(running=True, pid=os.getpid())
    stand_in(ctx).registry[a1] = SimpleNamespace(state=SandboxState.RUNNING, info=container)
    clock = iter(range(1000, 2000, 2))
    figures = iter(range(10))
    monkeypatch.setattr(workspace, "clock", lambda: float(next(clock)))
    monkeypatch.setattr(
        workspace,
        "sample",
        lambda pid: CgroupSample(next(figures) * 10**9, 100 * 2**20, 0, 0),
    )
    login(client, ALICE)
    page = client.get("/sandbox?key=a1").text
    assert 'data-live-usage="/sandbox/usage.json?tenant=alice&amp;key=a1"' in page
    for _ in range(3):
        data = client.get("/sandbox/usage.json?key=a1").json()
    assert data["samples"] == 4
    assert (data["cpu_s"], data["memory_mb"]) == (3.0, 100.0)
    assert 'id="usage-cpu"' in data["chart"]
    assert "<polyline" in data["chart"]
    assert 'class="label">50</text>' in data["chart"]  # 1 s of CPU in 2 s: half a core
    assert client.get("/sandbox/usage.json?tenant=bob&key=b1").status_code == 404
    assert len(ctx.usage[a1]) <= workspace.HISTORY


@dataclasses.dataclass(frozen=True)
class Mount:
    target: str
    options: str


@dataclasses.dataclass(frozen=True)
class Report:
    """Shaped as IsolationReport is: fields, nested fields, lists of records."""

    key: str
    engine: str
    inside: dict[str, Any]
    namespaces: tuple[dict[str, Any], ...]
    mounts: tuple[Mount, ...]


def test_the_isolation_report_is_a_table_with_its_raw_json_behind_a_toggle(
    client: TestClient, ctx: ConsoleContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    mounts = tuple(Mount(f"/m{i}", "ro,<nosuid>") for i in range(150))
    report = Report(
        key=scope("alice", "a1"),
        engine="podman",
        inside={"no_new_privs": True, "root": {"read_only": True, "write_error": "EROFS"},
                "capabilities": {"effective": ["CAP_CHOWN", "CAP_KILL"]}},
        namespaces=({"type": "pid", "private": True}, {"type": "net", "private": True}),
        mounts=mounts,
    )  # fmt: skip

    async def inspect(key: str) -> Report:
        return report

    monkeypatch.setattr(stand_in(ctx), "inspect_isolation", inspect)
    login(client, ALICE)
    text = client.get("/sandbox/isolation?key=a1").text
    fields = text.split('id="isolation-fields"', 1)[1].split("</table>", 1)[0]
    assert "<td>inside.no_new_privs</td><td>yes</td>" in fields
    assert "<td>inside.root.write_error</td><td>EROFS</td>" in fields
    assert "CAP_CHOWN, CAP_KILL" in fields
    assert "<td>key</td><td>a1</td>" in fields  # the tenant's own key, not the scoped one
    assert '<h2>namespaces (2)</h2><table id="isolation-namespaces">' in text
    assert '<details class="list"><summary><h2>mounts (150)</h2></summary>' in text  # folded
    assert "50 more in the raw JSON." in text
    assert text.count("<td>/m") == 100
    assert '<details id="raw"><summary>Raw JSON</summary><pre>' in text
    assert "<nosuid>" not in text  # escaped in the tables and the raw JSON
    assert "ro,&lt;nosuid&gt;" in text
