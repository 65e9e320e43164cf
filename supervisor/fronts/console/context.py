"""What the console's handlers share: the supervisor's own domain objects (the ones the
gRPC servicers use), the sessions, and the rules of who sees which tenant."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qs

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request

from stockade.supervisor.auth import Authenticator
from stockade.supervisor.calls.lifecycle import Actor, Lifecycle, LifecycleSandboxes
from stockade.supervisor.calls.pipeline import HostPolicy
from stockade.supervisor.config import Config
from stockade.supervisor.engines.isolation import IsolationReport
from stockade.supervisor.errors import InvalidRequest, Unauthenticated
from stockade.supervisor.fronts.backoff import client_of
from stockade.supervisor.fronts.console.security import MAX_BODY_BYTES, csrf_ok, same_origin
from stockade.supervisor.fronts.console.sessions import COOKIE, Session, Sessions
from stockade.supervisor.keys import scope, split, validate_key, validate_tenant
from stockade.supervisor.models import SandboxInfo, ToolCall, ToolResult
from stockade.supervisor.observe.alarms import AlarmHub
from stockade.supervisor.observe.metrics import Metrics
from stockade.supervisor.sandboxes.snapshots.checkpoints import Undo

if TYPE_CHECKING:
    from stockade.supervisor.fronts.console.trends import Trends

FRONT = "console"


RATE_WINDOW_S = 60.0


@dataclass
class Rates:
    """(time, calls so far) samples taken when the overview is read: calls per second over
    the last minute of reads."""

    samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=256))

    def rate(self, total: float, now: float) -> float | None:
        while self.samples and now - self.samples[0][0] > RATE_WINDOW_S:
            self.samples.popleft()
        first = self.samples[0] if self.samples else None
        self.samples.append((now, total))
        if first is None or now - first[0] < 0.5:
            return None
        return round((total - first[1]) / (now - first[0]), 2)


class ConsoleSandboxes(LifecycleSandboxes, Protocol):
    """What the console reads and asks of the sandbox manager, its changes through the
    lifecycle path (sandboxes/manager.py SandboxManager is the real one; tests put a
    recording stand-in in its place)."""

    @property
    def config(self) -> Config: ...

    def state_counts(self) -> dict[str, int]: ...

    async def list(self) -> list[SandboxInfo]: ...

    async def get(self, key: str) -> SandboxInfo: ...

    async def inspect_isolation(self, key: str) -> IsolationReport: ...


class Undoing(Protocol):
    """The undo of a key's files to the checkpoint before a call, shown (apply=False) or
    done and audited: the one RollbackSandbox path (sandboxes/snapshots/checkpoints.py
    Checkpoints.undo is the real one)."""

    async def __call__(self, key: str, to_call: str, *, apply: bool, reason: str = "") -> Undo: ...


class ConsoleCalls(Protocol):
    """The one thing the console asks of the tool pipeline (calls/pipeline.py ToolPipeline):
    a call, run as every front's is."""

    async def call(self, call: ToolCall, caller: str = "") -> ToolResult: ...


class NeedLogin(Exception):
    """No live session: a page redirects to /login, anything else answers 401."""


@dataclass
class ConsoleContext:
    config: Config
    policy: HostPolicy
    authenticator: Authenticator
    manager: ConsoleSandboxes
    metrics: Metrics | None
    alarms: AlarmHub | None = None
    """The supervisor's alarms: a quarantine by hand is told everywhere, as the RPC's is."""
    pipeline: ConsoleCalls | None = None
    """The tool pipeline of the other fronts: a sandbox's files and background processes
    are read through it, as calls (workspace.py); None: not offered."""
    undo: Undoing | None = None
    """Undo from a call's audit record (None: no checkpoints on this host)."""
    usage: dict[str, deque[tuple[float, int, int]]] = field(default_factory=dict)
    """Each running sandbox's recent (time, CPU ns, memory bytes) samples (workspace.py)."""
    sessions: Sessions = field(init=False)
    rates: Rates = field(init=False)
    lifecycle: Lifecycle[ConsoleSandboxes] = field(init=False)
    """The one lifecycle path (calls/lifecycle.py): every action is one audit record."""
    trends: Trends | None = field(init=False, default=None)
    """The overview's trends, made at its first read or at the console's start (overview.py)."""

    def __post_init__(self) -> None:
        self.sessions = Sessions(self.config.console.session_ttl_s)
        self.rates = Rates()
        sound = self.alarms.sound if self.alarms is not None else None
        self.lifecycle = Lifecycle(self.manager, self.policy.audit, sound)

    @property
    def refresh(self) -> str:
        """How often live parts refresh, for console.js (data-refresh, seconds)."""
        return f"{self.config.console.refresh_s:g}"

    def is_operator(self, tenant: str) -> bool:
        return tenant in self.config.console.operators

    def session(self, request: Request) -> Session:
        """The request's live session, its token still in the tokens file; NeedLogin
        otherwise."""
        session = self.sessions.find(request.cookies.get(COOKIE))
        if session is None:
            raise NeedLogin
        try:
            tenant = self.authenticator.authenticate([f"Bearer {session.token}"], ())
        except Unauthenticated:
            tenant = None
        if tenant != session.tenant:  # the token was removed, or moved to another tenant
            self.sessions.end(session)
            self.refused(request, "the session's token is no longer valid for its tenant")
            raise NeedLogin
        return session

    async def changing(self, request: Request) -> tuple[Session, dict[str, str]]:
        """A state-changing request: its session, and its form once the request is shown
        to be the console's own (same origin, the session's CSRF token); 403 otherwise."""
        session = self.session(request)
        form = await read_form(request)
        given = request.headers.get("x-csrf-token") or form.get("csrf")
        if not same_origin(request) or not csrf_ok(session.csrf, given):
            raise HTTPException(403, "forbidden: missing or wrong CSRF token, or another origin")
        return session, form

    def known_tenants(self, session: Session) -> list[str]:
        """Every tenant the console knows of, for an operator's views across tenants: the
        operators, the [tenants.*] tables and the tenants of the sandboxes held."""
        known = {session.tenant, *self.config.console.operators}
        known |= {t for t in self.config.tenants if t != "*"}
        known |= {split(k)[0] for k in self.manager.registry}
        return sorted(t for t in known if t)

    def tenant_for(self, session: Session, asked: str | None) -> str:
        """The tenant a request acts in: a tenant user's own, whatever it asks; for an
        operator, the one it names ("" when it names none: every tenant where that means
        something)."""
        if not session.operator:
            return session.tenant
        if not asked:
            return ""
        try:
            return validate_tenant(asked)
        except InvalidRequest as exc:
            raise HTTPException(400, str(exc)) from None

    def scoped(self, session: Session, tenant: str | None, key: str) -> str:
        """A sandbox key within the tenant the session may act in (400 for a bad key)."""
        own = self.tenant_for(session, tenant) if session.operator else session.tenant
        if session.operator and not own:
            raise HTTPException(400, "name the sandbox's tenant")
        try:
            validate_key(key)
            return scope(own, key)
        except InvalidRequest as exc:
            raise HTTPException(400, str(exc)) from None

    def visible(self, session: Session, scoped_key: str) -> bool:
        return session.operator or split(scoped_key)[0] == session.tenant

    def actor(self, session: Session, request: Request) -> Actor:
        """The caller of a console action: the session's user and the client's address."""
        return Actor(FRONT, f"{session.who}@{client_of(request.scope)}")

    def refused(self, request: Request, why: str) -> None:
        """A sign-in refused for its token: audited, bounded per address (refusals.py)."""
        if self.policy.refusals is not None:
            self.policy.refusals.refused(FRONT, client_of(request.scope), why)


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form of at most MAX_BODY_BYTES, first value of each field."""
    if request.method not in ("POST",):
        return {}
    body = b""
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise HTTPException(413, "request body too large")
    except ClientDisconnect:
        raise HTTPException(413, "request body too large") from None
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if body and kind != "application/x-www-form-urlencoded":
        raise HTTPException(415, "send an urlencoded form")
    try:
        fields = parse_qs(body.decode("utf-8"), max_num_fields=32, strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        raise HTTPException(400, "malformed form") from None
    return {k: v[0] for k, v in fields.items()}


def query(request: Request, name: str, limit: int = 1024) -> str:
    value = request.query_params.get(name, "")
    if len(value) > limit:
        raise HTTPException(400, f"{name} is too long")
    return value
