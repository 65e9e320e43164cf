"""Brokered secrets (`[secrets.NAME]`, docs/secrets.md): credentials the sandbox never holds.
The egress proxy puts the real value into requests to the secret's hosts; the sandbox has a
placeholder in the variable `sandbox_env`. The value comes from a host file or a host
environment variable, read once when the configuration is made (checks below), and is kept
out of every repr and error."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stockade.supervisor.config.allowlist import AllowlistError, check_pattern, shown
from stockade.supervisor.errors import ConfigError, InvalidRequest
from stockade.supervisor.keys import validate_tenant

MAX_SECRETS = 64
MAX_HOSTS = 64
MAX_VALUE_BYTES = 8192
MIN_VALUE_CHARS = 8
"""Shorter values are refused: the scrubber hides literals of 8 characters or more, and a
short one would also turn up by chance in ordinary output."""
MAX_TEMPLATE_CHARS = 256
SECRET_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}")
"""An HTTP field name (RFC 9110 token), at most 64 characters."""
FRAMING_HEADERS = frozenset(
    {
        "host", "content-length", "transfer-encoding", "connection", "upgrade", "te",
        "trailer", "keep-alive", "proxy-connection", "proxy-authorization", "expect",
    }
)  # fmt: skip
"""Headers that steer the connection or the framing, never a place for a credential."""
RESERVED_ENV = frozenset(
    {
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
        "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
        "NODE_EXTRA_CA_CERTS", "NODE_OPTIONS", "PATH", "HOME", "PYTHONPATH",
    }
)  # fmt: skip
"""Variables the supervisor sets itself (the proxy, the trust bundle) or the image needs."""


@dataclass(frozen=True)
class SecretConfig:
    """One brokered secret, `[secrets.NAME]`."""

    file: str = ""
    """An absolute path of a host file holding the value (one trailing newline dropped); it
    must not be readable or writable by other users (chmod o-rwx)."""
    env: str = ""
    """Or: the name of a variable of the supervisor's environment holding the value."""
    hosts: tuple[str, ...] = ()
    """Where it may be sent: exact names and wildcards ("*.example.com": any name under it,
    not the name itself). No IP addresses, no bare "*"."""
    header: str = ""
    """The request header it goes in (with `template`; default Authorization)."""
    template: str = ""
    """The header's value, with `{secret}` once where the secret goes: "Bearer {secret}"."""
    basic_user: str = ""
    """Or: HTTP basic authentication with this user name, the secret as the password."""
    sandbox_env: str = ""
    """The sandbox's variable that holds the placeholder (e.g. GITHUB_TOKEN)."""
    tenants: tuple[str, ...] = ()
    """The tenants whose sandboxes get it; empty: all."""
    profiles: tuple[str, ...] = ()
    """The profiles ("base": [sandbox]) whose sandboxes get it; empty: all."""
    value: str = field(default="", init=False, repr=False, compare=False)
    """The real value, read when the configuration is made: never from the config file,
    never in a repr or an error."""

    def load(self, value: str) -> None:
        object.__setattr__(self, "value", value)


def check_secrets(
    secrets: Mapping[str, SecretConfig],
    *,
    network_mode: str,
    profiles: Mapping[str, object],
    sandbox_env: Mapping[str, str],
) -> None:
    """Every `[secrets.NAME]`, its value read (from its file or variable) on the way;
    ConfigError naming the key, never showing the value."""
    if not secrets:
        return
    if len(secrets) > MAX_SECRETS:
        raise ConfigError(f"secrets: at most {MAX_SECRETS} brokered secrets, got {len(secrets)}")
    if network_mode != "egress":
        raise ConfigError(
            f'[secrets] needs sandbox.network = "egress" (it is {network_mode!r}): a '
            "brokered secret is put into requests by the egress proxy, the only way a "
            "sandbox reaches its hosts"
        )
    taken: dict[str, str] = {}
    for name, secret in secrets.items():
        where = f"secrets.{name}"
        if not SECRET_NAME.fullmatch(name):
            raise ConfigError(
                f"[{shown(where)}]: a secret's name is 1 to 64 of a-z, 0-9, '_' and '-', "
                "starting with a letter or digit"
            )
        _check_hosts(where, secret.hosts)
        _check_placement(where, secret)
        _check_sandbox_env(where, secret.sandbox_env, taken, sandbox_env)
        taken[secret.sandbox_env] = name
        for tenant in secret.tenants:
            try:
                validate_tenant(tenant)
            except InvalidRequest as exc:
                raise ConfigError(f"{where}.tenants: {exc}") from None
        for profile in secret.profiles:
            if profile != "base" and profile not in profiles:
                raise ConfigError(
                    f"{where}.profiles: no profile {shown(profile)} (known: base"
                    f"{''.join(', ' + p for p in sorted(profiles))})"
                )
        secret.load(_read_value(where, secret))


def _check_hosts(where: str, hosts: tuple[str, ...]) -> None:
    if not hosts:
        raise ConfigError(f"{where}.hosts must name at least one host it may be sent to")
    if len(hosts) > MAX_HOSTS:
        raise ConfigError(f"{where}.hosts: at most {MAX_HOSTS} names, got {len(hosts)}")
    for host in hosts:
        if host.strip() in ("*", "*."):
            raise ConfigError(f"{where}.hosts: a bare '*' would send the secret anywhere")
        try:
            canonical = check_pattern(host)
        except AllowlistError as exc:
            raise ConfigError(f"{where}.hosts: {exc}") from None
        if canonical != host:
            raise ConfigError(
                f"{where}.hosts: write {shown(host)} as {canonical!r} (lower case, no "
                "trailing dot, IDNA), the form the proxy compares"
            )


def _check_placement(where: str, secret: SecretConfig) -> None:
    if secret.basic_user:
        if secret.header or secret.template:
            raise ConfigError(
                f"{where}: basic_user (HTTP basic authentication) goes without header and "
                "template; set one or the other"
            )
        user = secret.basic_user
        if len(user) > 128 or ":" in user or not _printable(user) or user != user.strip():
            raise ConfigError(
                f"{where}.basic_user must be at most 128 printable ASCII characters without "
                "':' or surrounding spaces"
            )
        return
    if not secret.template:
        raise ConfigError(
            f"{where}: say where the secret goes: template (with header) or basic_user"
        )
    template = secret.template
    if len(template) > MAX_TEMPLATE_CHARS or not _printable(template):
        raise ConfigError(
            f"{where}.template must be at most {MAX_TEMPLATE_CHARS} printable ASCII characters"
        )
    if template.count("{secret}") != 1:
        raise ConfigError(
            f'{where}.template must contain {{secret}} exactly once, e.g. "Bearer {{secret}}"'
        )
    header = secret.header or "Authorization"
    if not HEADER_NAME.fullmatch(header):
        raise ConfigError(f"{where}.header must be an HTTP header name, got {shown(header)}")
    if header.lower() in FRAMING_HEADERS:
        raise ConfigError(
            f"{where}.header: {header} steers the connection or the framing of a request; "
            "it cannot carry a credential"
        )


def _check_sandbox_env(
    where: str, variable: str, taken: Mapping[str, str], sandbox_env: Mapping[str, str]
) -> None:
    if not variable:
        raise ConfigError(
            f"{where}.sandbox_env must name the sandbox's variable, e.g. GITHUB_TOKEN"
        )
    if not ENV_VAR.fullmatch(variable):
        raise ConfigError(
            f"{where}.sandbox_env must be a variable name (letters, digits, '_'; not first a "
            f"digit; at most 128), got {shown(variable)}"
        )
    if variable in RESERVED_ENV or variable.startswith("STOCKADE_"):
        raise ConfigError(f"{where}.sandbox_env: {variable} is set by the supervisor itself")
    if variable in taken:
        raise ConfigError(f"{where}.sandbox_env: {variable} is also secrets.{taken[variable]}'s")
    if variable in sandbox_env:
        raise ConfigError(f"{where}.sandbox_env: {variable} is also in [sandbox] secrets")


def _read_value(where: str, secret: SecretConfig) -> str:
    if bool(secret.file) == bool(secret.env):
        raise ConfigError(f"{where}: give exactly one of file and env (where the value is)")
    if secret.env:
        if not ENV_VAR.fullmatch(secret.env):
            raise ConfigError(f"{where}.env must be a variable name, got {shown(secret.env)}")
        raw = os.environ.get(secret.env)
        if not raw:
            raise ConfigError(f"{where}.env: the variable {secret.env} is not set or empty")
        origin = f"{where}.env ({secret.env})"
    else:
        raw = _read_file(where, secret.file)
        origin = f"{where}.file"
    value = raw[:-1] if raw.endswith("\n") else raw
    value = value[:-1] if value.endswith("\r") else value
    if len(value.encode("utf-8", "surrogatepass")) > MAX_VALUE_BYTES:
        raise ConfigError(f"{origin}: the value is longer than {MAX_VALUE_BYTES} bytes")
    if not _printable(value) or value != value.strip():
        raise ConfigError(
            f"{origin}: the value must be printable ASCII without surrounding spaces or "
            "line breaks (it goes into an HTTP header)"
        )
    if len(value) < MIN_VALUE_CHARS:
        raise ConfigError(
            f"{origin}: the value is shorter than {MIN_VALUE_CHARS} characters (too short to "
            "be told apart from ordinary output and scrubbed from it)"
        )
    if value.startswith("stk_ph_"):
        raise ConfigError(f"{origin}: the value is a placeholder, not a secret")
    return value


def _read_file(where: str, file: str) -> str:
    if not file.startswith("/") or "\0" in file:
        raise ConfigError(f"{where}.file must be an absolute path")
    path = Path(file)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{where}.file: cannot open {file}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{where}.file: {file} is not a regular file")
        if info.st_mode & 0o007:
            raise ConfigError(
                f"{where}.file: {file} is open to other users (mode "
                f"{stat.S_IMODE(info.st_mode):04o}); chmod o-rwx it"
            )
        if info.st_size > MAX_VALUE_BYTES + 2:
            raise ConfigError(f"{where}.file: the value is longer than {MAX_VALUE_BYTES} bytes")
        data = os.read(fd, MAX_VALUE_BYTES + 3)
    except OSError as exc:
        raise ConfigError(f"{where}.file: cannot read {file}: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}.file: the value must be printable ASCII") from None


def _printable(text: str) -> bool:
    return all(" " <= c <= "~" for c in text)
