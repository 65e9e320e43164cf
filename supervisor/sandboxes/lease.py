"""A lease: one call's hold on its sandbox. The manager hands it out (SandboxManager.lease),
once per call; while it is held the sandbox counts a call in flight (housekeeping leaves it
alone), and every agent call of the tool call goes through it. Here, and nowhere else, the
agent link's failures become domain errors:

    agent link                          lease
    AgentMisbehaved (protocol broken)   the sandbox marked broken -> AgentMisbehaved
    deadline passed, deadline "caller"  CallTimedOut (the agent still answers)
    deadline passed, deadline "agent"   the agent enforces the timeout itself: broken
    deadline passed, agent silent       broken (agent_unresponsive)
    any other failure                   Clinic.diagnose: SandboxLost (the container died),
                                        SandboxBroken, or broken (AgentMisbehaved)

A command that could not start because the sandbox is wedged never ran: the lease has the
sandbox re-created (a heal) and runs it once more there.

A paused sandbox (pausing.py) is made ready again before each agent call, as when the lease
was taken: resumed, or the call refused (SandboxPaused). A call that a pause met on its way
was frozen, not failed: its deadline passing is CallTimedOut, and nothing is marked."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

from stockade.supervisor.errors import AgentMisbehaved, CallTimedOut, SandboxBroken
from stockade.supervisor.sandboxes import healing
from stockade.supervisor.sandboxes.agent_link import (
    AgentCallFailed,
    AgentFacts,
    AgentOutput,
    AgentReply,
    AgentStarted,
    AgentWatchEvent,
)
from stockade.supervisor.sandboxes.health import Clinic, silent
from stockade.supervisor.sandboxes.sandbox import Sandbox

Deadline = Literal["caller", "agent", "fault"]
"""What a passed RPC deadline means: the caller's time ran out ("caller": CallTimedOut); the
agent should have ended the call itself ("agent": exec enforces the command's timeout, so
the agent is at fault); or it is a failure like any other ("fault": transfers, inspection)."""
AgentEvent = AgentStarted | AgentOutput | AgentReply

TRANSFER_TIMEOUT_S = 3600.0
_OVERRAN = "the sandbox's agent did not end the command by its timeout and grace"


class Lease:
    def __init__(
        self, sandbox: Sandbox, clinic: Clinic, renew: Callable[[], Awaitable[Sandbox]]
    ) -> None:
        self.sandbox = sandbox
        self._clinic = clinic
        self._renew = renew

    @property
    def key(self) -> str:
        return self.sandbox.key

    @property
    def generation(self) -> str:
        """Which container serves the key now (its id): a shell session lives in one."""
        return self.sandbox.container.info.id

    async def invoke(
        self,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        request_id: str,
        *,
        deadline: Deadline = "caller",
    ) -> AgentReply:
        """The tool's reply."""
        for attempt in (1, 2):
            await self._awake()
            agent = self.sandbox.agent
            async with self._faults(deadline, f"{tool} did not finish within {timeout:g} s"):
                reply = await agent.invoke(tool, arguments, timeout, request_id)
            if attempt == 2 or not await self._clinic.wedged_by(self.sandbox, agent, reply):
                return reply
            await self._heal()
        raise AssertionError("unreachable")

    async def stream(
        self,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        request_id: str,
        *,
        deadline: Deadline = "caller",
    ) -> AsyncIterator[AgentEvent]:
        """As invoke(), streamed: a reply that comes first (the command never started) in a
        sandbox found wedged is not passed on; the call runs once more instead."""
        for attempt in (1, 2):
            await self._awake()
            agent, seen = self.sandbox.agent, False
            async with self._faults(deadline, f"{tool} did not finish within {timeout:g} s"):
                async for event in agent.invoke_stream(tool, arguments, timeout, request_id):
                    wedged = isinstance(event, AgentReply) and await self._clinic.wedged_by(
                        self.sandbox, agent, event
                    )
                    if wedged and not seen and attempt == 1:
                        break  # the reply ends the stream: nothing is left unread
                    seen = True
                    yield event
                else:
                    return
            await self._heal()

    async def upload(
        self, path: str, tar: bool, mode: int, chunks: AsyncIterator[bytes], wide: bool = False
    ) -> AgentReply:
        """`wide`: the path may lead anywhere in the container (agent.proto container_wide)."""
        await self._awake()
        async with self._faults("fault"):
            agent = self.sandbox.agent
            return await agent.upload(path, tar, mode, chunks, TRANSFER_TIMEOUT_S, wide)

    async def download(
        self, path: str, tar: bool, wide: bool = False
    ) -> AsyncIterator[bytes | AgentReply]:
        await self._awake()
        async with self._faults("fault"):
            async for item in self.sandbox.agent.download(path, tar, TRANSFER_TIMEOUT_S, wide):
                yield item

    async def watch_files(self, path: str, recursive: bool) -> AsyncIterator[AgentWatchEvent]:
        """The agent's watch, for as long as the caller iterates (and holds this lease)."""
        await self._awake()
        async with self._faults("fault"):
            async for item in self.sandbox.agent.watch_files(path, recursive):
                yield item

    async def inspect(
        self, files: list[str], links: list[str], write_probe: str, timeout: float
    ) -> AgentFacts:
        await self._awake()
        async with self._faults("fault"):
            return await self.sandbox.agent.inspect(files, links, write_probe, timeout)

    async def _heal(self) -> None:
        """The sandbox was found wedged: take the re-created one (the manager heals it)."""
        self.sandbox.in_flight -= 1
        self.sandbox = await self._renew()
        self.sandbox.in_flight += 1

    async def _awake(self) -> None:
        """Paused since the lease was taken (or the last agent call): the manager resumes
        it, or refuses the call (SandboxPaused)."""
        if self.sandbox.paused:
            await self._heal()

    @asynccontextmanager
    async def _faults(self, deadline: Deadline, late: str = "") -> AsyncIterator[None]:
        """The agent link's failures as domain errors (the table in the module docstring)."""
        sandbox = self.sandbox
        pauses = sandbox.pauses
        try:
            yield
        except AgentMisbehaved as exc:
            self._clinic.mark_broken(sandbox, str(exc))
        except AgentCallFailed as exc:
            passed = exc.code.name == "DEADLINE_EXCEEDED"
            if sandbox.paused or sandbox.pauses != pauses:  # frozen, not failed
                if passed:
                    why = late or "the call did not finish in time"
                    raise CallTimedOut(f"{why}: the sandbox was paused during the call") from exc
                raise SandboxBroken(f"the call failed while the sandbox was paused: {exc}") from exc
            if passed and deadline == "agent":  # a fault whatever it answers now: not asked
                self._clinic.mark_broken(sandbox, _OVERRAN, healing.AGENT_UNRESPONSIVE)
            if passed and await self._clinic.unresponsive(sandbox):
                why = silent(self._clinic.silence_s)
                self._clinic.mark_broken(sandbox, why, healing.AGENT_UNRESPONSIVE)
            if passed and deadline == "caller":
                raise CallTimedOut(late) from exc
            await self._clinic.diagnose(sandbox, exc)
