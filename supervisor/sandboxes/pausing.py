"""Pausing and resuming sandboxes. The engine's pause freezes every process of a container
(the cgroup freezer): it uses no CPU, keeps its memory, and its background processes, open
sessions and agent carry on where they were when it is thawed.

A paused sandbox's agent does not answer, so nothing may take its silence for a wedge: the
Clinic skips paused sandboxes, and a probe or call that met a pause on its way (the
sandbox's `pauses` count changed) draws no conclusion from the silence. A call to a paused
sandbox resumes it first, in the one place a call takes its sandbox (the manager's ensure),
or is refused (sandbox.paused_call = "refuse"). Every pause and resume is an audit record:
housekeeping's own (an idle pause, a call's resume) as housekeeping's actions are, one a
front asked for as that front's (calls/lifecycle.py). The caller holds the key's lock."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from stockade.supervisor.engines.backends.base import ContainerBackend, ContainerInfo
from stockade.supervisor.errors import SandboxPaused, SandboxStateConflict
from stockade.supervisor.keys import shown
from stockade.supervisor.sandboxes import freezer, layout
from stockade.supervisor.sandboxes.health import Recorder
from stockade.supervisor.sandboxes.sandbox import Sandbox

log = logging.getLogger("stockade")


class Pausing:
    def __init__(self, backend: ContainerBackend, record: Recorder, refuse_calls: bool) -> None:
        self._backend = backend
        self._record = record
        self.refuse_calls = refuse_calls
        """sandbox.paused_call = "refuse": a call to a paused sandbox is refused."""

    async def pause(self, sandbox: Sandbox, reason: str, *, recorded: bool = True) -> bool:
        """Freeze the sandbox; False when it was paused already. SandboxStateConflict when
        its container no longer runs or it is marked broken (nothing worth keeping).
        `recorded`: False when the change is audited by whoever asked (calls/lifecycle.py,
        or a quarantine's own record)."""
        if sandbox.paused:
            return False
        if not sandbox.usable:
            raise SandboxStateConflict(
                f"sandbox {shown(sandbox.key)!r} is {sandbox.state.value}, not running: there "
                "is nothing to pause (its next call re-creates its container)"
            )
        sandbox.pauses += 1  # before the freeze: a probe under way knows what it met
        sandbox.paused_at = datetime.now(UTC)  # a call now waits for the lock, then resumes
        try:
            frozen = await asyncio.to_thread(self._backend.pause, sandbox.info.id)
        except BaseException:
            sandbox.paused_at = None
            raise
        if not frozen:
            sandbox.paused_at = None
            sandbox.lost = True
            raise SandboxStateConflict(
                f"sandbox {shown(sandbox.key)!r}: its container no longer runs, there is "
                "nothing to pause (its next call re-creates it)"
            )
        await asyncio.to_thread(layout.stamp, sandbox.container.paths.paused)
        log.info("paused sandbox %r: %s", shown(sandbox.key), reason)
        if recorded:
            self._record(sandbox.key, "pause", reason)
        return True

    async def resume(self, sandbox: Sandbox, reason: str, *, recorded: bool = True) -> bool:
        """Thaw the sandbox; False when it was not paused. A container that vanished while
        paused is marked lost (the next call re-creates it). `recorded`: as for pause."""
        if not sandbox.paused:
            return False
        thawed = await asyncio.to_thread(self._backend.unpause, sandbox.info.id)
        sandbox.paused_at = None
        sandbox.idle_since = time.monotonic()  # else an idle pause would follow at once
        with contextlib.suppress(FileNotFoundError):
            sandbox.container.paths.paused.unlink()
        if not thawed:
            sandbox.lost = True
        log.info("resumed sandbox %r: %s", shown(sandbox.key), reason)
        if recorded:
            self._record(sandbox.key, "resume", reason if thawed else f"{reason}; container gone")
        return True

    @contextlib.asynccontextmanager
    async def frozen(self, sandbox: Sandbox | None) -> AsyncIterator[list[float]]:
        """Freeze the sandbox for the block, as a pause does but with no record nor stamp (a
        snapshot's final pass), through its cgroup's freezer where the supervisor can reach
        it (freezer.py), else the engine's pause; not one already paused or whose container
        is gone. Yields [seconds frozen], filled in when the block ends. The caller holds the
        key's lock."""
        clock = [0.0]
        if sandbox is None or sandbox.paused or sandbox.lost:
            yield clock
            return
        sandbox.pauses += 1  # a probe or call that meets the freeze takes it for a pause
        sandbox.paused_at = datetime.now(UTC)  # new calls wait for the key's lock
        started = time.monotonic()
        try:
            cgroup = await asyncio.to_thread(_frozen_cgroup, sandbox)  # freezer.py: quicker
            frozen = cgroup is not None
            if cgroup is None:
                frozen = await asyncio.to_thread(self._backend.pause, sandbox.info.id)
            if not frozen:
                sandbox.lost = True
            try:
                yield clock
            finally:
                if cgroup is None:
                    if frozen:
                        await asyncio.to_thread(self._backend.unpause, sandbox.info.id)
                elif not await asyncio.to_thread(cgroup.thaw):  # its next call re-creates it
                    log.error("sandbox %r: its cgroup could not be thawed", shown(sandbox.key))
                    sandbox.lost = True
                clock[0] = time.monotonic() - started
        finally:
            sandbox.paused_at = None
            sandbox.idle_since = time.monotonic()

    async def for_call(self, sandbox: Sandbox) -> None:
        """A call takes the paused sandbox: resume it, or refuse the call (SandboxPaused). One
        whose container died while paused is not refused: the call re-creates it."""
        if not sandbox.paused:
            return
        if self.refuse_calls and sandbox.usable:
            since = sandbox.paused_at.isoformat(timespec="seconds") if sandbox.paused_at else "?"
            raise SandboxPaused(
                f"sandbox {shown(sandbox.key)!r} is paused (since {since}) and this supervisor "
                'refuses calls to paused sandboxes (sandbox.paused_call = "refuse"): resume '
                "it first (ResumeSandbox, `stockade resume KEY`)"
            )
        await self.resume(sandbox, "a call to the paused sandbox")

    @staticmethod
    def adopted(sandbox: Sandbox, info: ContainerInfo) -> None:
        """A container found paused at start stays paused: since the stamp's time (when this
        supervisor's predecessor paused it), or now when there is none."""
        if not info.paused:
            _thaw_leftover(sandbox, info)
            return
        try:
            since = sandbox.container.paths.paused.stat().st_mtime
        except FileNotFoundError:
            since = time.time()
        sandbox.pauses += 1
        sandbox.paused_at = datetime.fromtimestamp(since, UTC)


def _frozen_cgroup(sandbox: Sandbox) -> freezer.Cgroup | None:
    """The sandbox frozen through its cgroup (freezer.py), or None: not reachable so."""
    found = freezer.find(sandbox.info.pid, sandbox.info.id)
    return found if found is not None and found.freeze() else None


def _thaw_leftover(sandbox: Sandbox, info: ContainerInfo) -> None:
    """A container the engine says runs but whose cgroup is frozen: a capture's freeze that a
    supervisor killed during it left (freezer.py); thawed (quick: a few sysfs files)."""
    found = freezer.find(info.pid, info.id)
    try:
        if found is None or not found.frozen():
            return
    except OSError:
        return
    thawed = found.thaw()
    log.warning(
        "sandbox %r was left frozen by an interrupted capture: %s",
        shown(sandbox.key), "thawed" if thawed else "could not thaw it",
    )  # fmt: skip
