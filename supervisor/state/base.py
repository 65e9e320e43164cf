"""What supervisors of one installation share, behind one interface: the audit log, the
commands approved with allow-always, the pending approvals (asked through one supervisor,
answered through any), the tenants' sandbox counts (quotas hold across supervisors) and a
per-key lock held across a key's create.

SQLite (sqlite.py) keeps today's single-supervisor behaviour: nothing to share, so no board
and no ledger, and the manager's in-process per-key lock is the only one needed. PostgreSQL
(postgres.py) makes supervisors stateless: every supervisor pointed at one database sees
the same approvals, audit and counts.

The approval board's interface (ApprovalBoard, BoardListener) is policy/approvals.py's: the
approvals are policy's, and policy never imports state."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from stockade.supervisor.config import TenantConfig
    from stockade.supervisor.observe.audit import AuditLog
    from stockade.supervisor.observe.chain import Sealing
    from stockade.supervisor.observe.retention import Retention
    from stockade.supervisor.policy.approvals import AllowAlways, ApprovalBoard


class TenantLedger(Protocol):
    """The sandboxes every supervisor holds, per tenant: what quotas count."""

    async def admit(self, key: str, memory_mb: int, limits: TenantConfig) -> None:
        """Reserve a sandbox for `key` (tenant-scoped), or raise QuotaExceeded when the
        tenant's sandboxes across all supervisors are at its limits."""

    async def sync(self, held: Callable[[], Mapping[str, int]]) -> None:
        """This supervisor's sandboxes now (key -> memory MiB, read under the ledger's
        lock): the rest of its rows are gone."""


class SharedState(Protocol):
    description: str
    """Where the state is, for logs: never a password."""

    def audit_log(
        self, retention: Retention | None = None, sealing: Sealing | None = None
    ) -> AuditLog: ...

    def allow_always(self) -> AllowAlways: ...

    @property
    def board(self) -> ApprovalBoard | None:
        """None: approvals are this supervisor's own (SQLite)."""

    @property
    def ledger(self) -> TenantLedger | None:
        """None: quotas count this supervisor's sandboxes only (SQLite)."""

    def lock(self, key: str) -> AbstractAsyncContextManager[None]:
        """Held across a key's create, on top of the manager's in-process lock."""

    def follow(self, held: Callable[[], Mapping[str, int]]) -> None:
        """What this supervisor holds (key -> memory MiB): the ledger reads it."""

    async def replicas(self) -> frozenset[str] | None:
        """The supervisors alive now (their ids: app.replica_id), this one included, as
        their heartbeats say; None when this supervisor shares its state with none
        (SQLite): then it is alone, and any other's leftovers are of an ended one."""

    async def start(self) -> None:
        """Begin background work (heartbeat, notifications); on the event loop."""

    async def close(self) -> None: ...


def redacted_url(url: str) -> str:
    """A connection URL as logs may show it: scheme, host, port and database, no user or
    password (nor query options, which may hold a password too)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "local socket"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "postgresql://(unparsable URL)"
    return f"{parts.scheme}://{host}{port}{parts.path}"
