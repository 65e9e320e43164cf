"""Refused requests in the audit log, bounded. Three kinds: refused authentication (every front:
the gRPC interceptor, the MCP endpoint, the E2B API, the console's sign-in tell `refused`),
refused bodies (the HTTP fronts tell `body` of a request body refused before any work: too
large, a bomb, an encoding not taken, a stream that does not decode, JSON too deep;
fronts/bodies.py) and requests refused at a per-tenant cap a front keeps itself (`capped`: MCP
sessions; the caps the pipeline keeps are audited with their calls). The log gets one record
per kind, front and client address per WINDOW_S, counting the refusals it stands for, so a
flood cannot fill it.

The first refusal of an address is a record at once (`count` 1). The ones that follow
within the window are counted; when the window ends, one record says how many (`count`, and
`first`/`last` times). With more than MAX_ADDRESSES addresses counting at once, the others
are counted together under the address "*". A record names the front, the address and why
(a missing token, an unknown one, an expired session); never the token. A body's record
also names the request's path and HTTP status (of the window's last refusal); never a byte
of the body."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from stockade.supervisor.observe.audit import AuditRecord

log = logging.getLogger("stockade.auth")
TOOL = "authenticate"
"""The audit log's tool of a refused authentication (its error code UNAUTHENTICATED)."""
BODY_TOOL = "receive_body"
"""The audit log's tool of a refused body (its error code RESOURCE_EXHAUSTED for a 413,
INVALID_ARGUMENT otherwise)."""
CAP_TOOL = "tenant_cap"
"""The tool name of a request refused at a per-tenant cap a front keeps of its own (MCP
sessions), counted per client address as the other refusals are."""
MAX_PATH = 200
"""Characters of a refused body's request path kept."""
WINDOW_S = 60.0
"""One record per front and client address in this time, however many refusals."""
MAX_ADDRESSES = 1024
"""Addresses counted apart at once; past it, the rest are counted under "*"."""
OTHERS = "*"
MAX_REASON = 200
"""Characters of a refusal's reason kept (a reason is ours, never the caller's token)."""


_Key = tuple[str, str, str]
"""(tool, front, address): one window each."""


class Recording(Protocol):
    """What Refusals writes to: the AuditLog."""

    def record(self, rec: AuditRecord) -> None: ...


@dataclass
class _Window:
    started: float
    first: float
    last: float
    reason: str
    detail: dict[str, object]
    """A body's path and status (of the last refusal); {} for authentication."""
    count: int = 0
    """Refusals since the last record."""
    timer: asyncio.TimerHandle | None = None


class Refusals:
    def __init__(
        self,
        audit: Recording | None,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._audit = audit
        self._window_s = window_s
        self._clock = clock
        self._open: dict[_Key, _Window] = {}

    def refused(self, front: str, address: str, reason: str) -> None:
        """A request of `front` from `address` (the client's IP, no port) was refused for
        its credentials; never raises."""
        self._tell(TOOL, front, address, reason, {})

    def body(self, front: str, address: str, path: str, status: int, reason: str) -> None:
        """A request body sent to `front` from `address` (the client's IP, no port) at `path`
        (the URL's path, no query) was refused with HTTP `status` for `reason` (ours: never
        a byte of the body); never raises."""
        self._tell(BODY_TOOL, front, address, reason, {"path": path[:MAX_PATH], "status": status})

    def capped(self, front: str, address: str, setting: str, reason: str) -> None:
        """A request of `front` from `address` (the client's IP, no port) was refused at the
        per-tenant cap `setting` (e.g. mcp.max_sessions_per_tenant); never raises."""
        self._tell(CAP_TOOL, front, address, reason, {"setting": setting})

    def _tell(
        self, tool: str, front: str, address: str, reason: str, detail: dict[str, object]
    ) -> None:
        if self._audit is None:
            return
        try:
            self._count((tool, front, address or "?"), reason[:MAX_REASON], detail)
        except Exception:  # a refusal must be answered whatever the audit log does
            log.exception("auditing a refused request failed")

    def _count(self, key: _Key, reason: str, detail: dict[str, object]) -> None:
        now = self._clock()
        window = self._open.get(key)
        if window is None and len(self._open) >= MAX_ADDRESSES:
            key = (key[0], key[1], OTHERS)
            window = self._open.get(key)
        if window is not None:
            window.count += 1
            window.last, window.reason, window.detail = time.time(), reason, detail
            return
        wall = time.time()
        self._open[key] = _Window(now, wall, wall, reason, detail)
        self._write(key, reason, detail, 1, wall, wall)
        self._schedule(key)

    def _schedule(self, key: _Key) -> None:
        """The window's end, on the running loop (none: flush() ends it)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._open[key].timer = loop.call_later(self._window_s, self._end, key)

    def _end(self, key: _Key) -> None:
        window = self._open.pop(key, None)
        if window is None:
            return
        if window.timer is not None:
            window.timer.cancel()
        if window.count:
            self._write(key, window.reason, window.detail, window.count, window.first, window.last)

    def flush(self) -> None:
        """End every window whose time is up: each with refusals since its first record
        writes one more (what the window's timer does on a running loop)."""
        now = self._clock()
        for key, window in list(self._open.items()):
            if now - window.started >= self._window_s:
                self._end(key)

    def close(self) -> None:
        """End every window now (the supervisor stops): no count is lost."""
        for key in list(self._open):
            self._end(key)

    def _write(
        self,
        key: _Key,
        reason: str,
        detail: dict[str, object],
        count: int,
        first: float,
        last: float,
    ) -> None:
        assert self._audit is not None
        tool, front, address = key
        if tool == TOOL:
            step, code = f"{front}: authentication refused: {reason}", "UNAUTHENTICATED"
        elif tool == CAP_TOOL:
            step, code = f"{front}: refused at {detail['setting']}: {reason}", "QUOTA_EXCEEDED"
        else:
            step = f"{front}: body refused ({detail['status']}) at {detail['path']}: {reason}"
            code = "RESOURCE_EXHAUSTED" if detail["status"] == 413 else "INVALID_ARGUMENT"
        self._audit.record(
            AuditRecord(
                time=time.time(),
                request_id="",
                caller=address,
                sandbox_key="",
                agent_id="",
                provider="",
                tool=tool,
                arguments_json=json.dumps(
                    {
                        **detail,
                        "count": count,
                        "first": round(first, 3),
                        "last": round(last, 3),
                        "window_s": self._window_s,
                    }
                ),
                policy_step=step,
                error_code=code,
                is_error=True,
                front=front,
            )
        )


def address_of_peer(peer: str) -> str:
    """The client's address of a gRPC peer ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000",
    "unix:/path"), without its port: refusals are counted per address."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1:].partition("]")[0]
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    return peer
