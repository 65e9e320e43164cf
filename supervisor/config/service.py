"""The sections about the service itself: who may call (auth, tenants), the audit log,
file transfers and observability."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal


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
    signing_key: str = ""
    """Absolute path of the Ed25519 key (PKCS#8 PEM, mode 0600) that signs the hash chain's
    checkpoints and anchors; empty: STATE_DIR/audit-signing.key, made on first use. Give
    every replica sharing a PostgreSQL state the same key (docs/audit.md)."""
    checkpoint_interval_s: float = 300.0
    """How often the chain's head is signed (when records came since), besides at shutdown."""


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
class McpConfig:
    """The MCP front door: tools over the Model Context Protocol (streamable HTTP), with the
    same tokens, tenants and policy as the gRPC API (see docs/mcp.md)."""

    listen: str = ""
    """host:port of the MCP endpoint (e.g. "127.0.0.1:50052"); empty: no MCP front. Plain
    HTTP: a loopback address only (port 0 picks a free port)."""
    path: str = "/mcp"
    """The endpoint's path."""
    key: str = ""
    """The sandbox key every MCP call uses (within the caller's tenant) unless the call names
    one in its `_meta`, so that all MCP sessions share one sandbox; empty: one sandbox per MCP
    session (the key `mcp-` and the session id), and `mcp-default` for a sessionless call."""
    session_idle_timeout_s: float = 1800.0
    """An MCP session with no request in flight (nor an open GET stream) for this long ends,
    and its own sandbox is released as at the client's DELETE."""
    max_sessions_per_tenant: int = 100
    """MCP sessions a tenant may have open at once; an `initialize` past it is answered 429
    (the others' sessions are not touched). 0: no limit."""
    max_sessions: int = 10000
    """MCP sessions open at once, every tenant together (the SDK's own cap: 503 past it)."""
    undo: Literal["off", "show", "apply"] = "off"
    """The `undo` tool (docs/undo.md): "off" does not list it; "show" lists it to show what
    an undo of the caller's sandbox takes back; "apply" lets it undo too."""


@dataclass(frozen=True)
class E2bConfig:
    """The E2B-compatible front: the unmodified E2B SDKs' control plane and envd on one
    port, with the same tokens, tenants and policy as the gRPC API (see docs/e2b.md)."""

    listen: str = ""
    """host:port of the E2B endpoint (e.g. "127.0.0.1:3000"), the URL to give as both
    E2B_API_URL and E2B_SANDBOX_URL; empty: no E2B front. Plain HTTP: a loopback address
    only (port 0 picks a free port)."""
    default_timeout_s: int = 300
    """A sandbox created without `timeout` is removed this long after its creation (E2B's
    default), unless its timeout is set again."""
    max_timeout_s: int = 86400
    """The longest `timeout` a create, connect or set_timeout may ask for."""
    sweep_interval_s: float = 1.0
    """How often sandboxes whose timeout has passed are looked for (and removed: container
    and workspace)."""
    max_sandboxes_per_tenant: int = 100
    """E2B sandboxes a tenant may have on record at once (running or paused); a create past
    it is answered 429. 0: no limit. ([tenants.NAME] max_sandboxes caps containers of every
    front.)"""
    max_metadata_bytes: int = 65536
    """The largest `metadata` of a sandbox, and the largest `envVars`, counted as the UTF-8
    bytes of their keys and values; a create with more is answered 400."""


SNAPSHOT_OPERATIONS = ("snapshot", "restore", "fork", "delete")


@dataclass(frozen=True)
class SnapshotsConfig:
    """Snapshots of sandboxes' files (docs/sandboxes.md#snapshots): who may take and use
    them, and how much each tenant may keep."""

    operations: tuple[str, ...] = SNAPSHOT_OPERATIONS
    """What callers may do, of "snapshot", "restore", "fork" and "delete" (listing is always
    allowed); [tenants.NAME] snapshot_operations overrides it per tenant. [] : none."""
    max_count: int = 100
    """Snapshots a tenant may keep; 0: no limit (tenants.NAME.max_snapshots overrides)."""
    max_mb: int = 10240
    """MiB a tenant's snapshots may take on disk, after deduplication; 0: no limit
    (tenants.NAME.max_snapshot_mb overrides). A capture that would pass it is undone."""
    dir: str = ""
    """Where the store lives (absolute); empty: STATE_DIR/snapshots."""
    copy_on_write: bool = True
    """A fork's new sandboxes, and a restore into another sandbox than the snapshot's, get a
    layered workspace: an overlay over the snapshot's files, made without copying their
    bytes (docs/sandboxes.md#layered-workspaces). Used where the host can (overlayfs with a
    data-only layer: Linux 6.5 or later, root); false: every file is copied."""


CHECKPOINT_TRIGGERS = ("destructive", "unparsed", "commands", "apply_patch", "overwrite")


@dataclass(frozen=True)
class CheckpointsConfig:
    """Checkpoints: a snapshot of the workspace taken before a risky call, for `stockade undo`
    (docs/undo.md)."""

    enabled: bool = False
    """Take them ([tenants.NAME] checkpoints overrides it per tenant)."""
    before: tuple[str, ...] = ("destructive", "unparsed", "apply_patch", "overwrite")
    """Which calls get one: "destructive" (a command the guard asked an approval for, once
    allowed), "unparsed" (a command the guard could not parse, once allowed), "commands"
    (every command), "apply_patch", "overwrite" (write_file and edit_file calls)."""
    keep: int = 20
    """Checkpoints kept per sandbox, the oldest dropped first (1 to 1000)."""
    max_mb: int = 1024
    """MiB of new content a sandbox's checkpoints may add to the store, the oldest dropped
    first (0: no bound but keep)."""
    freeze: bool = True
    """Freeze the sandbox for the checkpoint's walk (its background processes cannot change a
    file half read); off: a file written during the walk may be kept torn."""


@dataclass(frozen=True)
class TenantConfig:
    """Limits of one tenant (`[tenants.NAME]`; `[tenants."*"]` for tenants without a table)."""

    max_sandboxes: int = 0
    """Containers at once (running or being created); 0: no limit. Past it, creating another
    is RESOURCE_EXHAUSTED."""
    max_memory_mb: int = 0
    """Sum of the memory limits (sandbox.memory_mb each) of its containers; 0: no limit."""
    max_snapshots: int = -1
    """Snapshots it may keep; -1: [snapshots] max_count; 0: no limit."""
    max_snapshot_mb: int = -1
    """MiB its snapshots may take after deduplication; -1: [snapshots] max_mb; 0: no limit."""
    snapshot_operations: tuple[str, ...] | None = None
    """What it may do with snapshots (see [snapshots] operations); unset: those."""
    shell: Literal["", "bash", "sh"] = ""
    """The shell of its sandboxes ([sandbox] shell); empty: [sandbox]'s. A profile's wins."""
    login_shell: bool | None = None
    """Its sandboxes' login_shell; unset: [sandbox]'s. A profile's wins."""
    checkpoints: bool | None = None
    """Checkpoints before risky calls ([checkpoints] enabled); unset: as [checkpoints] says."""


@dataclass(frozen=True)
class StateConfig:
    """Where the state shared by supervisors lives: the audit log, approvals (pending and
    allow-always), tenant counters and per-key serialization."""

    url: str = field(default="", repr=False)
    """postgresql://user@host/db: every replica of an installation shares it (stateless
    supervisors); empty: SQLite in state_dir (one supervisor on one host). Not in the repr:
    it may hold a password."""
