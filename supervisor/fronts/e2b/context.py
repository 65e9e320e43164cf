"""What the E2B front's handlers share: config, the one pipeline and its policy, the token
authenticator (None with auth off), the sandbox manager and the E2B sandbox records."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from stockade.supervisor.auth import Authenticator
from stockade.supervisor.calls.pipeline import HostPolicy, ToolPipeline
from stockade.supervisor.config import Config
from stockade.supervisor.fronts.e2b.records import Records
from stockade.supervisor.sandboxes.manager import SandboxManager

FRONT = "e2b"
"""What the audit log names as the front of a call or action that came in over E2B."""


@dataclass
class E2bContext:
    config: Config
    pipeline: ToolPipeline
    policy: HostPolicy
    authenticator: Authenticator | None
    """None when auth is off: any X-API-KEY is accepted, the tenant is ""."""
    manager: SandboxManager
    records: Records
    forgetters: list[Callable[[str], None]] = field(default_factory=list)
    """Called with a sandbox id when the front removes that sandbox (envd's state of it)."""
    pausers: list[Callable[[str], None]] = field(default_factory=list)
    """Called with a sandbox id when the front pauses that sandbox (its open streams end)."""
