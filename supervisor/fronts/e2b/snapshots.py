"""E2B's forks and snapshots on Stockade's (sandboxes/snapshots/): `Sandbox.fork(count)`,
`create_snapshot`, `list_snapshots`, `delete_snapshot`, and a create whose template is one of
the caller's snapshots. Files only: the workspace and /tmp of the sandbox, never its memory
(containers cannot keep it; a `memory: true` snapshot is refused, an unset one is taken as
files). A snapshot is the tenant's (the same store as the gRPC API's SnapshotSandbox), its
E2B id is its Stockade name.

A fork is Stockade's, all or nothing: its new sandboxes are made together (in parallel, from
one capture) or none is; the SDK's per-fork results then carry the same error each. The
snapshot operations are recorded by the snapshot store as for every front (the operation,
the front and the caller in its reason); a sandbox made from a snapshot is also the create's
one lifecycle record (calls/lifecycle.py)."""

from __future__ import annotations

import secrets
import time
from contextlib import AbstractContextManager
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stockade.supervisor import errors
from stockade.supervisor.fronts.e2b.context import E2bContext
from stockade.supervisor.fronts.e2b.records import KEY_PREFIX, E2bSandbox, new_sandbox_id
from stockade.supervisor.fronts.e2b.wire import ApiError, from_domain, not_found, read_json
from stockade.supervisor.keys import scope
from stockade.supervisor.sandboxes.snapshots.repository import Snapshot

MAX_FORKS = 20
"""The most forks of one request (E2B's: 1 to 20)."""
MAX_LISTED = 1000
"""The most snapshots of one page of GET /snapshots."""
NEXT_TOKEN_HEADER = "x-next-token"


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """E2B's SnapshotInfo: the id a create takes as its template, and the names it has."""
    return {"snapshotID": snap.name, "names": [snap.name]}


class ControlPlane(Protocol):
    """What these handlers take of the control plane (control.py's Control)."""

    ctx: E2bContext
    default_timeout: int

    def caller_of(self, request: Request) -> str: ...
    def tenant(self, request: Request) -> str: ...
    def own(self, request: Request) -> tuple[str, E2bSandbox]: ...
    def seconds_of(self, value: Any) -> int: ...
    def is_template(self, name: str) -> bool: ...
    def sandbox_json(self, sandbox: E2bSandbox) -> dict[str, Any]: ...
    def creating(
        self, tenant: str, request: Request, sandbox: E2bSandbox, arguments: dict[str, Any],
        count: int = 1,
    ) -> AbstractContextManager[None]: ...  # fmt: skip


class SnapshotHandlers:
    """The fork and snapshot handlers over the control plane's (control.py)."""

    def __init__(self, control: ControlPlane) -> None:
        self.c = control

    def _reason(self, request: Request, what: str) -> str:
        return f"{what} through e2b by {self.c.caller_of(request)}"

    async def named(self, tenant: str, name: str) -> Snapshot | None:
        """The tenant's snapshot of that name (a transient fork capture is none)."""
        for snap in await self.c.ctx.manager.snapshots.listed(tenant):
            if snap.name == name and not snap.transient:
                return snap
        return None

    async def fork(self, request: Request) -> Response:
        """POST /sandboxes/{id}/fork: `count` new sandboxes with the source's files of now
        (the source runs on, frozen a moment), each with the source's template, metadata,
        env vars and lifecycle; 201 with [{sandbox} | {error}], one per fork."""
        tenant, source = self.c.own(request)
        body = await read_json(request, self.c.ctx.config.max_request_bytes)
        count = body.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_FORKS:
            raise ApiError(400, f"count must be a whole number from 1 to {MAX_FORKS}")
        timeout = self.c.default_timeout
        if body.get("timeout") is not None:
            timeout = self.c.seconds_of(body["timeout"])
        now = time.time()
        forks = [
            E2bSandbox(
                sandbox_id=(sid := new_sandbox_id()),
                tenant=tenant,
                key=scope(tenant, KEY_PREFIX + sid),
                template_id=source.template_id,
                access_token=secrets.token_urlsafe(32),
                started_at=now,
                end_at=now + timeout,
                metadata=dict(source.metadata),
                env_vars=dict(source.env_vars),
                auto_pause=source.auto_pause,
                auto_resume=source.auto_resume,
            )
            for _ in range(count)
        ]
        try:
            with self.c.creating(tenant, request, forks[0], {"as": "fork"}, count):
                await self.c.ctx.manager.snapshots.fork(
                    source.key, [f.key for f in forks], include_tmp=True, include_memory=False,
                    reason=self._reason(request, f"fork of {source.sandbox_id}"),
                )  # fmt: skip
        except errors.SandboxNotFound:
            raise not_found(source.sandbox_id) from None
        except errors.StockadeError as exc:
            failed = from_domain(exc)
            error = {"code": failed.status, "message": failed.message}
            return JSONResponse([{"error": error} for _ in forks], status_code=201)
        started = time.time()
        for fork in forks:
            fork.started_at, fork.end_at = started, started + timeout
            await self.c.ctx.records.add(fork)
        return JSONResponse([{"sandbox": self.c.sandbox_json(f)} for f in forks], status_code=201)

    async def create_snapshot(self, request: Request) -> Response:
        """POST /sandboxes/{id}/snapshots: the sandbox's files of now (the sandbox runs on,
        frozen a moment; a paused one stays paused), named `name` or a new id; 201."""
        _tenant, sandbox = self.c.own(request)
        body = await read_json(request, self.c.ctx.config.max_request_bytes)
        if body.get("memory") is True:
            raise ApiError(
                400, "memory: Stockade's sandboxes are containers, whose memory a snapshot "
                "cannot keep; ask for mode 'filesystem' (files only)",
            )  # fmt: skip
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise ApiError(400, "name must be a string")
        if name and self.c.is_template(name):
            raise ApiError(409, f"name {name[:64]!r} is a template already")
        name = name or f"snap-{new_sandbox_id()}"
        try:
            taken = await self.c.ctx.manager.snapshots.snapshot(
                sandbox.key, name, include_tmp=True, include_memory=False,
                reason=self._reason(request, f"create_snapshot of {sandbox.sandbox_id}"),
            )  # fmt: skip
        except errors.AlreadyExists as exc:
            raise ApiError(409, str(exc)) from None
        except errors.SandboxNotFound:
            raise not_found(sandbox.sandbox_id) from None
        except errors.StockadeError as exc:
            raise from_domain(exc) from None
        return JSONResponse(snapshot_json(taken.snapshot), status_code=201)

    async def list_snapshots(self, request: Request) -> Response:
        """GET /snapshots?sandboxID=&name=&limit=&nextToken=: the caller's snapshots, newest
        first; the next page's token in x-next-token."""
        tenant = self.c.tenant(request)
        query = request.query_params
        of = query.get("sandboxID", "")
        name = query.get("name", "")
        limit = _number(query.get("limit", "100"), "limit", 1, MAX_LISTED)
        start = _number(query.get("nextToken", "0") or "0", "nextToken", 0, 10**9)
        try:
            found = await self.c.ctx.manager.snapshots.listed(tenant)
        except errors.StockadeError as exc:
            raise from_domain(exc) from None
        chosen = [
            s
            for s in sorted(found, key=lambda s: (-s.created, s.name))
            if not s.transient
            and (not of or s.source == KEY_PREFIX + of)
            and (not name or s.name == name)
        ]
        page = chosen[start : start + limit]
        more = start + limit < len(chosen)
        headers = {NEXT_TOKEN_HEADER: str(start + limit)} if more else None
        return JSONResponse([snapshot_json(s) for s in page], headers=headers)

    async def delete_template(self, request: Request) -> Response:
        """DELETE /templates/{id} (the SDK's delete_snapshot): 204, 404 when the caller has
        no snapshot of that id (a configured template is not deleted over E2B)."""
        tenant = self.c.tenant(request)
        name = str(request.path_params["template_id"])
        if await self.named(tenant, name) is None:
            raise ApiError(404, f"snapshot {name[:64]!r} not found")
        try:
            await self.c.ctx.manager.snapshots.delete(
                tenant, name, self._reason(request, "delete_snapshot")
            )
        except errors.NotFound:
            raise ApiError(404, f"snapshot {name[:64]!r} not found") from None
        except errors.StockadeError as exc:
            raise from_domain(exc) from None
        return Response(status_code=204)

    async def restore_into(self, request: Request, sandbox: E2bSandbox, snap: Snapshot) -> None:
        """A new sandbox (its key unused) made with the snapshot's files."""
        await self.c.ctx.manager.snapshots.restore(
            sandbox.key, snap.name, self._reason(request, f"create from snapshot {snap.name}")
        )


def _number(text: str, what: str, least: int, most: int) -> int:
    if not text.isdigit() or not least <= int(text) <= most:
        raise ApiError(400, f"{what} must be a whole number from {least} to {most}")
    return int(text)
