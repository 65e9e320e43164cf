"""The sections about the containers: the engine, the sandboxes themselves, their network,
and housekeeping (their lifetime and the host's room), with the constants of the image."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

EngineKind = Literal["podman", "docker", "kubernetes"]
ENGINE_KINDS: tuple[EngineKind, ...] = ("podman", "docker", "kubernetes")
WorkspaceVolume = Literal["pvc", "emptydir"]
NetworkMode = Literal["none", "egress", "open"]
PausedCall = Literal["resume", "refuse"]
IdleAction = Literal["destroy", "pause"]
ShellName = Literal["bash", "sh"]
NETWORK_MODES: tuple[NetworkMode, ...] = ("none", "egress", "open")
"""Narrowest first: a request may only ask for a mode at or before the configured one."""
MiB = 1024 * 1024
MIN_WORKSPACE_MB = 16
"""Smallest capped workspace: ext4 keeps about 5 MiB of a small file system for itself."""
AGENT_UID = 65533
"""The image's stockade-agent user and group, which tini and the agent run as (a constant of
the image's entry point)."""


@dataclass(frozen=True)
class EngineConfig:
    kind: EngineKind = "podman"
    """Which host kind runs the sandboxes: a container engine on this host (podman, docker),
    or pods on a Kubernetes cluster ([kubernetes])."""
    socket: str = ""
    """The engine's API address (unix:///path). Empty: Docker's default socket, or for
    Podman a `podman system service` that the supervisor starts itself."""


@dataclass(frozen=True)
class KubernetesConfig:
    """Sandboxes as pods ([engine] kind = "kubernetes"; docs/kubernetes.md)."""

    namespace: str = "stockade"
    """The one namespace of this installation: its sandbox pods, their claims and Secrets."""
    kubeconfig: str = ""
    """A kubeconfig file; empty: the in-cluster config (the supervisor's service account)."""
    context: str = ""
    """A context of the kubeconfig; empty: its current one."""
    runtime_class: str = ""
    """runtimeClassName of sandbox pods (gvisor, kata); empty: the cluster's default."""
    workspace: WorkspaceVolume = "pvc"
    """pvc: a PersistentVolumeClaim per key that outlives its pods; emptydir: the pod's own."""
    workspace_size_mb: int = 1024
    """The claim's request (or the emptyDir's sizeLimit)."""
    storage_class: str = ""
    """storageClassName of the claims; empty: the cluster's default class."""
    ephemeral_storage_mb: int = 1024
    """The pod's ephemeral-storage limit (its writable layers, logs and emptyDirs)."""
    agent_port: int = 7443
    """The port the agent serves on with mutual TLS (never plain text)."""
    ca_secret: str = "stockade-agent-ca"
    """The Secret (tls.crt, tls.key) of the installation's CA, which issues each sandbox's
    agent certificate and the supervisors' client certificates."""
    supervisor_labels: Mapping[str, str] = field(
        default_factory=lambda: {
            "app.kubernetes.io/name": "stockade",
            "app.kubernetes.io/component": "supervisor",
        }
    )
    """The labels of the supervisor pods: the only pods a sandbox's agent port admits."""
    egress_proxy: str = ""
    """host:port of the Stockade egress proxy Service, the only way out of an egress-mode
    sandbox (its pod's HTTP_PROXY and HTTPS_PROXY); empty: egress mode is refused."""
    egress_listen: str = "0.0.0.0:3128"
    """Where each supervisor serves the egress proxy for pods (the Service's target), when
    the sandboxes' network may be egress: one listener for every pod, each connection known
    by its source address, the pod's IP."""
    seccomp_profile: str = ""
    """A Localhost seccomp profile (relative to the kubelet's seccomp folder); empty:
    RuntimeDefault."""
    image_pull_policy: str = "IfNotPresent"
    ready_timeout_s: float = 120.0
    """How long a new pod may take to be scheduled, pulled and answered by its agent."""


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
    paused_call: PausedCall = "resume"
    """What a call to a paused sandbox does: "resume" it first (transparently; the call then
    runs as usual), or "refuse": FAILED_PRECONDITION with reason SANDBOX_PAUSED, nothing
    runs, the sandbox stays paused until ResumeSandbox."""
    secrets: Mapping[str, str] = field(default_factory=dict)
    """Environment variables injected into every sandbox whose values are redacted from
    every output (with scrub.secrets)."""
    shell: ShellName = "bash"
    """The shell of `exec` and `process start`: "bash" (`/bin/bash -c`) or "sh" (`/bin/sh
    -c`, dash on the sandbox image: no `[[ ]]`, arrays, `{a,b}`, `$'..'`, `==` in `[`).
    Sessions (exec's `session`) need bash. A profile or a tenant may choose another."""
    login_shell: bool = False
    """bash as a login shell (`bash -l -c`): /etc/profile and ~/.profile run before each
    command, for code that expects them (E2B's envd does this; it costs a few ms a call)."""


@dataclass(frozen=True)
class ProfileConfig:
    """A sandbox profile (`[profiles.NAME]`): what a sandbox made with it gets instead of
    [sandbox]'s image, CPUs and memory. A sandbox's profile is chosen when its container is
    made (EnsureSandbox `profile`, an E2B templateID) and kept by its key (docs/sandboxes.md)."""

    image: str = ""
    """Its image; empty: [sandbox] image. Built FROM the sandbox image (it needs its agent)."""
    cpus: float = 0.0
    """CPUs; 0: [sandbox] cpus."""
    memory_mb: int = 0
    """Memory limit; 0: [sandbox] memory_mb."""
    description: str = ""
    """What it is for (shown to E2B clients as the template's)."""
    shell: Literal["", "bash", "sh"] = ""
    """Its shell ([sandbox] shell); empty: the tenant's, else [sandbox]'s."""
    login_shell: bool | None = None
    """Its login_shell; unset: the tenant's, else [sandbox]'s."""
    warm_pool: int = 0
    """Started containers of this profile kept with no key (housekeeping.warm_pool is the
    default profile's), taken by a new key that asks for this profile. 0: no pool."""


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
    upstream_ca_file: str = ""
    """A PEM file of CA certificates the proxy trusts, besides the host's trust store, when it
    opens its own TLS connection to a host it intercepts (one with a brokered secret:
    docs/secrets.md); empty: the host's trust store alone."""
    intercept: str = "brokered"
    """Which TLS connections of a sandbox that holds brokered secrets the proxy terminates:
    "brokered", those to its secrets' hosts (any other allowed host is a plain tunnel, whose
    content the proxy cannot read); "all", every one, so that a placeholder or a decoy is
    seen on its way to any allowed host (the sandbox trusts the egress CA already)."""


@dataclass(frozen=True)
class HousekeepingConfig:
    """Removing what is no longer used, refusing what the host cannot hold, and stopping
    gently. Times are in seconds; 0 turns a timer off."""

    idle_timeout_s: float = 1800.0
    """A sandbox with no call for this long loses its container (the workspace is kept; the
    next call makes a new container on it), paused or not. Never while a call is in flight.
    Background processes started with the `process` tool do not count as use: they end with
    it."""
    idle_action: IdleAction = "destroy"
    """What idleness does first. "destroy": only idle_timeout_s applies. "pause": a sandbox
    with no call for idle_pause_s is paused (every process frozen, memory kept; a call
    resumes it, see sandbox.paused_call), and still loses its container at idle_timeout_s."""
    idle_pause_s: float = 300.0
    """With idle_action = "pause": how long a sandbox may go without a call before it is
    paused; shorter than idle_timeout_s (unless that is 0)."""
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
