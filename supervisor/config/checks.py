"""Checks of one section of the Config each, as it is made: what the types cannot say
(ranges, formats, one setting of a section against another). A value that would make a check
fail open (NaN, infinity) is refused here, at load. Also the checks of single values that
sections and fronts share (a number of seconds, host:port, a loopback address).

root.py calls these (and runs the checks that read more than one section). This module
imports the section modules, never root.py; no section module imports it (honey.py,
quarantine.py and secrets.py keep their own checks, which need nothing of it)."""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from stockade.supervisor.config.allowlist import AllowlistError, check_pattern
from stockade.supervisor.config.console import MAX_SESSION_S, ConsoleConfig
from stockade.supervisor.config.policy import FILE_APPROVAL_TOOLS
from stockade.supervisor.config.sandbox import AGENT_UID, KubernetesConfig, ProfileConfig
from stockade.supervisor.config.service import CHECKPOINT_TRIGGERS, SNAPSHOT_OPERATIONS
from stockade.supervisor.errors import ConfigError, InvalidRequest
from stockade.supervisor.keys import validate_key, validate_tenant

INTERCEPT_MODES = ("brokered", "all")

if TYPE_CHECKING:
    from stockade.supervisor.config.sandbox import HousekeepingConfig, NetworkConfig
    from stockade.supervisor.config.service import (
        AuditConfig,
        AuthConfig,
        CheckpointsConfig,
        E2bConfig,
        McpConfig,
        ObservabilityConfig,
        SnapshotsConfig,
        StateConfig,
        TenantConfig,
    )

MAX_RUNTIME_CHARS = 4096
RUNTIME_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
MAX_ID = 0xFFFFFFFE
USER_IDS = re.compile(r"[0-9]{1,10}(:[0-9]{1,10})?", re.ASCII)
MAX_WARM_POOL = 64
MAX_AUDIT_DAYS = 36500.0
MAX_AUDIT_MB = 1 << 24
"""16 TiB: more is a mistake (SQLite's own limit is near 281 TB)."""
MAX_SECONDS = 10 * 365 * 86400.0
"""Longest timer accepted (ten years): beyond it a value is a mistake, and an infinite or
NaN one would never compare as intended."""


def check_seconds(name: str, value: float) -> None:
    """A positive, finite number (of seconds, or per second) up to MAX_SECONDS."""
    if not math.isfinite(value) or value > MAX_SECONDS:
        raise ConfigError(f"{name} must be a finite number up to {MAX_SECONDS:.0f}, got {value}")


def split_host_port(value: str, name: str) -> tuple[str, int]:
    """("127.0.0.1", 9464) from "127.0.0.1:9464" ("[::1]:9464" for IPv6)."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{name} must be host:port, got {value!r}")
    return host, int(port)


def check_loopback(listen: str, name: str, front: str) -> None:
    """A plain-HTTP front listens on a loopback address only: bearer tokens must not cross
    a network in clear text."""
    host, _port = split_host_port(listen, name)
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(
            f"{name} must be a loopback address (127.0.0.1, [::1] or localhost): the "
            f"{front} front speaks plain HTTP, got {listen!r}"
        )


DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
LABEL_NAME = re.compile(
    r"([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?"
)
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
"""An environment variable name Kubernetes takes (and a Secret key after "env.")."""
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
STATE_SCHEMES = ("postgresql://", "postgres://")


def check_kubernetes(kube: KubernetesConfig) -> None:
    if not DNS_LABEL.fullmatch(kube.namespace):
        raise ConfigError(
            f"kubernetes.namespace must be a DNS label (a-z, 0-9, '-'; at most 63), "
            f"got {kube.namespace!r}"
        )
    for name, value in (("ca_secret", kube.ca_secret), ("runtime_class", kube.runtime_class)):
        if (value or name == "ca_secret") and not DNS_SUBDOMAIN.fullmatch(value):
            raise ConfigError(f"kubernetes.{name} must be a DNS subdomain name, got {value!r}")
    if kube.workspace not in ("pvc", "emptydir"):
        raise ConfigError(f"kubernetes.workspace must be pvc or emptydir, got {kube.workspace!r}")
    if kube.storage_class and not DNS_SUBDOMAIN.fullmatch(kube.storage_class):
        raise ConfigError(f"kubernetes.storage_class is not a name: {kube.storage_class!r}")
    for name, mb in (
        ("workspace_size_mb", kube.workspace_size_mb),
        ("ephemeral_storage_mb", kube.ephemeral_storage_mb),
    ):
        if not 0 < mb <= MAX_AUDIT_MB:
            raise ConfigError(f"kubernetes.{name} must be between 1 and {MAX_AUDIT_MB}, got {mb}")
    if not 0 < kube.agent_port < 65536:
        raise ConfigError(f"kubernetes.agent_port must be a port, got {kube.agent_port}")
    if not (math.isfinite(kube.ready_timeout_s) and 0 < kube.ready_timeout_s <= MAX_SECONDS):
        raise ConfigError(
            f"kubernetes.ready_timeout_s must be positive, got {kube.ready_timeout_s}"
        )
    if kube.image_pull_policy not in PULL_POLICIES:
        raise ConfigError(
            f"kubernetes.image_pull_policy must be one of {', '.join(PULL_POLICIES)}, "
            f"got {kube.image_pull_policy!r}"
        )
    if not kube.supervisor_labels:
        raise ConfigError("kubernetes.supervisor_labels must name the supervisor pods' labels")
    for name, value in kube.supervisor_labels.items():
        if not LABEL_NAME.fullmatch(name) or not LABEL_VALUE.fullmatch(value):
            raise ConfigError(f"kubernetes.supervisor_labels: not a label: {name}={value!r}")
    if kube.egress_proxy:
        host, _, port = kube.egress_proxy.rpartition(":")
        if (
            not host
            or not DNS_SUBDOMAIN.fullmatch(host)
            or not port.isdigit()
            or not 0 < int(port) < 65536
        ):
            raise ConfigError(
                f"kubernetes.egress_proxy must be host:port, got {kube.egress_proxy!r}"
            )
    listen_host, listen_port = split_host_port(kube.egress_listen, "kubernetes.egress_listen")
    try:
        ipaddress.ip_address(listen_host)
    except ValueError:
        listen_port = 0
    if not listen_port:
        raise ConfigError(
            "kubernetes.egress_listen must be an IP address and a port (0.0.0.0:3128), "
            f"got {kube.egress_listen[:100]!r}"
        )
    if kube.seccomp_profile and (
        kube.seccomp_profile.startswith("/") or ".." in Path(kube.seccomp_profile).parts
    ):
        raise ConfigError(
            "kubernetes.seccomp_profile is a path relative to the kubelet's seccomp folder, "
            f"got {kube.seccomp_profile!r}"
        )


def check_state(state: StateConfig) -> None:
    if state.url and not state.url.startswith(STATE_SCHEMES):
        raise ConfigError(
            "state.url must be a postgresql:// URL (or empty: SQLite in state_dir), "
            "got a URL of another scheme"
        )


PROFILE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
MAX_CPUS = 1024.0


def check_profiles(profiles: Mapping[str, ProfileConfig]) -> None:
    for name, profile in profiles.items():
        where = f"profiles.{name}"
        if not PROFILE_NAME.fullmatch(name) or name == "base":
            raise ConfigError(
                f"[{where}]: a profile name is 1 to 64 of a-z, 0-9, '.', '_' and '-', starting "
                "with a letter or digit, and not 'base' (the name of the [sandbox] defaults)"
            )
        if not (math.isfinite(profile.cpus) and 0 <= profile.cpus <= MAX_CPUS):
            raise ConfigError(f"{where}.cpus must be 0 ([sandbox] cpus) to {MAX_CPUS:g}")
        if profile.memory_mb != 0 and not 16 <= profile.memory_mb <= 1 << 22:
            raise ConfigError(f"{where}.memory_mb must be 0 ([sandbox] memory_mb) or 16 to 4194304")
        if profile.image != profile.image.strip() or any(c.isspace() for c in profile.image):
            raise ConfigError(f"{where}.image must be an image reference without spaces")
        if not 0 <= profile.warm_pool <= MAX_WARM_POOL:
            raise ConfigError(
                f"{where}.warm_pool must be between 0 and {MAX_WARM_POOL}, got {profile.warm_pool}"
            )


def check_warm_pools(hk: HousekeepingConfig, profiles: Mapping[str, ProfileConfig]) -> None:
    """The pools of every profile together keep at most MAX_WARM_POOL containers."""
    total = hk.warm_pool + sum(p.warm_pool for p in profiles.values())
    if total > MAX_WARM_POOL:
        raise ConfigError(
            f"the warm pools keep {total} containers together (housekeeping.warm_pool and "
            f"each [profiles.NAME] warm_pool): at most {MAX_WARM_POOL}"
        )


def check_observability(obs: ObservabilityConfig) -> None:
    if obs.metrics_listen:
        split_host_port(obs.metrics_listen, "observability.metrics_listen")
    if obs.trace_exporter == "otlp" and not obs.trace_endpoint.startswith(("http://", "https://")):
        raise ConfigError(
            f"observability.trace_endpoint must be an http(s) URL, got {obs.trace_endpoint!r}"
        )


def check_runtime(runtime: str) -> None:
    """A runtime name or absolute path; it reaches the engine's command line and API, so
    nothing that could read as a flag or carry more than one word."""
    if not runtime:
        return
    if len(runtime) > MAX_RUNTIME_CHARS:
        raise ConfigError(f"sandbox.runtime is longer than {MAX_RUNTIME_CHARS} characters")
    if runtime.startswith("/"):
        ok = all(c.isprintable() and not c.isspace() for c in runtime) and ".." not in runtime
        what = "an absolute path without spaces, control characters or '..'"
    else:
        ok = bool(RUNTIME_NAME.fullmatch(runtime))
        what = "a name of letters, digits, '.', '_', '+' and '-' (not first), or an absolute path"
    if not ok:
        raise ConfigError(f"sandbox.runtime must be {what}, got {runtime[:80]!r}")


def check_user(user: str) -> None:
    if not USER_IDS.fullmatch(user):
        raise ConfigError(f"sandbox.user must be UID:GID in digits, got {user[:40]!r}")
    uid, _, gid = user.partition(":")
    if int(uid) == 0 or int(gid or uid) == 0:
        raise ConfigError("sandbox.user must not be root")
    if AGENT_UID in (int(uid), int(gid or uid)) or max(int(uid), int(gid or uid)) > MAX_ID:
        raise ConfigError(
            f"sandbox.user must not be {AGENT_UID} (the agent's own user) nor above {MAX_ID}, "
            f"got {user!r}"
        )


def check_housekeeping(hk: HousekeepingConfig) -> None:
    timers = {
        "idle_timeout_s": hk.idle_timeout_s,
        "max_age_s": hk.max_age_s,
        "idle_pause_s": hk.idle_pause_s,
        "workspace_retention_s": hk.workspace_retention_s,
        "sweep_interval_s": hk.sweep_interval_s,
        "shutdown_grace_s": hk.shutdown_grace_s,
    }
    for name, value in timers.items():
        if not 0 <= value <= MAX_SECONDS:  # also false for NaN
            raise ConfigError(
                f"housekeeping.{name} must be between 0 and {MAX_SECONDS:.0f} s, got {value}"
            )
    if hk.idle_action == "pause" and not 0 < hk.idle_pause_s < (hk.idle_timeout_s or math.inf):
        raise ConfigError(
            'housekeeping.idle_action = "pause" needs idle_pause_s above 0 and below '
            f"idle_timeout_s (else the sandbox is removed before it is paused), got "
            f"idle_pause_s {hk.idle_pause_s:g} and idle_timeout_s {hk.idle_timeout_s:g}"
        )
    if hk.sweep_interval_s < 0.05:
        raise ConfigError(
            f"housekeeping.sweep_interval_s must be at least 0.05 s, got {hk.sweep_interval_s}"
        )
    if not 0 <= hk.warm_pool <= MAX_WARM_POOL:
        raise ConfigError(
            f"housekeeping.warm_pool must be between 0 and {MAX_WARM_POOL}, got {hk.warm_pool}"
        )
    for name, mb in {
        "min_free_memory_mb": hk.min_free_memory_mb,
        "min_free_disk_mb": hk.min_free_disk_mb,
    }.items():
        if mb < 0:
            raise ConfigError(f"housekeeping.{name} must not be negative (0: no check), got {mb}")


def check_audit(audit: AuditConfig) -> None:
    if not 0 <= audit.max_age_days <= MAX_AUDIT_DAYS:  # also false for NaN
        raise ConfigError(
            f"audit.max_age_days must be between 0 (no limit) and {MAX_AUDIT_DAYS:.0f}, "
            f"got {audit.max_age_days}"
        )
    if audit.max_size_mb != 0 and not 1 <= audit.max_size_mb <= MAX_AUDIT_MB:
        raise ConfigError(
            f"audit.max_size_mb must be 0 (no limit) or between 1 and {MAX_AUDIT_MB}, "
            f"got {audit.max_size_mb}"
        )
    if not 0.05 <= audit.trim_interval_s <= 86400:
        raise ConfigError(
            f"audit.trim_interval_s must be between 0.05 and 86400 s, got {audit.trim_interval_s}"
        )
    if not 1 <= audit.checkpoint_interval_s <= 86400:
        raise ConfigError(
            "audit.checkpoint_interval_s must be between 1 and 86400 s, "
            f"got {audit.checkpoint_interval_s}"
        )
    if audit.signing_key and not Path(audit.signing_key).is_absolute():
        raise ConfigError(f"audit.signing_key must be an absolute path, got {audit.signing_key!r}")
    if audit.export_dir and not Path(audit.export_dir).is_absolute():
        raise ConfigError(f"audit.export_dir must be an absolute path, got {audit.export_dir!r}")
    if "\0" in audit.export_dir:
        raise ConfigError("audit.export_dir must not contain a NUL character")


def check_network(net: NetworkConfig) -> None:
    try:
        for pattern in net.allow:
            check_pattern(pattern)
    except AllowlistError as exc:
        raise ConfigError(f"network.allow: {exc}") from exc
    for port in (*net.ports, net.proxy_port):
        if not 0 < port < 65536:
            raise ConfigError(f"network: port {port} is out of range")
    for name, address in net.hosts.items():
        try:
            ipaddress.ip_address(address)
        except ValueError as exc:
            raise ConfigError(f"network.hosts.{name}: {address!r} is not an IP address") from exc
    try:
        subnet = ipaddress.IPv4Network(net.subnet)
    except ValueError as exc:
        raise ConfigError(f"network.subnet: {exc}") from exc
    if subnet.num_addresses < 4:
        raise ConfigError("network.subnet needs at least two host addresses (/30)")
    if net.bandwidth_kbit < 0 or net.max_connections <= 0:
        raise ConfigError("network.bandwidth_kbit >= 0 and network.max_connections > 0")
    if net.connect_timeout_s <= 0 or net.idle_timeout_s <= 0:
        raise ConfigError("network timeouts must be positive")
    if net.intercept not in INTERCEPT_MODES:
        raise ConfigError(
            f"network.intercept must be one of {', '.join(INTERCEPT_MODES)}, "
            f"got {net.intercept[:100]!r}"
        )
    ca = net.upstream_ca_file
    if ca and (not ca.startswith("/") or "\0" in ca or not Path(ca).is_file()):
        raise ConfigError(
            f"network.upstream_ca_file must be the absolute path of a PEM file, got {ca[:200]!r}"
        )


def check_auth(auth: AuthConfig, tenants: Mapping[str, TenantConfig]) -> None:
    if bool(auth.tls_cert) != bool(auth.tls_key):
        raise ConfigError("auth.tls_cert and auth.tls_key go together")
    if auth.client_ca and not auth.tls_cert:
        raise ConfigError("auth.client_ca (mutual TLS) needs auth.tls_cert and auth.tls_key")
    if auth.client_certs and not auth.client_ca:
        raise ConfigError("auth.client_certs needs auth.client_ca")
    if auth.enabled is False and (auth.tokens_file or auth.client_ca):
        raise ConfigError("auth.enabled = false, yet auth.tokens_file or auth.client_ca is set")
    names = [*auth.client_certs.values(), *(t for t in tenants if t != "*")]
    try:
        for name in names:
            validate_tenant(name)
    except InvalidRequest as exc:
        raise ConfigError(str(exc)) from None
    for name, limits in tenants.items():
        if limits.max_sandboxes < 0 or limits.max_memory_mb < 0:
            raise ConfigError(f"tenants.{name}: limits must not be negative (0: no limit)")
        if limits.max_snapshots < -1 or limits.max_snapshot_mb < -1:
            raise ConfigError(
                f"tenants.{name}: snapshot limits are -1 (the [snapshots] default), 0 (no "
                "limit) or a positive number"
            )
        if limits.snapshot_operations is not None:
            _check_snapshot_operations(limits.snapshot_operations, f"tenants.{name}")


def check_snapshots(snaps: SnapshotsConfig) -> None:
    _check_snapshot_operations(snaps.operations, "snapshots")
    if snaps.max_count < 0 or snaps.max_mb < 0:
        raise ConfigError("snapshots.max_count and max_mb must not be negative (0: no limit)")
    if snaps.dir and not snaps.dir.startswith("/"):
        raise ConfigError(f"snapshots.dir must be an absolute path, got {snaps.dir!r}")


MAX_CHECKPOINTS = 1000


def check_checkpoints(points: CheckpointsConfig) -> None:
    unknown = sorted(set(points.before) - set(CHECKPOINT_TRIGGERS))
    if unknown:
        raise ConfigError(
            f"checkpoints.before: unknown {unknown}; known: {list(CHECKPOINT_TRIGGERS)}"
        )
    if not 1 <= points.keep <= MAX_CHECKPOINTS:
        raise ConfigError(f"checkpoints.keep must be 1 to {MAX_CHECKPOINTS}, got {points.keep}")
    if points.max_mb < 0:
        raise ConfigError("checkpoints.max_mb must not be negative (0: bounded by keep alone)")


def check_approval_files(tools: tuple[str, ...]) -> None:
    unknown = sorted(set(tools) - set(FILE_APPROVAL_TOOLS))
    if unknown:
        raise ConfigError(f"approvals.files: unknown {unknown}; known: {list(FILE_APPROVAL_TOOLS)}")


def _check_snapshot_operations(operations: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(operations) - set(SNAPSHOT_OPERATIONS))
    if unknown:
        raise ConfigError(
            f"{where}.snapshot operations: unknown {unknown}; known: {list(SNAPSHOT_OPERATIONS)}"
        )


MCP_PATH = re.compile(r"/[A-Za-z0-9._~/-]{0,255}")


def check_mcp(mcp: McpConfig) -> None:
    """The MCP endpoint: plain HTTP, so on a loopback address only (bearer tokens must not
    cross a network in clear text); a plain path; a usable key."""
    if mcp.listen:
        check_loopback(mcp.listen, "mcp.listen", "MCP")
    if not MCP_PATH.fullmatch(mcp.path) or "//" in mcp.path or "/." in mcp.path:
        raise ConfigError(
            f"mcp.path must be an absolute URL path of letters, digits and ._~-/ (e.g. /mcp), "
            f"got {mcp.path[:80]!r}"
        )
    if mcp.key:
        try:
            validate_key(mcp.key)
        except InvalidRequest as exc:
            raise ConfigError(f"mcp.key: {exc}") from None
    idle = mcp.session_idle_timeout_s
    if not (math.isfinite(idle) and idle > 0):
        raise ConfigError(f"mcp.session_idle_timeout_s must be a positive number, got {idle}")


def check_e2b(e2b: E2bConfig) -> None:
    """The E2B endpoint: plain HTTP on a loopback address only; timeouts in range."""
    if e2b.listen:
        check_loopback(e2b.listen, "e2b.listen", "E2B")
    if not 1 <= e2b.max_timeout_s <= MAX_SECONDS:
        raise ConfigError(f"e2b.max_timeout_s must be between 1 and {MAX_SECONDS:.0f}")
    if not 1 <= e2b.default_timeout_s <= e2b.max_timeout_s:
        raise ConfigError(
            f"e2b.default_timeout_s must be between 1 and e2b.max_timeout_s "
            f"({e2b.max_timeout_s}), got {e2b.default_timeout_s}"
        )
    sweep = e2b.sweep_interval_s
    if not (math.isfinite(sweep) and 0 < sweep <= 3600):
        raise ConfigError(f"e2b.sweep_interval_s must be in (0, 3600], got {sweep}")


def check_console(console: ConsoleConfig) -> None:
    """The console: plain HTTP, so on a loopback address only; operators that are tenant
    names; a session and a refresh period in range."""
    if console.listen:
        check_loopback(console.listen, "console.listen", "console")
    for name in console.operators:
        try:
            validate_tenant(name)
        except Exception as exc:
            raise ConfigError(f"console.operators: {exc}") from None
    if not 60 <= console.session_ttl_s <= MAX_SESSION_S:
        raise ConfigError(
            f"console.session_ttl_s must be between 60 and {MAX_SESSION_S:.0f}, "
            f"got {console.session_ttl_s}"
        )
    if not 0.2 <= console.refresh_s <= 60:
        raise ConfigError(f"console.refresh_s must be between 0.2 and 60, got {console.refresh_s}")
