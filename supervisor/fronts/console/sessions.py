"""Console sessions: kept in memory, named to the browser by a signed cookie.

The cookie holds a random session id and its HMAC under a key made at start, so a forged or
altered cookie is refused before any lookup, and every session ends when the supervisor
restarts. The session keeps the token it signed in with: each request checks it again
against the tokens file, so removing a token from the file ends its console sessions too."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

COOKIE = "stockade_console"
MAX_SESSIONS = 4096
"""Sessions kept at once; signing in past it ends the oldest."""
MAX_COOKIE_CHARS = 256


@dataclass
class Session:
    id: str
    token: str = field(repr=False)
    tenant: str
    operator: bool
    csrf: str = field(repr=False)
    expires_at: float

    @property
    def who(self) -> str:
        """How a decision or an action names its author."""
        role = "operator" if self.operator else "tenant"
        return f"console:{role}:{self.tenant}"


class Sessions:
    def __init__(self, ttl_s: float) -> None:
        self._key = secrets.token_bytes(32)
        self._ttl = ttl_s
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def create(self, token: str, tenant: str, operator: bool) -> tuple[Session, str]:
        """A new session and its cookie value."""
        self._prune()
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.popitem(last=False)
        sid = secrets.token_urlsafe(32)
        session = Session(
            sid, token, tenant, operator, secrets.token_urlsafe(32), time.time() + self._ttl
        )
        self._sessions[sid] = session
        return session, f"{sid}.{self._sign(sid)}"

    def find(self, cookie: str | None) -> Session | None:
        """The live session a cookie names, or None (missing, malformed, forged, ended)."""
        if not cookie or len(cookie) > MAX_COOKIE_CHARS or not cookie.isascii():
            return None
        sid, _, mac = cookie.partition(".")
        if not sid or not hmac.compare_digest(mac.encode(), self._sign(sid).encode()):
            return None
        session = self._sessions.get(sid)
        if session is None:
            return None
        if session.expires_at <= time.time():
            self._sessions.pop(sid, None)
            return None
        return session

    def end(self, session: Session) -> None:
        self._sessions.pop(session.id, None)

    def __len__(self) -> int:
        return len(self._sessions)

    def _sign(self, sid: str) -> str:
        mac = hmac.new(self._key, sid.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def _prune(self) -> None:
        now = time.time()
        for sid in [s.id for s in self._sessions.values() if s.expires_at <= now]:
            self._sessions.pop(sid, None)
