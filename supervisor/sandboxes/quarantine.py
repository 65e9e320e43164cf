"""Quarantine: what an alarm (observe/alarms.py) does to the sandbox it came from. The
sandbox is frozen (the engine's pause: its processes stopped, not killed), its network cut
(egress: its proxy closed and its link removed; open: disconnected from the engine's
network; none: nothing to cut), and every later call on the key refused (Quarantined, gRPC
FAILED_PRECONDITION) in the one place a call takes its sandbox (SandboxManager.ensure, which
a lease's renewal goes through too). Its workspace and container are kept for inspection:
housekeeping leaves a quarantined key alone (no idle prune, no maximum age, no heal, no
workspace retention), and a restart keeps it quarantined: the record is a file in the key's
host folder (QUARANTINE), read back at start, and adoption leaves the container paused and
without its link.

An operator ends it: release (network back, thawed, calls served again) or destroy
(DestroySandbox: container, and the record with it)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from stockade.supervisor.errors import (
    InvalidRequest,
    NotFound,
    Quarantined,
    SandboxNotFound,
    StockadeError,
)
from stockade.supervisor.keys import shown, split
from stockade.supervisor.keys import validate_scoped as validate_key
from stockade.supervisor.models import SandboxInfo
from stockade.supervisor.observe.alarms import Alarm, from_dict, sane_time, to_dict
from stockade.supervisor.observe.audit import AuditLog, AuditQuery, AuditRecord
from stockade.supervisor.sandboxes.parts import Parts
from stockade.supervisor.sandboxes.sandbox import Sandbox

log = logging.getLogger("stockade")

QUARANTINE = "quarantine"
"""The file in a key's host folder that keeps its quarantine (JSON: since, the alarms)."""
MAX_ALARMS = 20
"""Alarms a quarantine keeps (the first ones: later ones are in the audit log)."""
MAX_RECORD_BYTES = 1 << 20


@dataclass
class Quarantine:
    key: str
    """The scoped key."""
    since: float
    alarms: list[Alarm] = field(default_factory=list)
    frozen: bool = False
    """Its container was paused by the quarantine (or found paused)."""
    network_cut: str = ""
    """What was cut: "egress", "open", or "" (mode none, or no container)."""
    note: str = ""
    """What could not be done (no freezer on this engine, ...)."""

    @property
    def why(self) -> str:
        return self.alarms[0].detail if self.alarms else "quarantined by an operator"

    def since_text(self) -> str:
        return datetime.fromtimestamp(self.since, UTC).isoformat(timespec="seconds")

    def to_json(self) -> str:
        return json.dumps(
            {
                "key": self.key,
                "since": self.since,
                "alarms": [to_dict(a) for a in self.alarms],
                "frozen": self.frozen,
                "network_cut": self.network_cut,
                "note": self.note,
            }
        )


def read(folder: Path, key: str) -> Quarantine | None:
    """The quarantine kept in a key's folder; None when there is none. A record that cannot
    be read still quarantines (an unreadable file is no reason to let a sandbox go)."""
    path = folder / QUARANTINE
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("the quarantine record %s is unreadable (%s): kept quarantined", path, exc)
        return Quarantine(key, path_time(path), note=f"record unreadable: {exc}")
    try:
        data = json.loads(raw)
        alarms = [a for a in map(from_dict, data.get("alarms") or ()) if a is not None]
        since = float(data["since"]) if sane_time(data["since"]) else path_time(path)
        return Quarantine(
            key,
            since,
            alarms[:MAX_ALARMS],
            bool(data.get("frozen")),
            str(data.get("network_cut", "")),
            str(data.get("note", "")),
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("the quarantine record %s is damaged (%s): kept quarantined", path, exc)
        return Quarantine(key, path_time(path), note="record damaged")


def path_time(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return datetime.now(UTC).timestamp()


def kept(folder: Path) -> bool:
    """Whether the key of this folder is quarantined (adoption asks before it builds a link)."""
    return (folder / QUARANTINE).exists()


def _write(folder: Path, record: Quarantine) -> None:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = folder / (QUARANTINE + ".new")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(record.to_json() + "\n")
    os.replace(temp, folder / QUARANTINE)


class Quarantines:
    def __init__(self, parts: Parts) -> None:
        self._parts = parts
        self.held: dict[str, Quarantine] = {}

    def refuse(self, key: str) -> None:
        """Quarantined when the key is: every front's call ends here."""
        record = self.held.get(key)
        if record is not None:
            raise Quarantined(
                f"sandbox {shown(key)!r} is quarantined since {record.since_text()}: "
                f"{record.why}; `stockade quarantine show {shown(key)}` for the evidence, "
                "`release` or `destroy` to end it"
            )

    def get(self, key: str) -> Quarantine:
        validate_key(key)
        record = self.held.get(key)
        if record is None:
            raise NotFound(f"sandbox {shown(key)!r} is not quarantined")
        return record

    def mark(self, info: SandboxInfo) -> SandboxInfo:
        """The sandbox's info, with since when it is quarantined when it is."""
        record = self.held.get(info.key)
        if record is None:
            return info
        return dataclasses.replace(info, quarantined_at=datetime.fromtimestamp(record.since, UTC))

    def list(self) -> list[Quarantine]:
        return sorted(self.held.values(), key=lambda r: (r.since, r.key))

    async def quarantine(self, key: str, alarm: Alarm, *, recorded: bool = True) -> Quarantine:
        """Quarantine the key's sandbox (idempotent: a second alarm is added to the record).
        Calls are refused from the first step of this coroutine on, before any wait.
        `recorded`: False when the caller audits it (a front's, calls/lifecycle.py); an
        alarm's reaction is the supervisor's own, audited here."""
        validate_key(key)
        if alarm.sandbox_key != key:
            raise InvalidRequest("the alarm names another sandbox than the one quarantined")
        folder = self._parts.layout.of(key).root
        if key not in self._parts.registry and not folder.is_dir():
            raise SandboxNotFound(f"no sandbox for key {shown(key)!r}")
        record = self.held.get(key)
        if record is not None and alarm in record.alarms:
            return record  # this very alarm is on the record (a quarantine by hand, sounded after)
        if record is None:
            record = self.held[key] = Quarantine(key, alarm.time, [alarm])
        elif len(record.alarms) < MAX_ALARMS and alarm not in record.alarms:
            record.alarms.append(alarm)
        async with self._parts.lock(key):
            if self.held.get(key) is not record:
                return record  # released meanwhile: an alarm sounded before the release
            await asyncio.to_thread(_write, folder, record)
            sandbox = self._parts.registry.get(key)
            if sandbox is not None:
                await self._isolate(sandbox, record, f"quarantined: {record.why}")
                await asyncio.to_thread(_write, folder, record)
        log.warning("sandbox %r is quarantined: %s", shown(key), record.why)
        if recorded:
            self._parts.record(key, "quarantine", alarm.detail)
        return record

    async def _isolate(self, sandbox: Sandbox, record: Quarantine, why: str) -> None:
        """Cut the network, then freeze (an engine may refuse to disconnect a paused one).
        What this engine cannot do is noted on the record; calls are refused all the same."""
        notes = []
        try:
            record.network_cut = await self._cut(sandbox)
        except StockadeError as exc:
            notes.append(f"network not cut: {exc}")
        if sandbox.paused:
            record.frozen = True
        elif not sandbox.lost:
            try:
                # the quarantine's record says it (frozen): no pause record of its own
                record.frozen = await self._parts.pausing.pause(sandbox, why, recorded=False)
            except StockadeError as exc:
                notes.append(f"not frozen: {exc}")
        if notes:
            record.note = "; ".join(notes)
            log.warning("quarantine of sandbox %r: %s", shown(sandbox.key), record.note)

    async def _cut(self, sandbox: Sandbox) -> str:
        mode = sandbox.network.mode
        if mode == "egress":
            await self._parts.networks.egress.detach(sandbox.sid)
            return "egress"
        if mode == "open":
            await asyncio.to_thread(self._parts.backend.set_connected, sandbox.info.id, False)
            return "open"
        return ""

    async def release(self, key: str, *, recorded: bool = True) -> Quarantine:
        """End the quarantine: network back, thawed, calls served again. NotFound when
        the key is not quarantined. A sandbox whose network cannot be given back is marked
        lost (its next call re-creates its container, workspace kept). `recorded`: as for
        quarantine."""
        validate_key(key)
        async with self._parts.lock(key):
            record = self.get(key)
            sandbox = self._parts.registry.get(key)
            if sandbox is not None and not sandbox.lost:
                await self._parts.pausing.resume(sandbox, "quarantine released", recorded=False)
                try:
                    await self._restore(sandbox)
                except StockadeError as exc:
                    log.warning("sandbox %r: network not restored (%s)", shown(key), exc)
                    sandbox.lost = True
            del self.held[key]
            folder = self._parts.layout.of(key).root
            with contextlib.suppress(FileNotFoundError):
                (folder / QUARANTINE).unlink()
        log.warning("sandbox %r released from quarantine", shown(key))
        if recorded:
            self._parts.record(key, "release quarantine", record.why)
        return record

    async def _restore(self, sandbox: Sandbox) -> None:
        if sandbox.network.mode == "egress":
            await self._parts.networks.attach(sandbox.key, sandbox.container, sandbox.network)
        elif sandbox.network.mode == "open":
            await asyncio.to_thread(self._parts.backend.set_connected, sandbox.info.id, True)

    def forget(self, key: str) -> None:
        """The key was destroyed: its quarantine ends with it. The caller holds its lock."""
        self.held.pop(key, None)
        with contextlib.suppress(FileNotFoundError):
            (self._parts.layout.of(key).root / QUARANTINE).unlink()

    async def restore(self) -> None:
        """At start, after adoption: every key whose folder keeps a quarantine is
        quarantined again; its adopted container is kept frozen and cut off."""
        for key, paths in await asyncio.to_thread(self._parts.layout.folders):
            record = await asyncio.to_thread(read, paths.root, key)
            if record is None:
                continue
            self.held[key] = record
            sandbox = self._parts.registry.get(key)
            if sandbox is not None:
                async with self._parts.lock(key):
                    await self._isolate(sandbox, record, "still quarantined after a restart")
            log.warning("sandbox %r is still quarantined: %s", shown(key), record.why)


MAX_REASON = 1024
"""The longest reason an operator may give for a quarantine by hand (every front's)."""
MAX_EVIDENCE_RECORDS = 1000


async def evidence(audit: AuditLog | None, record: Quarantine, window: float) -> list[AuditRecord]:
    """The sandbox's audit records from `window` seconds before its first alarm to `window`
    after its last, oldest first, at most MAX_EVIDENCE_RECORDS (GetQuarantine's, and the
    console's)."""
    if audit is None:
        return []
    tenant, key = split(record.key)
    times = [a.time for a in record.alarms] or [record.since]
    since, until = min(times) - window, max(times) + window
    query = AuditQuery(tenant=tenant, sandbox_key=key, since=since, limit=10_000)
    found = [r for r in await audit.query(query) if r.time <= until]
    return list(reversed(found[-MAX_EVIDENCE_RECORDS:]))
