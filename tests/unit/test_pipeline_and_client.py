"""The call pipeline (with a recording fake in place of the sandbox manager) and the client's
conversions and error table."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from stockade.client import InvalidArgument, NotFound, StockadeError, Unavailable
from stockade.client._core import error_from_rpc, result_from_pb
from stockade.supervisor.app import build_policy
from stockade.supervisor.calls.pipeline import Sandboxes, ToolPipeline
from stockade.supervisor.config import (
    AgentConfig,
    AgentTools,
    ApprovalsConfig,
    Config,
    ScrubConfig,
    ToolsConfig,
)
from stockade.supervisor.errors import CallTimedOut, InvalidRequest, SandboxLost
from stockade.supervisor.fronts.grpc.convert import result_to_pb
from stockade.supervisor.models import CallContext, ToolCall
from stockade.supervisor.observe.audit import AuditQuery
from stockade.supervisor.sandboxes.agent_link import AgentReply
from stockade.supervisor.sandboxes.lease import AgentEvent
from tests.unit.fakes import STATE


class RecordingSandboxes:
    def __init__(self, reply: AgentReply | Exception) -> None:
        self.reply = reply
        self.calls: list[tuple[str, dict[str, Any], float]] = []

    @contextlib.asynccontextmanager
    async def lease(self, key: str) -> AsyncIterator[RecordingSandboxes]:
        """The pipeline takes the sandbox once (its own stage), then calls through the lease."""
        yield self

    async def invoke(
        self, tool: str, args: dict[str, Any], timeout: float, request_id: str, **_: object
    ) -> AgentReply:
        self.calls.append((tool, args, timeout))
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply

    async def stream(
        self, tool: str, args: dict[str, Any], timeout: float, request_id: str, **_: object
    ) -> AsyncIterator[AgentEvent]:
        """Only ToolPipeline.call_stream streams; no test here calls it."""
        raise NotImplementedError("the recording fake does not stream")
        yield OK  # an async generator, as the real lease's


def _are_sandboxes(fake: RecordingSandboxes) -> Sandboxes:
    """Type-checked only: mypy says here when the fake no longer satisfies Sandboxes."""
    return fake


OK = AgentReply("", "", {"exit_code": 0, "stdout": "hi\n", "stderr": ""})


pytestmark = pytest.mark.usefixtures("state_dir")


def pipeline(reply: AgentReply | Exception = OK, **tools: int) -> tuple[ToolPipeline, Any]:
    fake = RecordingSandboxes(reply)
    config = Config(tools=ToolsConfig(**tools), state_dir=STATE[-1])  # type: ignore[arg-type]
    return ToolPipeline(config, fake, build_policy(config)), fake


def call(tool: str = "exec", args: object = None, timeout_ms: int = 0) -> ToolCall:
    return ToolCall("k", tool, json.dumps(args or {"command": "echo hi"}), timeout_ms=timeout_ms)


async def test_exec_gets_the_default_timeout_and_a_longer_deadline() -> None:
    pipe, fake = pipeline()
    result = await pipe.call(call())
    assert not result.is_error
    assert result.for_llm == "hi\n"
    assert result.request_id
    (tool, args, deadline) = fake.calls[0]
    assert (tool, args["timeout"]) == ("exec", 30)
    assert deadline == 40


@pytest.mark.parametrize(
    ("args", "timeout_ms", "want_timeout", "want_deadline"),
    [
        ({"command": "x", "timeout": 1000}, 0, 300, 310),
        ({"command": "x", "timeout": 100}, 5000, 5.0, 15.0),
        ({"command": "x", "timeout": 2}, 5000, 2, 15.0),
    ],
)
async def test_exec_timeout_is_clamped(
    args: dict[str, Any], timeout_ms: int, want_timeout: object, want_deadline: float
) -> None:
    pipe, fake = pipeline()
    await pipe.call(call(args=args, timeout_ms=timeout_ms))
    _, sent, deadline = fake.calls[0]
    assert (sent["timeout"], deadline) == (want_timeout, want_deadline)


async def test_unknown_tool_bad_json_and_bad_arguments_never_reach_the_sandbox() -> None:
    pipe, fake = pipeline()
    bad_type = await pipe.call(call(args={"command": "x", "timeout": "soon"}))
    assert bad_type.error_code.value == "INVALID_ARGS"
    assert "timeout" in bad_type.error_message
    assert (await pipe.call(call("nope"))).error_code.value == "NOT_FOUND"
    bad = await pipe.call(ToolCall("k", "exec", "{"))
    assert bad.error_code.value == "INVALID_ARGS"
    assert fake.calls == []


async def test_bad_key_is_a_request_error() -> None:
    pipe, _ = pipeline()
    with pytest.raises(InvalidRequest):
        await pipe.call(ToolCall("", "exec", "{}"))


async def test_agent_errors_and_lost_sandboxes_become_results() -> None:
    pipe, _ = pipeline(AgentReply("FILE_NOT_FOUND", "no such file 'x'", None))
    result = await pipe.call(call("read_file", {"path": "x"}))
    assert (result.error_code.value, result.error_message) == ("FILE_NOT_FOUND", "no such file 'x'")
    pipe, _ = pipeline(SandboxLost("container exited"))
    assert (await pipe.call(call())).error_code.value == "SANDBOX_LOST"
    pipe, _ = pipeline(CallTimedOut("exec did not finish within 40 s"))  # the lease's word
    assert (await pipe.call(call())).error_code.value == "TIMEOUT"


async def test_long_output_is_capped_for_the_model() -> None:
    big = AgentReply("", "", {"exit_code": 0, "stdout": "x" * 200_000, "stderr": ""})
    pipe, _ = pipeline(big, llm_max_bytes=1000)
    result = await pipe.call(call())
    assert result.truncated
    assert len(result.for_llm.encode()) <= 1000
    assert len(result.for_user) == 200_000
    assert result.data is not None
    assert len(result.data["stdout"]) == 200_000


async def test_results_survive_the_wire_including_non_utf8_names() -> None:
    reply = AgentReply("", "", {"matches": ["bad\udcffname", "ü"], "truncated": False})
    pipe, _ = pipeline(reply)
    result = await pipe.call(call("glob", {"pattern": "*"}))
    message = result_to_pb(result)
    wire = message.SerializeToString()
    back = result_from_pb(type(message).FromString(wire))
    assert back.data["matches"] == ["bad\udcffname", "ü"]
    assert "\ufffd" in back.for_llm
    assert back.to_dict()["error_code"] == "TOOL_ERROR_CODE_UNSPECIFIED"


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, reason: str = "") -> None:
        self._code, self._details, self._reason = code, details, reason

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("stockade-error-reason", self._reason),) if self._reason else ()


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
        (grpc.StatusCode.NOT_FOUND, NotFound),
        (grpc.StatusCode.UNAVAILABLE, Unavailable),
        (grpc.StatusCode.INTERNAL, StockadeError),
    ],
)
def test_status_codes_map_to_client_errors(code: grpc.StatusCode, cls: type) -> None:
    err = error_from_rpc(FakeRpcError(code, "why", "SOME_REASON"))
    assert type(err) is cls
    assert (err.code, err.reason) == (code.name, "SOME_REASON")
    assert str(err) == f"{code.name}: why"


class HangingSandboxes(RecordingSandboxes):
    """An agent call that never ends until it is cancelled."""

    def __init__(self) -> None:
        super().__init__(OK)
        self.entered = asyncio.Event()

    async def invoke(
        self, tool: str, args: dict[str, Any], timeout: float, request_id: str, **_: object
    ) -> AgentReply:
        self.entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_call_its_caller_cancels_is_still_audited() -> None:
    """A command that ran (or waited for a human) when its caller went away leaves a record."""
    config = Config(state_dir=STATE[-1], approvals=ApprovalsConfig(mode="on-miss"))
    fake = HangingSandboxes()
    policy = build_policy(config)
    pipe = ToolPipeline(config, fake, policy)
    watcher = asyncio.ensure_future(anext(policy.approvals.watch()))
    running = asyncio.create_task(pipe.call(call(args={"command": "sleep 1"}), caller="bob"))
    await asyncio.wait_for(watcher, 5)  # the approval request
    request = policy.approvals.pending()[0]
    policy.approvals.resolve(request.id, "allow-once", "alice")
    await asyncio.wait_for(fake.entered.wait(), 5)
    running.cancel()
    waiting = asyncio.create_task(pipe.call(call(args={"command": "make deploy"})))
    while not policy.approvals.pending():
        await asyncio.sleep(0.001)
    waiting.cancel()
    await asyncio.gather(running, waiting, return_exceptions=True)
    assert policy.audit is not None
    records = await policy.audit.query(AuditQuery())
    assert [(r.tool, r.error_code, r.is_error, r.approval) for r in records] == [
        ("exec", "CANCELLED", True, "withdrawn"),
        ("exec", "CANCELLED", True, "allow-once"),
    ]
    assert json.loads(records[1].arguments_json) == {"command": "sleep 1"}
    assert (records[1].caller, records[1].approver) == ("bob", "alice")


async def test_unknown_tool_names_only_what_the_caller_may_use() -> None:
    """As ListTools: a denied tool is not offered in the NOT_FOUND message either."""
    config = Config(
        state_dir=STATE[-1],
        agents={"reader": AgentConfig(tools=AgentTools(allow=("group:fs",), deny=("write",)))},
    )
    pipe = ToolPipeline(config, RecordingSandboxes(OK), build_policy(config))
    reader = ToolCall("k", "nope", "{}", context=CallContext(agent_id="reader"))
    message = (await pipe.call(reader)).error_message
    assert "read_file" in message
    assert "exec" not in message
    assert "write_file" not in message
    assert "exec" in (await pipe.call(call("nope"))).error_message


async def test_a_huge_unknown_tool_name_gives_a_short_message() -> None:
    pipe, _ = pipeline()
    result = await pipe.call(call("x" * 1_000_000))
    assert result.error_code.value == "NOT_FOUND"
    assert len(result.error_message) < 1000


async def test_a_configured_secret_cut_by_the_output_limit_leaves_no_piece(tmp_path: Path) -> None:
    """The agent keeps the first max_output_bytes: a secret across that limit ends the
    output as a piece no pattern knows."""
    secret = "Zq7-hunter2-s3cr3t-9fX"
    reply = AgentReply(
        "", "", {"exit_code": 0, "stdout": "x" * 50 + secret[:12], "stdout_truncated": True}
    )
    fake = RecordingSandboxes(reply)
    config = Config(scrub=ScrubConfig(secrets=[secret]), state_dir=tmp_path)
    pipe = ToolPipeline(config, fake, build_policy(config))
    result = await pipe.call(call())
    assert secret[:12] not in json.dumps(result.data)
    assert secret[:12] not in result.for_llm
    assert result.redactions == 1
