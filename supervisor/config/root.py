"""The whole configuration: one frozen Config of the sections, checked when it is made, and
the checks that read more than one section. The top of the config package: it imports the
section modules and checks.py; none of them imports it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade.supervisor.config import checks
from stockade.supervisor.config.console import ConsoleConfig
from stockade.supervisor.config.honey import HoneytokensConfig, check_honeytokens
from stockade.supervisor.config.http import HttpConfig, check_http
from stockade.supervisor.config.policy import (
    AgentConfig,
    ApprovalsConfig,
    CustomToolConfig,
    GroupConfig,
    GuardConfig,
    LimitsConfig,
    ScrubConfig,
    SubagentConfig,
    ToolsConfig,
)
from stockade.supervisor.config.quarantine import QuarantineConfig, check_quarantine
from stockade.supervisor.config.sandbox import (
    ENGINE_KINDS,
    MIN_WORKSPACE_MB,
    EngineConfig,
    HousekeepingConfig,
    KubernetesConfig,
    MiB,
    NetworkConfig,
    ProfileConfig,
    SandboxConfig,
)
from stockade.supervisor.config.secrets import SecretConfig, check_secrets
from stockade.supervisor.config.service import (
    AuditConfig,
    AuthConfig,
    CheckpointsConfig,
    E2bConfig,
    FilesConfig,
    McpConfig,
    ObservabilityConfig,
    SnapshotsConfig,
    StateConfig,
    TenantConfig,
)
from stockade.supervisor.errors import ConfigError


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
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    profiles: Mapping[str, ProfileConfig] = field(default_factory=dict)
    """Sandbox profiles by name ([profiles.NAME]); [sandbox] is the default one."""
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
    mcp: McpConfig = field(default_factory=McpConfig)
    e2b: E2bConfig = field(default_factory=E2bConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    """The limits of every HTTP front's listener (MCP, E2B, the console)."""
    housekeeping: HousekeepingConfig = field(default_factory=HousekeepingConfig)
    snapshots: SnapshotsConfig = field(default_factory=SnapshotsConfig)
    checkpoints: CheckpointsConfig = field(default_factory=CheckpointsConfig)
    state: StateConfig = field(default_factory=StateConfig)
    quarantine: QuarantineConfig = field(default_factory=QuarantineConfig)
    honeytokens: HoneytokensConfig = field(default_factory=HoneytokensConfig)
    secrets: Mapping[str, SecretConfig] = field(default_factory=dict)
    """Brokered secrets by name ([secrets.NAME], docs/secrets.md): added by the egress proxy,
    never in a sandbox."""

    def __post_init__(self) -> None:
        _check(self)

    def tenant_limits(self, tenant: str) -> TenantConfig:
        """The limits of a tenant ("": no tenant, auth off: none)."""
        if not tenant:
            return TenantConfig()
        return self.tenants.get(tenant) or self.tenants.get("*") or TenantConfig()

    def snapshot_rules(self, tenant: str) -> tuple[tuple[str, ...], int, int]:
        """What a tenant may do with snapshots, and its count and byte limits (0: none)."""
        own, snaps = self.tenant_limits(tenant), self.snapshots
        operations = (
            snaps.operations if own.snapshot_operations is None else own.snapshot_operations
        )
        count = snaps.max_count if own.max_snapshots < 0 else own.max_snapshots
        mb = snaps.max_mb if own.max_snapshot_mb < 0 else own.max_snapshot_mb
        return operations, count, mb * 1024 * 1024

    def checkpoints_on(self, tenant: str) -> bool:
        """Whether the tenant's risky calls get a checkpoint ([checkpoints], tenants.NAME)."""
        own = self.tenant_limits(tenant).checkpoints
        return self.checkpoints.enabled if own is None else own


def _check(cfg: Config) -> None:
    """Every check of the whole configuration; ConfigError naming the first problem."""
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
        "mcp.max_sessions": cfg.mcp.max_sessions,
        "e2b.max_metadata_bytes": cfg.e2b.max_metadata_bytes,
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
        "limits.max_streams_per_tenant": cfg.limits.max_streams_per_tenant,
        "limits.max_watches_per_tenant": cfg.limits.max_watches_per_tenant,
        "limits.shared_transfer_mb_per_s": cfg.limits.shared_transfer_mb_per_s,
        "mcp.max_sessions_per_tenant": cfg.mcp.max_sessions_per_tenant,
        "e2b.max_sandboxes_per_tenant": cfg.e2b.max_sandboxes_per_tenant,
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
    checks.check_runtime(cfg.sandbox.runtime)
    checks.check_user(cfg.sandbox.user)
    checks.check_profiles(cfg.profiles)
    checks.check_network(cfg.network)
    _check_policy(cfg)
    checks.check_housekeeping(cfg.housekeeping)
    checks.check_warm_pools(cfg.housekeeping, cfg.profiles)
    checks.check_audit(cfg.audit)
    checks.check_observability(cfg.observability)
    checks.check_auth(cfg.auth, cfg.tenants)
    checks.check_mcp(cfg.mcp)
    checks.check_e2b(cfg.e2b)
    checks.check_console(cfg.console)
    check_http(cfg.http)
    checks.check_snapshots(cfg.snapshots)
    checks.check_checkpoints(cfg.checkpoints)
    for rule in cfg.guard.rules:
        if rule.checkpoint and rule.action != "deny":
            raise ConfigError(
                f"guard rule {rule.name!r}: checkpoint = true does not deny, so it takes no "
                f"action {rule.action!r}"
            )
    check_quarantine(cfg.quarantine)
    if cfg.engine.kind not in ENGINE_KINDS:
        raise ConfigError(
            f"engine.kind must be one of {', '.join(ENGINE_KINDS)}, got {cfg.engine.kind!r}"
        )
    checks.check_kubernetes(cfg.kubernetes)
    if cfg.engine.kind == "kubernetes":
        _check_pods(cfg)
    checks.check_state(cfg.state)
    check_honeytokens(
        cfg.honeytokens,
        engine_kind=cfg.engine.kind,
        sandbox_env=cfg.sandbox.secrets,
        profiles=cfg.profiles,
    )
    placeholders = {s.sandbox_env for s in cfg.secrets.values() if s.sandbox_env}
    if cfg.honeytokens.enabled and cfg.honeytokens.env_var in placeholders:
        raise ConfigError(
            f"honeytokens.env_var {cfg.honeytokens.env_var!r} is the sandbox_env of a brokered "
            "secret ([secrets.NAME]): one variable cannot hold a decoy and a placeholder"
        )
    check_secrets(
        cfg.secrets,
        network_mode=cfg.sandbox.network,
        profiles=cfg.profiles,
        sandbox_env=cfg.sandbox.secrets,
    )


def _check_pods(cfg: Config) -> None:
    """What sandboxes as pods cannot do (yet): each is a feature of this host."""
    refused = {
        'housekeeping.idle_action = "pause"': (
            cfg.housekeeping.idle_action == "pause",
            "a pod cannot be frozen through the Kubernetes API",
        ),
        "sandbox.workspace_size_mb": (
            cfg.sandbox.workspace_size_mb > 0,
            "a pod's workspace is sized by kubernetes.workspace_size_mb",
        ),
        "network.bandwidth_kbit": (
            cfg.network.bandwidth_kbit > 0,
            "it shapes a host sandbox's own link; a pod reaches the proxy over the cluster "
            "network, which Stockade does not shape",
        ),
        "[secrets.NAME]": (
            bool(cfg.secrets),
            "a pod gets no placeholders and no egress CA in its trust store yet: brokered "
            "secrets are for host sandboxes",
        ),
    }
    if cfg.sandbox.network == "egress" and not cfg.kubernetes.egress_proxy:
        raise ConfigError(
            'sandbox.network = "egress" with engine.kind kubernetes needs kubernetes.egress_proxy: '
            "the host:port of the egress Service (deploy/kubernetes/egress-service.yaml), which "
            "each pod is told as its HTTP_PROXY"
        )
    for setting, (wanted, why) in refused.items():
        if wanted:
            raise ConfigError(f"{setting} does not go with engine.kind kubernetes: {why}")
    for name in cfg.sandbox.secrets:
        if not checks.ENV_NAME.fullmatch(name):
            raise ConfigError(
                f"sandbox.secrets: {name!r} is not an environment variable name a pod can "
                "have (letters, digits, '_', '-', '.'; not starting with a digit)"
            )


def _check_policy(cfg: Config) -> None:
    """What the policy pipeline cannot check itself: numbers that NaN or infinity would make
    fail open (a NaN rate never runs out of tokens), and ids that could never match a call."""
    if not math.isfinite(cfg.limits.rate_per_s):  # any finite rate; 1e9 means "no limit"
        raise ConfigError(f"limits.rate_per_s must be a finite number, got {cfg.limits.rate_per_s}")
    checks.check_seconds("approvals.timeout_s", cfg.approvals.timeout_s)
    checks.check_approval_files(cfg.approvals.files)
    if cfg.mcp.undo != "off" and any(t.name == "undo" for t in cfg.custom_tools):
        raise ConfigError(
            '[mcp] undo lists a tool "undo": a custom tool of that name would be hidden'
        )
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
