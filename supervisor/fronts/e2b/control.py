"""The E2B control plane: create, connect (and resume), get, list, set timeout, kill,
metrics and pause of a caller's sandboxes, as the E2B SDKs call them (/v2 paths and the
older ones). A sandbox is a Stockade sandbox of the key "e2b-<id>" within the caller's
tenant, made and unmade through the sandbox manager like any other; another tenant's id is
unknown (404). Every create, connect, resume, timeout, pause, kill and expiry goes through
the one lifecycle path (calls/lifecycle.py): one audit record each, front "e2b", the
client's address as its caller ("supervisor" for an expiry). A refused API key is audited
(observe/refusals.py)."""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
import time
from collections.abc import Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from stockade.supervisor import errors
from stockade.supervisor.calls.lifecycle import (
    CONNECT,
    CREATE,
    PAUSE,
    SET_TIMEOUT,
    Actor,
    Lifecycle,
)
from stockade.supervisor.fronts.backoff import client_of
from stockade.supervisor.fronts.e2b import listing
from stockade.supervisor.fronts.e2b.context import FRONT, E2bContext
from stockade.supervisor.fronts.e2b.metrics import Metrics
from stockade.supervisor.fronts.e2b.network_options import network_request
from stockade.supervisor.fronts.e2b.records import (
    CLIENT_ID,
    DEFAULT_TEMPLATE,
    ENVD_VERSION,
    KEY_PREFIX,
    PAUSED,
    RUNNING,
    E2bSandbox,
    new_sandbox_id,
    rfc3339,
)
from stockade.supervisor.fronts.e2b.snapshots import SnapshotHandlers
from stockade.supervisor.fronts.e2b.wire import (
    ApiError,
    from_domain,
    not_found,
    read_json,
    seconds,
    string_map,
    tenant_of,
)
from stockade.supervisor.keys import scope
from stockade.supervisor.sandboxes.profiles import SandboxProfile
from stockade.supervisor.sandboxes.snapshots.repository import Snapshot

log = logging.getLogger("stockade.e2b")
UNSUPPORTED_CREATE = {
    "mcp": "MCP gateways in sandboxes",
    "volumeMounts": "volumes",
    "iam": "IAM tokens",
}
"""Create options refused with 400 rather than silently ignored."""


def lifecycle_of(body: dict[str, Any]) -> tuple[bool, bool]:
    """(auto_pause, auto_resume) of a create: E2B's `autoPause` (lifecycle.on_timeout
    "pause"), `autoPauseMemory` (False: mode "filesystem"; both are Stockade's pause, which
    keeps the memory) and `autoResume.enabled`. 400 for a value of the wrong type and for
    auto-resume without auto-pause (as E2B's SDK refuses it)."""
    auto_pause = body.get("autoPause")
    if auto_pause is not None and not isinstance(auto_pause, bool):
        raise ApiError(400, "autoPause must be a boolean")
    memory = body.get("autoPauseMemory")
    if memory is not None and not isinstance(memory, bool):
        raise ApiError(400, "autoPauseMemory must be a boolean")
    resume = body.get("autoResume")
    if resume is not None and not isinstance(resume, dict):
        raise ApiError(400, "autoResume must be an object")
    enabled = (resume or {}).get("enabled", False)
    if not isinstance(enabled, bool):
        raise ApiError(400, "autoResume.enabled must be a boolean")
    if enabled and not auto_pause:
        raise ApiError(400, "autoResume: auto-resume needs lifecycle.on_timeout 'pause'")
    if enabled and memory is False:
        raise ApiError(400, "autoResume: a filesystem-only pause cannot be auto-resumed")
    return bool(auto_pause), enabled


def caller_of(request: Request) -> str:
    client = request.client
    return f"{client.host}:{client.port}" if client is not None else ""


def actor(request: Request | None) -> Actor:
    """The caller of a change through E2B: the client's address; the front itself (its
    expiry) without a request."""
    return Actor(FRONT, caller_of(request) if request is not None else "supervisor")


class Control:
    """The control-plane handlers over one E2bContext."""

    def __init__(self, ctx: E2bContext) -> None:
        self.ctx = ctx
        self.lifecycle = Lifecycle(ctx.manager, ctx.policy.audit)
        self.metrics = Metrics(ctx.config)
        self.snapshots = SnapshotHandlers(self)
        self.caller_of = caller_of
        e2b = ctx.config.e2b
        self.default_timeout = e2b.default_timeout_s
        self.max_timeout = e2b.max_timeout_s
        self._pending: dict[str, int] = {}
        """Per tenant: its sandboxes being made (not on record yet)."""
        self._failed: set[str] = set()
        """Sandboxes whose removal at expiry failed (audited once, tried at every sweep)."""

    # lookups and answers

    def tenant(self, request: Request) -> str:
        try:
            return tenant_of(self.ctx.authenticator, request.headers)
        except ApiError as exc:
            refusals = self.ctx.policy.refusals
            if exc.status == 401 and refusals is not None:
                refusals.refused(FRONT, client_of(request.scope), exc.message)
            raise

    def own(self, request: Request) -> tuple[str, E2bSandbox]:
        """(tenant, the caller's live sandbox named in the path); 404 for an unknown id, one
        of another tenant and one whose timeout has passed (its removal may be pending)."""
        tenant = self.tenant(request)
        sandbox_id = str(request.path_params["sandbox_id"])
        sandbox = self.ctx.records.get(tenant, sandbox_id)
        if sandbox is None or sandbox.ended(time.time()):
            raise not_found(sandbox_id)
        return tenant, sandbox

    def state_of(self, sandbox: E2bSandbox) -> str:
        """Its container's state when it has one (a call may have resumed it, housekeeping
        may have paused it), else the state on record."""
        held = self.ctx.manager.registry.get(sandbox.key)
        if held is not None:
            return PAUSED if held.paused else RUNNING
        return sandbox.state

    def sandbox_json(self, sandbox: E2bSandbox) -> dict[str, Any]:
        """E2B's `Sandbox` (create and connect answers)."""
        return {
            "templateID": sandbox.template_id,
            "sandboxID": sandbox.sandbox_id,
            "clientID": CLIENT_ID,
            "envdVersion": ENVD_VERSION,
            "alias": sandbox.template_id,
            "envdAccessToken": sandbox.access_token,
        }

    def listed_json(self, sandbox: E2bSandbox) -> dict[str, Any]:
        """E2B's `ListedSandbox`; never null for objects the SDK would parse."""
        config = self.ctx.config.sandbox
        profile = self._profile(sandbox.template_id)
        return {
            "templateID": sandbox.template_id,
            "sandboxID": sandbox.sandbox_id,
            "clientID": CLIENT_ID,
            "alias": sandbox.template_id,
            "startedAt": rfc3339(sandbox.started_at),
            "endAt": rfc3339(sandbox.end_at),
            "cpuCount": max(1, math.ceil(profile.cpus)),
            "memoryMB": profile.memory_mb,
            "diskSizeMB": config.workspace_size_mb,
            "state": self.state_of(sandbox),
            "envdVersion": ENVD_VERSION,
            "metadata": dict(sandbox.metadata),
            "lifecycle": {
                "onTimeout": "pause" if sandbox.auto_pause else "kill",
                "autoResume": sandbox.auto_resume,
            },
        }

    def _profile(self, template: str) -> SandboxProfile:
        """The template's profile; the default for one no longer configured."""
        try:
            return self.ctx.manager.profiles.get(template)
        except errors.NotFound:
            return self.ctx.manager.profiles.default

    def audit(
        self, request: Request | None, sandbox: E2bSandbox, tool: str, arguments: dict[str, Any],
        *, error: str = "",
    ) -> None:  # fmt: skip
        """A step of E2B's that is no change of the manager's (set_timeout, a connect or
        resume's new end), recorded through the lifecycle path as every change is."""
        asked = {"sandbox_id": sandbox.sandbox_id, **arguments}
        self.lifecycle.record(actor(request), sandbox.key, tool, asked, error=error or None)

    @contextlib.contextmanager
    def creating(
        self, tenant: str, request: Request, sandbox: E2bSandbox, arguments: dict[str, Any],
        count: int = 1,
    ) -> Iterator[None]:  # fmt: skip
        """`count` of the tenant's sandboxes while they are made (a create's one, a fork's
        several): QuotaExceeded (429) when the tenant would have more than
        e2b.max_sandboxes_per_tenant on record or being made, recorded through the lifecycle
        path as the create's one record. Counted per tenant: one at its cap never refuses
        another's create."""
        cap = self.ctx.config.e2b.max_sandboxes_per_tenant
        pending = self._pending.get(tenant, 0)
        if cap and self.ctx.records.count(tenant) + pending + count > cap:
            refused = errors.QuotaExceeded(
                f"this tenant has {cap} E2B sandboxes already, its limit "
                f"(e2b.max_sandboxes_per_tenant): kill one first"
            )
            self.lifecycle.record(actor(request), sandbox.key, CREATE, arguments, error=refused)
            raise refused
        self._pending[tenant] = pending + count
        try:
            yield
        finally:
            left = self._pending[tenant] - count
            if left:
                self._pending[tenant] = left
            else:
                del self._pending[tenant]

    # handlers

    async def create(self, request: Request) -> Response:
        """POST /v2/sandboxes (and /sandboxes): a running sandbox when it answers, 201."""
        tenant = self.tenant(request)
        body = await read_json(request, self.ctx.config.max_request_bytes)
        template = body.get("templateID", DEFAULT_TEMPLATE)
        if not isinstance(template, str):
            raise ApiError(400, "templateID must be a string")
        snapshot = None
        try:
            self.ctx.manager.profiles.get(template)  # a template is a sandbox profile
        except errors.NotFound as exc:
            snapshot = await self.snapshots.named(tenant, template)  # or a snapshot
            if snapshot is None:
                raise ApiError(404, f"template {template[:64]!r} not found: {exc}") from None
        for option, what in UNSUPPORTED_CREATE.items():
            if body.get(option) not in (None, {}, []):
                raise ApiError(400, f"{option}: {what} are not supported by Stockade yet")
        auto_pause, auto_resume = lifecycle_of(body)
        network = network_request(body, self.ctx.config)
        if snapshot is not None and network is not None:
            raise ApiError(400, "network options with a snapshot as the template: not supported")
        timeout = self.default_timeout
        if body.get("timeout") is not None:
            timeout = seconds(body["timeout"], "timeout", self.max_timeout)
        most = self.ctx.config.e2b.max_metadata_bytes
        metadata = string_map(body.get("metadata"), "metadata", max_bytes=most)
        env_vars = string_map(body.get("envVars"), "envVars", max_bytes=most)
        sandbox_id = new_sandbox_id()
        now = time.time()
        sandbox = E2bSandbox(
            sandbox_id=sandbox_id,
            tenant=tenant,
            key=scope(tenant, KEY_PREFIX + sandbox_id),
            template_id=template,
            access_token=secrets.token_urlsafe(32),
            started_at=now,
            end_at=now + timeout,
            metadata=metadata,
            env_vars=env_vars,
            auto_pause=auto_pause,
            auto_resume=auto_resume,
        )
        arguments = {
            "template": template,
            "timeout": timeout,
            "metadata": metadata,
            "env_vars": sorted(env_vars),  # names only: values may be secrets
            "on_timeout": "pause" if auto_pause else "kill",
            "auto_resume": auto_resume,
        }
        arguments = {"sandbox_id": sandbox_id, **arguments}
        try:
            with self.creating(tenant, request, sandbox, arguments):
                if snapshot is None:
                    await self.lifecycle.ensure(
                        actor(request), sandbox.key, network, template, tool=CREATE,
                        arguments=arguments,
                    )  # fmt: skip
                else:
                    await self._from_snapshot(request, sandbox, snapshot, arguments)
        except errors.StockadeError as exc:
            raise from_domain(exc) from None
        sandbox.started_at = time.time()
        sandbox.end_at = sandbox.started_at + timeout
        await self.ctx.records.add(sandbox)
        log.info("E2B sandbox %s created (timeout %d s)", sandbox_id, timeout)
        return JSONResponse(self.sandbox_json(sandbox), status_code=201)

    async def _from_snapshot(
        self, request: Request, sandbox: E2bSandbox, snapshot: Snapshot, arguments: dict[str, Any]
    ) -> None:
        """A create whose template is a snapshot: the store's restore into the new key (its
        own record, as for every front), and the create's one lifecycle record."""
        asked = {**arguments, "snapshot": snapshot.name}
        try:
            await self.snapshots.restore_into(request, sandbox, snapshot)
        except errors.StockadeError as exc:
            self.lifecycle.record(actor(request), sandbox.key, CREATE, asked, error=exc)
            raise
        self.lifecycle.record(actor(request), sandbox.key, CREATE, asked)

    def is_template(self, name: str) -> bool:
        """Whether a configured profile (an E2B template) has that name."""
        try:
            self.ctx.manager.profiles.get(name)
        except errors.NotFound:
            return False
        return True

    def seconds_of(self, value: Any) -> int:
        """A request's `timeout` within e2b.max_timeout_s (400 otherwise)."""
        return seconds(value, "timeout", self.max_timeout)

    async def connect(self, request: Request) -> Response:
        """POST /v2/sandboxes/{id}/connect (and /sandboxes/{id}/connect): a running sandbox
        gets a later end if `timeout` asks for one (200); a paused one is resumed (201)."""
        _tenant, sandbox = self.own(request)
        body = await read_json(request, self.ctx.config.max_request_bytes)
        timeout = None
        if body.get("timeout") is not None:
            timeout = seconds(body["timeout"], "timeout", self.max_timeout)
        resumed = await self._resume(request, sandbox, {"as": "connect", "timeout": timeout})
        if timeout is not None:
            wanted = time.time() + timeout
            sandbox.end_at = wanted if resumed else max(sandbox.end_at, wanted)
        elif resumed:
            sandbox.end_at = max(sandbox.end_at, time.time() + self.default_timeout)
        await self.ctx.records.save(sandbox)
        return JSONResponse(self.sandbox_json(sandbox), status_code=201 if resumed else 200)

    async def resume(self, request: Request) -> Response:
        """POST /sandboxes/{id}/resume (older SDKs): 201, or 409 when it is not paused."""
        _tenant, sandbox = self.own(request)
        body = await read_json(request, self.ctx.config.max_request_bytes)
        if self.state_of(sandbox) != PAUSED:
            raise ApiError(409, f"sandbox {sandbox.sandbox_id} is not paused")
        timeout = self.default_timeout
        if body.get("timeout") is not None:
            timeout = seconds(body["timeout"], "timeout", self.max_timeout)
        await self._resume(request, sandbox, {"as": "resume", "timeout": timeout})
        sandbox.end_at = time.time() + timeout
        await self.ctx.records.save(sandbox)
        return JSONResponse(self.sandbox_json(sandbox), status_code=201)

    async def _resume(
        self, request: Request, sandbox: E2bSandbox, arguments: dict[str, Any]
    ) -> bool:
        """Make the sandbox's container run (resumed when paused, made again when it is
        gone); True when it was paused. One record: a resume of a paused one, else a
        connect (which may have made its container again)."""
        who = self.lifecycle
        was_paused = self.state_of(sandbox) == PAUSED
        asked = {"sandbox_id": sandbox.sandbox_id, **arguments}
        try:
            resumed = False
            if was_paused:
                with contextlib.suppress(errors.SandboxNotFound):  # gone: ensure makes another
                    _info, resumed = await who.resume(actor(request), sandbox.key, asked)
            if resumed:
                await self.ctx.manager.ensure(sandbox.key)  # resumed: running, nothing made
            else:
                await who.ensure(actor(request), sandbox.key, tool=CONNECT, arguments=asked)
        except errors.StockadeError as exc:
            raise from_domain(exc) from None
        sandbox.state = RUNNING
        return was_paused

    async def info(self, request: Request) -> Response:
        """GET /sandboxes/{id}: SandboxDetail."""
        _tenant, sandbox = self.own(request)
        detail = self.listed_json(sandbox)
        detail["envdAccessToken"] = sandbox.access_token
        return JSONResponse(detail)

    async def list_v2(self, request: Request) -> Response:
        """GET /v2/sandboxes: one page of the caller's sandboxes, the next page's token in
        x-next-token."""
        tenant = self.tenant(request)
        params: dict[str, list[str]] = {}
        for name, value in request.query_params.multi_items():
            params.setdefault(name, []).append(value)
        query = listing.parse_query(params)
        now = time.time()
        found = [
            s
            for s in self.ctx.records.of_tenant(tenant)
            if not s.ended(now) and listing.matches(s, self.state_of(s), query)
        ]
        chosen, token = listing.page(found, query)
        headers = {listing.NEXT_TOKEN_HEADER: token} if token else None
        return JSONResponse([self.listed_json(s) for s in chosen], headers=headers)

    async def list_v1(self, request: Request) -> Response:
        """GET /sandboxes (older SDKs): the caller's running sandboxes, `metadata` filter."""
        tenant = self.tenant(request)
        raw = request.query_params.get("metadata", "")
        wanted = listing.parse_metadata(raw) if raw else {}
        now = time.time()
        found = [
            self.listed_json(s)
            for s in self.ctx.records.of_tenant(tenant)
            if not s.ended(now)
            and self.state_of(s) == RUNNING
            and all(s.metadata.get(k) == v for k, v in wanted.items())
        ]
        return JSONResponse(found)

    async def set_timeout(self, request: Request) -> Response:
        """POST /sandboxes/{id}/timeout: the sandbox ends `timeout` seconds from now; 204."""
        _tenant, sandbox = self.own(request)
        body = await read_json(request, self.ctx.config.max_request_bytes, required=True)
        timeout = seconds(body.get("timeout"), "timeout", self.max_timeout)
        sandbox.end_at = time.time() + timeout
        await self.ctx.records.save(sandbox)
        self.audit(request, sandbox, SET_TIMEOUT, {"timeout": timeout})
        return Response(status_code=204)

    async def kill(self, request: Request) -> Response:
        """DELETE /sandboxes/{id}: container and workspace removed; 204 (404: SDKs -> False)."""
        _tenant, sandbox = self.own(request)
        await self.remove(sandbox, request)
        return Response(status_code=204)

    async def remove(
        self, sandbox: E2bSandbox, request: Request | None = None, *, audit_failure: bool = True
    ) -> None:
        """Remove the sandbox's record, container and workspace (one destroy record: a
        kill by `request`'s client, an expiry without one; `audit_failure`: False for an
        expiry that failed before and is tried again, audited once)."""
        await self.ctx.records.remove(sandbox.sandbox_id)
        self.metrics.forget(sandbox.sandbox_id)
        for forget in self.ctx.forgetters:
            forget(sandbox.sandbox_id)
        asked: dict[str, Any] = {"sandbox_id": sandbox.sandbox_id}
        if request is None:
            asked.update({"as": "expire", "end_at": rfc3339(sandbox.end_at)})
        else:
            asked["as"] = "kill"
        try:
            await self.lifecycle.destroy(
                actor(request), sandbox.key, delete_workspace=True, arguments=asked,
                missing_ok=True, audit_failure=audit_failure,
            )  # fmt: skip
        except errors.StockadeError as exc:
            raise from_domain(exc) from None

    async def pause(self, request: Request) -> Response:
        """POST /sandboxes/{id}/pause: every process frozen (the engine's pause), memory
        kept; 204, or 409 when it is paused already (SDKs -> False)."""
        _tenant, sandbox = self.own(request)
        await read_json(request, self.ctx.config.max_request_bytes)
        if self.state_of(sandbox) == PAUSED:
            raise ApiError(409, f"sandbox {sandbox.sandbox_id} is already paused")
        manager, asked = self.ctx.manager, {"sandbox_id": sandbox.sandbox_id}
        before, sandbox.state = sandbox.state, PAUSED  # before the freeze: pause_at_timeout
        try:
            if sandbox.key not in manager.registry:  # its container was removed (idle)
                try:
                    await manager.ensure(sandbox.key)  # made again, to be paused: one change
                except errors.StockadeError as exc:
                    self.lifecycle.record(actor(request), sandbox.key, PAUSE, asked, error=exc)
                    raise
            _info, changed = await self.lifecycle.pause(actor(request), sandbox.key, asked)
        except errors.StockadeError as exc:
            sandbox.state = before
            raise from_domain(exc) from None
        except BaseException:
            sandbox.state = before
            raise
        await self.ctx.records.save(sandbox)
        self._dropped(sandbox)
        if not changed:
            raise ApiError(409, f"sandbox {sandbox.sandbox_id} is already paused")
        return Response(status_code=204)

    async def metrics_of(self, request: Request) -> Response:
        """GET /sandboxes/{id}/metrics?start=&end=: one sample of now (metrics.py), [] when
        its container is not running or the range (unix seconds, E2B's `start` and `end`)
        lies wholly before the sandbox's start or after now: there is no history to give."""
        _tenant, sandbox = self.own(request)
        held = self.ctx.manager.registry.get(sandbox.key)
        if held is None or not held.info.running:
            return JSONResponse([])
        start = _unix_seconds(request.query_params.get("start"), "start")
        end = _unix_seconds(request.query_params.get("end"), "end")
        if (end is not None and end < int(sandbox.started_at)) or (
            start is not None and start > time.time()
        ):
            return JSONResponse([])
        workspace = self.ctx.manager.layout.of(sandbox.key).workspace
        sample = self.metrics.now(sandbox.sandbox_id, held.info.pid, held.born, workspace)
        return JSONResponse([sample])

    async def wake(self, request: Request, sandbox: E2bSandbox) -> bool:
        """Whether an envd request may reach this sandbox: a sandbox paused through E2B
        (its pause or the timeout's) answers nothing (E2B's edge: 502) unless it was created
        with auto_resume, which resumes it here (one resume record, "as": "auto_resume").
        A sandbox housekeeping paused for idleness is resumed by the call itself, as on
        every front."""
        if sandbox.state != PAUSED:
            return True
        if not sandbox.auto_resume:
            return False
        await self._resume(request, sandbox, {"as": "auto_resume"})
        sandbox.end_at = max(sandbox.end_at, time.time() + self.default_timeout)
        await self.ctx.records.save(sandbox)
        return True

    def _dropped(self, sandbox: E2bSandbox) -> None:
        """A pause ends the sandbox's open envd streams (E2B drops them: the SDK then finds
        the sandbox paused)."""
        for drop in self.ctx.pausers:
            drop(sandbox.sandbox_id)

    async def pause_at_timeout(self, sandbox: E2bSandbox) -> None:
        """lifecycle.on_timeout "pause": Stockade's pause at the end instead of a kill (one
        pause record, caller "supervisor", "as": "timeout"); the paused sandbox is kept
        e2b.max_timeout_s more, then removed as any other at its end."""
        asked = {"sandbox_id": sandbox.sandbox_id, "as": "timeout",
                 "end_at": rfc3339(sandbox.end_at)}  # fmt: skip
        # Paused on record before the freeze, so that no envd call in between finds the
        # container frozen but the record running: it would be let through (wake), and a
        # call to a frozen container resumes it (seen as is_running() True just after
        # get_info() said paused).
        # Its new end goes with the state: a paused record past its end is gone (`ended`).
        before = sandbox.state, sandbox.end_at
        sandbox.state, sandbox.end_at = PAUSED, time.time() + self.max_timeout
        try:
            if sandbox.key in self.ctx.manager.registry:
                await self.lifecycle.pause(actor(None), sandbox.key, asked)
            else:  # its container was removed (idle): nothing runs; a connect makes it again
                self.lifecycle.record(actor(None), sandbox.key, PAUSE, asked)
        except BaseException:
            sandbox.state, sandbox.end_at = before
            raise
        await self.ctx.records.save(sandbox)
        self._dropped(sandbox)
        log.info("E2B sandbox %s paused: its timeout passed (on_timeout pause)",
                 sandbox.sandbox_id)  # fmt: skip

    async def expire(self) -> int:
        """Remove the sandboxes whose timeout has passed (pause those created with
        on_timeout "pause"); how many were removed."""
        count = 0
        for sandbox in self.ctx.records.expired():
            if sandbox.auto_pause and sandbox.state == RUNNING:
                try:
                    await self.pause_at_timeout(sandbox)
                except errors.StockadeError as exc:  # tried again at the next sweep
                    if sandbox.sandbox_id not in self._failed:
                        log.warning("E2B sandbox %s: timeout passed, pause failed: %s",
                                    sandbox.sandbox_id, exc)  # fmt: skip
                        self._failed.add(sandbox.sandbox_id)
                continue
            try:
                await self.remove(sandbox, audit_failure=sandbox.sandbox_id not in self._failed)
            except ApiError as exc:
                await self.ctx.records.add(sandbox)  # tried again at the next sweep
                if sandbox.sandbox_id not in self._failed:  # said once, not at every sweep
                    log.warning("E2B sandbox %s: timeout passed, removal failed: %s",
                                sandbox.sandbox_id, exc.message)  # fmt: skip
                    self._failed.add(sandbox.sandbox_id)
                continue
            self._failed.discard(sandbox.sandbox_id)
            log.info("E2B sandbox %s removed: its timeout passed", sandbox.sandbox_id)
            count += 1
        return count


def _unix_seconds(text: str | None, name: str) -> int | None:
    """A query's time in unix seconds (None: not given); 400 unless a whole number."""
    if text is None:
        return None
    if not text.isdigit() or len(text) > 12:
        raise ApiError(400, f"{name} must be a time in whole unix seconds")
    return int(text)
