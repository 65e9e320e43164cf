"""The tenants' limits on sandboxes (tenants.NAME.max_sandboxes, max_memory_mb): counted
over this supervisor's sandboxes (those held and those being made), and, with a shared state
(supervisor/state: PostgreSQL), over every supervisor's too, through the state's ledger,
which also gets what this supervisor holds (held) at each heartbeat."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from stockade.supervisor.config import Config
from stockade.supervisor.errors import QuotaExceeded
from stockade.supervisor.keys import split

if TYPE_CHECKING:
    from stockade.supervisor.sandboxes.profiles import SandboxProfile
    from stockade.supervisor.sandboxes.sandbox import Sandbox
    from stockade.supervisor.state.base import SharedState


class Quotas:
    def __init__(
        self,
        config: Config,
        registry: dict[str, Sandbox],
        starting: set[str],
        profile_of: Callable[[Sandbox], SandboxProfile],
        state: SharedState | None,
    ) -> None:
        self._config, self._registry, self._starting = config, registry, starting
        self._profile_of, self._state = profile_of, state

    def admit(self, key: str, memory_mb: int | None = None) -> None:
        """Refuse a new container (of `memory_mb`: its profile's) past its tenant's limits.
        Sandboxes being created count, at [sandbox] memory_mb (no await between this check
        and the reservation, so concurrent first calls of one tenant cannot overshoot)."""
        tenant = split(key)[0]
        limits = self._config.tenant_limits(tenant)
        if not (limits.max_sandboxes or limits.max_memory_mb):
            return
        live = {k for k in (*self._registry, *self._starting) if split(k)[0] == tenant}
        count = len(live - {key}) + 1
        if limits.max_sandboxes and count > limits.max_sandboxes:
            raise QuotaExceeded(
                f"tenant {tenant!r} may have at most {limits.max_sandboxes} sandbox(es) "
                f"(tenants.{tenant}.max_sandboxes); destroy one first"
            )
        own = self._config.sandbox.memory_mb if memory_mb is None else memory_mb
        held = [self._registry.get(k) for k in live - {key}]
        memory = own + sum(self._profile_of(s).memory_mb if s else own for s in held)
        if limits.max_memory_mb and memory > limits.max_memory_mb:
            raise QuotaExceeded(
                f"tenant {tenant!r} may use at most {limits.max_memory_mb} MiB of sandbox memory "
                f"(tenants.{tenant}.max_memory_mb); another sandbox of "
                f"{own} MiB would make {memory} MiB"
            )

    async def admit_shared(self, key: str, memory_mb: int | None = None) -> None:
        """With a shared state, the tenant's limits counted across supervisors (and the key
        reserved there): admit counted this supervisor's sandboxes only."""
        ledger = self._state.ledger if self._state is not None else None
        if ledger is not None:
            own = self._config.sandbox.memory_mb if memory_mb is None else memory_mb
            await ledger.admit(key, own, self._config.tenant_limits(split(key)[0]))

    def shared_lock(self, key: str) -> contextlib.AbstractAsyncContextManager[None]:
        """The key's lock across supervisors (held across its create), if state is shared."""
        if self._state is None:
            return contextlib.nullcontext()
        return self._state.lock(key)

    def held(self) -> dict[str, int]:
        """The keys this supervisor holds a sandbox for (or is making one), with their
        memory in MiB: what a shared state's ledger counts."""
        own = self._config.sandbox.memory_mb
        held = {k: own for k in self._starting}
        held.update({k: self._profile_of(s).memory_mb for k, s in self._registry.items()})
        return held
