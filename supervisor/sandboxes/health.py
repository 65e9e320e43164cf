"""The sandboxes' health: telling a failed call from a sandbox that can no longer serve,
marking such a sandbox (the next call re-creates it, a heal), and recording each heal.
healing.py judges the facts; this module gathers them (the agent's Inspect, the engine's
view of the container) and acts on the verdict."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, NoReturn

from stockade.supervisor.config import Config
from stockade.supervisor.engines.backends.base import ContainerBackend, ContainerInfo
from stockade.supervisor.errors import AgentMisbehaved, SandboxBroken, SandboxLost, StockadeError
from stockade.supervisor.keys import shown
from stockade.supervisor.sandboxes import healing
from stockade.supervisor.sandboxes.agent_link import AgentCallFailed, AgentLink, AgentReply
from stockade.supervisor.sandboxes.sandbox import Sandbox

log = logging.getLogger("stockade")

SILENCE_S = 5.0
"""How long an agent whose container runs may leave Hello unanswered before the sandbox is
taken for wedged (probes of PROBE_S each, one after another)."""
PROBE_S = 1.0
FACTS_TIMEOUT_S = 5.0
DEATH_NOTICE_S = 15.0

Recorder = Callable[[str, str, str], None]
"""(sandbox key, action, reason): a housekeeping event for the audit log."""


class Clinic:
    def __init__(
        self,
        config: Config,
        backend: ContainerBackend,
        registry: Mapping[str, Sandbox],
        record: Recorder,
        silence_s: float = SILENCE_S,
    ) -> None:
        self._backend = backend
        self._registry = registry
        self._record = record
        self.silence_s = silence_s
        sb = config.sandbox
        fsize = sb.max_file_size_mb * 1024 * 1024 or None
        self._expected = (
            None
            if not backend.host.rlimits  # pods: the node runtime sets the limits
            else healing.Expected(sb.nofile, sb.nproc, fsize)
        )
        self.heal_counts = dict.fromkeys(healing.KINDS, 0)
        """Containers re-created because they could not serve, by healing kind."""
        self._heals: dict[str, healing.Heal] = {}

    def mark_broken(
        self, sandbox: Sandbox, why: str, kind: str = healing.AGENT_MISBEHAVED
    ) -> NoReturn:
        self.mark_wedged(sandbox, healing.Trouble(kind, why))
        raise AgentMisbehaved(
            f"{why}; the sandbox is marked broken and the next call recreates it "
            "(the workspace is kept)"
        )

    def mark_wedged(self, sandbox: Sandbox, trouble: healing.Trouble) -> None:
        """The next call re-creates the sandbox (the workspace is kept) and records a heal."""
        if not sandbox.broken:
            log.warning("sandbox %r cannot serve calls: %s", shown(sandbox.key), trouble)
        sandbox.broken = True
        sandbox.trouble = sandbox.trouble or trouble

    def healed(self, key: str, trouble: healing.Trouble) -> None:
        before = self._heals.get(key)
        count = before.count + 1 if before is not None else 1
        self._heals[key] = healing.Heal(trouble, datetime.now(UTC), count)
        self.heal_counts[trouble.kind] = self.heal_counts.get(trouble.kind, 0) + 1
        log.warning(
            "healed sandbox %r: its container was re-created with the workspace kept (%s)",
            shown(key), trouble,
        )  # fmt: skip
        self._record(key, "heal", str(trouble))

    def fields(self, sandbox: Sandbox) -> dict[str, Any]:
        """SandboxInfo's health fields: the trouble now, and the key's heals."""
        heal = self._heals.get(sandbox.key)
        return {
            "trouble": str(sandbox.trouble) if sandbox.broken and sandbox.trouble else "",
            "heals": heal.count if heal else 0,
            "last_heal_reason": str(heal.trouble) if heal else "",
            "last_healed_at": heal.at if heal else None,
        }

    async def trouble(self, sandbox: Sandbox, start_timeout_s: float) -> healing.Trouble | None:
        """Why the sandbox cannot take the next call (None: it can)."""
        if sandbox.broken:
            return sandbox.trouble or healing.Trouble(healing.AGENT_MISBEHAVED, "marked broken")
        if sandbox.lost:
            return healing.Trouble(healing.CONTAINER_EXITED, "the container stopped or vanished")
        if sandbox.greeted and sandbox.agent.is_ready():
            return None
        # a greeted agent whose link has no open connection (its calls' connections all
        # closed: cancelled or failed ones) is asked before the engine is: a sandbox that
        # runs is reached without the engine, which may be down (restarting) meanwhile
        if sandbox.greeted and await sandbox.agent.answers(PROBE_S):
            return None
        info = await asyncio.to_thread(self._backend.inspect, sandbox.info.id)
        if info is None or not info.running:
            return healing.Trouble(healing.CONTAINER_EXITED, death_note(info))
        try:
            await sandbox.agent.wait_ready(start_timeout_s)
        except SandboxBroken as exc:
            return healing.Trouble(healing.AGENT_UNRESPONSIVE, str(exc))
        sandbox.greeted = True
        return None

    async def unresponsive(self, sandbox: Sandbox) -> bool:
        """Whether the agent leaves Hello unanswered for silence_s while the engine says its
        container runs (a dead container is no wedge: the call's own path reports it), and
        no pause met the probes (a frozen agent is silent: pausing.py)."""
        pauses = sandbox.pauses
        deadline = time.monotonic() + self.silence_s
        while time.monotonic() < deadline:
            if sandbox.paused or await sandbox.agent.answers(PROBE_S):
                return False
        info = await asyncio.to_thread(self._backend.inspect, sandbox.info.id)
        frozen = sandbox.paused or sandbox.pauses != pauses or (info is not None and info.paused)
        return info is not None and info.running and not frozen

    async def _facts(self, sandbox: Sandbox, *, after_sweep: bool) -> healing.Trouble | None:
        """What the agent's facts show (healing.diagnose); None when it cannot tell them."""
        try:
            facts = await sandbox.agent.inspect(list(healing.FACT_FILES), [], "", FACTS_TIMEOUT_S)
        except (StockadeError, AgentCallFailed) as exc:
            log.info("sandbox %r: no health facts: %s", shown(sandbox.key), exc)
            return None
        return healing.diagnose(facts.files, self._expected, after_sweep=after_sweep)

    async def wedged_by(self, sandbox: Sandbox, agent: AgentLink, reply: AgentReply) -> bool:
        """After a failed reply, or an exec result that says the pids limit stays crowded
        (the flag is taken out of the result), read the facts; mark the sandbox when they
        show it wedged. True when the reply says the command never started and the sandbox
        is now marked (running it again on a fresh container is safe)."""
        crowded = reply.result is not None and bool(reply.result.pop(healing.CROWDED, False))
        if not (crowded or reply.error_code in healing.CHECKED_CODES):
            return False
        if self._registry.get(sandbox.key) is not sandbox or sandbox.agent is not agent:
            return False
        if not sandbox.usable:
            return False
        spawn_failure = healing.spawn_failed(reply.error_code, reply.error_message)
        trouble = await self._facts(sandbox, after_sweep=crowded or spawn_failure)
        if trouble is None:
            return False
        self.mark_wedged(sandbox, trouble)
        return spawn_failure

    async def check(self, sandbox: Sandbox) -> None:
        """A probe between calls: a silent agent (or an adopted one that fails the handshake),
        a stopped init or lowered agent limits mark the sandbox, and a silent agent's channel
        is closed (calls stuck on it end with SandboxLost). A paused sandbox is not probed:
        its agent is frozen, and a pause that meets a probe voids its verdict."""
        if not sandbox.usable or sandbox.paused:
            return
        pauses = sandbox.pauses
        if not sandbox.greeted:  # adopted: the probe is the handshake (protocol checked)
            first = await self.trouble(sandbox, self.silence_s)
            held = self._registry.get(sandbox.key) is sandbox and sandbox.pauses == pauses
            if first is not None and held:
                self.mark_wedged(sandbox, first)
            return
        answered = await sandbox.agent.answers(PROBE_S)
        if self._registry.get(sandbox.key) is not sandbox or sandbox.pauses != pauses:
            return  # retired, replaced, destroyed or paused meanwhile: nothing left to judge
        if not answered and await self.unresponsive(sandbox):
            silence = healing.Trouble(healing.AGENT_UNRESPONSIVE, silent(self.silence_s))
            self.mark_wedged(sandbox, silence)
            await sandbox.agent.close()
            return
        trouble = await self._facts(sandbox, after_sweep=False)
        if trouble is not None and sandbox.usable and sandbox.pauses == pauses:
            self.mark_wedged(sandbox, trouble)

    async def diagnose(self, sandbox: Sandbox, exc: AgentCallFailed) -> NoReturn:
        """The agent call failed: find out whether the container died. An engine can take
        seconds to notice a killed container (Podman on a busy host), so while the agent does
        not answer either, keep asking the engine for up to DEATH_NOTICE_S. If the container
        runs on, the agent failed (an oversized or undecodable reply, a broken connection):
        the sandbox is broken, unless the call only ran out of time. A reply the channel
        refused (too large, undecodable) proves the agent answered: no probing then, only the
        one look at the container."""
        answered = exc.code.name in ("RESOURCE_EXHAUSTED", "INTERNAL")
        deadline = time.monotonic() + (0.0 if answered else DEATH_NOTICE_S)
        delay = 0.0
        while True:
            await asyncio.sleep(delay)
            info = await asyncio.to_thread(self._backend.inspect, sandbox.info.id)
            if info is None or not info.running:
                sandbox.lost = True
                raise SandboxLost(death_note(info))
            if delay and await sandbox.agent.answers():
                answered = True
                break
            if time.monotonic() >= deadline:
                break
            delay = min(delay * 2 or 0.05, 1.0)
        if not answered:
            self.mark_broken(sandbox, silent(DEATH_NOTICE_S), healing.AGENT_UNRESPONSIVE)
        if exc.code.name in ("DEADLINE_EXCEEDED", "CANCELLED"):
            raise SandboxBroken(f"the sandbox's agent failed: {exc}") from exc
        self.mark_broken(sandbox, f"the sandbox's agent failed: {exc}")


def silent(seconds: float) -> str:
    return f"the sandbox's agent did not answer for {seconds:g} s while its container runs"


def death_note(info: ContainerInfo | None) -> str:
    if info is None:
        return "the sandbox's container was removed during the call; the next call recreates it"
    why = " (out of memory)" if info.oom_killed else ""
    return (
        f"the sandbox's container exited during the call with code {info.exit_code}{why}; "
        "the next call recreates it with the same workspace"
    )
