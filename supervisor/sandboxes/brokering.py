"""Brokered secrets as a sandbox gets them (docs/secrets.md): which `[secrets.NAME]` apply to
it, the placeholder of each (what its variable `sandbox_env` holds instead of the value), the
Broker its egress proxy is given, and the trust the sandbox needs to accept the proxy's own
certificates for the hosts it intercepts.

Placeholders are derived, not stored: HMAC-SHA256 under a key this installation keeps in its
state directory (0600), over the sandbox id and the secret's name. A restarted supervisor
therefore knows the placeholders of the containers it adopts, and a placeholder says nothing
about the value or about another sandbox's. A sandbox keeps its placeholders for as long as its
key (paused, healed, restored, re-created); a fork, a new key, has its own.

A reload (cli/reloading.py) swaps the secrets whole: containers made from then on get them,
and each running sandbox's proxy a Broker rebuilt from the one it holds (rebroker): the same
placeholders with today's values and places, a removed secret retired (refused, never
injected).

The trust: a bundle (the host's CA certificates and the installation's egress CA) written to
the sandbox's host folder and bind-mounted read-only over the image's
/etc/ssl/certs/ca-certificates.crt, which curl, git, Python (ssl, requests) and OpenSSL read,
with the variables that name it; Node reads NODE_EXTRA_CA_CERTS, the egress CA alone."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import ssl
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from stockade.supervisor.config import Config, SecretConfig
from stockade.supervisor.engines.backends.base import BindMount
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.keys import shown, split
from stockade.supervisor.network.brokered import (
    PLACEHOLDER_CHARS,
    PLACEHOLDER_PREFIX,
    Broker,
    BrokeredSecret,
    Injection,
)

log = logging.getLogger("stockade")

KEY_FILE = "broker.key"
"""The installation's placeholder key, in the state directory."""
TRUST_FOLDER = "trust"
"""In a sandbox's host folder: the bundle and the CA its container mounts."""
BUNDLE = "ca-certificates.crt"
CA_ALONE = "stockade-egress-ca.crt"
SANDBOX_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
SANDBOX_CA = "/usr/local/share/ca-certificates/stockade-egress-ca.crt"
HOST_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def placeholder(key: bytes, sid: str, name: str) -> str:
    """The placeholder of secret `name` in sandbox `sid`: stk_ph_ and 32 of a-z2-7."""
    digest = hmac.new(key, f"{sid}\0{name}".encode(), hashlib.sha256).digest()
    return PLACEHOLDER_PREFIX + base64.b32encode(digest).decode()[:PLACEHOLDER_CHARS].lower()


def installation_key(state_dir: Path) -> bytes:
    """The key placeholders are derived with: made once (32 random bytes, 0600), then read."""
    path = state_dir / KEY_FILE
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as out:
            out.write(os.urandom(32))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ConfigError(f"{path} is not a regular file: remove it to make anew")
            if info.st_mode & 0o077:
                os.fchmod(fd, 0o600)
            data = os.read(fd, 64)
        finally:
            os.close(fd)
    except OSError as exc:
        raise ConfigError(f"cannot read the placeholder key {path}: {exc.strerror}") from exc
    if len(data) != 32:
        raise ConfigError(f"{path} is not a placeholder key (32 bytes): remove it to make anew")
    return data


@dataclass(frozen=True)
class SecretChanges:
    """What a reload changed in `[secrets]`, by name (never a value)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerParts:
    """What a container gets for its brokered secrets: variables and read-only mounts."""

    environment: dict[str, str]
    mounts: tuple[BindMount, ...] = ()


class Brokering:
    """The brokered secrets of this supervisor's sandboxes. `ca_pem`: the egress CA's
    certificate (PEM), read when a sandbox first needs it."""

    def __init__(self, config: Config, ca_pem: Callable[[], bytes]) -> None:
        self._config = config
        self._secrets: Mapping[str, SecretConfig] = MappingProxyType(dict(config.secrets))
        """Swapped whole by reload(), never changed in place: a reader holds one snapshot."""
        self._ca_pem = ca_pem
        self._key: bytes | None = None
        self._told: set[str] = set()

    @property
    def enabled(self) -> bool:
        return bool(self._secrets)

    def _installation_key(self) -> bytes:
        if self._key is None:
            self._key = installation_key(self._config.state_dir)
        return self._key

    def applying(self, key: str, profile: str) -> list[tuple[str, SecretConfig]]:
        """The secrets a sandbox of this key and profile ("": [sandbox]) gets."""
        tenant = split(key)[0]
        return [
            (name, secret)
            for name, secret in self._secrets.items()
            if (not secret.tenants or tenant in secret.tenants)
            and (not secret.profiles or (profile or "base") in secret.profiles)
        ]

    def reload(self, secrets: Mapping[str, SecretConfig]) -> SecretChanges:
        """Take the reloaded `[secrets]` (checked at load) in one swap: containers made from
        now on get them; running ones are given rebroker()'s. What changed, by name."""
        old, new = self._secrets, MappingProxyType(dict(secrets))
        self._secrets = new
        return SecretChanges(
            added=tuple(sorted(new.keys() - old.keys())),
            removed=tuple(sorted(old.keys() - new.keys())),
            changed=tuple(sorted(n for n in old.keys() & new.keys() if _differ(old[n], new[n]))),
        )

    def rebroker(self, old: Broker, key: str, profile: str) -> Broker:
        """A running sandbox's Broker after a reload: each secret its container holds a
        placeholder of, as configured now (a new value, hosts or place take effect), or
        retired when it is gone or no longer applies to the sandbox (its placeholder then
        refused); a secret added since is not given (the container has no variable for it:
        it comes with the next container)."""
        now = dict(self.applying(key, profile))
        secrets = []
        for held in old.secrets:
            secret = now.get(held.name)
            if secret is None or held.retired:
                secrets.append(replace(held, value="", retired=True))
            else:
                secrets.append(replace(
                    held, value=secret.value, hosts=secret.hosts, injection=_injection(secret)
                ))  # fmt: skip
        return Broker(tuple(secrets), everything=old.everything)

    def broker(self, key: str, sid: str, profile: str) -> Broker:
        """What the sandbox's egress proxy is given (empty: nothing intercepted)."""
        if not self._secrets:
            return Broker()
        ikey = self._installation_key()
        return Broker(
            tuple(
                BrokeredSecret(
                    name=name,
                    value=secret.value,
                    placeholder=placeholder(ikey, sid, name),
                    hosts=secret.hosts,
                    injection=_injection(secret),
                )
                for name, secret in self.applying(key, profile)
            ),
            everything=self._config.network.intercept == "all",
        )

    def container_parts(
        self, key: str, sid: str, profile: str, mode: str, folder: Path
    ) -> ContainerParts:
        """The placeholders' variables and the trust for a new container of `key` (its host
        folder `folder`); nothing when no secret applies, or on a network other than egress
        (then a placeholder would be of no use: said once per key in the log)."""
        applying = self.applying(key, profile) if key else []
        if not applying:
            return ContainerParts({})
        if mode != "egress":
            if key not in self._told:
                self._told.add(key)
                log.warning(
                    "sandbox %r: no brokered secrets (%s): its network is %r, and only the "
                    "egress proxy adds them",
                    shown(key), ", ".join(name for name, _ in applying), mode,
                )  # fmt: skip
            return ContainerParts({})
        ikey = self._installation_key()
        environment = {s.sandbox_env: placeholder(ikey, sid, name) for name, s in applying}
        bundle, ca = self.write_trust(folder / TRUST_FOLDER)
        environment.update(
            {
                "SSL_CERT_FILE": SANDBOX_BUNDLE,
                "REQUESTS_CA_BUNDLE": SANDBOX_BUNDLE,
                "CURL_CA_BUNDLE": SANDBOX_BUNDLE,
                "GIT_SSL_CAINFO": SANDBOX_BUNDLE,
                "NODE_EXTRA_CA_CERTS": SANDBOX_CA,
            }
        )
        mounts = (
            BindMount(str(bundle), SANDBOX_BUNDLE, read_only=True),
            BindMount(str(ca), SANDBOX_CA, read_only=True),
        )
        return ContainerParts(environment, mounts)

    def write_trust(self, folder: Path) -> tuple[Path, Path]:
        """The bundle (the host's CAs and the egress CA) and the egress CA alone, written
        anew (0644: the sandbox user reads them; they hold no key)."""
        ca = self._ca_pem()
        host = _host_bundle()
        folder.mkdir(mode=0o755, exist_ok=True)
        os.chmod(folder, 0o755)
        bundle, alone = folder / BUNDLE, folder / CA_ALONE
        for path, data in ((bundle, host.rstrip(b"\n") + b"\n" + ca), (alone, ca)):
            partial = path.with_name(path.name + ".partial")
            partial.unlink(missing_ok=True)
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.chmod(partial, 0o644)
            partial.rename(path)
        return bundle, alone


def _differ(old: SecretConfig, new: SecretConfig) -> bool:
    """Whether a secret's settings or value changed (its value is left out of ==)."""
    return old != new or not hmac.compare_digest(old.value.encode(), new.value.encode())


def _injection(secret: SecretConfig) -> Injection:
    if secret.basic_user:
        return Injection("basic", username=secret.basic_user)
    return Injection("header", header=secret.header or "Authorization", template=secret.template)


def _host_bundle() -> bytes:
    """The host's CA certificates (what the sandbox trusted before): Debian's bundle, or
    Fedora's, or OpenSSL's default file."""
    candidates = [*HOST_BUNDLES, ssl.get_default_verify_paths().openssl_cafile]
    for candidate in candidates:
        try:
            return Path(candidate).read_bytes()
        except OSError:
            continue
    log.warning("no CA bundle on this host: sandboxes with brokered secrets trust the egress CA")
    return b""
