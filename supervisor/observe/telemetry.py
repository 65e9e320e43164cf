"""What the supervisor tells about itself: one CallObservation per tool call (for metrics and
traces), the request id of the call being served (a context variable), and JSON logs.

The pipeline records when each of its stages ran; observers (metrics.py, tracing.py) turn
that into Prometheus series and OpenTelemetry spans after the call, off its path: an observer
that fails is logged and never fails the call."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
"""The request id of the tool call this task serves ("" outside calls)."""

log = logging.getLogger("stockade.calls")

STAGES = ("policy", "guard", "approval", "queue", "sandbox", "agent", "finish")
"""The pipeline's stages in order; a call that stops early has only the first few."""


@dataclass(frozen=True)
class Stage:
    name: str
    start_ns: int
    """time.time_ns() when it began (wall clock: spans need it)."""
    end_ns: int

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass
class Stages:
    """The stages one call went through, in order."""

    done: list[Stage] = field(default_factory=list)

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        start = time.time_ns()
        try:
            yield
        finally:
            self.done.append(Stage(name, start, time.time_ns()))


@dataclass(frozen=True)
class CallObservation:
    request_id: str
    sandbox_key: str
    tool: str
    """The tool's canonical name, or "" when the name was not a known tool."""
    result: str
    """"ok", or the ToolErrorCode's name (EXECUTION_FAILED, RATE_LIMITED, ...)."""
    start_ns: int
    end_ns: int
    stages: tuple[Stage, ...]
    redactions: int
    agent_id: str = ""
    traceparent: str = ""
    """The caller's W3C trace context, when it sent one."""


Observer = Callable[[CallObservation], None]


def notify(observers: tuple[Observer, ...], observation: CallObservation) -> None:
    for observer in observers:
        try:
            observer(observation)
        except Exception:
            log.exception("an observer failed on call %s", observation.request_id)


def log_call(observation: CallObservation) -> None:
    """The per-call log line (observability.log_calls)."""
    log.info(
        "call %s on %r: %s in %.1f ms",
        observation.tool or "(unknown tool)",
        observation.sandbox_key,
        observation.result,
        (observation.end_ns - observation.start_ns) / 1e6,
        extra={
            "tool": observation.tool,
            "sandbox_key": observation.sandbox_key,
            "result": observation.result,
            "duration_ms": round((observation.end_ns - observation.start_ns) / 1e6, 3),
        },
    )


class RequestIdFilter(logging.Filter):
    """Puts the current call's request id on every record (as `request_id`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", ""):
            record.request_id = request_id.get()
        return True


_EXTRA_FIELDS = (
    "tool", "sandbox_key", "result", "duration_ms", "alarm_kind", "alarm_where", "alarm_detail",
)  # fmt: skip


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (RFC 3339, UTC), level, logger, message, request_id
    (when serving a call), the call fields of the per-call line, and the exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", "")
        if rid:
            entry["request_id"] = rid
        for name in _EXTRA_FIELDS:
            if hasattr(record, name):
                entry[name] = getattr(record, name)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def setup_logging(log_format: str, stream: Any = None) -> None:
    """Configure the root logger for `stockade serve`: text or JSON lines on stderr."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(RequestIdFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
