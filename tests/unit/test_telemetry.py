"""Observations, metrics, JSON logs and spans without a supervisor."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from stockade.supervisor.config import ObservabilityConfig
from stockade.supervisor.fronts.grpc.convert import traceparent_of
from stockade.supervisor.observe.metrics import Metrics
from stockade.supervisor.observe.telemetry import (
    CallObservation,
    JsonFormatter,
    RequestIdFilter,
    Stage,
    Stages,
    notify,
    request_id,
)
from stockade.supervisor.observe.tracing import MAX_TRACEPARENT, CallTracer
from tests.unit.fakes import refused_config


def observation(**kw: object) -> CallObservation:
    base: dict[str, object] = {
        "request_id": "r1",
        "sandbox_key": "k",
        "tool": "exec",
        "result": "ok",
        "start_ns": 1_000_000_000,
        "end_ns": 1_004_000_000,
        "stages": (Stage("policy", 1_000_000_000, 1_001_000_000),),
        "redactions": 0,
    }
    base.update(kw)
    return CallObservation(**base)  # type: ignore[arg-type]


def test_stages_are_timed_in_order_even_when_a_stage_raises() -> None:
    stages = Stages()
    with stages.timed("policy"):
        pass
    with pytest.raises(ValueError, match="boom"), stages.timed("agent"):
        raise ValueError("boom")
    assert [s.name for s in stages.done] == ["policy", "agent"]
    assert all(s.end_ns >= s.start_ns for s in stages.done)


def test_metrics_count_calls_stages_redactions_and_rejections() -> None:
    m = Metrics()
    m.observe(observation())
    m.observe(observation(result="RATE_LIMITED", redactions=0))
    m.observe(observation(tool="", result="NOT_FOUND", redactions=3))
    text = generate_latest(m.registry).decode()
    assert 'stockade_tool_calls_total{result="ok",tool="exec"} 1.0' in text
    assert 'stockade_tool_calls_total{result="NOT_FOUND",tool="(unknown)"} 1.0' in text
    assert "stockade_rate_limit_rejections_total 1.0" in text
    assert 'stockade_redactions_total{tool="(unknown)"} 3.0' in text
    assert 'stockade_pipeline_stage_seconds_count{stage="policy"} 3.0' in text


def test_state_series_are_read_at_scrape_time() -> None:
    m = Metrics()
    counts = {"RUNNING": 1, "BROKEN": 0, "EXITED": 0}
    m.watch(lambda: counts, lambda: (4, 1), lambda: 2)
    counts["RUNNING"] = 3
    text = generate_latest(m.registry).decode()
    assert 'stockade_sandboxes{state="RUNNING"} 3.0' in text
    assert "stockade_container_starts_total 4.0" in text
    assert "stockade_container_start_failures_total 1.0" in text
    assert "stockade_approvals_pending 2.0" in text


def test_heals_are_counted_by_kind_at_scrape_time() -> None:
    m = Metrics()
    heals = {"init_stopped": 0, "agent_unresponsive": 2}
    m.watch(dict, lambda: (0, 0), lambda: 0, lambda: heals)
    heals["init_stopped"] = 1
    text = generate_latest(m.registry).decode()
    assert 'stockade_sandbox_heals_total{kind="init_stopped"} 1.0' in text
    assert 'stockade_sandbox_heals_total{kind="agent_unresponsive"} 2.0' in text


def test_a_failing_observer_never_fails_the_call(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def broken(_: CallObservation) -> None:
        raise RuntimeError("exporter down")

    notify((broken, lambda o: seen.append(o.request_id)), observation())
    assert seen == ["r1"]
    assert "an observer failed on call r1" in caplog.text


def test_json_log_lines_carry_the_request_id() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("stockade.test-json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        token = request_id.set("req-42")
        logger.warning('odd "quote"\nand a newline', extra={"tool": "exec"})
        request_id.reset(token)
        try:
            raise ValueError("inner")
        except ValueError:
            logger.exception("outside a call")
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["request_id"] == "req-42"
    assert first["tool"] == "exec"
    assert first["message"] == 'odd "quote"\nand a newline'
    assert first["level"] == "warning"
    assert "request_id" not in second
    assert "ValueError: inner" in second["exception"]


class _Context:
    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self._metadata


def test_traceparent_is_taken_only_when_plausible() -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert traceparent_of(_Context([("traceparent", good)])) == good
    assert traceparent_of(_Context([("traceparent", "x" * (MAX_TRACEPARENT + 1))])) == ""
    assert traceparent_of(_Context([])) == ""


def test_spans_with_a_hostile_or_missing_traceparent_start_a_trace(tmp_path: Path) -> None:
    out = tmp_path / "spans.jsonl"
    tracer = CallTracer(ObservabilityConfig(trace_exporter="console", trace_file=str(out)))
    tracer.observe(observation(traceparent="00-not-a-trace-zz", request_id="bad"))
    tracer.observe(observation(traceparent="", request_id="none", result="TIMEOUT"))
    tracer.close()
    spans = [json.loads(line) for line in out.read_text().splitlines()]
    roots = [s for s in spans if s["kind"] == "SpanKind.SERVER"]
    assert {r["attributes"]["stockade.request_id"] for r in roots} == {"bad", "none"}
    assert all(r["parent_id"] is None for r in roots)
    assert [
        r["status"]["status_code"] for r in roots if r["attributes"]["stockade.result"] != "ok"
    ] == ["ERROR"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('metrics_listen = "9464"', "host:port"),
        ('metrics_listen = "127.0.0.1:99999"', "host:port"),
        ('metrics_listen = "127.0.0.1:port"', "host:port"),
        ('log_format = "xml"', "log_format"),
        ('trace_exporter = "jaeger"', "trace_exporter"),
        ('trace_exporter = "otlp"\ntrace_endpoint = "ftp://x"', "http"),
    ],
)
def test_bad_observability_config_is_refused(tmp_path: Path, text: str, message: str) -> None:
    assert re.search(message, refused_config(tmp_path, f"[observability]\n{text}\n"))


def test_otlp_exports_spans_to_a_collector(tmp_path: Path) -> None:
    """The OTLP/HTTP exporter, against a collector of the test's own on loopback."""
    import http.server
    import threading

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    received: list[bytes] = []

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Collector)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        tracer = CallTracer(ObservabilityConfig(trace_exporter="otlp", trace_endpoint=endpoint))
        tracer.observe(observation(request_id="otlp-1"))
        tracer.close()  # flushes
    finally:
        server.shutdown()
        server.server_close()
    assert received, "the collector got nothing"
    request = trace_service_pb2.ExportTraceServiceRequest.FromString(received[0])
    spans = [s for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]
    assert {s.name for s in spans} == {"tool exec", "policy"}
    service = {a.key: a.value.string_value for a in request.resource_spans[0].resource.attributes}
    assert service["service.name"] == "stockade"
