"""OpenTelemetry traces of tool calls (observability.trace_exporter), built from each call's
CallObservation after it ends: a SERVER span for the call, child spans for the pipeline's
stages at the times they ran. The caller's W3C `traceparent` (gRPC metadata) becomes the
parent, so a trace runs from the agent framework through the supervisor to the sandbox hop.
The in-sandbox agent exports nothing itself (a sandbox has no network to reach a
collector): its part is the `agent` span, with the tool's own timing as an attribute.

Needs the `otel` extra; imported only when tracing is configured."""

from __future__ import annotations

from typing import IO, Any

from stockade.supervisor.config import ObservabilityConfig
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.observe.telemetry import CallObservation

MAX_TRACEPARENT = 128
"""The longest W3C `traceparent` taken from a caller, on any front (a valid one is 55
characters); a longer value is dropped: it only names a parent span."""


class CallTracer:
    def __init__(self, config: ObservabilityConfig) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
        except ImportError as exc:
            raise ConfigError(
                "observability.trace_exporter needs OpenTelemetry: pip install 'stockade[otel]'"
            ) from exc
        self._file: IO[str] | None = None
        exporter: SpanExporter
        if config.trace_exporter == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError as exc:
                raise ConfigError(
                    "trace_exporter = otlp needs the OTLP exporter: pip install 'stockade[otel]'"
                ) from exc
            exporter = OTLPSpanExporter(endpoint=config.trace_endpoint)
        else:
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            if config.trace_file:
                self._file = open(config.trace_file, "a", encoding="utf-8")  # noqa: SIM115
            exporter = ConsoleSpanExporter(
                out=self._file or _stderr(), formatter=lambda span: span.to_json(indent=None) + "\n"
            )
        resource = Resource.create({"service.name": config.service_name})
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("stockade.supervisor")

    def observe(self, call: CallObservation) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = (
            TraceContextTextMapPropagator().extract({"traceparent": call.traceparent})
            if call.traceparent
            else None
        )
        attributes: dict[str, Any] = {
            "stockade.request_id": call.request_id,
            "stockade.sandbox_key": call.sandbox_key,
            "stockade.tool": call.tool,
            "stockade.result": call.result,
            "stockade.redactions": call.redactions,
        }
        if call.agent_id:
            attributes["stockade.agent_id"] = call.agent_id
        root = self._tracer.start_span(
            f"tool {call.tool or '(unknown)'}",
            context=parent,
            kind=SpanKind.SERVER,
            start_time=call.start_ns,
            attributes=attributes,
        )
        inside = trace.set_span_in_context(root)
        for stage in call.stages:
            span = self._tracer.start_span(stage.name, context=inside, start_time=stage.start_ns)
            span.end(end_time=stage.end_ns)
        if call.result != "ok":
            root.set_status(Status(StatusCode.ERROR, call.result))
        root.end(end_time=call.end_ns)

    def close(self) -> None:
        self._provider.shutdown()
        if self._file is not None:
            self._file.close()


def _stderr() -> IO[str]:
    import sys

    return sys.stderr
