"""Prometheus metrics on an HTTP port (observability.metrics_listen).

Calls, their results, stage latencies and redactions come from the pipeline's
CallObservations; sandboxes by state, container starts and pending approvals are read from
the sandbox manager and the approval manager when scraped. Each Metrics has a registry of its
own, so several supervisors in one process (tests) never share series."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stockade.supervisor.config import split_host_port
from stockade.supervisor.observe.telemetry import CallObservation

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
)  # fmt: skip
UNKNOWN_TOOL = "(unknown)"
"""The tool label of a call whose tool name is not a tool: names a caller makes up never
become label values (each would be a new series)."""


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.calls = Counter(
            "stockade_tool_calls",
            "Tool calls by tool and result (ok or the error code).",
            ["tool", "result"],
            registry=self.registry,
        )
        self.call_seconds = Histogram(
            "stockade_tool_call_seconds",
            "Time of a whole tool call, by tool.",
            ["tool"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "stockade_pipeline_stage_seconds",
            "Time in each stage of the call pipeline (policy, guard, approval, queue, "
            "sandbox, agent, finish).",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.redactions = Counter(
            "stockade_redactions",
            "Credentials replaced in tool output, by tool.",
            ["tool"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "stockade_rate_limit_rejections",
            "Calls refused by the per-key rate or concurrency limit.",
            registry=self.registry,
        )
        self.alarms = Counter(
            "stockade_alarms",
            "Alarms sounded (observe/alarms.py), by kind and where the sign was seen.",
            ["kind", "where"],
            registry=self.registry,
        )
        self._server: Any = None

    def observe(self, call: CallObservation) -> None:
        tool = call.tool or UNKNOWN_TOOL
        self.calls.labels(tool, call.result).inc()
        self.call_seconds.labels(tool).observe((call.end_ns - call.start_ns) / 1e9)
        for stage in call.stages:
            self.stage_seconds.labels(stage.name).observe(stage.seconds)
        if call.redactions:
            self.redactions.labels(tool).inc(call.redactions)
        if call.result == "RATE_LIMITED":
            self.rate_limited.inc()

    def watch(
        self,
        sandboxes: Callable[[], Mapping[str, int]],
        starts: Callable[[], tuple[int, int]],
        approvals_pending: Callable[[], int],
        heals: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        """Series read at scrape time: sandboxes by state, container (starts, failures),
        approvals waiting for a decision and heals (containers re-created because they could
        not serve) by kind."""
        self.registry.register(_StateCollector(sandboxes, starts, approvals_pending, heals))

    def serve(self, listen: str) -> int:
        """Serve /metrics on host:port (port 0: any free one); the port."""
        host, port = split_host_port(listen, "observability.metrics_listen")
        server, _thread = start_http_server(port, host, registry=self.registry)
        self._server = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            # shutdown() waits for serve_forever to end; the thread is a daemon
            threading.Thread(target=_shutdown, args=(server,), daemon=True).start()


def _shutdown(server: Any) -> None:
    server.shutdown()
    server.server_close()


class _StateCollector(Collector):
    def __init__(
        self,
        sandboxes: Callable[[], Mapping[str, int]],
        starts: Callable[[], tuple[int, int]],
        approvals_pending: Callable[[], int],
        heals: Callable[[], Mapping[str, int]],
    ) -> None:
        self._sandboxes = sandboxes
        self._starts = starts
        self._pending = approvals_pending
        self._heals = heals

    def collect(self) -> Iterable[Metric]:
        by_state = GaugeMetricFamily(
            "stockade_sandboxes", "Sandboxes this supervisor holds, by state.", labels=["state"]
        )
        for state, count in sorted(self._sandboxes().items()):
            by_state.add_metric([state], count)
        yield by_state
        started, failed = self._starts()
        yield CounterMetricFamily(
            "stockade_container_starts", "Sandbox containers started.", value=started
        )
        yield CounterMetricFamily(
            "stockade_container_start_failures",
            "Sandbox containers that failed to start (engine error or no agent answer).",
            value=failed,
        )
        heals = CounterMetricFamily(
            "stockade_sandbox_heals",
            "Sandbox containers re-created (workspace kept) because they could not serve "
            "calls, by kind (init_stopped, pids_exhausted, agent_limits_lowered, "
            "agent_unresponsive, agent_misbehaved, container_exited).",
            labels=["kind"],
        )
        for kind, count in sorted(self._heals().items()):
            heals.add_metric([kind], count)
        yield heals
        yield GaugeMetricFamily(
            "stockade_approvals_pending",
            "Commands waiting for a human decision.",
            value=self._pending(),
        )
