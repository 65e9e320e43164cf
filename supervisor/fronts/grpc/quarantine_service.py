"""QuarantineService: the caller's tenant's quarantined sandboxes, their evidence (the
alarms and the audit records around them), release, quarantine by hand, and the alarms as
they sound (WatchAlarms). Every key a request names is scoped to the caller's tenant; a
watcher sees only its own tenant's alarms. Quarantine and release go through the one
lifecycle path (calls/lifecycle.py): one audit record each."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

from stockade.supervisor.calls.lifecycle import Lifecycle
from stockade.supervisor.fronts.grpc.convert import _timestamp, audit_to_pb, scoped
from stockade.supervisor.fronts.grpc.interceptor import current_tenant
from stockade.supervisor.fronts.grpc.sandbox_service import actor
from stockade.supervisor.fronts.grpc.status import Context, mapped, mapped_stream
from stockade.supervisor.keys import shown, split
from stockade.supervisor.observe.alarms import MAX_EVIDENCE, Alarm, AlarmHub
from stockade.supervisor.observe.audit import AuditLog, AuditRecord
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.supervisor.sandboxes.quarantine import Quarantine, evidence
from stockade.v1 import quarantine_pb2, quarantine_pb2_grpc


class QuarantineServicer(quarantine_pb2_grpc.QuarantineServiceServicer):
    def __init__(
        self,
        lifecycle: Lifecycle[SandboxManager],
        alarms: AlarmHub,
        audit: AuditLog | None,
        scrubber: Scrubber | None = None,
    ) -> None:
        """`lifecycle`: its sound is the AlarmHub's (a quarantine by hand's alarm)."""
        self._lifecycle = lifecycle
        sandboxes: SandboxManager = lifecycle.sandboxes
        self._sandboxes = sandboxes
        self._alarms = alarms
        self._audit = audit
        self.scrubber = scrubber
        self._window = sandboxes.config.quarantine.evidence_window_s

    @mapped
    async def ListQuarantines(
        self, request: quarantine_pb2.ListQuarantinesRequest, context: Context
    ) -> quarantine_pb2.ListQuarantinesResponse:
        tenant = current_tenant()
        held = [q for q in self._sandboxes.quarantines.list() if split(q.key)[0] == tenant]
        return quarantine_pb2.ListQuarantinesResponse(quarantines=[self._pb(q) for q in held])

    @mapped
    async def GetQuarantine(
        self, request: quarantine_pb2.GetQuarantineRequest, context: Context
    ) -> quarantine_pb2.GetQuarantineResponse:
        record = self._sandboxes.quarantines.get(scoped(request.key))
        audit = [audit_to_pb(r) for r in await self._evidence(record)]
        return quarantine_pb2.GetQuarantineResponse(quarantine=self._pb(record), audit=audit)

    @mapped
    async def ReleaseQuarantine(
        self, request: quarantine_pb2.ReleaseQuarantineRequest, context: Context
    ) -> quarantine_pb2.ReleaseQuarantineResponse:
        record = await self._lifecycle.release(actor(context), scoped(request.key))
        return quarantine_pb2.ReleaseQuarantineResponse(quarantine=self._pb(record))

    @mapped
    async def QuarantineSandbox(
        self, request: quarantine_pb2.QuarantineSandboxRequest, context: Context
    ) -> quarantine_pb2.QuarantineSandboxResponse:
        key = scoped(request.key)
        record = await self._lifecycle.quarantine(actor(context), key, request.reason)
        return quarantine_pb2.QuarantineSandboxResponse(quarantine=self._pb(record))

    @mapped_stream
    async def WatchAlarms(
        self, request: quarantine_pb2.WatchAlarmsRequest, context: Context
    ) -> AsyncIterator[quarantine_pb2.Alarm]:
        tenant = current_tenant()
        subscription = self._alarms.subscribe()
        try:
            async for alarm in subscription:
                if split(alarm.sandbox_key)[0] == tenant:
                    yield self._alarm_pb(alarm)
        finally:
            subscription.close()

    async def _evidence(self, record: Quarantine) -> list[AuditRecord]:
        return await evidence(self._audit, record, self._window)

    def _pb(self, record: Quarantine) -> quarantine_pb2.Quarantine:
        return quarantine_pb2.Quarantine(
            sandbox_key=shown(record.key),
            since=_timestamp(datetime.fromtimestamp(record.since, UTC)),
            reason=self._clean(record.why),
            frozen=record.frozen,
            network_cut=record.network_cut,
            note=self._clean(record.note),
            alarms=[self._alarm_pb(a) for a in record.alarms],
        )

    def _alarm_pb(self, alarm: Alarm) -> quarantine_pb2.Alarm:
        return quarantine_pb2.Alarm(
            sandbox_key=shown(alarm.sandbox_key),
            kind=alarm.kind,
            where=alarm.where,
            detail=self._clean(alarm.detail),
            evidence=self._clean(alarm.evidence[:MAX_EVIDENCE]),
            time=_timestamp(datetime.fromtimestamp(alarm.time, UTC)),
        )

    def _clean(self, text: str) -> str:
        """Scrubbed once more (evidence is scrubbed where it is taken; this is the last line),
        and made valid UTF-8 for the wire."""
        text = text.encode("utf-8", "replace").decode("utf-8")
        return text if self.scrubber is None else self.scrubber.scrub(text)[0]
