"""Who is calling: bearer tokens from a file (re-read when it changes) and client
certificate identities, each mapped to a tenant. No gRPC here: the server's interceptor
hands in the `authorization` header and the certificate's names.

Tokens are kept only as SHA-256 digests and compared in constant time against every entry,
so neither memory nor timing gives one away."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stockade.supervisor.config import AuthConfig, Config
from stockade.supervisor.errors import ConfigError, InvalidRequest, Unauthenticated
from stockade.supervisor.keys import validate_tenant

log = logging.getLogger("stockade.auth")
MIN_TOKEN_CHARS = 16
MAX_HEADER_CHARS = 4096
MAX_FILE_BYTES = 16 << 20
_HASHED = "sha256:"


def local_only(listen: str) -> bool:
    """Whether a listen address is reachable from this host only: a unix socket or a
    loopback address (127.0.0.0/8, ::1, localhost)."""
    if listen.startswith("unix:") or listen.startswith("unix-abstract:"):
        return True
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name or a wildcard ("0.0.0.0", "[::]", "") may reach the network


def auth_enabled(config: Config) -> bool:
    """Whether callers must authenticate; ConfigError when the config is not allowed to run.
    Decided before anything binds or touches the engine."""
    auth = config.auth
    if auth.enabled is False:
        if not local_only(config.listen):
            raise ConfigError(
                f"auth.enabled = false is allowed only on a unix socket or a loopback address, "
                f"not on {config.listen!r}: set [auth] tokens_file (bearer tokens) or client_ca "
                "(client certificates), or listen on 127.0.0.1 or unix:/path"
            )
        return False
    if not (auth.tokens_file or auth.client_ca):
        raise ConfigError(
            f"authentication is required on {config.listen!r} but not configured: set [auth] "
            "tokens_file (bearer tokens) or client_ca (client certificates); to serve without "
            "it on a unix socket or a loopback address, set auth.enabled = false"
        )
    if not local_only(config.listen) and not auth.tls_cert:
        log.warning("bearer tokens travel in clear text: %s has no TLS", config.listen)
    return True


@dataclass(frozen=True)
class _Entry:
    digest: bytes
    tenant: str


def parse_tokens(text: str) -> tuple[_Entry, ...]:
    """`TOKEN TENANT` or `sha256:HEX TENANT` per line; `#` comments. ValueError naming the
    line (never the token) for anything else."""
    entries: list[_Entry] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 2:
            raise ValueError(f"line {number}: expected `TOKEN TENANT`, got {len(fields)} fields")
        token, tenant = fields
        try:
            validate_tenant(tenant)
        except InvalidRequest as exc:
            raise ValueError(f"line {number}: {exc}") from None
        entries.append(_Entry(_digest_of(token, number), tenant))
    digests = [e.digest for e in entries]
    if len(set(digests)) != len(digests):
        raise ValueError("the same token appears twice")
    return tuple(entries)


def _digest_of(token: str, number: int) -> bytes:
    if token.startswith(_HASHED):
        try:
            digest = bytes.fromhex(token.removeprefix(_HASHED))
        except ValueError:
            digest = b""
        if len(digest) != 32:
            raise ValueError(f"line {number}: sha256: needs 64 hex digits")
        return digest
    if len(token) < MIN_TOKEN_CHARS or not token.isascii() or not token.isprintable():
        raise ValueError(
            f"line {number}: a token must be at least {MIN_TOKEN_CHARS} printable ASCII "
            "characters (e.g. `openssl rand -hex 32`)"
        )
    return hashlib.sha256(token.encode()).digest()


class TokenFile:
    """The tokens file, re-read on the first lookup after it changed (a stat per lookup)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._stamp: tuple[int, ...] | None = None
        self._entries: tuple[_Entry, ...] = ()
        try:
            self._stamp, self._entries = self._read()
        except (OSError, ValueError) as exc:
            raise ConfigError(f"auth.tokens_file {path}: {exc}") from None

    def _read(self) -> tuple[tuple[int, ...], tuple[_Entry, ...]]:
        with self._path.open("rb") as f:
            st = os.fstat(f.fileno())
            if st.st_mode & (stat.S_IRWXO | stat.S_IWGRP):
                raise ValueError(
                    f"mode {stat.S_IMODE(st.st_mode):o} lets others read or write it "
                    f"(chmod 600 {self._path})"
                )
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ValueError(f"larger than {MAX_FILE_BYTES >> 20} MiB")
        return _stamp(st), parse_tokens(data.decode("utf-8"))

    def _refresh(self) -> None:
        try:
            st = os.stat(self._path)
        except OSError as exc:
            if self._entries:
                log.error("tokens file %s: %s; no token is accepted", self._path, exc)
            self._stamp, self._entries = None, ()
            return
        if _stamp(st) == self._stamp:
            return
        try:
            self._stamp, self._entries = self._read()
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            self._stamp = _stamp(st)  # log once per version, not once per call
            log.error("tokens file %s not reloaded, the previous tokens stay: %s", self._path, exc)
            return
        log.info("tokens file %s reloaded: %d token(s)", self._path, len(self._entries))

    def tenant_for(self, token: str) -> str | None:
        self._refresh()
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found = None
        for entry in self._entries:  # every entry, no early exit: constant time in the token
            if hmac.compare_digest(entry.digest, digest):
                found = entry.tenant
        return found


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Authenticator:
    """Turns a caller's credentials into its tenant, or raises Unauthenticated."""

    def __init__(self, config: AuthConfig) -> None:
        self._tokens = TokenFile(Path(config.tokens_file)) if config.tokens_file else None
        self._certs = dict(config.client_certs)

    def authenticate(self, authorization: Sequence[str], cert_names: Sequence[str]) -> str:
        """`authorization`: the values of that header; `cert_names`: the verified client
        certificate's SANs and common name (empty without mutual TLS)."""
        by_cert = {self._certs[n] for n in cert_names if n in self._certs}
        if len(by_cert) > 1:
            raise Unauthenticated("the client certificate names more than one tenant")
        by_token = self._token_tenant(authorization)
        if by_token and by_cert and by_cert != {by_token}:
            raise Unauthenticated("the bearer token and the client certificate disagree")
        tenant = by_token or next(iter(by_cert), None)
        if tenant is None:
            if cert_names:
                raise Unauthenticated(
                    "the client certificate maps to no tenant and no bearer token was sent"
                )
            raise Unauthenticated("missing credentials: send `authorization: Bearer TOKEN`")
        return tenant

    def _token_tenant(self, authorization: Sequence[str]) -> str | None:
        if not authorization:
            return None
        if len(authorization) > 1:
            raise Unauthenticated("more than one authorization header")
        scheme, _, token = authorization[0].strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the authorization header must be `Bearer TOKEN`")
        if self._tokens is None or len(token) > MAX_HEADER_CHARS:
            raise Unauthenticated("invalid bearer token")
        tenant = self._tokens.tenant_for(token.strip())
        if tenant is None:
            raise Unauthenticated("invalid bearer token")
        return tenant
