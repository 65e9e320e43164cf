"""The whole configuration: one frozen Config of the sections, checked when it is made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stockade.supervisor.config.checks import check
from stockade.supervisor.config.console import ConsoleConfig
from stockade.supervisor.config.honey import HoneytokensConfig
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
from stockade.supervisor.config.quarantine import QuarantineConfig
from stockade.supervisor.config.sandbox import (
    EngineConfig,
    HousekeepingConfig,
    KubernetesConfig,
    MiB,
    NetworkConfig,
    ProfileConfig,
    SandboxConfig,
)
from stockade.supervisor.config.secrets import SecretConfig
from stockade.supervisor.config.service import (
    AuditConfig,
    AuthConfig,
    E2bConfig,
    FilesConfig,
    McpConfig,
    ObservabilityConfig,
    SnapshotsConfig,
    StateConfig,
    TenantConfig,
)


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
    housekeeping: HousekeepingConfig = field(default_factory=HousekeepingConfig)
    snapshots: SnapshotsConfig = field(default_factory=SnapshotsConfig)
    state: StateConfig = field(default_factory=StateConfig)
    quarantine: QuarantineConfig = field(default_factory=QuarantineConfig)
    honeytokens: HoneytokensConfig = field(default_factory=HoneytokensConfig)
    secrets: Mapping[str, SecretConfig] = field(default_factory=dict)
    """Brokered secrets by name ([secrets.NAME], docs/secrets.md): added by the egress proxy,
    never in a sandbox."""

    def __post_init__(self) -> None:
        check(self)

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
