"""Errors of the supervisor's domain.

    StockadeError
    ├── ConfigError            bad configuration (at load time)
    ├── InvalidRequest         the caller is wrong: malformed key, bad field   -> INVALID_ARGUMENT
    ├── Unauthenticated        missing or wrong credentials                    -> UNAUTHENTICATED
    ├── NotFound               no such sandbox, approval, ... (also another tenant's)  -> NOT_FOUND
    ├── AlreadyExists          a new name or key that is taken (snapshot, fork) -> ALREADY_EXISTS
    ├── Unsupported            this host cannot do it (memory checkpoints)     -> UNIMPLEMENTED
    ├── QuotaExceeded          a tenant's sandbox or memory limit              -> RESOURCE_EXHAUSTED
    ├── ApproverBehind         an approver left too many events unread         -> RESOURCE_EXHAUSTED
    ├── PolicyDenied           policy forbids it (file transfer)               -> PERMISSION_DENIED
    ├── EngineUnavailable      the container engine cannot be reached or fails -> UNAVAILABLE
    ├── StateUnavailable       the shared state (state.url) cannot be reached  -> UNAVAILABLE
    ├── HostExhausted          the host is short of memory or disk for a new sandbox
    │                                                                  -> RESOURCE_EXHAUSTED
    ├── SandboxBroken          the container or its agent does not work        -> UNAVAILABLE
    │   └── AgentMisbehaved    the agent answered outside the protocol
    ├── SandboxLost            the container died during a call
    ├── SandboxStateConflict   the sandbox's state does not allow it  -> FAILED_PRECONDITION
    │   ├── SandboxPaused      a call to a paused sandbox (sandbox.paused_call = "refuse")
    │   └── Quarantined        a call to a quarantined sandbox (an alarm froze it)
    └── CallTimedOut           the agent did not answer a call by its deadline

Agent faults become these classes in one place, the sandbox's lease (sandboxes/lease.py).
Tool failures are not exceptions: they are ToolResults with is_error set; the errors a call
reports as a result (SandboxLost, AgentMisbehaved, CallTimedOut) become one in
calls/outcome.py. The gRPC layer maps the rest to status codes in one table (fronts/grpc/status.py).
"""

from __future__ import annotations


class StockadeError(Exception):
    """Root of the supervisor's own errors."""

    reason = "STOCKADE_ERROR"


class ConfigError(StockadeError):
    reason = "CONFIG_INVALID"


class InvalidRequest(StockadeError):
    reason = "INVALID_REQUEST"


class Unauthenticated(StockadeError):
    reason = "UNAUTHENTICATED"


class QuotaExceeded(StockadeError):
    reason = "QUOTA_EXCEEDED"


class ApproverBehind(StockadeError):
    """An approver's stream held more unread events than the backlog: it was dropped."""

    reason = "APPROVER_BEHIND"


class NotFound(StockadeError):
    reason = "NOT_FOUND"


class AlreadyExists(StockadeError):
    reason = "ALREADY_EXISTS"


class Unsupported(StockadeError):
    """A feature this host cannot offer (e.g. process memory checkpoints without CRIU)."""

    reason = "UNSUPPORTED"


class SandboxNotFound(NotFound):
    reason = "SANDBOX_NOT_FOUND"


class ApprovalNotFound(NotFound):
    reason = "APPROVAL_NOT_FOUND"


class PolicyDenied(StockadeError):
    reason = "POLICY_DENIED"


class EngineUnavailable(StockadeError):
    reason = "ENGINE_UNAVAILABLE"


class StateUnavailable(StockadeError):
    """The PostgreSQL database of state.url did not answer (supervisor/state/postgres.py)."""

    reason = "STATE_UNAVAILABLE"


class HostExhausted(StockadeError):
    """No new container now: the host has too little memory or disk left (housekeeping.
    min_free_*); sandboxes that run keep working."""

    reason = "HOST_RESOURCES_EXHAUSTED"


class SandboxBroken(StockadeError):
    reason = "SANDBOX_BROKEN"


class AgentMisbehaved(SandboxBroken):
    """The agent answered outside the protocol (oversized, malformed or out-of-order messages,
    fields of the wrong type or size) or failed while its container runs. Nothing it sent is
    used; the sandbox is marked broken and the next call recreates it (workspace kept).

    Reported to the model as a ToolResult (SANDBOX_LOST), not as a gRPC status."""

    reason = "AGENT_MISBEHAVED"


class SandboxLost(StockadeError):
    """The container died while a call was in flight; the next call recreates it.

    Reported to the model as a ToolResult (SANDBOX_LOST), not as a gRPC status."""

    reason = "SANDBOX_LOST"


class SandboxStateConflict(StockadeError):
    """The request needs the sandbox in another state (pausing a sandbox whose container
    exited or that is marked broken: there is nothing to freeze)."""

    reason = "SANDBOX_STATE_CONFLICT"


class SandboxPaused(SandboxStateConflict):
    """A call to a paused sandbox while sandbox.paused_call is "refuse": nothing ran; resume
    the sandbox first (ResumeSandbox, `stockade resume KEY`)."""

    reason = "SANDBOX_PAUSED"


class Quarantined(SandboxStateConflict):
    """A call (or a resume) of a sandbox an alarm quarantined (sandboxes/quarantine.py):
    nothing ran; an operator reads the evidence (`stockade quarantine show KEY`) and
    releases or destroys it."""

    reason = "SANDBOX_QUARANTINED"


class CallTimedOut(StockadeError):
    """The agent did not answer a call by its deadline, while its container runs and its
    agent answers probes: the caller's time ran out, the sandbox is fine.

    Reported to the model as a ToolResult (TIMEOUT), not as a gRPC status."""

    reason = "CALL_TIMED_OUT"
