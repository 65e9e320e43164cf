"""Today's state, in the supervisor's own SQLite database (supervisor/database.py): the audit
log and allow-always in STATE_DIR/stockade.db (or audit.path), pending approvals and quota
counts in memory. One supervisor per state directory (its instance lock), so nothing here is
shared: no board, no ledger, and the key lock is the manager's in-process one."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from stockade.supervisor.state.base import TenantLedger

if TYPE_CHECKING:
    from stockade.supervisor.config import Config
    from stockade.supervisor.observe.audit import AuditLog
    from stockade.supervisor.observe.chain import Sealing
    from stockade.supervisor.observe.retention import Retention
    from stockade.supervisor.policy.approvals import AllowAlways, ApprovalBoard


class SqliteState:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.description = f"sqlite {path}"

    @classmethod
    def from_config(cls, config: Config) -> SqliteState:
        path = Path(config.audit.path) if config.audit.path else config.state_dir / "stockade.db"
        return cls(path)

    def audit_log(
        self, retention: Retention | None = None, sealing: Sealing | None = None
    ) -> AuditLog:
        from stockade.supervisor.observe.audit import AuditLog

        return AuditLog(self.path, retention, sealing=sealing)

    def allow_always(self) -> AllowAlways:
        from stockade.supervisor.policy.approvals import AllowAlways

        return AllowAlways(self.path)

    @property
    def board(self) -> ApprovalBoard | None:
        return None

    @property
    def ledger(self) -> TenantLedger | None:
        return None

    def lock(self, key: str) -> AbstractAsyncContextManager[None]:
        """Nothing beyond the manager's in-process lock on the key, which is held already
        wherever this is taken: one supervisor owns this state."""
        return _held()

    def follow(self, held: Callable[[], Mapping[str, int]]) -> None:
        pass

    async def replicas(self) -> frozenset[str] | None:
        return None  # one supervisor per state directory: no others to know of

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


@contextlib.asynccontextmanager
async def _held() -> AsyncIterator[None]:
    yield
