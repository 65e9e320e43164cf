"""Supervisor configuration: loaded once (file, then environment, then flags), then frozen.

An unknown key anywhere in the file is an error at load time, never a silent pass.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any, Literal, get_args, get_origin, get_type_hints

from stockade.supervisor.errors import ConfigError, InvalidRequest
from stockade.supervisor.keys import validate_tenant
from stockade.supervisor.network.allowlist import AllowlistError, check_pattern

EngineKind = Literal["podman", "docker"]
NetworkMode = Literal["none", "egress", "open"]
NETWORK_MODES: tuple[NetworkMode, ...] = ("none", "egress", "open")
"""Narrowest first: a request may only ask for a mode at or before the configured one."""
MiB = 1024 * 1024
MAX_RUNTIME_CHARS = 4096
RUNTIME_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
MIN_WORKSPACE_MB = 16
AGENT_UID = 65533
"""The image's stockade-agent user and group, which tini and the agent run as (a constant of
the image's entry point)."""
MAX_ID = 0xFFFFFFFE
USER_IDS = re.compile(r"[0-9]{1,10}(:[0-9]{1,10})?", re.ASCII)
"""Smallest capped workspace: ext4 keeps about 5 MiB of a small file system for itself."""


@dataclass(frozen=True)
class EngineConfig:
    kind: EngineKind = "podman"
    """Which container engine runs the sandboxes."""
    socket: str = ""
    """The engine's API address (unix:///path). Empty: Docker's default socket, or for
    Podman a `podman system service` that the supervisor starts itself."""


@dataclass(frozen=True)
class SandboxConfig:
    image: str = ""
    """Sandbox image; empty means the one `stockade image build` makes for the engine. At start,
    a running sandbox whose container was made from another image than the one this names now
    is re-created from it (workspace kept, processes lost)."""
    user: str = "65532:65532"
    """uid:gid every tool runs as (numbers; never root, never AGENT_UID). The default is the
    image's `sandbox` user, an id of no account on Debian, Ubuntu or Fedora hosts (Debian and
    systemd leave 65520-65533 unused): without a user namespace the container's ids are the
    host's, and a host account's uid would make the sandbox that person. The agent and init
    run as AGENT_UID, out of reach of the tools (signals, ptrace, /proc)."""
    read_only_root: bool = True
    drop_all_capabilities: bool = True
    no_new_privileges: bool = True
    network: NetworkMode = "none"
    """none: only `lo`. egress: one veth link to a host-side proxy that lets through HTTP and
    HTTPS to the [network] allowlist and nothing else. open: the engine's bridge network
    (logged as a warning). EnsureSandbox may ask for a narrower mode, never a wider one."""
    memory_mb: int = 512
    """Memory limit; swap is set to the same value, so no swap."""
    cpus: float = 1.0
    pids: int = 256
    nofile: int = 1024
    nproc: int = 16384
    """RLIMIT_NPROC. The kernel counts it per uid across the host (without a user namespace
    all sandboxes share one uid), so `pids` is the per-sandbox cap; this must stay at or
    below the engine process's own hard limit, or the container fails to start."""
    tmp_size_mb: int = 64
    """Size cap of the tmpfs at /tmp."""
    tmp_inodes: int = 65536
    """Inode cap of /tmp (files, directories and links at once); past it a create fails with
    ENOSPC, so a million empty files cannot eat the memory limit. Docker sets it on its
    tmpfs; Podman 4.3 refuses the option, so on Podman the supervisor (as root) mounts a
    fresh tmpfs per container under the sandbox's state folder and bind-mounts it at /tmp.
    0: the engine's default (half the host's RAM pages)."""
    runtime: str = ""
    """OCI runtime of the sandboxes: a name the engine knows ("runc", "runsc") or, for
    Podman, an absolute path; empty: the engine's default. Docker: the name must be
    registered under "runtimes" in /etc/docker/daemon.json. Podman: its API ignores a
    container's runtime (Podman 4.3), so the service's default applies: the service the
    supervisor starts (engine.socket empty) gets --runtime; a configured socket's service
    must have been started with it. A container that runs under another runtime is removed
    and its creation fails. gVisor's runsc needs --host-uds=create (the agent's socket is on
    a bind mount), --network=none and --oci-seccomp (engines.RUNSC_FLAGS); the supervisor
    adds these to its own Podman service, Docker's daemon.json must list them as runtimeArgs.
    Under runsc a sandbox has no network but its own loopback, and /tmp is a tmpfs the
    supervisor mounts (gVisor ignores an engine tmpfs's inode cap)."""
    workspace_size_mb: int = 0
    """Size cap of the workspace: a file system of its own per sandbox (ext4 in a sparse image
    file beside the workspace, loop-mounted at it; its inodes are capped too, one per 16 KiB).
    Needs a supervisor running as root on a host with loop devices; the start fails with the
    reason otherwise. 0: no cap, the workspace is a directory on the state directory's disk.
    The size applies when a workspace's image is made; an existing image keeps its size."""
    max_file_size_mb: int = 0
    """Largest file a sandbox process may write (RLIMIT_FSIZE); a write past it fails with
    EFBIG, "File too large". 0: no limit."""
    user_namespace: bool | None = None
    """Run each sandbox in a user namespace, so that its uids are unprivileged ids of no host
    user. Unset (the default): on where the engine gives each sandbox a range of its own
    (Podman on the host, not under gVisor, with a `containers` range), else off with a
    warning at start (the sandbox user's uid is then the host's, shared by all sandboxes).
    true: on, or the start fails saying why; false: off. Podman: a range of 65536 ids of its
    own per container (`--userns=auto`, from the
    `containers` entry in /etc/subuid and /etc/subgid; the start fails naming it when
    missing). Docker: the daemon's `userns-remap` (daemon-wide; the start fails when dockerd
    does not remap). The workspace and agent directory are handed to the mapped ids before the
    container starts; a re-created sandbox given another range has its workspace walked and
    re-owned (a cost that grows with its number of files). Off, but on a remapping dockerd,
    the workspace is handed over all the same."""
    start_timeout_s: float = 30.0
    """How long a new container's agent may take to answer."""
    secrets: Mapping[str, str] = field(default_factory=dict)
    """Environment variables injected into every sandbox whose values are redacted from
    every output (with scrub.secrets)."""


@dataclass(frozen=True)
class NetworkConfig:
    """What `egress` sandboxes may reach, through the supervisor's proxy."""

    allow: tuple[str, ...] = ()
    """Domain names ("example.com") and wildcards ("*.example.com": any name under it, not
    the name itself). IP addresses are never allowed."""
    ports: tuple[int, ...] = (80, 443)
    hosts: Mapping[str, str] = field(default_factory=dict)
    """Pinned addresses: name -> IP, used instead of DNS (and then any address is fine,
    e.g. a loopback test server). The name must still be allowed."""
    allow_private_addresses: bool = False
    """Whether an allowed name may resolve to a loopback, private, link-local or other
    non-global address (off: an allowed name pointing inside is refused)."""
    bandwidth_kbit: int = 0
    """Per-sandbox cap in each direction (tc token bucket on both ends of the link); 0: none."""
    max_connections: int = 32
    """Proxied connections open at once per sandbox; more are refused."""
    connect_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    """A tunnel with no bytes either way for this long is closed."""
    subnet: str = "10.213.0.0/30"
    """The link's addresses: the proxy's side takes the first host, the sandbox the second.
    Each sandbox's link lives in namespaces of its own, so all can use the same subnet."""
    proxy_port: int = 3128


@dataclass(frozen=True)
class ToolPolicy:
    profile: str = ""
    """Empty: this step does not restrict."""
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    also_allow: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentTools(ToolPolicy):
    by_provider: Mapping[str, ToolPolicy] = field(default_factory=dict)
    """Step 6: allow and deny for this agent with context.provider."""


@dataclass(frozen=True)
class AgentConfig:
    tools: AgentTools = field(default_factory=AgentTools)
    """Step 5: this agent's allow, deny and also_allow."""
    approvals: Literal["", "off", "on-miss", "always"] = ""
    """Empty: the global approvals.mode."""


@dataclass(frozen=True)
class GroupConfig:
    tools: ToolPolicy = field(default_factory=ToolPolicy)
    """Step 7, for calls whose context.peer_kind is "group" and chat_id is this group's key
    ("*" applies to every group)."""


@dataclass(frozen=True)
class SubagentConfig:
    deny: tuple[str, ...] = ()
    """Denied to every subagent (context.subagent_depth >= 1)."""
    leaf_deny: tuple[str, ...] = ()
    """Also denied at subagent_depth >= max_depth."""
    max_depth: int = 1


@dataclass(frozen=True)
class GuardRuleConfig:
    name: str
    pattern: str
    """Regex searched in each normalized simple command ("prog arg arg")."""
    reason: str = ""


@dataclass(frozen=True)
class GuardConfig:
    enabled: bool = True
    on_parse_error: Literal["deny", "ask"] = "deny"
    """What a command that cannot be parsed gets; never allow."""
    rules: tuple[GuardRuleConfig, ...] = ()


@dataclass(frozen=True)
class ApprovalsConfig:
    mode: Literal["off", "on-miss", "always"] = "off"
    """on-miss: ask unless the command matches the allowlist; always: ask for every command."""
    allowlist: tuple[str, ...] = ()
    """Shell-style patterns (fnmatch) over the command, e.g. "git status", "pytest *". Only a
    single simple command can match: one chained with another (`;`, `&&`, `|`, a new line, a
    substitution) is asked about, or "git *" would pass "git status; curl x | sh"."""
    timeout_s: float = 120.0
    """No decision in time is a deny."""
    no_approver: Literal["deny", "allow"] = "deny"
    """What happens at once when no approver is connected."""


@dataclass(frozen=True)
class ScrubConfig:
    enabled: bool = True
    secrets: tuple[str, ...] = ()
    """Literal values to redact (also in base64 and URL-encoded form)."""


@dataclass(frozen=True)
class LimitsConfig:
    rate_per_s: float = 20.0
    """Token bucket per sandbox key: refill rate..."""
    burst: int = 40
    """...and size."""
    max_concurrent: int = 10
    """Calls running at once per key; more wait in a queue..."""
    max_queued: int = 100
    """...of at most this many; past it a call fails at once."""


@dataclass(frozen=True)
class ObservabilityConfig:
    metrics_listen: str = ""
    """host:port of an HTTP endpoint serving Prometheus metrics at /metrics (e.g.
    "127.0.0.1:9464"); empty: none. Unauthenticated: keep it on loopback or behind a proxy."""
    log_format: Literal["text", "json"] = "text"
    """json: one JSON object per line, with the request id of the call being served."""
    log_calls: bool = True
    """One INFO line per tool call (tool, key, result, duration, request id)."""
    trace_exporter: Literal["", "otlp", "console"] = ""
    """OpenTelemetry traces of each call, a span per pipeline stage (needs the `otel` extra:
    pip install 'stockade[otel]'). otlp: OTLP over HTTP to trace_endpoint; console: JSON
    spans appended to trace_file (stderr when empty); "": no tracing."""
    trace_endpoint: str = "http://127.0.0.1:4318/v1/traces"
    trace_file: str = ""
    service_name: str = "stockade"


@dataclass(frozen=True)
class FilesConfig:
    scrub_downloads: Literal["text", "all", "off"] = "text"
    """Replace credentials in downloaded files (the bytes then differ from the file;
    FileInfo.redactions says how many). "text": files whose first 8 KiB hold no NUL byte
    (binary files pass byte-exact: credential heuristics would corrupt them); "all"; "off"."""
    chunk_bytes: int = 1 << 20


@dataclass(frozen=True)
class AuditConfig:
    enabled: bool = True
    path: str = ""
    """SQLite file; empty: STATE_DIR/stockade.db."""
    max_arguments_bytes: int = 4096
    max_age_days: float = 30.0
    """Records older than this are removed; 0: no age limit."""
    max_size_mb: int = 1024
    """The database's pages in use are kept at or below this, oldest records removed first
    (the file stops growing there: freed pages are reused); 0: no size limit."""
    export_dir: str = ""
    """Absolute directory: removed records are appended there first, as JSON lines, to
    audit-YYYY-MM-DD.jsonl (fsynced before the delete); empty: not kept."""
    trim_interval_s: float = 60.0
    """How often retention looks for records to remove."""


@dataclass(frozen=True)
class CustomToolConfig:
    name: str
    description: str
    command: str
    """sh command template; {{.name}} is replaced by the shell-escaped argument."""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})
    timeout_s: float = 60.0
    workdir: str = "."
    env: Mapping[str, str] = field(default_factory=dict)
    profiles: tuple[str, ...] = ("coding", "full")
    """The profiles that include this tool; `full` includes every tool in any case."""


@dataclass(frozen=True)
class AuthConfig:
    """Who may call. Required unless explicitly off, and off only on a unix socket or a
    loopback address: a start that would serve without it anywhere else is refused.
    Health checking and reflection stay open (they name services, never sandboxes)."""

    enabled: bool | None = None
    """true: callers must authenticate (then tokens_file or client_ca is needed). false: no
    authentication; allowed only when `listen` is unix:/path or a loopback address. Unset:
    on when tokens_file or client_ca is set, else the start is refused (say which you mean)."""
    tokens_file: str = ""
    """Bearer tokens, one `TOKEN TENANT` per line (`#` comments; `sha256:HEX TENANT` stores a
    token's SHA-256 instead of the token). Re-read when it changes, on the next call; a new
    version that does not parse leaves the previous tokens in force (logged), a missing file
    accepts no token. Refused when others may read or write it, or its group may write it."""
    tls_cert: str = ""
    """PEM certificate chain of the server; with tls_key, the port speaks TLS."""
    tls_key: str = ""
    client_ca: str = ""
    """PEM CA bundle: clients must present a certificate it signed (mutual TLS; a client
    without one cannot connect). Needs tls_cert and tls_key."""
    client_certs: Mapping[str, str] = field(default_factory=dict)
    """Client certificate identity (a subject alternative name or the common name) -> tenant.
    A certificate naming no mapped identity needs a bearer token as well."""


@dataclass(frozen=True)
class TenantConfig:
    """Limits of one tenant (`[tenants.NAME]`; `[tenants."*"]` for tenants without a table)."""

    max_sandboxes: int = 0
    """Containers at once (running or being created); 0: no limit. Past it, creating another
    is RESOURCE_EXHAUSTED."""
    max_memory_mb: int = 0
    """Sum of the memory limits (sandbox.memory_mb each) of its containers; 0: no limit."""


@dataclass(frozen=True)
class ToolsConfig:
    exec_default_timeout_s: int = 30
    exec_max_timeout_s: int = 300
    max_output_bytes: int = 10 * MiB
    """Per stream cap on what exec keeps of stdout and of stderr."""
    llm_max_bytes: int = 64 * 1024
    """Cap of ToolResult.for_llm (head and tail kept)."""
    user_max_bytes: int = 1 * MiB
    """Cap of ToolResult.for_user."""
    max_processes: int = 5
    """Background processes (the process tool) running at once per sandbox."""
    process_log_bytes: int = 1 * MiB
    """Ring buffer of each background process's output."""
    profile: str = "full"
    """Step 1 of the policy pipeline: minimal, coding, messaging or full."""
    allow: tuple[str, ...] = ()
    """Step 3: when not empty, only these tools (names, aliases or group:NAME)."""
    deny: tuple[str, ...] = ()
    also_allow: tuple[str, ...] = ()
    """Added back after the allow steps (never over a deny)."""
    by_provider: Mapping[str, ToolPolicy] = field(default_factory=dict)
    """Steps 2 and 4: profile, allow and deny for context.provider."""


@dataclass(frozen=True)
class HousekeepingConfig:
    """Removing what is no longer used, refusing what the host cannot hold, and stopping
    gently. Times are in seconds; 0 turns a timer off."""

    idle_timeout_s: float = 1800.0
    """A sandbox with no call for this long loses its container (the workspace is kept; the
    next call makes a new container on it). Never while a call is in flight. Background
    processes started with the `process` tool do not count as use: they end with it."""
    max_age_s: float = 86400.0
    """A container older than this is removed at the first moment no call is in flight (the
    next call makes a new one on the same workspace)."""
    workspace_retention_s: float = 7 * 86400.0
    """How long a workspace without a container (pruned, destroyed without
    --delete-workspace, or lost) is kept before it is deleted; 0: kept until destroyed."""
    reap_orphans: bool = True
    """Remove containers of other supervisor instances on this engine that are provably gone:
    same boot, same pid and mount namespaces as this supervisor, their process no longer
    runs and their state directory no longer holds their instance id. Containers that
    carry no such proof (older supervisors, other namespaces) are never touched."""
    sweep_interval_s: float = 30.0
    """How often the sweeper looks for idle and old sandboxes, expired workspaces and
    orphans."""
    warm_pool: int = 0
    """Started containers kept with no key, so that a new key's first call does not wait
    for a container start (they use memory while unused). 0: no pool."""
    min_free_memory_mb: int = 256
    """No new container while the host has less memory available (psutil's
    virtual_memory().available): the call gets RESOURCE_EXHAUSTED; running sandboxes keep
    working. 0: no check."""
    min_free_disk_mb: int = 1024
    """The same for free space on the state directory's file system. 0: no check."""
    shutdown_grace_s: float = 10.0
    """On SIGTERM: health goes NOT_SERVING at once, new calls get UNAVAILABLE, calls in
    flight get this long to finish before the server stops. Containers keep running for the
    next start to adopt."""


@dataclass(frozen=True)
class Config:
    listen: str = "127.0.0.1:50051"
    """host:port, or unix:/path."""
    state_dir: Path = Path("/var/lib/stockade")
    """Workspaces, agent sockets and the instance id live here."""
    max_request_bytes: int = 16 * MiB
    """Largest request a client may send; larger ones get RESOURCE_EXHAUSTED."""
    max_response_bytes: int = 128 * MiB
    engine: EngineConfig = field(default_factory=EngineConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    agents: Mapping[str, AgentConfig] = field(default_factory=dict)
    groups: Mapping[str, GroupConfig] = field(default_factory=dict)
    subagents: SubagentConfig = field(default_factory=SubagentConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    approvals: ApprovalsConfig = field(default_factory=ApprovalsConfig)
    scrub: ScrubConfig = field(default_factory=ScrubConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    files: FilesConfig = field(default_factory=FilesConfig)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    custom_tools: tuple[CustomToolConfig, ...] = ()
    auth: AuthConfig = field(default_factory=AuthConfig)
    tenants: Mapping[str, TenantConfig] = field(default_factory=dict)
    housekeeping: HousekeepingConfig = field(default_factory=HousekeepingConfig)

    def __post_init__(self) -> None:
        _check(self)

    def tenant_limits(self, tenant: str) -> TenantConfig:
        """The limits of a tenant ("": no tenant, auth off: none)."""
        if not tenant:
            return TenantConfig()
        return self.tenants.get(tenant) or self.tenants.get("*") or TenantConfig()


def _check(cfg: Config) -> None:
    positive = {
        "sandbox.memory_mb": cfg.sandbox.memory_mb,
        "sandbox.cpus": cfg.sandbox.cpus,
        "sandbox.pids": cfg.sandbox.pids,
        "sandbox.nofile": cfg.sandbox.nofile,
        "sandbox.nproc": cfg.sandbox.nproc,
        "sandbox.tmp_size_mb": cfg.sandbox.tmp_size_mb,
        "tools.exec_default_timeout_s": cfg.tools.exec_default_timeout_s,
        "tools.max_output_bytes": cfg.tools.max_output_bytes,
        "tools.llm_max_bytes": cfg.tools.llm_max_bytes,
        "tools.max_processes": cfg.tools.max_processes,
        "tools.process_log_bytes": cfg.tools.process_log_bytes,
        "max_request_bytes": cfg.max_request_bytes,
        "limits.rate_per_s": cfg.limits.rate_per_s,
        "limits.burst": cfg.limits.burst,
        "limits.max_concurrent": cfg.limits.max_concurrent,
        "approvals.timeout_s": cfg.approvals.timeout_s,
        "tools.user_max_bytes": cfg.tools.user_max_bytes,
        "audit.max_arguments_bytes": cfg.audit.max_arguments_bytes,
    }
    for name, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{name} must be positive, got {value}")
    for name, value in {
        "sandbox.tmp_inodes": cfg.sandbox.tmp_inodes,
        "sandbox.workspace_size_mb": cfg.sandbox.workspace_size_mb,
        "sandbox.max_file_size_mb": cfg.sandbox.max_file_size_mb,
    }.items():
        if value < 0:
            raise ConfigError(f"{name} must not be negative (0: no limit), got {value}")
    if 0 < cfg.sandbox.workspace_size_mb < MIN_WORKSPACE_MB:
        raise ConfigError(
            f"sandbox.workspace_size_mb must be 0 (no cap) or at least {MIN_WORKSPACE_MB}, "
            f"got {cfg.sandbox.workspace_size_mb}"
        )
    if cfg.limits.max_queued < 0:
        raise ConfigError("limits.max_queued must not be negative")
    if cfg.tools.exec_default_timeout_s > cfg.tools.exec_max_timeout_s:
        raise ConfigError("tools.exec_default_timeout_s exceeds tools.exec_max_timeout_s")
    _check_runtime(cfg.sandbox.runtime)
    _check_user(cfg.sandbox.user)
    _check_network(cfg.network)
    _check_policy(cfg)
    _check_housekeeping(cfg.housekeeping)
    _check_audit(cfg.audit)
    _check_observability(cfg.observability)
    _check_auth(cfg.auth, cfg.tenants)
    if cfg.engine.kind not in ("podman", "docker"):
        raise ConfigError(f"engine.kind must be podman or docker, got {cfg.engine.kind!r}")


def _check_policy(cfg: Config) -> None:
    """What the policy pipeline cannot check itself: numbers that NaN or infinity would make
    fail open (a NaN rate never runs out of tokens), and ids that could never match a call."""
    if not math.isfinite(cfg.limits.rate_per_s):  # any finite rate; 1e9 means "no limit"
        raise ConfigError(f"limits.rate_per_s must be a finite number, got {cfg.limits.rate_per_s}")
    check_seconds("approvals.timeout_s", cfg.approvals.timeout_s)
    if cfg.subagents.max_depth < 1:
        raise ConfigError(f"subagents.max_depth must be at least 1, got {cfg.subagents.max_depth}")
    tables: dict[str, Mapping[str, Any]] = {
        "agents": cfg.agents,
        "groups": cfg.groups,
        "tools.by_provider": cfg.tools.by_provider,
        **{f"agents.{a}.tools.by_provider": c.tools.by_provider for a, c in cfg.agents.items()},
    }
    for where, table in tables.items():
        if "" in table:
            raise ConfigError(f"{where}: an id must not be empty")


def check_seconds(name: str, value: float) -> None:
    """A positive, finite number (of seconds, or per second) up to MAX_SECONDS."""
    if not math.isfinite(value) or value > MAX_SECONDS:
        raise ConfigError(f"{name} must be a finite number up to {MAX_SECONDS:.0f}, got {value}")


def _check_observability(obs: ObservabilityConfig) -> None:
    if obs.metrics_listen:
        split_host_port(obs.metrics_listen, "observability.metrics_listen")
    if obs.trace_exporter == "otlp" and not obs.trace_endpoint.startswith(("http://", "https://")):
        raise ConfigError(
            f"observability.trace_endpoint must be an http(s) URL, got {obs.trace_endpoint!r}"
        )


def split_host_port(value: str, name: str) -> tuple[str, int]:
    """("127.0.0.1", 9464) from "127.0.0.1:9464" ("[::1]:9464" for IPv6)."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{name} must be host:port, got {value!r}")
    return host, int(port)


def _check_runtime(runtime: str) -> None:
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


def _check_user(user: str) -> None:
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


def _build(cls: type[Any], data: dict[str, Any], where: str) -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) in [{where or 'top level'}]: {', '.join(unknown)}")
    kwargs = {
        name: _coerce(hints[name], value, f"{where}.{name}" if where else name)
        for name, value in data.items()
    }
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required key is missing
        raise ConfigError(f"[{where}]: {exc}") from exc


def _coerce(hint: Any, value: Any, path: str) -> Any:
    origin, args = get_origin(hint), get_args(hint)
    if origin is UnionType and type(None) in args:  # TOML has no null: the value is set
        (hint,) = (a for a in args if a is not type(None))
        origin, args = get_origin(hint), get_args(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"[{path}] must be a table")
        return _build(hint, value, path)  # type: ignore[arg-type]
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"{path} must be a list")
        return tuple(_coerce(args[0], item, f"{path}[{i}]") for i, item in enumerate(value))
    if origin in (Mapping, dict):
        if not isinstance(value, dict):
            raise ConfigError(f"[{path}] must be a table")
        return {str(k): _coerce(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if hint is Any:
        return value
    if hint is Path:
        if not isinstance(value, str):
            raise ConfigError(f"{path} must be a string path")
        return Path(value)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path} must be one of {list(args)}, got {value!r}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{path} must be {hint.__name__}, got {type(value).__name__}")
    return value


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Load the TOML file (if any), then STOCKADE_* environment values, then overrides.

    Environment: STOCKADE_LISTEN, STOCKADE_STATE_DIR, STOCKADE_ENGINE, STOCKADE_ENGINE_SOCKET.
    Overrides are dotted names, e.g. {"engine.kind": "docker"}.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        except RecursionError:
            raise ConfigError(f"cannot read config {path}: it nests too deeply") from None
    env = {
        "listen": os.environ.get("STOCKADE_LISTEN"),
        "state_dir": os.environ.get("STOCKADE_STATE_DIR"),
        "engine.kind": os.environ.get("STOCKADE_ENGINE"),
        "engine.socket": os.environ.get("STOCKADE_ENGINE_SOCKET"),
    }
    for dotted, value in [*env.items(), *(overrides or {}).items()]:
        if value is not None:
            _set_dotted(data, dotted, value)
    return _build(Config, data, "")  # type: ignore[no-any-return]


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for name in parents:
        node = node.setdefault(name, {})
    node[leaf] = value


MAX_WARM_POOL = 64
MAX_SECONDS = 10 * 365 * 86400.0
"""Longest timer accepted (ten years): beyond it a value is a mistake, and an infinite or
NaN one would never compare as intended."""


def _check_housekeeping(hk: HousekeepingConfig) -> None:
    timers = {
        "idle_timeout_s": hk.idle_timeout_s,
        "max_age_s": hk.max_age_s,
        "workspace_retention_s": hk.workspace_retention_s,
        "sweep_interval_s": hk.sweep_interval_s,
        "shutdown_grace_s": hk.shutdown_grace_s,
    }
    for name, value in timers.items():
        if not 0 <= value <= MAX_SECONDS:  # also false for NaN
            raise ConfigError(
                f"housekeeping.{name} must be between 0 and {MAX_SECONDS:.0f} s, got {value}"
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


MAX_AUDIT_DAYS = 36500.0
MAX_AUDIT_MB = 1 << 24
"""16 TiB: more is a mistake (SQLite's own limit is near 281 TB)."""


def _check_audit(audit: AuditConfig) -> None:
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
    if audit.export_dir and not Path(audit.export_dir).is_absolute():
        raise ConfigError(f"audit.export_dir must be an absolute path, got {audit.export_dir!r}")
    if "\0" in audit.export_dir:
        raise ConfigError("audit.export_dir must not contain a NUL character")


def _check_network(net: NetworkConfig) -> None:
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


def _check_auth(auth: AuthConfig, tenants: Mapping[str, TenantConfig]) -> None:
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
