"""Per-key limits: a token bucket on the call rate, and a cap on calls running at once with a
bounded queue behind it. Past either limit a call is refused without running. Per-tenant
caps on what a caller holds open for long (streams, watches: TenantSlots), counted across the
fronts, one tenant's count apart from every other's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

from stockade.supervisor import errors
from stockade.supervisor.config import LimitsConfig
from stockade.supervisor.keys import split


class LimitExceeded(Exception):
    """The call may not run now; the message says which limit and what to do."""


@dataclass
class _Bucket:
    tokens: float
    stamp: float


@dataclass
class _Slots:
    running: int = 0
    waiting: int = 0
    users: int = 0
    """Calls holding this table (running, queued or about to be); at 0 it is dropped."""
    freed: asyncio.Condition = field(default_factory=asyncio.Condition)


PRUNE_AT = 4096
"""Buckets kept before the full ones (no different from a new one) are dropped."""


class KeyLimiter:
    def __init__(self, config: LimitsConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._slots: dict[str, _Slots] = {}
        self._prune_at = PRUNE_AT

    def take(self, key: str) -> None:
        """Spend one token of the key's bucket, or raise LimitExceeded."""
        now, cfg = self._clock(), self._config
        if len(self._buckets) >= self._prune_at:
            self._prune(now)
        bucket = self._buckets.setdefault(key, _Bucket(float(cfg.burst), now))
        bucket.tokens = min(cfg.burst, bucket.tokens + (now - bucket.stamp) * cfg.rate_per_s)
        bucket.stamp = now
        if bucket.tokens < 1:
            wait = (1 - bucket.tokens) / cfg.rate_per_s
            raise LimitExceeded(
                f"rate limit for this sandbox: {cfg.rate_per_s:g} calls/s, burst {cfg.burst}; "
                f"retry in {wait:.2f} s"
            )
        bucket.tokens -= 1

    def _prune(self, now: float) -> None:
        """Drop the buckets that have refilled: a new one starts full as well."""
        cfg = self._config
        full = [
            key
            for key, b in self._buckets.items()
            if b.tokens + (now - b.stamp) * cfg.rate_per_s >= cfg.burst
        ]
        for key in full:
            del self._buckets[key]
        self._prune_at = max(PRUNE_AT, 2 * len(self._buckets))

    @asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[None]:
        """Hold one of the key's concurrent-call slots, queueing for one if needed."""
        slots = self._slots.setdefault(key, _Slots())
        slots.users += 1
        try:
            async with self._held(slots):
                yield
        finally:
            slots.users -= 1
            if slots.users == 0:
                del self._slots[key]

    @asynccontextmanager
    async def _held(self, slots: _Slots) -> AsyncIterator[None]:
        cfg = self._config
        if slots.running >= cfg.max_concurrent and slots.waiting >= cfg.max_queued:
            raise LimitExceeded(
                f"this sandbox already runs {slots.running} calls with {slots.waiting} queued "
                f"(limits: {cfg.max_concurrent} at once, {cfg.max_queued} queued)"
            )
        async with slots.freed:
            slots.waiting += 1
            try:
                await slots.freed.wait_for(lambda: slots.running < cfg.max_concurrent)
            except asyncio.CancelledError:
                # The wake-up of a freed slot may have come to this call as it was cancelled
                # (Python 3.11's Condition drops it): pass it on to the next one in the queue.
                slots.freed.notify()
                raise
            finally:
                slots.waiting -= 1
            slots.running += 1
        try:
            yield
        finally:
            async with slots.freed:
                slots.running -= 1
                slots.freed.notify()

    def running(self, key: str) -> int:
        slots = self._slots.get(key)
        return slots.running if slots else 0


class TenantSlots:
    """How many of one kind of long-lived hold (an open stream, a file watch) each tenant has,
    at most `cap` each (0: no limit). A tenant's count is its own: one at its cap refuses
    its own next one, never another tenant's. Tenants are told apart by the scoped sandbox
    key a hold is for (keys.split); "" (auth off) is a tenant like the others."""

    def __init__(self, cap: int, what: str, setting: str) -> None:
        self.cap = cap
        self._what = what
        self._setting = setting
        self._held: dict[str, int] = {}

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    @contextmanager
    def hold(self, scoped_key: str) -> Iterator[None]:
        """One hold for the key's tenant while the block runs; QuotaExceeded naming the cap
        and its setting when the tenant holds `cap` already."""
        tenant = split(scoped_key)[0]
        count = self._held.get(tenant, 0)
        if self.cap and count >= self.cap:
            who = f"tenant {tenant!r}" if tenant else "this supervisor (auth off)"
            raise errors.QuotaExceeded(
                f"{who} has {count} {self._what} open, its limit ({self._setting} = "
                f"{self.cap}): end one first"
            )
        self._held[tenant] = count + 1
        try:
            yield
        finally:
            left = self._held[tenant] - 1
            if left:
                self._held[tenant] = left
            else:
                del self._held[tenant]


SHARED_WINDOW_S = 0.5
"""A tenant counts as busy for this long after it last started a call or moved a piece of a
transfer."""
SHARED_BURST_S = 0.02
"""How far ahead of its paced rate a transfer may run (its first bytes are never held)."""
SHARED_TENANTS = 4096
"""Tenants remembered at most (the longest-quiet forgotten first)."""


class FairShare:
    """Bulk transfers give way to other tenants' calls (limits.shared_transfer_mb_per_s):
    while another tenant is busy (it started a call or moved part of a transfer within the
    last SHARED_WINDOW_S), a tenant's file transfers move at most `bytes_per_s`, paced piece by
    piece; alone on the supervisor they run at full speed. The supervisor is one event loop
    on a few cores: a 300 MB upload streamed through it at full speed costs every other
    tenant's call most of its time (docs/security.md#fair-share). `bytes_per_s` 0: never
    paced. Tenants are told apart by the scoped sandbox key (keys.split)."""

    def __init__(self, bytes_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.bytes_per_s = bytes_per_s
        self._clock = clock
        self._busy: dict[str, float] = {}
        """Tenant -> when it was last busy, the most recent last (insertion order)."""
        self._due: dict[str, float] = {}
        """Tenant -> when its paced transfers will have caught up with their rate."""

    def busy(self, scoped_key: str) -> None:
        """The key's tenant started a call (or moved part of a transfer) now."""
        self._mark(split(scoped_key)[0])

    def _mark(self, tenant: str) -> None:
        self._busy.pop(tenant, None)
        self._busy[tenant] = self._clock()
        if len(self._busy) > SHARED_TENANTS:
            del self._busy[next(iter(self._busy))]

    def contended(self, tenant: str) -> bool:
        """Another tenant than `tenant` was busy within the window."""
        since = self._clock() - SHARED_WINDOW_S
        for other, at in reversed(self._busy.items()):
            if at < since:
                return False
            if other != tenant:
                return True
        return False

    def wait_s(self, scoped_key: str, size: int) -> float:
        """Count `size` bytes of the key's tenant's transfer; how long it should now wait (0
        when it is alone or still within its rate)."""
        tenant = split(scoped_key)[0]
        self._mark(tenant)
        if not self.bytes_per_s or not self.contended(tenant):
            self._due.pop(tenant, None)
            return 0.0
        now = self._clock()
        due = max(self._due.get(tenant, now), now) + size / self.bytes_per_s
        self._due[tenant] = due
        if len(self._due) > SHARED_TENANTS:
            del self._due[next(iter(self._due))]
        return max(0.0, due - now - SHARED_BURST_S)

    async def paced(self, scoped_key: str, size: int) -> None:
        """Wait as wait_s says."""
        if wait := self.wait_s(scoped_key, size):
            await asyncio.sleep(wait)
