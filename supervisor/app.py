"""Assembly: config -> engine -> sandbox manager -> gRPC server (and the MCP endpoint). Used
by `stockade serve` and by the tests, which run the real server in-process on port 0."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from stockade.supervisor.auth import Authenticator, auth_enabled
from stockade.supervisor.calls.pipeline import HostPolicy
from stockade.supervisor.calls.tripwires import CallTripwire
from stockade.supervisor.config import AuditConfig, Config
from stockade.supervisor.engines import hosts, incontainer
from stockade.supervisor.engines.backends import create_backend
from stockade.supervisor.engines.backends.base import ContainerBackend
from stockade.supervisor.errors import ConfigError, EngineUnavailable
from stockade.supervisor.fronts.grpc.server import Server
from stockade.supervisor.keys import split
from stockade.supervisor.network.brokered import Injected, InjectionRecorder
from stockade.supervisor.network.egress import EgressHooks
from stockade.supervisor.network.proxy import EgressDecision
from stockade.supervisor.observe import chain
from stockade.supervisor.observe.alarms import AlarmHub, AlarmSink
from stockade.supervisor.observe.audit import AuditLog, AuditRecord
from stockade.supervisor.observe.metrics import Metrics
from stockade.supervisor.observe.refusals import Refusals
from stockade.supervisor.observe.retention import Retention
from stockade.supervisor.observe.telemetry import Observer, log_call
from stockade.supervisor.policy.honeytokens import Honeytokens, as_tripwire, load_key
from stockade.supervisor.sandboxes.containers import AddressOf, socket_address
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.supervisor.sandboxes.owner import InstanceLock
from stockade.supervisor.state import SharedState, SqliteState, open_state

if TYPE_CHECKING:
    from stockade.supervisor.fronts.console.server import ConsoleFront
    from stockade.supervisor.fronts.e2b.server import E2bFront
    from stockade.supervisor.fronts.mcp.server import McpFront
    from stockade.supervisor.observe.tracing import CallTracer

log = logging.getLogger("stockade")
DOCKER_SOCKET = "unix:///var/run/docker.sock"
MAX_AUDIT_PATH = 2048
"""Characters of a request's path an injection's audit record keeps."""


def instance_id(state_dir: Path, config: Config | None = None) -> str:
    """This supervisor's identity, kept in the state directory so a restart adopts. On
    Kubernetes, the installation's (one namespace each): every replica has the same, so any
    of them serves any key's pod, whatever its own (emptyDir) state directory holds."""
    path = state_dir / "instance-id"
    if config is not None and hosts.of_engine(config.engine.kind).shared:
        namespace = config.kubernetes.namespace
        value = hashlib.sha256(f"kubernetes/{namespace}".encode()).hexdigest()[:16]
    elif path.exists():
        return path.read_text().strip()
    else:
        value = secrets.token_hex(8)
    state_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")
    return value


def replica_id(config: Config, instance: str) -> str:
    """Who this supervisor process is in the shared state (its rows, its approvals, its
    heartbeat): on a host, its instance; on Kubernetes, where every replica shares the
    installation's instance id, that and a part of its own, new with each start (a replica
    that ended stops beating and its rows are let be)."""
    if hosts.of_engine(config.engine.kind).shared:
        return f"{instance}-{secrets.token_hex(6)}"
    return instance


def engine_url(config: Config) -> tuple[str, subprocess.Popen[bytes] | None]:
    """The engine's API address; for Podman with no socket configured, start the service.
    Kubernetes has none here: its API server is the kubeconfig's ([kubernetes])."""
    if not hosts.of_engine(config.engine.kind).on_this_machine:
        return "", None
    if config.engine.socket:
        return config.engine.socket, None
    if config.engine.kind == "docker":
        return DOCKER_SOCKET, None
    from stockade.supervisor.engines.services import ensure_podman_service, podman_service_args

    socket = config.state_dir / "podman.sock"
    config.state_dir.mkdir(parents=True, exist_ok=True)
    runtime = config.sandbox.runtime
    try:
        process = ensure_podman_service(
            socket, config.state_dir / "podman-service.log", podman_service_args(runtime)
        )
    except Exception as exc:
        if runtime and "runtime" in str(exc):
            raise ConfigError(
                f"Podman's service does not start with sandbox.runtime {runtime!r}: {exc}\n"
                "The runtime must be an absolute path or a name listed under [engine.runtimes] "
                f'in containers.conf (e.g. {Path(runtime).name} = ["/usr/bin/{Path(runtime).name}"]'
                " in /etc/containers/containers.conf.d/runtimes.conf)"
            ) from exc
        raise EngineUnavailable(f"cannot start the Podman service: {exc}") from exc
    return f"unix://{socket}", process


def agent_addresses(backend: ContainerBackend) -> AddressOf:
    """Where a sandbox's agent is reached: a pod's over TCP with mutual TLS at its IP; a host
    kind's on the unix socket in its host folder."""
    if backend.host.agent_over_network:
        from stockade.supervisor.engines.backends.kubernetes.backend import KubernetesBackend

        if isinstance(backend, KubernetesBackend):
            return backend.address_of
    return socket_address


def sandbox_image(config: Config) -> str:
    if config.sandbox.image:
        return config.sandbox.image
    from stockade.supervisor.engines.image import image_ref

    return image_ref(config.engine.kind)


def build_policy(config: Config, state: SharedState | None = None) -> HostPolicy:
    """The host-side policy parts; a bad rule or secret is a ConfigError here, at start.
    `state`: where the audit log and approvals live (None: SQLite in the state directory);
    one with a shared board must be given on the event loop."""
    from stockade.supervisor.policy.approvals import ApprovalManager
    from stockade.supervisor.policy.guard import Guard, GuardConfigError, GuardRule
    from stockade.supervisor.policy.limits import FairShare, KeyLimiter, TenantSlots
    from stockade.supervisor.policy.scrub.scrubber import Scrubber
    from stockade.supervisor.policy.tool_policy import PolicyEngine
    from stockade.supervisor.sandboxes.manager import WORKSPACE
    from stockade.supervisor.tools.catalog import Catalog

    catalog = Catalog(config.custom_tools)
    state = state or SqliteState.from_config(config)
    rules = [GuardRule(r.name, r.pattern, r.reason, r.checkpoint) for r in config.guard.rules]
    secrets = [
        *config.scrub.secrets,
        *config.sandbox.secrets.values(),
        *(brokered.value for brokered in config.secrets.values()),
    ]
    try:
        guard = Guard(rules, on_parse_error=config.guard.on_parse_error, workspace=WORKSPACE)
        scrubber = Scrubber(secrets)
    except (GuardConfigError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
    audit = (
        state.audit_log(retention(config.audit), sealing(config)) if config.audit.enabled else None
    )
    return HostPolicy(
        catalog=catalog,
        tools=PolicyEngine(config, catalog),
        guard=guard if config.guard.enabled else None,
        approvals=ApprovalManager(
            config.approvals, config.agents, state.allow_always(), board=state.board
        ),
        limiter=KeyLimiter(config.limits),
        streams=TenantSlots(
            config.limits.max_streams_per_tenant, "streams", "limits.max_streams_per_tenant"
        ),
        watches=TenantSlots(
            config.limits.max_watches_per_tenant, "watches", "limits.max_watches_per_tenant"
        ),
        share=FairShare(config.limits.shared_transfer_mb_per_s * (1 << 20)),
        scrubber=scrubber if config.scrub.enabled else None,
        audit=audit,
        refusals=Refusals(audit),
    )


def retention(audit: AuditConfig) -> Retention:
    """The audit log's retention, from its config (checked at load)."""
    return Retention(
        max_age_s=audit.max_age_days * 86400,
        max_bytes=audit.max_size_mb << 20,
        export_dir=Path(audit.export_dir) if audit.export_dir else None,
        interval_s=audit.trim_interval_s,
    )


def signing_key_path(config: Config) -> Path:
    """Where the audit chain's signing key is (audit.signing_key, else the state directory)."""
    return Path(config.audit.signing_key or config.state_dir / chain.KEY_FILE)


def sealing(config: Config) -> chain.Sealing:
    """How the audit writer signs its chain; the key is made on first use unless given."""
    path = signing_key_path(config)
    try:
        key = chain.load_signing_key(path, create=not config.audit.signing_key)
    except chain.SigningKeyError as exc:
        raise ConfigError(str(exc)) from exc
    return chain.Sealing(chain.Signer(key), config.audit.checkpoint_interval_s)


def egress_recorder(policy: HostPolicy) -> Callable[[EgressDecision], None]:
    """Each decision of the egress proxy becomes an audit record (tool "network")."""
    audit = policy.audit

    def record(decision: EgressDecision) -> None:
        target: dict[str, object] = {
            "method": decision.method,
            "host": decision.host,
            "port": decision.port,
        }
        if decision.address:
            target["address"] = decision.address
        step = f"egress: {decision.reason}"
        _network_record(audit, decision.sandbox_key, target, step, refused=not decision.allowed)

    return record


def _network_record(
    audit: AuditLog | None, scoped_key: str, target: dict[str, object], step: str, refused: bool
) -> None:
    """One egress audit record (tool "network", caller "sandbox"): a proxy's decision or a
    brokered secret's injection."""
    if audit is None:
        return
    tenant, key = split(scoped_key)
    audit.record(
        AuditRecord(
            time=time.time(),
            request_id="",
            caller="sandbox",
            sandbox_key=key,
            tenant=tenant,
            agent_id="",
            provider="",
            tool="network",
            arguments_json=json.dumps(target),
            policy_step=step,
            error_code="PERMISSION_DENIED" if refused else "",
            is_error=refused,
        )
    )


def honeytokens(config: Config, policy: HostPolicy, alarm: AlarmSink) -> Honeytokens | None:
    """The decoys' tripwire, when [honeytokens] is on (its key made in the state directory
    on first use); the pipeline gets its checks (policy.honey)."""
    if not config.honeytokens.enabled:
        return None
    try:
        key = load_key(config.state_dir)
    except OSError as exc:
        raise ConfigError(f"honeytokens: {exc}") from exc
    return Honeytokens(key, alarm, config.honeytokens.env_var)


def injection_recorder(policy: HostPolicy) -> InjectionRecorder:
    """Each brokered secret the egress proxy put into a request becomes an audit record
    (tool "network", policy_step "egress: injected NAME"): the sandbox, the secret's name,
    the host, method and path; never the value."""
    audit = policy.audit

    def record(event: Injected) -> None:
        target: dict[str, object] = {
            "secret": event.secret,
            "host": event.host,
            "method": event.method,
            "path": event.path[:MAX_AUDIT_PATH],
        }
        step = f"egress: injected {event.secret}"
        _network_record(audit, event.sandbox_key, target, step, refused=False)

    return record


def housekeeping_recorder(policy: HostPolicy) -> Callable[[str, str, str], None]:
    """Each housekeeping action (a container pruned or reaped, a workspace deleted) becomes
    an audit record (tool "housekeeping", the action and reason in policy_step)."""
    audit = policy.audit

    def record(key: str, action: str, reason: str) -> None:
        if audit is None:
            return
        audit.record(
            AuditRecord(
                time=time.time(),
                request_id="",
                caller="supervisor",
                sandbox_key=key,
                agent_id="",
                provider="",
                tool="housekeeping",
                arguments_json=json.dumps({"action": action}),
                policy_step=f"housekeeping: {action}: {reason}",
            )
        )

    return record


@dataclass
class Telemetry:
    """The observers of calls, and what serves or exports them."""

    observers: tuple[Observer, ...] = ()
    metrics: Metrics | None = None
    metrics_port: int = 0
    tracer: CallTracer | None = None

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.tracer is not None:
            self.tracer.close()


def start_telemetry(config: Config, manager: SandboxManager, policy: HostPolicy) -> Telemetry:
    """Per-call log lines, Prometheus metrics (serving already) and tracing, as configured."""
    obs = config.observability
    found = Telemetry()
    observers: list[Observer] = [log_call] if obs.log_calls else []
    if obs.trace_exporter:
        from stockade.supervisor.observe.tracing import CallTracer

        found.tracer = CallTracer(obs)
        observers.append(found.tracer.observe)
    if obs.metrics_listen:
        metrics = Metrics()
        approvals = policy.approvals
        metrics.watch(
            manager.state_counts,
            lambda: (manager.starts, manager.start_failures),
            lambda: len(approvals.pending()),
            lambda: manager.heal_counts,
        )
        try:
            found.metrics_port = metrics.serve(obs.metrics_listen)
        except OSError as exc:
            found.close()
            raise ConfigError(f"cannot serve metrics on {obs.metrics_listen}: {exc}") from exc
        found.metrics = metrics
        observers.append(metrics.observe)
    found.observers = tuple(observers)
    return found


@dataclass
class Supervisor:
    server: Server
    sandboxes: SandboxManager
    engine_process: subprocess.Popen[bytes] | None
    telemetry: Telemetry
    state: SharedState | None = None
    """Where the audit, approvals and counts live (closed last)."""
    mcp: McpFront | None = None
    """The MCP endpoint, when [mcp] listen is set."""
    e2b: E2bFront | None = None
    """The E2B endpoint, when [e2b] listen is set."""
    console: ConsoleFront | None = None
    """The operator's console, when [console] listen is set."""

    async def stop(self, grace: float | None = None) -> None:
        """Drain (housekeeping.shutdown_grace_s unless given), then stop; sandboxes'
        containers keep running for the next start to adopt. The MCP and E2B endpoints stop
        first: their calls need the sandbox manager the gRPC server closes."""
        if grace is None:
            grace = self.server.config.housekeeping.shutdown_grace_s
        if self.console is not None:
            await self.console.stop(grace)
        if self.e2b is not None:
            await self.e2b.stop(grace)
        if self.mcp is not None:
            await self.mcp.stop(grace)
        await self.server.stop(grace)
        refusals = self.server.policy.refusals
        if refusals is not None:
            refusals.close()  # the counts of the last windows, before the audit log closes
        self.telemetry.close()
        if self.state is not None:
            await self.state.close()
        if self.engine_process is not None:
            self.engine_process.terminate()
            await asyncio.to_thread(self.engine_process.wait, 10)


async def start(config: Config) -> Supervisor:
    """Start everything; the caller owns the returned Supervisor and must stop() it. A
    config that would serve without authentication beyond this host is refused first."""
    authenticator = Authenticator(config.auth) if auth_enabled(config) else None
    config.state_dir.mkdir(parents=True, exist_ok=True)
    lock = InstanceLock(config.state_dir)  # then: a second supervisor starts nothing
    instance = instance_id(config.state_dir, config)
    replica = replica_id(config, instance)
    state = await asyncio.to_thread(open_state, config, replica)
    try:
        return await _start(config, authenticator, lock, instance, replica, state)
    except BaseException:
        await state.close()
        raise


async def _start(
    config: Config,
    authenticator: Authenticator | None,
    lock: InstanceLock,
    instance: str,
    replica: str,
    state: SharedState,
) -> Supervisor:
    policy = build_policy(config, state)
    alarms = AlarmHub(policy.audit, None, None, config)  # its sink goes to whoever sees signs
    alarms.bind(asyncio.get_running_loop())
    honey = honeytokens(config, policy, alarms.sound)
    if honey is not None:
        policy = replace(policy, honey=CallTripwire(honey, config.honeytokens, policy.scrubber))
    pods = not hosts.of_engine(config.engine.kind).on_this_machine
    if incontainer.declared() and not pods:  # before engine_url: it may start Podman's service
        problems = incontainer.config_problems(config)
        if problems:
            raise ConfigError("in a container: " + "; ".join(problems))
    scrubber = policy.scrubber
    warming = asyncio.create_task(asyncio.to_thread(scrubber.warm)) if scrubber else None
    url, process = await asyncio.to_thread(engine_url, config)
    if warming is not None:
        await warming
    backend = await asyncio.to_thread(create_backend, config.engine.kind, url, config.kubernetes)
    try:
        # pods are on other machines: no mount the supervisor makes reaches them
        contained = pods or await asyncio.to_thread(incontainer.check, config, backend)
    except Exception:
        backend.close()
        if process is not None:
            process.terminate()
        raise
    manager = SandboxManager(
        config,
        backend,
        instance_id=instance,
        image=sandbox_image(config),
        address_of=agent_addresses(backend),
        record_egress=egress_recorder(policy),
        egress_hooks=EgressHooks(
            alarm=alarms.sound,
            tripwire=as_tripwire(honey),
            record_injection=injection_recorder(policy),
        ),
        host_mounts=not contained,
        record_event=housekeeping_recorder(policy),
        lock=lock,
        state=state,
        replica=replica,
        honeytokens=honey,
    )
    alarms.react = manager.quarantine
    state.follow(manager.held)
    adopted = await manager.start()
    if adopted:
        log.info("adopted %d running sandbox(es)", len(adopted))
    if not await asyncio.to_thread(backend.image_exists, manager.image):
        log.warning(
            "image %s is missing: run `stockade image build --engine %s`",
            manager.image,
            config.engine.kind,
        )
    telemetry = start_telemetry(config, manager, policy)
    mcp = e2b = console = None
    try:
        alarms.metrics = telemetry.metrics
        server = Server(config, manager, policy, authenticator, telemetry.observers, alarms)
        if config.mcp.listen:  # the SDK is imported only then
            from stockade.supervisor.fronts.mcp.server import start_mcp

            mcp = await start_mcp(config, server.pipeline, policy, authenticator, manager)
        if config.e2b.listen:
            from stockade.supervisor.fronts.e2b.server import start_e2b

            e2b = await start_e2b(config, server.pipeline, policy, authenticator, manager)
        if config.console.listen:
            from stockade.supervisor.fronts.console.server import start_console

            console = await start_console(
                config,
                policy,
                authenticator,
                manager,
                telemetry.metrics,
                alarms,
                server.pipeline,
                manager.checkpoints.undo,
            )
        await server.start()  # once the gRPC API serves, so do MCP and E2B (the launcher waits)
    except BaseException:
        if console is not None:
            await console.stop(0)
        if e2b is not None:
            await e2b.stop(0)
        if mcp is not None:
            await mcp.stop(0)
        telemetry.close()
        raise
    await state.start()
    manager.start_housekeeping()
    return Supervisor(server, manager, process, telemetry, state, mcp, e2b, console)
