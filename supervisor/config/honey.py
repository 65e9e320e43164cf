"""The `[honeytokens]` section: decoy credentials planted in sandboxes (docs/honeytokens.md),
and its checks. A decoy is worthless to anyone who takes it, so the only thing it buys is a
sign: the supervisor knows every decoy it planted and sounds an alarm where one shows up."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from stockade.supervisor.errors import ConfigError, InvalidRequest
from stockade.supervisor.keys import validate_tenant

HONEY_KINDS = ("aws", "github", "netrc", "env")
"""aws: ~/.aws/credentials; github: ~/.config/gh/hosts.yml (the GitHub CLI's token file);
netrc: ~/.netrc; env: an environment variable of the container (env_var)."""
Reaction = Literal["alert", "quarantine"]
MAX_PATHS = 32
MAX_PATH_BYTES = 1024
MAX_NAMES = 1024
ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}", re.ASCII)
RESERVED_ENV = frozenset(
    {"PATH", "HOME", "USER", "SHELL", "PWD", "TERM", "LANG", "TMPDIR", "PYTHONPATH"}
    | {p + "_PROXY" for p in ("HTTP", "HTTPS", "ALL", "NO", "FTP")}
    | {p.lower() + "_proxy" for p in ("HTTP", "HTTPS", "ALL", "NO", "FTP")}
)
"""Variables a decoy must not take: the container needs them (the proxies: network.py)."""
OFF_LIMITS = ("/proc", "/sys", "/dev", "/run/stockade", "/etc", "/usr", "/bin", "/sbin", "/lib")
"""Absolute places a decoy is never planted: the kernel's, the agent's socket, the image's."""


@dataclass(frozen=True)
class HoneytokensConfig:
    """Decoy credentials, unique per sandbox, in the places an attacker looks. Off unless
    enabled; then for every sandbox, or only those of the listed profiles and tenants."""

    enabled: bool = False
    kinds: tuple[str, ...] = HONEY_KINDS
    """Which decoys to plant, of "aws", "github", "netrc" and "env"."""
    paths: tuple[str, ...] = ()
    """More files to plant (a .env-style file of decoys in each): absolute, `~/...` (the
    sandbox user's home) or relative to the workspace. A file that exists is left as it is."""
    workspace_env: bool = False
    """Plant `.env` at the workspace root too (off by default: it writes into the user's
    files; an existing .env is never replaced)."""
    env_var: str = "AWS_SECRET_ACCESS_KEY"
    """The environment variable of the container that holds a decoy (kind "env"): an AWS
    secret access key when its name says AWS and SECRET, else a GitHub-style token."""
    on_read: Reaction = "alert"
    """A decoy in a call's output (it was read): "alert" (alarm only) or "quarantine"."""
    on_use: Reaction = "quarantine"
    """A decoy in a call's arguments, command, input or upload, or a request through the
    egress proxy (it was used): "quarantine" refuses the call and quarantines the sandbox."""
    profiles: tuple[str, ...] = ()
    """Only sandboxes made with these profiles ("base": the [sandbox] defaults); empty: all.
    A caller opts a sandbox in by asking for such a profile (EnsureSandbox `profile`)."""
    tenants: tuple[str, ...] = ()
    """Only sandboxes of these tenants; empty: all."""

    def applies(self, tenant: str, profile: str) -> bool:
        """Whether a sandbox of `tenant` made with `profile` ("" or "base": the default)
        gets decoys."""
        if not self.enabled:
            return False
        if self.tenants and tenant not in self.tenants:
            return False
        return not self.profiles or (profile or "base") in self.profiles


def check_honeytokens(
    honey: HoneytokensConfig,
    *,
    engine_kind: str,
    sandbox_env: Mapping[str, str],
    profiles: Collection[str],
) -> None:
    """ConfigError naming the first wrong [honeytokens] setting, given the settings of the
    other sections it is checked against: engine.kind, [sandbox.secrets] (`sandbox_env`) and
    the names of the [profiles]."""
    if honey.enabled and engine_kind == "kubernetes":
        raise ConfigError(
            "honeytokens are not available with engine.kind = kubernetes yet: each replica "
            "keeps its own honeytoken key, so replicas would not know each other's decoys"
        )
    _check_names("kinds", honey.kinds, HONEY_KINDS)
    if len(honey.paths) > MAX_PATHS:
        raise ConfigError(f"honeytokens.paths: at most {MAX_PATHS} paths, got {len(honey.paths)}")
    seen: set[str] = set()
    for path in honey.paths:
        normal = check_path(path)
        if normal in seen:
            raise ConfigError(f"honeytokens.paths names {path[:80]!r} twice")
        seen.add(normal)
    if not ENV_VAR.fullmatch(honey.env_var) or honey.env_var in RESERVED_ENV:
        raise ConfigError(
            f"honeytokens.env_var {honey.env_var[:80]!r} must be a variable name (letters, "
            "digits and '_', not starting with a digit, at most 128) the container does not "
            "need (not PATH, HOME or a proxy variable)"
        )
    if "env" in honey.kinds and honey.env_var in sandbox_env:
        raise ConfigError(
            f"honeytokens.env_var {honey.env_var!r} is also in [sandbox.secrets]: a decoy "
            "would hide a real secret; name another variable"
        )
    _check_names("profiles", honey.profiles, ("base", *profiles))
    if len(honey.tenants) > MAX_NAMES:
        raise ConfigError(f"honeytokens.tenants: at most {MAX_NAMES} names")
    for tenant in honey.tenants:
        try:
            validate_tenant(tenant)
        except InvalidRequest as exc:
            raise ConfigError(f"honeytokens.tenants: {exc}") from None


def _check_names(name: str, values: tuple[str, ...], known: tuple[str, ...]) -> None:
    if len(values) > MAX_NAMES:
        raise ConfigError(f"honeytokens.{name}: at most {MAX_NAMES} names")
    for value in values:
        if value not in known:
            choices = ", ".join(sorted(known)) or "none"
            raise ConfigError(f"honeytokens.{name}: unknown {value[:80]!r} (known: {choices})")
    if len(set(values)) != len(values):
        raise ConfigError(f"honeytokens.{name} names one twice")


def check_path(path: str) -> str:
    """The path as planted (absolute, `~/...` or workspace-relative, normalised); ConfigError
    for one that is empty, too long, holds a control character or `..`, names a folder, or
    points into the system's or the agent's places."""
    shown = repr(path[:80])
    if not path or len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise ConfigError(f"honeytokens.paths: {shown} must be 1 to {MAX_PATH_BYTES} bytes")
    if any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) < 0xE000 for c in path):
        raise ConfigError(f"honeytokens.paths: {shown} holds a control character")
    if path.endswith("/") or path in ("~", "."):
        raise ConfigError(f"honeytokens.paths: {shown} names a folder; name a file")
    rest = path[2:] if path.startswith("~/") else path
    if path.startswith("~") and not path.startswith("~/"):
        raise ConfigError(f"honeytokens.paths: {shown}: only `~/` (the sandbox user's home)")
    parts = PurePosixPath(rest).parts
    if ".." in rest.split("/") or not parts or parts == ("/",):
        raise ConfigError(f"honeytokens.paths: {shown} must not hold '..' and must name a file")
    normal = str(PurePosixPath(rest))
    if normal.startswith("/") and any(
        normal == top or normal.startswith(top + "/") for top in OFF_LIMITS
    ):
        raise ConfigError(
            f"honeytokens.paths: {shown} is in a system folder ({', '.join(OFF_LIMITS)}); "
            "plant decoys in the home, the workspace or /tmp"
        )
    return ("~/" + normal) if path.startswith("~/") else normal
