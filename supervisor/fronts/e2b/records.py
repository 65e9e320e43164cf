"""The E2B sandboxes this front created: what E2B's control plane reports of them (template,
metadata, env vars, times, state) and the envd access token their requests carry. Held in
memory, persisted one JSON file per sandbox in STATE_DIR/e2b/sandboxes/ID.json (mode 0600:
they hold the tokens) so that a restart keeps them; every lookup by a caller is scoped to its
tenant.

A change writes that sandbox's file alone (atomically: a temporary file, fsync, rename), in a
worker thread: its cost does not grow with the number of sandboxes, and the event loop never
waits on the disk. Writes of one sandbox land in the order they were asked for (a later one
makes an earlier one that has not run yet a no-op). A file that does not parse (torn by a
crash of the host, edited by hand) is set aside with a log line, not fatal. Older
installations kept every record in one file, STATE_DIR/e2b/sandboxes.json: it is migrated
into the per-sandbox files at the first start, then removed."""

from __future__ import annotations

import asyncio
import contextlib
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
ENVD_VERSION = "0.6.4"
"""The envd version reported to the SDKs, which gate features on it (see
WIRE.md 3.1): >= 0.4.0, the server picks the default user; 0.5.7, plain
and octet-stream uploads; 0.6.2, file metadata (file_metadata.py); 0.6.3, watch events
with their entries (`include_entry`); 0.6.4, `allow_network_mounts` on watches (a
sandbox has no network mounts: the flag changes nothing). Nothing the pinned SDKs gate
on lies above it (python e2b 2.63.0, JS e2b 2.51.0)."""
CLIENT_ID = "stockade"
DEFAULT_TEMPLATE = "base"
"""The only template for now: the configured sandbox image."""
RUNNING = "running"
PAUSED = "paused"
LEGACY_FILE = "sandboxes.json"
"""Every record in one file: how installations before per-sandbox files kept them."""
FOLDER = "sandboxes"
SUFFIX = ".json"


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
    auto_pause: bool = False
    """`lifecycle.on_timeout` "pause" (E2B's autoPause): at end_at the sandbox is paused
    (Stockade's pause) and kept `e2b.max_timeout_s` more, not removed."""
    auto_resume: bool = False
    """`lifecycle.auto_resume` (autoResume.enabled): an envd request to the paused sandbox
    resumes it; without it such a request is answered 502, as E2B's edge does."""

    def ended(self, now: float) -> bool:
        """Past its end and not waiting for the sweep to pause it (an auto-pause sandbox
        stays reachable until the sweep has paused it)."""
        return self.end_at <= now and not (self.auto_pause and self.state == RUNNING)

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
            auto_pause=data.get("auto_pause") is True,
            auto_resume=data.get("auto_resume") is True,
        )


class Records:
    """The E2B sandboxes by id. Mutate a record, then `await save(record)`."""

    def __init__(self, state_dir: Path | None) -> None:
        """state_dir: the supervisor's STATE_DIR (records in state_dir/e2b/), None: memory
        only. Reads the disk: call it off the event loop (asyncio.to_thread)."""
        self._dir = state_dir / "e2b" if state_dir is not None else None
        self._by_id: dict[str, E2bSandbox] = {}
        self._counts: dict[str, int] = {}
        """Sandboxes on record per tenant."""
        self._lock = threading.Lock()
        self._wanted: dict[str, int] = {}
        """Per sandbox id, the latest write asked for (its number), until it has run."""
        self._asked = 0
        self.writes = 0
        """Record files written or removed since start (for the tests)."""
        if self._dir is not None:
            self._load(self._dir)

    @property
    def folder(self) -> Path | None:
        """Where the per-sandbox files are; None: memory only."""
        return self._dir / FOLDER if self._dir is not None else None

    def _load(self, base: Path) -> None:
        folder = base / FOLDER
        if folder.is_dir():
            for path in sorted(folder.iterdir()):
                self._load_one(path)
        legacy = base / LEGACY_FILE
        if legacy.is_file():
            self._migrate(legacy)

    def _load_one(self, path: Path) -> None:
        name = path.name
        if not name.endswith(SUFFIX) or not valid_sandbox_id(name[: -len(SUFFIX)]):
            if name.endswith(".tmp"):  # a write a crash cut short: its record is the older file
                path.unlink(missing_ok=True)
            return
        try:
            sandbox = E2bSandbox.from_json(json.loads(path.read_bytes()))
            if sandbox.sandbox_id != name[: -len(SUFFIX)]:
                raise ValueError(f"it names the sandbox {sandbox.sandbox_id[:64]!r}")
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("E2B sandbox record %s is unreadable, set aside as .bad: %s", path, exc)
            with contextlib.suppress(OSError):
                path.replace(path.with_name(name + ".bad"))
            return
        self._keep(sandbox)

    def _migrate(self, legacy: Path) -> None:
        """The records of one older file into per-sandbox files (one that has its own file
        already keeps it: that one is newer), then the old file removed."""
        try:
            entries = json.loads(legacy.read_text(encoding="utf-8"))
            found = [E2bSandbox.from_json(entry) for entry in entries]
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("E2B sandbox records in %s are unreadable, not migrated: %s", legacy, exc)
            return
        for sandbox in found:
            if sandbox.sandbox_id in self._by_id or not valid_sandbox_id(sandbox.sandbox_id):
                continue
            self._keep(sandbox)
            self._write(sandbox.sandbox_id, _text(sandbox), None)
        legacy.unlink()
        log.info("E2B sandbox records: %d migrated from %s to %s", len(found), legacy, FOLDER)

    async def save(self, sandbox: E2bSandbox) -> None:
        """Write this sandbox's record as it is now (one file, off the event loop)."""
        if self._dir is None:
            return
        text = _text(sandbox)
        number = self._ask(sandbox.sandbox_id)
        await asyncio.to_thread(self._write, sandbox.sandbox_id, text, number)

    async def add(self, sandbox: E2bSandbox) -> None:
        self._keep(sandbox)
        await self.save(sandbox)

    def _keep(self, sandbox: E2bSandbox) -> None:
        if sandbox.sandbox_id not in self._by_id:
            self._counts[sandbox.tenant] = self._counts.get(sandbox.tenant, 0) + 1
        self._by_id[sandbox.sandbox_id] = sandbox

    async def remove(self, sandbox_id: str) -> E2bSandbox | None:
        sandbox = self._by_id.pop(sandbox_id, None)
        if sandbox is not None:
            left = self._counts[sandbox.tenant] - 1
            if left:
                self._counts[sandbox.tenant] = left
            else:
                del self._counts[sandbox.tenant]
        if sandbox is not None and self._dir is not None:
            number = self._ask(sandbox_id)
            await asyncio.to_thread(self._write, sandbox_id, None, number)
        return sandbox

    def _ask(self, sandbox_id: str) -> int:
        with self._lock:
            self._asked += 1
            self._wanted[sandbox_id] = self._asked
            return self._asked

    def _write(self, sandbox_id: str, text: bytes | None, number: int | None) -> None:
        """Write (text) or remove (None) one record file, unless a later write of it was
        asked for since (number: this write's; None at the migration, which runs alone).
        Atomic: a crash leaves the old file or the new one."""
        assert self._dir is not None
        folder = self._dir / FOLDER
        path = folder / (sandbox_id + SUFFIX)
        with self._lock:
            if number is not None and self._wanted.get(sandbox_id) != number:
                return  # a later write of this record is on its way
            if number is not None and text is None:
                self._wanted.pop(sandbox_id, None)
            self.writes += 1
            if text is None:
                path.unlink(missing_ok=True)
                return
            if not folder.is_dir():
                for made in (self._dir, folder):
                    made.mkdir(exist_ok=True)
                    os.chmod(made, 0o700)
            tmp = folder / (sandbox_id + SUFFIX + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)

    def get(self, tenant: str, sandbox_id: str) -> E2bSandbox | None:
        """The tenant's sandbox of that id; None when unknown or another tenant's."""
        sandbox = self._by_id.get(sandbox_id)
        if sandbox is None or sandbox.tenant != tenant:
            return None
        return sandbox

    def by_id(self, sandbox_id: str) -> E2bSandbox | None:
        """The sandbox of that id whatever its tenant (envd requests: the access token decides)."""
        return self._by_id.get(sandbox_id)

    def count(self, tenant: str) -> int:
        """How many sandboxes the tenant has on record."""
        return self._counts.get(tenant, 0)

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


def _text(sandbox: E2bSandbox) -> bytes:
    return json.dumps(sandbox.to_json(), ensure_ascii=False).encode("utf-8")
