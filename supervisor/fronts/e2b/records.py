"""The E2B sandboxes this front created: what E2B's control plane reports of them (template,
metadata, env vars, times, state) and the envd access token their requests carry. Held in
memory, persisted as JSON in STATE_DIR/e2b/sandboxes.json (mode 0600: it holds the tokens) so
that a restart keeps them; every lookup by a caller is scoped to its tenant."""

from __future__ import annotations

import json
import logging
import os
import secrets
import string
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger("stockade.e2b")
ID_ALPHABET = string.ascii_lowercase + string.digits
ID_LENGTH = 20
KEY_PREFIX = "e2b-"
"""The Stockade key of an E2B sandbox is this plus its id, within the caller's tenant."""
ENVD_VERSION = "0.5.7"
"""The envd version reported to the SDKs, which gate features on it (see
WIRE.md 3.1): >= 0.4.0, the server picks the default user; 0.5.7, plain
and octet-stream uploads; below 0.6.2, no file metadata, below 0.6.3 no watch entries."""
CLIENT_ID = "stockade"
DEFAULT_TEMPLATE = "base"
"""The only template for now: the configured sandbox image."""
RUNNING = "running"
PAUSED = "paused"
FILE_NAME = "sandboxes.json"


def new_sandbox_id() -> str:
    """An id shaped like E2B's: 20 lowercase letters and digits."""
    return "".join(secrets.choice(ID_ALPHABET) for _ in range(ID_LENGTH))


def valid_sandbox_id(text: str) -> bool:
    return len(text) == ID_LENGTH and all(c in ID_ALPHABET for c in text)


def rfc3339(ts: float) -> str:
    """`2025-06-01T12:00:00.123Z`: what dateutil.isoparse and JS Date both read."""
    moment = datetime.fromtimestamp(ts, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@dataclass
class E2bSandbox:
    sandbox_id: str
    tenant: str
    """The caller's tenant ("" with auth off)."""
    key: str
    """The scoped Stockade key (keys.scope(tenant, "e2b-" + sandbox_id))."""
    template_id: str
    access_token: str
    """envd's X-Access-Token for this sandbox (compared in constant time)."""
    started_at: float
    end_at: float
    """When the sandbox is killed (E2B's timeout), epoch seconds."""
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    """Default environment of every process in the sandbox (applied by envd's process service)."""
    state: str = RUNNING
    """"running" or "paused"."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> E2bSandbox:
        return cls(
            sandbox_id=str(data["sandbox_id"]),
            tenant=str(data["tenant"]),
            key=str(data["key"]),
            template_id=str(data["template_id"]),
            access_token=str(data["access_token"]),
            started_at=float(data["started_at"]),
            end_at=float(data["end_at"]),
            metadata={str(k): str(v) for k, v in dict(data.get("metadata") or {}).items()},
            env_vars={str(k): str(v) for k, v in dict(data.get("env_vars") or {}).items()},
            state=PAUSED if data.get("state") == PAUSED else RUNNING,
        )


class Records:
    """The E2B sandboxes by id. Mutate a record, then call save()."""

    def __init__(self, state_dir: Path | None) -> None:
        """state_dir: the supervisor's STATE_DIR (records in state_dir/e2b/), None: memory only."""
        self._dir = state_dir / "e2b" if state_dir is not None else None
        self._by_id: dict[str, E2bSandbox] = {}
        self._write = threading.Lock()
        self._load()

    @property
    def path(self) -> Path | None:
        return self._dir / FILE_NAME if self._dir is not None else None

    def _load(self) -> None:
        path = self.path
        if path is None or not path.is_file():
            return
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
            for entry in entries:
                sandbox = E2bSandbox.from_json(entry)
                self._by_id[sandbox.sandbox_id] = sandbox
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("E2B sandbox records in %s are unreadable, starting empty: %s", path, exc)
            self._by_id.clear()

    def save(self) -> None:
        """Write every record (atomically: a crash leaves the old file or the new one)."""
        if self._dir is None:
            return
        text = json.dumps([s.to_json() for s in self._by_id.values()], indent=1)
        with self._write:
            self._dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self._dir, 0o700)
            tmp = self._dir / (FILE_NAME + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self._dir / FILE_NAME)

    def add(self, sandbox: E2bSandbox) -> None:
        self._by_id[sandbox.sandbox_id] = sandbox
        self.save()

    def remove(self, sandbox_id: str) -> E2bSandbox | None:
        sandbox = self._by_id.pop(sandbox_id, None)
        if sandbox is not None:
            self.save()
        return sandbox

    def get(self, tenant: str, sandbox_id: str) -> E2bSandbox | None:
        """The tenant's sandbox of that id; None when unknown or another tenant's."""
        sandbox = self._by_id.get(sandbox_id)
        if sandbox is None or sandbox.tenant != tenant:
            return None
        return sandbox

    def by_id(self, sandbox_id: str) -> E2bSandbox | None:
        """The sandbox of that id whatever its tenant (envd requests: the access token decides)."""
        return self._by_id.get(sandbox_id)

    def of_tenant(self, tenant: str) -> list[E2bSandbox]:
        """The tenant's sandboxes, oldest first (then by id: a stable order for paging)."""
        found = [s for s in self._by_id.values() if s.tenant == tenant]
        return sorted(found, key=lambda s: (s.started_at, s.sandbox_id))

    def expired(self, now: float | None = None) -> list[E2bSandbox]:
        """The sandboxes whose end_at has passed."""
        moment = time.time() if now is None else now
        return [s for s in self._by_id.values() if s.end_at <= moment]

    def __iter__(self) -> Iterator[E2bSandbox]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)
