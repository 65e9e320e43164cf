"""Alarms: signs of an attack seen anywhere in the supervisor (a honeytoken in a call or a
request, a brokered secret's placeholder on its way to the wrong place, a guard rule marked
`quarantine`), raised once and told everywhere an operator looks: the log, the audit log, a
metric, the stream `WatchAlarms` serves, and the configured reaction (quarantine).

Whoever sees a sign calls `AlarmHub.sound(alarm)` and goes on (sound never blocks and never
raises); the reaction runs on the event loop. Nothing here reads a secret: an alarm carries
names and bounded, scrubbed evidence only."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from stockade.supervisor.config import Config
    from stockade.supervisor.observe.audit import AuditRecord
    from stockade.supervisor.observe.metrics import Metrics

log = logging.getLogger("stockade.alarms")

AlarmKind = Literal["honeytoken", "placeholder", "guard"]
MAX_EVIDENCE = 4096
MAX_STEP = 300
"""Characters of an alarm's words in its audit record's policy_step (all of them in its
arguments_json)."""
"""Characters of evidence an alarm keeps (the triggering call or request, scrubbed)."""


@dataclass(frozen=True)
class Alarm:
    sandbox_key: str
    """The scoped key of the sandbox the sign came from."""
    kind: AlarmKind
    where: str
    """Where the sign was seen: "arguments", "output", "upload", "egress", "guard", ..."""
    detail: str
    """What happened, in words an operator reads (names, never a secret's value)."""
    evidence: str = ""
    """The triggering call or request, scrubbed and cut to MAX_EVIDENCE."""
    time: float = field(default_factory=time.time)


AlarmSink = Callable[[Alarm], None]
"""What sees a sign calls: AlarmHub.sound, or a test's list.append."""


class Tripwire(Protocol):
    """Finds the signs planted for sandboxes (honeytokens) in bytes on their way somewhere.
    The egress proxy and the call pipeline call it; it sounds the alarm itself."""

    longest: int
    """The longest sign in bytes: a caller scanning a stream keeps that many bytes minus one
    from each chunk to find a sign cut in two."""

    def check(self, sandbox_key: str, where: str, data: bytes | str, evidence: str = "") -> bool:
        """True (and the alarm sounded) when data carries a sign."""
        ...


class NoTripwire:
    """No honeytokens planted: nothing to find."""

    longest = 0

    def check(self, sandbox_key: str, where: str, data: bytes | str, evidence: str = "") -> bool:
        return False


React = Callable[[str, Alarm], Awaitable[None]]
"""The reaction: SandboxManager.quarantine(key, alarm)."""
SUBSCRIBER_QUEUE = 256
"""Alarms a WatchAlarms subscriber may leave unread; past that it loses the oldest."""
MAX_SUBSCRIBERS = 64
MAX_WHERE = 32
"""Characters of `where` kept as a metric label (each value is a series)."""


class Subscription:
    """One watcher's alarms, from when it subscribed, as an async iterator. A watcher that
    reads too slowly loses the oldest (counted in `lost`): sound never waits for it."""

    def __init__(self, hub: AlarmHub) -> None:
        self._hub = hub
        self._queue: asyncio.Queue[Alarm | None] = asyncio.Queue(SUBSCRIBER_QUEUE)
        self.lost = 0

    def offer(self, alarm: Alarm | None) -> None:
        while True:
            try:
                self._queue.put_nowait(alarm)
                return
            except asyncio.QueueFull:
                self._queue.get_nowait()
                self.lost += 1

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Alarm:
        alarm = await self._queue.get()
        if alarm is None:
            raise StopAsyncIteration
        return alarm

    def close(self) -> None:
        self._hub._subscribers.discard(self)


class AuditSink(Protocol):
    """Where the hub records an alarm (observe/audit.py AuditLog is the real one; tests put
    fakes in its place)."""

    def record(self, rec: AuditRecord, /) -> None: ...


class AlarmHub:
    """Where alarms are sounded: each is logged (a warning with alarm_* fields for JSON
    logs), recorded in the audit log (tool "alarm", policy_step "alarm: KIND at WHERE", the
    alarm as arguments_json), counted (stockade_alarms_total{kind, where}), handed to
    every WatchAlarms subscriber, and, when the config says so, reacted to: the sandbox is
    quarantined (the reaction runs as a task on the loop; sound returns at once)."""

    def __init__(
        self,
        audit: AuditSink | None,
        metrics: Metrics | None,
        react: React | None,
        config: Config,
    ) -> None:
        self.audit = audit
        self.metrics = metrics
        """Set after construction when the metrics start later (app.py)."""
        self.react = react
        self._config = config
        self._subscribers: set[Subscription] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sounded = 0

    def quarantines(self, alarm: Alarm) -> bool:
        """Whether this alarm quarantines its sandbox: its kind is in [quarantine] on, and
        for a honeytoken, [honeytokens] on_read (seen in output) or on_use (anywhere else)
        says "quarantine" (without that section: a read only alarms, a use quarantines)."""
        if alarm.kind not in self._config.quarantine.on:
            return False
        if alarm.kind != "honeytoken":
            return True
        honey = getattr(self._config, "honeytokens", None)
        read = alarm.where == "output"
        default = "alert" if read else "quarantine"
        action = getattr(honey, "on_read" if read else "on_use", default) if honey else default
        return bool(action == "quarantine")

    def sound(self, alarm: Alarm) -> None:
        """Tell everywhere; never raises, never blocks. From another thread, the work is
        handed to the loop the hub first sounded on (or was bound to)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._sound, alarm)
            return
        if running is not None:
            self._loop = running
        self._sound(alarm)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop alarms sounded from other threads are handed to."""
        self._loop = loop

    def _sound(self, alarm: Alarm) -> None:
        try:
            self.sounded += 1
            self._log(alarm)
            self._record(alarm)
            if self.metrics is not None:
                self.metrics.alarms.labels(alarm.kind, alarm.where[:MAX_WHERE]).inc()
            for subscriber in list(self._subscribers):
                subscriber.offer(alarm)
            if self.react is not None and self.quarantines(alarm):
                self._schedule(self.react(alarm.sandbox_key, alarm), alarm)
        except Exception:  # an alarm must never fail the call or request that sounded it
            log.exception("sounding an alarm failed")

    def _log(self, alarm: Alarm) -> None:
        log.warning(
            "ALARM %s at %s in sandbox %r: %s",
            alarm.kind,
            alarm.where,
            alarm.sandbox_key,
            alarm.detail,
            extra={
                "sandbox_key": alarm.sandbox_key,
                "alarm_kind": alarm.kind,
                "alarm_where": alarm.where,
                "alarm_detail": alarm.detail,
            },
        )

    def _record(self, alarm: Alarm) -> None:
        if self.audit is None:
            return
        from stockade.supervisor.observe.audit import AuditRecord

        self.audit.record(
            AuditRecord(
                time=alarm.time,
                request_id="",
                caller="supervisor",
                sandbox_key=alarm.sandbox_key,
                agent_id="",
                provider="",
                tool="alarm",
                arguments_json=json.dumps(to_dict(alarm)),
                policy_step=f"alarm: {alarm.kind} at {alarm.where}: {alarm.detail[:MAX_STEP]}",
                error_code="ALARM",
                is_error=True,
            )
        )

    def _schedule(self, reaction: Awaitable[None], alarm: Alarm) -> None:
        async def run() -> None:
            from stockade.supervisor.errors import StockadeError

            try:
                await reaction
            except StockadeError as exc:  # e.g. the sandbox was destroyed meanwhile
                log.warning("the reaction to an alarm in %r failed: %s", alarm.sandbox_key, exc)
            except Exception:
                log.exception("the reaction to an alarm in %r failed", alarm.sandbox_key)

        task = asyncio.get_running_loop().create_task(run(), name="stockade-alarm-reaction")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settled(self) -> None:
        """Wait for the reactions under way (tests; a stop)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def subscribe(self) -> Subscription:
        """A watcher's alarms from now on; close() it when done. QuotaExceeded when
        MAX_SUBSCRIBERS watch already."""
        from stockade.supervisor.errors import QuotaExceeded

        if len(self._subscribers) >= MAX_SUBSCRIBERS:
            raise QuotaExceeded(
                f"{MAX_SUBSCRIBERS} alarm watchers are connected already; try again later"
            )
        subscription = Subscription(self)
        self._subscribers.add(subscription)
        return subscription

    async def close(self) -> None:
        """End every watcher's stream and wait for reactions under way."""
        for subscriber in list(self._subscribers):
            subscriber.offer(None)
        self._subscribers.clear()
        await self.settled()


def to_dict(alarm: Alarm) -> dict[str, Any]:
    return asdict(alarm)


def from_dict(data: Any) -> Alarm | None:
    """An alarm kept as JSON (a quarantine's record); None when it is not one."""
    try:
        kind = str(data["kind"])
        if kind not in ("honeytoken", "placeholder", "guard") or not sane_time(data["time"]):
            return None
        return Alarm(
            sandbox_key=str(data["sandbox_key"]),
            kind=kind,  # type: ignore[arg-type]
            where=str(data["where"]),
            detail=str(data["detail"]),
            evidence=str(data.get("evidence", ""))[:MAX_EVIDENCE],
            time=float(data["time"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def sane_time(value: object) -> bool:
    """A time a record may carry: seconds since the epoch, before the year 5000 (a damaged
    record's NaN or 1e300 would break every reply that shows it)."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return 0 <= seconds < 95_000_000_000
