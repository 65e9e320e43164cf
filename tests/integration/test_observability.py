"""Metrics, JSON logs and traces of a real supervisor: a scrape of /metrics after calls of
every outcome, the per-call JSON log lines with their request ids, and the spans of a call
whose caller sent a W3C traceparent."""

from __future__ import annotations

import json
import re
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stockade.client import CallContext, Stockade, ToolResult
from stockade.v1 import tool_pb2, tool_pb2_grpc
from tests.integration.harness import Supervisor, running_supervisor

pytestmark = pytest.mark.timeout(300)

TOKEN = "ghp_" + "Z" * 36
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
HOSTILE_TOOL = 'x"}\nstockade_fake{a="1"} 9'
STAGES = {"policy", "guard", "approval", "queue", "sandbox", "agent", "finish"}


@pytest.fixture(scope="module")
def traces(engine: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="stk-traces") as folder:
        yield Path(folder) / f"spans-{engine}.jsonl"


@pytest.fixture(scope="module")
def sup(engine: str, traces: Path) -> Iterator[Supervisor]:
    config = f"""
[observability]
metrics_listen = "127.0.0.1:0"
log_format = "json"
trace_exporter = "console"
trace_file = "{traces}"
[agents.asker]
approvals = "always"
[limits]
rate_per_s = 0.1
burst = 6
"""
    with running_supervisor(engine, config) as s:
        yield s


def metrics_url(sup: Supervisor) -> str:
    found = re.search(r"metrics on (http://\S+/metrics)", sup.log())
    assert found, "the supervisor did not say where its metrics are:\n" + sup.log()[-2000:]
    return found.group(1)


def scrape(sup: Supervisor) -> tuple[str, dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    with urllib.request.urlopen(metrics_url(sup), timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return text, samples


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_logs_and_traces(sup: Supervisor, traces: Path, key: str) -> None:
    with sup.client() as c:
        box = c.sandbox(key)
        assert box.exec("echo hi").stdout == "hi\n"
        assert box.exec("exit 3").error_code == "EXECUTION_FAILED"
        leaked = box.exec(f"echo {TOKEN}")
        assert leaked.redactions >= 1
        assert TOKEN not in leaked.stdout
        assert c.call(key, HOSTILE_TOOL, {}).error_code == "NOT_FOUND"
        limited = [c.call(key + "-rl", "list_files", {"path": "."}) for _ in range(10)]
        assert "RATE_LIMITED" in {r.error_code for r in limited}
        traced = _call_with_traceparent(sup, key, "traced-call-1")
        assert traced.error_code == tool_pb2.TOOL_ERROR_CODE_UNSPECIFIED, traced.error_message

        text, samples = scrape(sup)
        assert value(samples, "stockade_tool_calls_total", tool="exec", result="ok") >= 3
        assert (
            value(samples, "stockade_tool_calls_total", tool="exec", result="EXECUTION_FAILED") == 1
        )
        assert (
            value(samples, "stockade_tool_calls_total", tool="(unknown)", result="NOT_FOUND") == 1
        )
        assert (
            value(samples, "stockade_tool_calls_total", tool="list_files", result="RATE_LIMITED")
            >= 1
        )
        assert value(samples, "stockade_rate_limit_rejections_total") >= 1
        assert value(samples, "stockade_redactions_total", tool="exec") >= 1
        for stage in STAGES:
            count = value(samples, "stockade_pipeline_stage_seconds_count", stage=stage)
            assert count >= 1, f"no {stage} stage observed"
        assert value(samples, "stockade_tool_call_seconds_count", tool="exec") >= 3
        assert value(samples, "stockade_sandboxes", state="RUNNING") == 2
        assert value(samples, "stockade_sandboxes", state="BROKEN") == 0
        assert value(samples, "stockade_container_starts_total") == 2
        assert ("stockade_container_start_failures_total", frozenset()) in samples
        assert value(samples, "stockade_approvals_pending") == 0
        # a tool name the caller made up is never a label value (nor injects a series)
        assert "stockade_fake" not in text
        assert 'x\\"}' not in text

        _pending_approval_is_counted(sup, c, key)

    sup.stop()  # flushes the spans
    sup.start()
    _logs_are_json_with_request_ids(sup)
    _spans_follow_the_callers_trace(traces)


def _call_with_traceparent(sup: Supervisor, key: str, request_id: str) -> tool_pb2.ToolResult:
    with grpc.insecure_channel(sup.target) as channel:
        stub = tool_pb2_grpc.ToolServiceStub(channel)
        request = tool_pb2.CallToolRequest(
            sandbox_key=key,
            tool="exec",
            arguments_json=json.dumps({"command": "echo traced"}),
            request_id=request_id,
        )
        traceparent = f"00-{TRACE_ID}-{PARENT_SPAN}-01"
        result: tool_pb2.ToolResult = stub.CallTool(
            request, metadata=[("traceparent", traceparent)], timeout=60
        )
        return result


def _pending_approval_is_counted(sup: Supervisor, c: Stockade, key: str) -> None:
    approver = sup.client()
    stream = approver.watch_approvals("obs-test")
    seen: list[object] = []
    reader = threading.Thread(target=lambda: seen.extend(stream), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 10
        while c.list_approvals().approvers < 1:
            assert time.monotonic() < deadline, "the approver did not connect"
            time.sleep(0.02)
        outcome: list[ToolResult] = []
        context = CallContext(agent_id="asker")
        caller = threading.Thread(
            target=lambda: outcome.append(
                c.call(key, "exec", {"command": "echo ok"}, context=context)
            )
        )
        caller.start()
        while not c.list_approvals().pending:
            assert time.monotonic() < deadline + 20, "the request never became pending"
            time.sleep(0.05)
        _, samples = scrape(sup)
        assert value(samples, "stockade_approvals_pending") == 1
        pending = c.list_approvals().pending[0]
        c.resolve_approval(pending.id, "allow-once", "obs-test")
        caller.join(30)
        assert outcome
        assert outcome[0].stdout == "ok\n"
        _, samples = scrape(sup)
        assert value(samples, "stockade_approvals_pending") == 0
        assert value(samples, "stockade_pipeline_stage_seconds_count", stage="approval") >= 1
    finally:
        approver.close()
        reader.join(5)


def _logs_are_json_with_request_ids(sup: Supervisor) -> None:
    records = []
    for line in sup.log().splitlines():
        if not line or line.startswith("stockade: "):  # the CLI's own announcements
            continue
        records.append(json.loads(line))  # every log line is one JSON object
    calls = [r for r in records if r.get("logger") == "stockade.calls"]
    assert calls, "no per-call log lines"
    traced = [r for r in calls if r.get("request_id") == "traced-call-1"]
    assert len(traced) == 1, calls[-5:]
    assert traced[0]["tool"] == "exec"
    assert traced[0]["result"] == "ok"
    assert traced[0]["level"] == "info"
    assert traced[0]["duration_ms"] > 0
    assert all(r["request_id"] for r in calls), "a call's log line without its request id"


def _spans_follow_the_callers_trace(traces: Path) -> None:
    spans = [json.loads(line) for line in traces.read_text().splitlines() if line.strip()]
    ours = [s for s in spans if s["context"]["trace_id"] == "0x" + TRACE_ID]
    roots = [s for s in ours if s["parent_id"] == "0x" + PARENT_SPAN]
    assert len(roots) == 1, [s["name"] for s in ours]
    root = roots[0]
    assert root["name"] == "tool exec"
    assert root["kind"] == "SpanKind.SERVER"
    assert root["attributes"]["stockade.request_id"] == "traced-call-1"
    children = [s for s in ours if s["parent_id"] == root["context"]["span_id"]]
    assert {s["name"] for s in children} == STAGES
    for child in children:
        assert root["start_time"] <= child["start_time"] <= child["end_time"] <= root["end_time"]
