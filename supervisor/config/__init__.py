"""Supervisor configuration: loaded once (file, then environment, then flags), then frozen.

The sections are frozen dataclasses (sandbox.py: the containers; policy.py: the tool
policy; service.py: auth, audit, files, observability, mcp, e2b), root.py holds the whole Config
and runs the checks as it is made (checks.py: one section's each, and the single values they
share), loading.py reads it. Inside the package imports run one way: the section modules, then
checks.py, then root.py, then loading.py. Every name is importable from
here. An unknown key anywhere in the file is an error at load time, never a silent pass.
"""

from stockade.supervisor.config.checks import check_seconds, split_host_port
from stockade.supervisor.config.console import ConsoleConfig
from stockade.supervisor.config.honey import HoneytokensConfig
from stockade.supervisor.config.http import HttpConfig
from stockade.supervisor.config.loading import _build, config_from_toml, load_config
from stockade.supervisor.config.policy import (
    AgentConfig,
    AgentTools,
    ApprovalsConfig,
    CustomToolConfig,
    GroupConfig,
    GuardConfig,
    GuardRuleConfig,
    LimitsConfig,
    ScrubConfig,
    SubagentConfig,
    ToolPolicy,
    ToolsConfig,
)
from stockade.supervisor.config.root import Config
from stockade.supervisor.config.sandbox import (
    AGENT_UID,
    NETWORK_MODES,
    EngineConfig,
    EngineKind,
    HousekeepingConfig,
    NetworkConfig,
    NetworkMode,
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
    TenantConfig,
)

__all__ = [
    "AGENT_UID",
    "NETWORK_MODES",
    "AgentConfig",
    "AgentTools",
    "ApprovalsConfig",
    "AuditConfig",
    "AuthConfig",
    "Config",
    "ConsoleConfig",
    "CustomToolConfig",
    "E2bConfig",
    "EngineConfig",
    "EngineKind",
    "FilesConfig",
    "GroupConfig",
    "GuardConfig",
    "GuardRuleConfig",
    "HoneytokensConfig",
    "HousekeepingConfig",
    "HttpConfig",
    "LimitsConfig",
    "McpConfig",
    "NetworkConfig",
    "NetworkMode",
    "ObservabilityConfig",
    "ProfileConfig",
    "SandboxConfig",
    "ScrubConfig",
    "SecretConfig",
    "SnapshotsConfig",
    "SubagentConfig",
    "TenantConfig",
    "ToolPolicy",
    "ToolsConfig",
    "_build",
    "check_seconds",
    "config_from_toml",
    "load_config",
    "split_host_port",
]
