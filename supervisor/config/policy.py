"""The sections of the tool policy: which tools (per profile, provider, agent, group and
subagent depth), the shell-command guard, approvals, scrubbing, rate limits, custom tools."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from stockade.supervisor.config.sandbox import MiB


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
    action: Literal["deny", "quarantine"] = "deny"
    """quarantine: the call is denied as with deny, and an alarm of kind "guard" sounds
    (which quarantines the sandbox while "guard" is in [quarantine] on)."""
    checkpoint: bool = False
    """The rule does not deny: a command it matches runs (when nothing else stops it) with a
    checkpoint of the workspace first, while [checkpoints] is on for the tenant (docs/undo.md).
    Not with action = "quarantine"."""


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
    files: tuple[str, ...] = ()
    """File tools whose every call is asked about, whatever the mode ("write_file",
    "edit_file", "apply_patch"): the approver sees the diff the call would make
    (docs/undo.md)."""


FILE_APPROVAL_TOOLS = ("write_file", "edit_file", "apply_patch")


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
    max_streams_per_tenant: int = 100
    """Streamed calls (gRPC CallToolStream and Interact, MCP calls with progress, E2B
    processes) a tenant may have open at once, every front together; past it a streamed call
    fails at once (RATE_LIMITED). 0: no limit."""
    max_watches_per_tenant: int = 64
    """File watches (gRPC WatchFiles, E2B WatchDir and watchers) a tenant may have open at
    once, every front together; past it a watch is refused (QUOTA_EXCEEDED). 0: no limit."""
    shared_transfer_mb_per_s: float = 64.0
    """While another tenant is calling, a tenant's file transfers (gRPC Upload/Download, E2B
    /files) move at most this many MB (MiB) a second; alone on the supervisor they run at
    full speed (policy/limits.py FairShare). 0: never paced."""


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
