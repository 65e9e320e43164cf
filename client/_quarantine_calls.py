"""The quarantine calls of `Stockade` and `AsyncStockade`, as mixins (the two clients'
modules stay small): each expects the class to have `_rpc` and `_quarantine`.

A sandbox is quarantined when an alarm (a honeytoken, a placeholder sent to the wrong
place, a guard rule marked quarantine) says so: frozen, cut off its network, its calls
refused with FailedPrecondition; its files and container kept until released or destroyed
(destroy_sandbox)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import grpc

from stockade.client import _core
from stockade.client._core import AuditRecord
from stockade.v1 import quarantine_pb2


@dataclass(frozen=True)
class Alarm:
    sandbox_key: str
    kind: str
    """"honeytoken", "placeholder" or "guard"."""
    where: str
    detail: str
    evidence: str
    time: datetime | None


@dataclass(frozen=True)
class QuarantineInfo:
    sandbox_key: str
    since: datetime | None
    reason: str
    frozen: bool
    network_cut: str
    note: str
    alarms: list[Alarm]


@dataclass(frozen=True)
class QuarantineEvidence:
    quarantine: QuarantineInfo
    audit: list[AuditRecord]
    """The sandbox's audit records around its alarms, oldest first."""


def alarm_from_pb(msg: Any) -> Alarm:
    return Alarm(
        msg.sandbox_key, msg.kind, msg.where, msg.detail, msg.evidence, _core._time(msg, "time")
    )


def quarantine_from_pb(msg: Any) -> QuarantineInfo:
    return QuarantineInfo(
        sandbox_key=msg.sandbox_key,
        since=_core._time(msg, "since"),
        reason=msg.reason,
        frozen=msg.frozen,
        network_cut=msg.network_cut,
        note=msg.note,
        alarms=[alarm_from_pb(a) for a in msg.alarms],
    )


def _evidence(reply: Any) -> QuarantineEvidence:
    audit = [_core.audit_from_pb(r) for r in reply.audit]
    return QuarantineEvidence(quarantine_from_pb(reply.quarantine), audit)


class QuarantineCalls:
    """Quarantine calls of the blocking client."""

    _quarantine: Any
    _rpc: Callable[..., Any]

    def list_quarantines(self) -> list[QuarantineInfo]:
        """The tenant's quarantined sandboxes, oldest first."""
        reply = self._rpc(self._quarantine.ListQuarantines, quarantine_pb2.ListQuarantinesRequest())
        return [quarantine_from_pb(q) for q in reply.quarantines]

    def get_quarantine(self, key: str) -> QuarantineEvidence:
        """A quarantine and its evidence; NotFound when the key is not quarantined."""
        request = quarantine_pb2.GetQuarantineRequest(key=key)
        return _evidence(self._rpc(self._quarantine.GetQuarantine, request))

    def release_quarantine(self, key: str) -> QuarantineInfo:
        """Network back, thawed, calls served again; NotFound when not quarantined."""
        request = quarantine_pb2.ReleaseQuarantineRequest(key=key)
        reply = self._rpc(self._quarantine.ReleaseQuarantine, request)
        return quarantine_from_pb(reply.quarantine)

    def quarantine_sandbox(self, key: str, reason: str = "") -> QuarantineInfo:
        """Quarantine a sandbox by hand (idempotent); NotFound for an unknown key."""
        request = quarantine_pb2.QuarantineSandboxRequest(key=key, reason=reason)
        reply = self._rpc(self._quarantine.QuarantineSandbox, request)
        return quarantine_from_pb(reply.quarantine)

    def watch_alarms(self) -> Iterator[Alarm]:
        """The tenant's alarms as they sound, until you stop iterating."""
        stream = self._quarantine.WatchAlarms(quarantine_pb2.WatchAlarmsRequest())
        try:
            for alarm in stream:
                yield alarm_from_pb(alarm)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise _core.error_from_rpc(exc) from None
        finally:
            stream.cancel()


class AsyncQuarantineCalls:
    """Quarantine calls of the asyncio client."""

    _quarantine: Any
    _rpc: Callable[..., Any]

    async def list_quarantines(self) -> list[QuarantineInfo]:
        request = quarantine_pb2.ListQuarantinesRequest()
        reply = await self._rpc(self._quarantine.ListQuarantines, request)
        return [quarantine_from_pb(q) for q in reply.quarantines]

    async def get_quarantine(self, key: str) -> QuarantineEvidence:
        request = quarantine_pb2.GetQuarantineRequest(key=key)
        return _evidence(await self._rpc(self._quarantine.GetQuarantine, request))

    async def release_quarantine(self, key: str) -> QuarantineInfo:
        request = quarantine_pb2.ReleaseQuarantineRequest(key=key)
        reply = await self._rpc(self._quarantine.ReleaseQuarantine, request)
        return quarantine_from_pb(reply.quarantine)

    async def quarantine_sandbox(self, key: str, reason: str = "") -> QuarantineInfo:
        request = quarantine_pb2.QuarantineSandboxRequest(key=key, reason=reason)
        reply = await self._rpc(self._quarantine.QuarantineSandbox, request)
        return quarantine_from_pb(reply.quarantine)

    async def watch_alarms(self) -> AsyncIterator[Alarm]:
        call = self._quarantine.WatchAlarms(quarantine_pb2.WatchAlarmsRequest())
        try:
            async for alarm in call:
                yield alarm_from_pb(alarm)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise _core.error_from_rpc(exc) from None
        finally:
            call.cancel()
