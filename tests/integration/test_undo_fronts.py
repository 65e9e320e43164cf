"""An approval that carries the diff, and undo from MCP and the console, on a real supervisor,
both engines: a write_file asked about (approvals.files) shows its diff, a secret of the old
file masked, to a gRPC approver and on the console's Approvals page (decided there); the
write's audit record offers the undo, shown then applied from the console; the MCP `undo`
tool shows and applies an undo; each applied undo is one audit record naming its front
(docs/undo.md)."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx2
import pytest

from stockade.client import ApprovalRequest, Stockade, ToolResult
from tests.integration.harness import (
    Supervisor,
    an_approver_connected,
    free_tcp_address,
    serving_front,
)
from tests.integration.test_mcp import connected, text_of

pytestmark = pytest.mark.timeout(300)

SECRET = "sk-live-" + "Zq8Lm2Vx7Rt4Np1Kw9Hs"
"""In the file the write replaces, and in [scrub] secrets: never shown to an approver."""
OLD = f"name = app\\napi_key = {SECRET}\\nport = 8080\\n"
NEW = f"name = app\napi_key = {SECRET}\nport = 9090\n"


@dataclass
class Fronts:
    sup: Supervisor
    mcp: str
    console: str
    token: str


@pytest.fixture(scope="module")
def fronts(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fronts]:
    console = free_tcp_address()
    config = (
        'undo = "apply"\n'
        '[checkpoints]\nenabled = true\nbefore = ["commands", "overwrite"]\n'
        '[approvals]\nfiles = ["write_file"]\ntimeout_s = 60\n'
        f'[scrub]\nsecrets = ["{SECRET}"]\n'
        f'[console]\nlisten = "{console}"\n'
    )
    folder = tmp_path_factory.mktemp("undo-fronts")
    with serving_front(engine, folder, "mcp", config) as (sup, address, tokens):
        yield Fronts(sup, f"http://{address}/mcp", f"http://{console}", tokens[0])


def with_file(c: Stockade, key: str) -> None:
    ran = c.sandbox(key).exec(f"printf '{OLD}' > app.toml")
    assert ran.exit_code == 0, ran.stderr


def write_in_background(c: Stockade, key: str) -> tuple[threading.Thread, list[ToolResult]]:
    done: list[ToolResult] = []

    def write() -> None:
        done.append(c.call(key, "write_file", {"path": "app.toml", "content": NEW}))

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread, done


class Approver:
    """A gRPC approver on its own connection: the requests it saw; it allows each when
    `allow`, else leaves them to another (it still counts as connected)."""

    def __init__(self, sup: Supervisor, token: str, allow: bool) -> None:
        self.client = sup.client(token=token)
        self.seen: list[ApprovalRequest] = []
        self.allow = allow
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for event in self.client.watch_approvals("diff-test"):
                if isinstance(event, ApprovalRequest):
                    self.seen.append(event)
                    if self.allow:
                        self.client.resolve_approval(event.id, "allow-once", "diff-test")
        except Exception:  # the stream ends when close() closes the client
            return

    def close(self) -> None:
        self.client.close()
        self.thread.join(10)


def test_a_write_shows_its_diff_to_a_grpc_approver(fronts: Fronts) -> None:
    key = f"diff-{uuid.uuid4().hex[:8]}"
    with fronts.sup.client(token=fronts.token) as c:
        with_file(c, key)
        approver = Approver(fronts.sup, fronts.token, allow=True)
        an_approver_connected(c)
        result = c.call(key, "write_file", {"path": "app.toml", "content": NEW})
        approver.close()
        assert not result.is_error, result.error_message
        assert c.sandbox(key).exec("cat app.toml").stdout.endswith("port = 9090\n")
    [request] = approver.seen
    assert request.tool == "write_file"
    assert request.command == "write_file app.toml"
    assert request.diff.startswith("--- a/app.toml\n+++ b/app.toml\n")
    assert "-port = 8080\n+port = 9090\n" in request.diff
    assert " api_key = [REDACTED]\n" in request.diff
    assert SECRET not in request.diff


@contextmanager
def signed_in(fronts: Fronts) -> Iterator[httpx2.Client]:
    """An HTTP client of the console signed in as tenant acme, sending the console's Origin."""
    with httpx2.Client(base_url=fronts.console, headers={"origin": fronts.console}) as http:
        answer = http.post("/login", data={"token": fronts.token})
        assert answer.status_code == 303, answer.text
        yield http


def csrf_of(page: str) -> str:
    return page.split('data-csrf="', 1)[1].split('"', 1)[0]


def test_the_console_shows_the_diff_decides_and_undoes(fronts: Fronts) -> None:
    key = f"console-{uuid.uuid4().hex[:8]}"
    with fronts.sup.client(token=fronts.token) as c, signed_in(fronts) as http:
        with_file(c, key)
        watcher = Approver(fronts.sup, fronts.token, allow=False)  # the request waits
        an_approver_connected(c)
        thread, done = write_in_background(c, key)
        while not c.list_approvals().pending and thread.is_alive():
            thread.join(0.05)
        assert thread.is_alive(), done  # the write waits for a decision
        page = http.get("/approvals").text
        assert '<pre class="diff">' in page
        assert '<span class="del">-port = 8080</span>' in page
        assert '<span class="add">+port = 9090</span>' in page
        assert "api_key = [REDACTED]" in page
        assert SECRET not in page
        [pending] = c.list_approvals().pending
        decide = {"csrf": csrf_of(page), "id": pending.id, "tenant": "acme"}
        answer = http.post("/approvals/decide", data={**decide, "decision": "allow-once"})
        assert answer.status_code == 303, answer.text
        thread.join(30)
        watcher.close()
        assert not done[0].is_error, done[0].error_message
        assert c.sandbox(key).exec("cat app.toml").stdout.endswith("port = 9090\n")

        # the write's record offers the undo: shown, then applied
        records = http.get("/audit/export.jsonl", params={"key": key, "tool": "write_file"})
        [record] = [json.loads(line) for line in records.text.splitlines()]
        assert record["checkpoint"].startswith("~ckpt-")
        assert record["approver"] == "console:tenant:acme"
        page = http.get("/audit/record", params={"id": record["id"]}).text
        assert 'id="undo-show"' in page
        form = {"csrf": csrf_of(page), "id": str(record["id"]), "tenant": "acme"}
        shown = http.post("/audit/undo", data=form)
        assert shown.status_code == 200, shown.text
        assert "0 added, 0 removed, 1 changed to take back" in shown.text
        assert '<span class="del">-port = 8080</span>' in shown.text
        assert SECRET not in shown.text
        assert c.sandbox(key).exec("cat app.toml").stdout.endswith("port = 9090\n")  # not yet
        applied = http.post("/audit/undo", data={**form, "confirmed": "undo"})
        assert applied.status_code == 200, applied.text
        assert "Undone." in applied.text
        assert c.sandbox(key).exec("cat app.toml").stdout.endswith("port = 8080\n")
        steps = [r.policy_step for r in c.list_audit(sandbox_key=key, tool="housekeeping")]
        undone = [s for s in steps if s.startswith("housekeeping: undo: ")]
        assert len(undone) == 1, steps
        assert "from the console by console:tenant:acme@" in undone[0]


def test_the_mcp_undo_tool_shows_then_undoes(fronts: Fronts) -> None:
    key = f"mcp-undo-{uuid.uuid4().hex[:8]}"
    meta = {"stockade/sandbox": key}

    async def scenario() -> tuple[str, str, bool]:
        async with connected(fronts.mcp, fronts.token) as client:
            listed = {t.name for t in (await client.list_tools()).tools}
            assert "undo" in listed
            for command in ("echo one > f.txt", "echo two > f.txt"):  # a checkpoint before 2
                ran = await client.call_tool("exec", {"command": command}, meta=meta)
                assert not ran.is_error, text_of(ran)
            shown = await client.call_tool("undo", {}, meta=meta)
            done = await client.call_tool("undo", {"apply": True}, meta=meta)
            return text_of(shown), text_of(done), bool(done.is_error)

    shown, done, failed = asyncio.run(scenario())
    assert shown.startswith("not applied (apply: true undoes): to before call ")
    assert "-one\n+two\n" in shown
    assert not failed, done
    assert done.startswith("undone: to before call ")
    with fronts.sup.client(token=fronts.token) as c:
        assert c.sandbox(key).exec("cat f.txt").stdout == "one\n"
        steps = [r.policy_step for r in c.list_audit(sandbox_key=key, tool="housekeeping")]
    undone = [s for s in steps if s.startswith("housekeeping: undo: ")]
    assert len(undone) == 1, steps
    assert "from MCP (ipv4:127.0.0.1:" in undone[0]
