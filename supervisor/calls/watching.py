"""File watches: a client follows the changes under a folder of a sandbox (inotify in the
agent). One path for every front (gRPC's FileService.WatchFiles, E2B's WatchDir and polling
watchers), so that policy and audit are the same: a watch reads what is in the workspace, so
it needs the read_file permission, as a download does; names in events are scrubbed like other
output; each watch leaves one audit record when it ends (tool "watch_files", with the number
of events it delivered). The watch holds its sandbox's lease for its whole life: the sandbox
counts a call in flight, so housekeeping does not reap it as idle meanwhile. It holds one of
its tenant's watches too (limits.max_watches_per_tenant, every front together): past the cap
it is refused, QuotaExceeded, and audited."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Literal, Protocol

from stockade.supervisor import errors
from stockade.supervisor.calls.pipeline import HostPolicy
from stockade.supervisor.calls.transfers import agent_failure
from stockade.supervisor.keys import validate_scoped as validate_key
from stockade.supervisor.models import CallContext
from stockade.supervisor.observe.audit import AuditRecord
from stockade.supervisor.sandboxes.agent_link import (
    AgentFileChange,
    AgentReply,
    AgentWatchEvent,
    AgentWatchStarted,
)

TOO_MANY = "limits.max_watches_per_tenant"
"""The policy step of a watch refused at its tenant's cap."""
ChangeKind = Literal["create", "write", "remove", "rename", "chmod", "overflow", "gone"]


@dataclass(frozen=True)
class Watch:
    sandbox_key: str
    path: str
    recursive: bool
    context: CallContext
    caller: str
    front: str = "grpc"
    """The front the watch came in through, for its audit record."""


@dataclass(frozen=True)
class Started:
    path: str
    """The watched folder, relative to the workspace."""


@dataclass(frozen=True)
class Change:
    kind: ChangeKind
    name: str
    """Relative to the watched folder, scrubbed; "" for overflow and gone."""
    is_dir: bool


class WatchLease(Protocol):
    """What a watch calls on its sandbox's lease (sandboxes/lease.py Lease is the real one)."""

    def watch_files(self, path: str, recursive: bool, /) -> AsyncIterator[AgentWatchEvent]: ...


class WatchSandboxes(Protocol):
    """What the watches ask of the sandboxes (sandboxes/manager.py SandboxManager is the real
    one; tests put fakes in its place): a lease on a key's sandbox."""

    def lease(self, key: str, /) -> AbstractAsyncContextManager[WatchLease]: ...


class FileWatches:
    def __init__(self, sandboxes: WatchSandboxes, policy: HostPolicy) -> None:
        self._sandboxes = sandboxes
        self._policy = policy

    async def watch(self, w: Watch) -> AsyncGenerator[Started | Change, None]:
        """Started, then changes until overflow or gone, or until the caller stops
        iterating (closing this generator ends the watch in the agent)."""
        self._allow(w)
        started, count, failure = time.monotonic(), 0, ""
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(self._policy.watches.hold(w.sandbox_key))
            except errors.QuotaExceeded:
                self._audit(w, started, 0, errors.QuotaExceeded.reason, TOO_MANY)
                raise
            try:
                async with self._sandboxes.lease(w.sandbox_key) as lease:
                    async for item in lease.watch_files(w.path, w.recursive):
                        if isinstance(item, AgentReply):
                            self._checked(item)
                            return
                        if isinstance(item, AgentWatchStarted):
                            yield Started(self._scrub(item.path))
                            continue
                        count += 1
                        yield self._change(item)
                raise errors.SandboxBroken("the sandbox ended the watch without a result")
            except errors.StockadeError as exc:
                failure = exc.reason  # a stable code (errors.py), never a Python class's name
                raise
            finally:
                self._audit(w, started, count, failure, "")

    def _change(self, item: AgentFileChange) -> Change:
        kind: ChangeKind = item.kind  # type: ignore[assignment]  # checked by agent_link
        return Change(kind, self._scrub(item.name), item.is_dir)

    def _scrub(self, text: str) -> str:
        if self._policy.scrubber is None or not text:
            return text
        return self._policy.scrubber.scrub(text)[0]

    def _allow(self, w: Watch) -> None:
        validate_key(w.sandbox_key)
        decision = self._policy.tools.decide("read_file", w.context)
        if not decision.allowed:
            self._audit(w, time.monotonic(), 0, "PERMISSION_DENIED", decision.step)
            raise errors.PolicyDenied(
                f"watching files needs read_file, which is not allowed here: {decision.reason}"
            )

    def _checked(self, reply: AgentReply) -> None:
        if reply.error_code:
            raise agent_failure(reply, self._policy.scrubber)

    def _audit(self, w: Watch, started: float, events: int, failure: str, denied: str) -> None:
        audit = self._policy.audit
        if audit is None:
            return
        arguments = {"path": w.path, "recursive": w.recursive, "events": events}
        audit.record(
            AuditRecord(
                time=time.time(),
                request_id="",
                caller=w.caller,
                sandbox_key=w.sandbox_key,
                agent_id=w.context.agent_id,
                provider=w.context.provider,
                tool="watch_files",
                arguments_json=json.dumps(arguments, ensure_ascii=False),
                policy_step=denied or "allowed",
                duration_ms=int((time.monotonic() - started) * 1000),
                error_code=failure,
                is_error=bool(failure),
                front=w.front,
            )
        )
