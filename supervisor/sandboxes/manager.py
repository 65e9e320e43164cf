"""The sandbox manager: one long-lived container per key, created lazily, adopted after a
supervisor restart, recreated when it died. No gRPC and no SDK here: engines are behind
ContainerBackend and every blocking call goes through asyncio.to_thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import stat
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from stockade.supervisor.config import NETWORK_MODES, Config
from stockade.supervisor.engines import isolation, seccomp, userns
from stockade.supervisor.engines.backends.base import (
    LABEL_INSTANCE,
    LABEL_KEY,
    LABEL_MANAGED,
    LABEL_NETWORK,
    LABEL_NETWORK_ALLOW,
    LABEL_OWNER,
    LABEL_POOL,
    LABEL_SANDBOX_ID,
    LABEL_STATE_DIR,
    LABEL_TENANT,
    BindMount,
    ContainerBackend,
    ContainerInfo,
    ContainerSpec,
)
from stockade.supervisor.errors import (
    AgentMisbehaved,
    ConfigError,
    EngineUnavailable,
    InvalidRequest,
    PolicyDenied,
    QuotaExceeded,
    SandboxBroken,
    SandboxLost,
    SandboxNotFound,
    StockadeError,
)
from stockade.supervisor.keys import sandbox_id, scope, shown, split
from stockade.supervisor.keys import validate_scoped as validate_key
from stockade.supervisor.models import NetworkRequest, SandboxInfo, SandboxState
from stockade.supervisor.network.allowlist import Allowlist, AllowlistError
from stockade.supervisor.network.egress import EgressNetwork
from stockade.supervisor.network.proxy import EgressDecision
from stockade.supervisor.sandboxes import healing, hostfs, owner, pressure, workspaces
from stockade.supervisor.sandboxes.agent_link import (
    AgentCallFailed,
    AgentConnection,
    AgentOutput,
    AgentReply,
    AgentStarted,
)
from stockade.supervisor.sandboxes.replies import ReplyLimits

log = logging.getLogger("stockade")

AGENT_SOCKET_DIR = "/run/stockade"
CONTAINER_USER = "0:0"
"""The container starts as root only for the image's entry point (setpriv), which at once
makes tini and the agent the image's stockade-agent (config.AGENT_UID) with the three
capabilities below; the agent takes the sandbox user as effective ids and drops them all."""
AGENT_CAPABILITIES = ("SETUID", "SETGID", "SETPCAP")
GVISOR_ENTRYPOINT = ("/usr/bin/tini", "--", "python3", "-m", "stockade.agent")
"""gVisor has no ambient capabilities, so setpriv cannot pass the three on: there tini stays
root (gVisor's own, inside its kernel) and the agent starts as root and becomes the sandbox
user itself (`--agent-user`: gVisor resets effective ids on exec, so it cannot keep a user of
its own and start commands as another; identity.py)."""
TRANSFER_TIMEOUT_S = 3600.0
INSPECT_TIMEOUT_S = 30.0
DEATH_NOTICE_S = 15.0
WORKSPACE = "/workspace"
MAX_NETWORK_ALLOW = 256
"""Patterns an EnsureSandbox request may list (they travel in a container label)."""
POOL_PREFIX = "pool-"
"""Folders of warm-pool containers under STATE/sandboxes (sandbox ids are hex: no clash)."""
RETIRED = "retired-at"
"""In a sandbox's folder: written when its container is removed (its mtime starts the
workspace's retention), deleted when a container is made."""
POOL_ID = "pool-id"
"""In a sandbox's folder that began as a warm-pool container: that container's pool id (its
labels carry no key, so adoption after a restart finds the key here)."""

SILENCE_S = 5.0
"""How long an agent whose container runs may leave Hello unanswered before the sandbox is
taken for wedged (probes of PROBE_S each, one after another)."""
PROBE_S = 1.0
FACTS_TIMEOUT_S = 5.0

POOL_CLOSE_S = 30.0
"""At close, how long a pool container being made may take beyond start_timeout_s."""
POOL_PROBE_S = 2.0
"""How long a pool container's agent may take to answer before it is replaced."""

Recorder = Callable[[str, str, str], None]
"""(sandbox key, action, reason): a housekeeping event for the audit log."""


@dataclass(frozen=True)
class SandboxNetwork:
    mode: str
    """none, egress or open."""
    allow: tuple[str, ...] = ()
    """egress: the canonical allowlist patterns of this sandbox."""

    def labels(self) -> dict[str, str]:
        return {LABEL_NETWORK: self.mode, LABEL_NETWORK_ALLOW: ",".join(self.allow)}


@dataclass
class _Sandbox:
    key: str
    sid: str
    info: ContainerInfo
    agent: AgentConnection
    network: SandboxNetwork
    last_used_at: datetime | None = None
    in_flight: int = 0
    """Calls using the agent now; housekeeping never removes a sandbox while above 0."""
    idle_since: float = field(default_factory=time.monotonic)
    born: float = field(default_factory=time.time)
    """When the container was made (wall clock: an adopted container's age counts too)."""
    lost: bool = False
    broken: bool = False
    """The agent misbehaved or the sandbox is wedged: nothing more is asked of it; the next
    call recreates the sandbox."""
    trouble: healing.Trouble | None = None
    """Why it is broken (healing.py)."""


@dataclass(frozen=True)
class _Paths:
    root: Path
    workspace: Path
    run: Path
    socket: Path
    key_file: Path
    image: Path
    """The workspace's file system when it is size-capped (sandbox.workspace_size_mb)."""
    tmp: Path
    """/tmp's tmpfs when the supervisor mounts it (an inode cap the engine cannot set)."""
    owners: Path
    """The host uid:gid the workspace was last handed to, one per line (two while a hand-over
    to new ids is under way): the ids the sandbox user had, to be translated."""

    @property
    def retired(self) -> Path:
        return self.root / RETIRED

    @property
    def pool_id(self) -> Path:
        return self.root / POOL_ID


@dataclass
class _Pooled:
    """A warm-pool container: started, its agent ready, no key yet."""

    pool_id: str
    info: ContainerInfo
    agent: AgentConnection
    paths: _Paths


class SandboxManager:
    def __init__(
        self,
        config: Config,
        backend: ContainerBackend,
        *,
        instance_id: str,
        image: str,
        connect: Callable[[Path], AgentConnection] | None = None,
        record_egress: Callable[[EgressDecision], None] | None = None,
        host_mounts: bool = True,
        record_event: Recorder | None = None,
        lock: owner.InstanceLock | None = None,
        silence_s: float = SILENCE_S,
    ) -> None:
        """host_mounts: whether a mount the supervisor makes reaches the engine (not from
        the supervisor's own container). `lock`: this instance's lock on the state directory,
        when the caller took it already (before starting an engine service); else it is
        taken here. `silence_s`: how long a silent agent is waited for (healing)."""
        self._config = config
        self._silence_s = silence_s
        self._backend = backend
        self._instance_id = instance_id
        self._image = image
        limits = ReplyLimits(config.tools.max_output_bytes, config.tools.process_log_bytes)
        self._connect = connect or partial(AgentConnection, limits=limits)
        self._root = config.state_dir / "sandboxes"
        self._seccomp = ""
        self._gvisor = False
        self._host_mounts = host_mounts
        self._sandboxes: dict[str, _Sandbox] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._starting: set[str] = set()
        uid, _, gid = config.sandbox.user.partition(":")
        self._uid, self._gid = int(uid), int(gid or uid)
        self._egress = EgressNetwork(config.network, instance_id, record_egress or _ignore)
        self._record = record_event or _ignore_event
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = lock or owner.InstanceLock(config.state_dir)
        self._owner = owner.this_process(self._lock)
        self._sweeper: asyncio.Task[None] | None = None
        self._pool: list[_Pooled] = []
        self._pool_wanted = asyncio.Event()
        self._pool_task: asyncio.Task[None] | None = None
        self._closing = False
        self._daemon_maps: userns.IdMaps | None = None
        self._userns = bool(config.sandbox.user_namespace)
        """sandbox.user_namespace as start() resolved it (unset: where the engine can)."""
        self.starts = 0
        """Containers started (and answered by their agent) since this supervisor started."""
        self.start_failures = 0
        """Container starts that failed: the engine refused, or the agent never answered."""
        self.heal_counts = dict.fromkeys(healing.KINDS, 0)
        """Containers re-created because they could not serve, by healing kind."""
        self._heals: dict[str, healing.Heal] = {}
        sb = config.sandbox
        fsize = sb.max_file_size_mb * 1024 * 1024 or None
        self._expected = healing.Expected(sb.nofile, sb.nproc, fsize)

    def state_counts(self) -> dict[str, int]:
        """How many sandboxes held now are in each state (RUNNING, BROKEN, EXITED), every
        state named; the ones with only a workspace are not counted."""
        held = (SandboxState.RUNNING, SandboxState.BROKEN, SandboxState.EXITED)
        counts = {state.name: 0 for state in held}
        for sandbox in self._sandboxes.values():
            counts[_state(sandbox).name] += 1
        return counts

    @property
    def engine(self) -> str:
        return self._backend.engine

    @property
    def image(self) -> str:
        return self._image

    async def start(self) -> list[str]:
        """Check the engine and adopt this instance's running containers; return adopted keys.
        A container made from another image than the configured one is re-created instead."""
        await asyncio.to_thread(self._backend.ping)
        self._gvisor = await asyncio.to_thread(self._runs_gvisor)
        if self._gvisor and self._config.sandbox.network != "none":
            log.warning(
                "sandbox.runtime %r is gVisor, which runs with --network=none here: sandboxes "
                "get no network, whatever their mode",
                self._config.sandbox.runtime,
            )
        self._userns = await asyncio.to_thread(self._wants_userns)
        wanted = self._userns
        self._daemon_maps = await asyncio.to_thread(self._backend.check_user_namespace, wanted)
        if self._daemon_maps is not None and not wanted:
            uid, gid = self._daemon_maps.host_ids(self._uid, self._gid)
            log.warning(
                "%s remaps user namespaces for every container (userns-remap): the sandbox "
                "user is %s:%s on the host, and workspaces are handed to it",
                self._backend.engine, uid, gid,
            )  # fmt: skip
        if self._config.sandbox.workspace_size_mb:
            await asyncio.to_thread(workspaces.check_support)
        if (
            not self._host_mounts
            and self._config.sandbox.tmp_inodes
            and (self._gvisor or not self._backend.tmpfs_inodes)
        ):
            log.warning(
                "sandbox.tmp_inodes is not enforced: %s's tmpfs takes no inode cap here, and a "
                "tmpfs this supervisor mounts in its container would not reach the engine",
                "gVisor" if self._gvisor else self._backend.engine,
            )
        if self._host_tmp() and os.geteuid() != 0:
            raise ConfigError(
                "sandbox.tmp_inodes: the engine's tmpfs mounts take no inode cap here (Podman "
                "4.3 refuses one; gVisor ignores it), so the supervisor mounts /tmp's tmpfs "
                "itself, which needs it to run as root; set sandbox.tmp_inodes = 0 for the "
                "engine's default"
            )
        self._root.mkdir(parents=True, exist_ok=True)
        os.chmod(self._root, 0o700)
        target = self._config.state_dir / "seccomp.json"
        profile = seccomp.write_profile(target, gvisor=self._gvisor)
        self._seccomp = str(profile) if profile else ""
        found = await asyncio.to_thread(self._backend.list, self._labels())
        image_id = await asyncio.to_thread(self._backend.image_id, self._image)
        pooled = self._pool_folders()
        adopted: list[str] = []
        for info in found:
            key = self._key_of(info, pooled)
            outcome = await self._adopt(key, info, image_id) if key is not None else ""
            if outcome == "adopted" and key is not None:
                adopted.append(key)
            elif not outcome:
                await asyncio.to_thread(self._backend.remove, info.id)
        await asyncio.to_thread(self._drop_pool_folders)
        await self._egress.prune({s.sid for s in self._sandboxes.values()})
        return adopted

    def start_housekeeping(self) -> None:
        """The sweeper (idle and age prune, workspace retention, orphan reaping) and the
        warm pool's filler, as background tasks until close()."""
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="stockade-sweeper")
        if self._config.housekeeping.warm_pool:
            self._pool_task = asyncio.create_task(self._fill_pool(), name="stockade-pool")
            self._pool_wanted.set()

    def _key_of(self, info: ContainerInfo, pooled: dict[str, Path]) -> str | None:
        """The (tenant-scoped) key a container of this instance serves: from its labels, or
        for one that began in the warm pool, from the folder it was given; None: not
        adoptable."""
        pool_id = info.labels.get(LABEL_POOL, "")
        if not pool_id:
            key = _labelled_key(info.labels)
            return key if key and info.labels.get(LABEL_SANDBOX_ID) == sandbox_id(key) else None
        folder = pooled.get(pool_id)
        if folder is None or folder.name.startswith(POOL_PREFIX):
            return None  # unassigned (the pool is filled afresh) or its folder is gone
        try:
            key = (folder / "key").read_text(encoding="utf-8", errors="surrogatepass")
        except OSError:
            return None
        return key if sandbox_id(key) == folder.name else None

    async def _adopt(self, key: str, info: ContainerInfo, image_id: str | None) -> str:
        """ "adopted", "replaced" (re-created on the configured image), or "" (not
        adoptable: the caller removes the container)."""
        network = self._adopted_network(info)
        if key in self._sandboxes or not info.running or network is None:
            return ""
        if not self._adoptable(self._paths(key), info):
            return ""
        if image_id and info.image_id != image_id:
            await self._replace(key, info, network, image_id)
            return "replaced"
        sandbox = _Sandbox(key, sandbox_id(key), info, self._agent_for(key), network)
        sandbox.born = _born(info)
        try:
            await self._attach_network(sandbox)
        except SandboxBroken as exc:
            log.warning("not adopting sandbox %r: %s", shown(key), exc)
            await sandbox.agent.close()
            return ""
        self._sandboxes[key] = sandbox
        return "adopted"

    async def _replace(
        self, key: str, info: ContainerInfo, network: SandboxNetwork, image_id: str
    ) -> None:
        """Re-create, with its workspace, a container that runs another image than the
        configured one (`stockade image build` made a new agent, or [sandbox] image changed).
        Done here rather than by the next call so that it keeps its network, which
        EnsureSandbox may have narrowed (a call would make it with the configured one)."""
        log.warning(
            "replacing sandbox %r: its container runs image %s (%s), the configured image %s "
            "is now %s; processes running in it are lost, its workspace is kept",
            shown(key), info.image, info.image_id[:12] or "?", self._image, image_id[:12],
        )  # fmt: skip
        await asyncio.to_thread(self._backend.remove, info.id)
        try:
            self._sandboxes[key] = await self._create(key, network)
        except SandboxBroken as exc:
            log.warning(
                "sandbox %r not re-created (the next call tries again): %s", shown(key), exc
            )

    def _pool_folders(self) -> dict[str, Path]:
        """pool id -> the folder holding it (pool-ID while unassigned, else a key's)."""
        found = {}
        for marker in self._root.glob(f"*/{POOL_ID}"):
            with contextlib.suppress(OSError):
                found[marker.read_text().strip()] = marker.parent
        return found

    def _drop_pool_folders(self) -> None:
        """Delete the folders of unassigned pool containers, at start (their containers
        were just removed). They never held a caller's files."""
        for folder in self._root.glob(f"{POOL_PREFIX}*"):
            _unmount_dirs(_paths_at(folder))
            hostfs.remove_tree(folder)

    def _adopted_network(self, info: ContainerInfo) -> SandboxNetwork | None:
        """An adopted container's network as it was created, re-checked against today's
        config: None when it is now wider than allowed (the container is then replaced)."""
        mode = info.labels.get(LABEL_NETWORK, "none")
        allow = tuple(p for p in info.labels.get(LABEL_NETWORK_ALLOW, "").split(",") if p)
        try:
            return self._network_for(NetworkRequest(mode, allow))
        except (InvalidRequest, PolicyDenied) as exc:
            log.warning("replacing sandbox %r: %s", info.labels.get(LABEL_KEY, ""), exc)
            return None

    def _network_for(self, request: NetworkRequest | None) -> SandboxNetwork:
        """The network a sandbox gets: the configured one, or a narrower one asked for."""
        configured = self._config.sandbox.network
        mode = (request.mode if request else "") or configured
        if mode not in NETWORK_MODES:
            raise InvalidRequest(f"network mode must be one of {list(NETWORK_MODES)}, not {mode!r}")
        if NETWORK_MODES.index(mode) > NETWORK_MODES.index(configured):
            raise PolicyDenied(
                f"network mode {mode!r} is wider than the configured {configured!r} "
                "(a request may narrow the network, never widen it)"
            )
        if request is not None and len(request.allow) > MAX_NETWORK_ALLOW:
            raise InvalidRequest(
                f"a network allowlist may have at most {MAX_NETWORK_ALLOW} patterns, "
                f"not {len(request.allow)}"
            )
        if request is not None and request.allow and mode != "egress":
            raise InvalidRequest("an allowlist applies only to network mode 'egress'")
        if mode != "egress":
            return SandboxNetwork(mode)
        configured_list = self._egress.allowlist
        try:
            chosen = configured_list.narrowed(request.allow) if request and request.allow else None
        except AllowlistError as exc:
            raise PolicyDenied(f"network allowlist: {exc}") from exc
        return SandboxNetwork(mode, (chosen or configured_list).patterns)

    async def _attach_network(self, sandbox: _Sandbox) -> None:
        if sandbox.network.mode == "egress":
            allowlist = Allowlist(sandbox.network.allow, self._config.network.ports)
            await self._egress.attach(sandbox.key, sandbox.sid, sandbox.info.pid, allowlist)

    async def close(self) -> None:
        """Stop the background tasks, remove the unassigned pool containers, close agent
        channels; sandboxes' containers keep running for the next start to adopt."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        if self._pool_task is not None:  # let a container being made join the pool first
            self._closing = True
            self._pool_wanted.set()
            limit = self._config.sandbox.start_timeout_s + POOL_CLOSE_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._pool_task), limit)
            self._pool_task.cancel()
            await asyncio.gather(self._pool_task, return_exceptions=True)
        while self._pool:
            await self._drop_pooled(self._pool.pop())
        for sandbox in self._sandboxes.values():
            await sandbox.agent.close()
        await self._egress.close()
        self._lock.release()

    @asynccontextmanager
    async def _agent(
        self, key: str, *, pass_deadline: bool = True, deadline_breaks: bool = False
    ) -> AsyncIterator[AgentConnection]:
        """The key's agent (its sandbox made ready), with a failed call turned into
        SandboxLost, AgentMisbehaved (the sandbox marked broken) or SandboxBroken; a passed
        deadline is the caller's to report unless pass_deadline is off, or a fault of the
        agent with deadline_breaks (exec: the agent enforces the command's timeout itself).
        Any passed deadline on an agent that then stays silent (healing) marks it broken."""
        sandbox = await self.ensure(key)
        sandbox.last_used_at = datetime.now(UTC)
        sandbox.in_flight += 1  # no await since ensure returned: housekeeping cannot slip in
        try:
            yield sandbox.agent
        except AgentMisbehaved as exc:
            self._mark_broken(sandbox, str(exc))
        except AgentCallFailed as exc:
            deadline = exc.code.name == "DEADLINE_EXCEEDED"
            if deadline and deadline_breaks:  # a fault whatever it answers now: not asked
                why = "the sandbox's agent did not end the command by its timeout and grace"
                self._mark_broken(sandbox, why, healing.AGENT_UNRESPONSIVE)
            if deadline and await self._unresponsive(sandbox):
                self._mark_broken(sandbox, _silent(self._silence_s), healing.AGENT_UNRESPONSIVE)
            if deadline and pass_deadline:
                raise
            await self._diagnose(sandbox, exc)
        finally:
            sandbox.in_flight -= 1
            sandbox.idle_since = time.monotonic()

    def _mark_broken(
        self, sandbox: _Sandbox, why: str, kind: str = healing.AGENT_MISBEHAVED
    ) -> NoReturn:
        self._mark_wedged(sandbox, healing.Trouble(kind, why))
        raise AgentMisbehaved(
            f"{why}; the sandbox is marked broken and the next call recreates it "
            "(the workspace is kept)"
        )

    def _mark_wedged(self, sandbox: _Sandbox, trouble: healing.Trouble) -> None:
        """The next call re-creates the sandbox (the workspace is kept) and records a heal."""
        if not sandbox.broken:
            log.warning("sandbox %r cannot serve calls: %s", shown(sandbox.key), trouble)
        sandbox.broken = True
        sandbox.trouble = sandbox.trouble or trouble

    def _healed(self, key: str, trouble: healing.Trouble) -> None:
        before = self._heals.get(key)
        count = before.count + 1 if before is not None else 1
        self._heals[key] = healing.Heal(trouble, datetime.now(UTC), count)
        self.heal_counts[trouble.kind] = self.heal_counts.get(trouble.kind, 0) + 1
        log.warning(
            "healed sandbox %r: its container was re-created with the workspace kept (%s)",
            shown(key), trouble,
        )  # fmt: skip
        self._record(key, "heal", str(trouble))

    async def _unresponsive(self, sandbox: _Sandbox) -> bool:
        """Whether the agent leaves Hello unanswered for silence_s while the engine says its
        container runs (a dead container is no wedge: the call's own path reports it)."""
        deadline = time.monotonic() + self._silence_s
        while time.monotonic() < deadline:
            if await sandbox.agent.answers(PROBE_S):
                return False
        info = await asyncio.to_thread(self._backend.inspect, sandbox.info.id)
        return info is not None and info.running

    async def _health(self, sandbox: _Sandbox, *, after_sweep: bool) -> healing.Trouble | None:
        """What the agent's facts show (healing.diagnose); None when it cannot tell them."""
        try:
            facts = await sandbox.agent.inspect(list(healing.FACT_FILES), [], "", FACTS_TIMEOUT_S)
        except (StockadeError, AgentCallFailed) as exc:
            log.info("sandbox %r: no health facts: %s", shown(sandbox.key), exc)
            return None
        return healing.diagnose(facts.files, self._expected, after_sweep=after_sweep)

    async def _wedged_by(self, key: str, agent: AgentConnection, reply: AgentReply) -> bool:
        """After a failed reply, or an exec result that says the pids limit stays crowded
        (the flag is taken out of the result), read the facts; mark the sandbox when they
        show it wedged. True when the reply says the command never started and the sandbox
        is now marked (running it again on a fresh container is safe)."""
        sandbox = self._sandboxes.get(key)
        crowded = reply.result is not None and bool(reply.result.pop(healing.CROWDED, False))
        if not (crowded or reply.error_code in healing.CHECKED_CODES) or sandbox is None:
            return False
        if sandbox.agent is not agent or not _usable(sandbox):
            return False
        spawn_failure = healing.spawn_failed(reply.error_code, reply.error_message)
        trouble = await self._health(sandbox, after_sweep=crowded or spawn_failure)
        if trouble is None:
            return False
        self._mark_wedged(sandbox, trouble)
        return spawn_failure

    async def check_health(self, sandbox: _Sandbox) -> None:
        """A probe between calls: a silent agent, a stopped init or lowered agent limits
        mark the sandbox, and a silent agent's channel is closed (calls stuck on it end with
        SandboxLost)."""
        if not _usable(sandbox):
            return
        answered = await sandbox.agent.answers(PROBE_S)
        if self._sandboxes.get(sandbox.key) is not sandbox:
            return  # retired, replaced or destroyed meanwhile: nothing left to judge
        if not answered and await self._unresponsive(sandbox):
            self._mark_wedged(
                sandbox, healing.Trouble(healing.AGENT_UNRESPONSIVE, _silent(self._silence_s))
            )
            await sandbox.agent.close()
            return
        trouble = await self._health(sandbox, after_sweep=False)
        if trouble is not None and _usable(sandbox):
            self._mark_wedged(sandbox, trouble)

    async def invoke(
        self, key: str, tool: str, arguments: dict[str, Any], timeout: float, request_id: str
    ) -> AgentReply:
        """The tool's reply. A command that could not start in a sandbox found wedged never
        ran: it is run once more, on the re-created container."""
        for attempt in (1, 2):
            async with self._agent(key, deadline_breaks=tool == "exec") as agent:
                reply = await agent.invoke(tool, arguments, timeout, request_id)
                if not await self._wedged_by(key, agent, reply) or attempt == 2:
                    return reply
        raise AssertionError("unreachable")

    async def invoke_stream(
        self, key: str, tool: str, arguments: dict[str, Any], timeout: float, request_id: str
    ) -> AsyncIterator[AgentStarted | AgentOutput | AgentReply]:
        """As invoke(), streamed: a reply that comes first (the command never started) in a
        sandbox found wedged is not passed on; the call runs once more instead."""
        for attempt in (1, 2):
            seen = False
            async with self._agent(key, deadline_breaks=tool == "exec") as agent:
                async for event in agent.invoke_stream(tool, arguments, timeout, request_id):
                    wedged = isinstance(event, AgentReply) and await self._wedged_by(
                        key, agent, event
                    )
                    if wedged and not seen and attempt == 1:
                        break  # the reply ends the stream: nothing is left unread
                    seen = True
                    yield event
                else:
                    return

    async def upload(
        self, key: str, path: str, tar: bool, mode: int, chunks: AsyncIterator[bytes]
    ) -> AgentReply:
        async with self._agent(key, pass_deadline=False) as agent:
            return await agent.upload(path, tar, mode, chunks, TRANSFER_TIMEOUT_S)

    async def download(self, key: str, path: str, tar: bool) -> AsyncIterator[bytes | AgentReply]:
        async with self._agent(key, pass_deadline=False) as agent:
            async for item in agent.download(path, tar, TRANSFER_TIMEOUT_S):
                yield item

    async def inspect_isolation(self, key: str) -> isolation.IsolationReport:
        """The sandbox's isolation from inside (raw facts from its agent, through no tool
        and no policy: nothing the caller says reaches the sandbox) and from outside (the
        engine). Never creates a container: an unknown key or one without a container is
        SandboxNotFound."""
        validate_key(key)
        if key not in self._sandboxes:
            where = "has only a workspace" if self._paths(key).root.is_dir() else "is unknown"
            raise SandboxNotFound(
                f"sandbox {shown(key)!r} {where}; a tool call creates its container"
            )
        probe = f"/.stockade-write-probe-{os.urandom(6).hex()}"
        async with self._agent(key, pass_deadline=False) as agent:
            facts = await agent.inspect(
                list(isolation.FILES), list(isolation.LINKS), probe, INSPECT_TIMEOUT_S
            )
        sandbox = self._sandboxes[key]
        view = await asyncio.to_thread(self._backend.security_view, sandbox.info.id)
        if view is None:
            raise SandboxNotFound(f"the container of sandbox {shown(key)!r} is gone")
        runtime = await asyncio.to_thread(self._backend.runtime_facts)
        known = await asyncio.to_thread(self._backend.runtimes)
        inside = isolation.InsideFacts(
            facts.files, facts.links, facts.root_read_only, facts.write_probe_error
        )
        return isolation.IsolationReport(
            key=key,
            container_id=sandbox.info.id,
            engine=self._backend.engine,
            inside=isolation.inside_view(inside),
            outside=view,
            namespaces=isolation.namespaces(facts.links, isolation.host_namespaces()),
            runtime=isolation.runtime_info(runtime, view.runtime, known),
        )

    async def _diagnose(self, sandbox: _Sandbox, exc: AgentCallFailed) -> NoReturn:
        """The agent call failed: find out whether the container died. An engine can take
        seconds to notice a killed container (Podman on a busy host), so while the agent does
        not answer either, keep asking the engine for up to DEATH_NOTICE_S. If the container
        runs on, the agent failed (an oversized or undecodable reply, a broken connection):
        the sandbox is broken, unless the call only ran out of time. A reply the channel
        refused (too large, undecodable) proves the agent answered: no probing then, only the
        one look at the container."""
        answered = exc.code.name in ("RESOURCE_EXHAUSTED", "INTERNAL")
        deadline = time.monotonic() + (0.0 if answered else DEATH_NOTICE_S)
        delay = 0.0
        while True:
            await asyncio.sleep(delay)
            info = await asyncio.to_thread(self._backend.inspect, sandbox.info.id)
            if info is None or not info.running:
                sandbox.lost = True
                raise SandboxLost(_death_note(info))
            if delay and await sandbox.agent.answers():
                answered = True
                break
            if time.monotonic() >= deadline:
                break
            delay = min(delay * 2 or 0.05, 1.0)
        if not answered:
            self._mark_broken(sandbox, _silent(DEATH_NOTICE_S), healing.AGENT_UNRESPONSIVE)
        if exc.code.name in ("DEADLINE_EXCEEDED", "CANCELLED"):
            raise SandboxBroken(f"the sandbox's agent failed: {exc}") from exc
        self._mark_broken(sandbox, f"the sandbox's agent failed: {exc}")

    async def ensure(self, key: str, network: NetworkRequest | None = None) -> _Sandbox:
        """The running sandbox for key, created (or re-created) when needed. With a network
        request, a sandbox whose network differs is re-created (the workspace is kept)."""
        sandbox = self._sandboxes.get(key)
        wanted = self._network_for(network) if network is not None else None
        if (
            sandbox is not None
            and _usable(sandbox)
            and sandbox.agent.is_ready()
            and wanted in (None, sandbox.network)
        ):
            sandbox.idle_since = time.monotonic()
            return sandbox
        validate_key(key)
        async with self._locks.setdefault(key, asyncio.Lock()):
            old = self._sandboxes.get(key)
            trouble = None
            if old is not None and wanted in (None, old.network):
                trouble = await self._trouble(old)
                if trouble is None:
                    old.idle_since = time.monotonic()
                    return old
            if old is not None:
                await self._discard(old)
            chosen = wanted or self._network_for(None)
            self._admit(key)
            self._starting.add(key)
            try:
                sandbox = await self._take_pooled(key, chosen)
                if sandbox is None:
                    hk, state_dir = self._config.housekeeping, self._config.state_dir
                    await asyncio.to_thread(pressure.check, hk, state_dir)
                    sandbox = await self._create(key, chosen)
            finally:
                self._starting.discard(key)
            self._sandboxes[key] = sandbox
            if trouble is not None:
                self._healed(key, trouble)
            return sandbox

    def _admit(self, key: str) -> None:
        """Refuse a new container past its tenant's limits. Sandboxes being created count
        (no await between this check and the reservation, so concurrent first calls of one
        tenant cannot overshoot together)."""
        tenant = split(key)[0]
        limits = self._config.tenant_limits(tenant)
        if not (limits.max_sandboxes or limits.max_memory_mb):
            return
        live = {k for k in (*self._sandboxes, *self._starting) if split(k)[0] == tenant}
        count = len(live - {key}) + 1
        if limits.max_sandboxes and count > limits.max_sandboxes:
            raise QuotaExceeded(
                f"tenant {tenant!r} may have at most {limits.max_sandboxes} sandbox(es) "
                f"(tenants.{tenant}.max_sandboxes); destroy one first"
            )
        memory = count * self._config.sandbox.memory_mb
        if limits.max_memory_mb and memory > limits.max_memory_mb:
            raise QuotaExceeded(
                f"tenant {tenant!r} may use at most {limits.max_memory_mb} MiB of sandbox memory "
                f"(tenants.{tenant}.max_memory_mb); another sandbox of "
                f"{self._config.sandbox.memory_mb} MiB would make {memory} MiB"
            )

    async def _trouble(self, sandbox: _Sandbox) -> healing.Trouble | None:
        """Why the sandbox cannot take the next call (None: it can)."""
        if sandbox.broken:
            return sandbox.trouble or healing.Trouble(healing.AGENT_MISBEHAVED, "marked broken")
        exited = healing.Trouble(healing.CONTAINER_EXITED, "the container stopped or vanished")
        if sandbox.lost:
            return exited
        if sandbox.agent.is_ready():
            return None
        info = await asyncio.to_thread(self._backend.inspect, sandbox.info.id)
        if info is None or not info.running:
            return healing.Trouble(healing.CONTAINER_EXITED, _death_note(info))
        try:
            await sandbox.agent.wait_ready(self._config.sandbox.start_timeout_s)
        except SandboxBroken as exc:
            return healing.Trouble(healing.AGENT_UNRESPONSIVE, str(exc))
        return None

    async def _discard(self, sandbox: _Sandbox) -> None:
        self._sandboxes.pop(sandbox.key, None)
        await sandbox.agent.close()
        await self._egress.detach(sandbox.sid)
        await asyncio.to_thread(self._backend.remove, sandbox.info.id)
        await asyncio.to_thread(workspaces.unmount, self._paths(sandbox.key).tmp)

    async def _create(self, key: str, network: SandboxNetwork) -> _Sandbox:
        paths = self._prepare_dirs(key)
        spec = self._spec(key, paths, network)
        await asyncio.to_thread(self._remove_own, spec.name)
        if network.mode == "open":
            log.warning("sandbox %r gets network mode open: the engine's bridge network", key)
        await asyncio.to_thread(self._mount_dirs, paths)
        handed: list[tuple[int, int]] = []
        hand_over = partial(self._hand_over, paths, handed)
        try:
            info = await asyncio.to_thread(self._backend.run, spec, hand_over)
        except Exception:
            self.start_failures += 1
            await asyncio.to_thread(workspaces.unmount, paths.tmp)
            raise
        sandbox = _Sandbox(key, sandbox_id(key), info, self._connect(paths.socket), network)
        sandbox.born = _born(info)
        try:
            self._check_mapped(info, handed[0])
            await self._attach_network(sandbox)
            await sandbox.agent.wait_ready(self._config.sandbox.start_timeout_s)
        except SandboxBroken as exc:
            self.start_failures += 1
            await sandbox.agent.close()
            await self._egress.detach(sandbox.sid)
            await asyncio.to_thread(self._backend.remove, info.id)
            await asyncio.to_thread(workspaces.unmount, paths.tmp)
            raise SandboxBroken(f"sandbox {shown(key)!r} did not start: {exc}") from exc
        self.starts += 1
        self._seal_run_dir(paths)
        return sandbox

    def _mount_dirs(self, paths: _Paths) -> None:
        """The file systems the supervisor makes for a new container: the size-capped
        workspace when configured, and /tmp when the engine cannot cap its inodes (a fresh
        tmpfs per container)."""
        self._mount_workspace(paths)
        if self._host_tmp():
            sb = self._config.sandbox
            workspaces.mount_tmp(paths.tmp, sb.tmp_size_mb * 1024 * 1024, sb.tmp_inodes)

    def _remove_own(self, name: str) -> bool:
        """Remove the container of that name if it is this instance's. Names carry only a
        prefix of the instance id: another supervisor's container may hold the name (then
        creating ours fails on the conflict, which is better than removing theirs)."""
        info = self._backend.inspect(name)
        if info is None or info.labels.get(LABEL_INSTANCE) != self._instance_id:
            return False
        return self._backend.remove(info.id)

    def _prepare_dirs(self, key: str) -> _Paths:
        paths = self._paths(key)
        paths.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        paths.key_file.write_text(key, encoding="utf-8", errors="surrogatepass")
        paths.retired.unlink(missing_ok=True)
        paths.pool_id.unlink(missing_ok=True)  # a container of its own now, not the pool's
        self._prepare_subdirs(paths)
        return paths

    def _prepare_subdirs(self, paths: _Paths) -> None:
        """A new workspace, and the agent's folder, for the sandbox user; an existing
        workspace keeps its owner until _hand_over (which reads it) gives it over."""
        for directory in (paths.workspace, paths.run):
            try:
                directory.mkdir()
            except FileExistsError:
                if directory == paths.workspace:
                    continue
            os.chown(directory, self._uid, self._gid, follow_symlinks=False)
        os.chmod(paths.run, 0o700)
        paths.socket.unlink(missing_ok=True)

    def _check_mapped(self, info: ContainerInfo, ids: tuple[int, int]) -> None:
        """Under gVisor the container's host process is gVisor's own kernel, whose uid map
        says nothing about the sandbox user's: the agent's start tells instead."""
        if not self._runs_gvisor():
            _check_mapped(info, self._uid, ids)

    def _wants_userns(self) -> bool:
        """sandbox.user_namespace, or when unset: on for Podman on the host (a range of ids
        per sandbox), unless under gVisor or without a `containers` range; else off, with a
        warning naming the uid sandboxes then share with the host."""
        configured = self._config.sandbox.user_namespace
        if configured is not None:
            return configured
        why = userns.auto_refusal(self._backend.engine, self._gvisor, self._host_mounts)
        if why is None:
            return True
        log.warning(
            "sandboxes run without a user namespace (%s): every sandbox runs as uid %s:%s on "
            "the host (no host account's, see `stockade doctor`), shared by all of them",
            why, self._uid, self._gid,
        )  # fmt: skip
        return False

    def _runs_gvisor(self) -> bool:
        """Whether sandbox.runtime is gVisor's runsc: by name or path, or (Docker) a name
        registered for a runsc program."""
        runtime = self._config.sandbox.runtime
        if not runtime:
            return False
        path = self._backend.runtimes().get(runtime) or runtime
        return "runsc" in (Path(runtime).name, Path(path).name)

    def _host_tmp(self) -> bool:
        """Whether /tmp is a tmpfs the supervisor mounts: an inode cap the engine cannot set
        (Podman 4.3), or that the runtime would ignore (gVisor makes an engine's tmpfs in its
        own kernel, where nr_inodes has no effect: `df -i` shows 0 inodes). Never from the
        supervisor's container: its mount would not reach the engine, which would bind-mount
        the plain directory under it (no cap at all); the engine's tmpfs stays then."""
        engine_can = self._backend.tmpfs_inodes and not self._gvisor
        wanted = bool(self._config.sandbox.tmp_inodes) and not engine_can
        return wanted and self._host_mounts

    def _hand_over(self, paths: _Paths, handed: list[tuple[int, int]], maps: userns.IdMaps) -> None:
        """Before the container starts: give its workspace and agent directory to the host
        ids its user has (itself without a user namespace). A workspace made for other ids
        (an earlier container had another range, or none) is walked, and what the sandbox
        user owned there changes hands; with unchanged ids nothing is walked."""
        try:
            ids = maps.host_ids(self._uid, self._gid)
        except ConfigError as exc:
            raise SandboxBroken(str(exc)) from None
        handed.append(ids)
        previous = _read_owners(paths.owners) or [_owner_of(paths.workspace, ids)]
        try:
            if previous != [ids]:
                _write_owners(paths.owners, [*previous, ids])
                changed = hostfs.chown_tree(
                    paths.workspace, ids, {u for u, _ in previous}, {g for _, g in previous}
                )
                _write_owners(paths.owners, [ids])
                log.info(
                    "workspace %s handed to %s:%s (%d entries)", paths.workspace, *ids, changed
                )
            os.chown(paths.workspace, *ids, follow_symlinks=False)
            os.chown(paths.run, *ids, follow_symlinks=False)
        except OSError as exc:
            raise SandboxBroken(f"cannot hand the workspace to the sandbox's ids: {exc}") from exc

    def _mount_workspace(self, paths: _Paths) -> None:
        """Mount the workspace's own file system when it is capped, or was capped before (its
        files live there); no container may be running on the directory meanwhile."""
        if self._capped(paths):
            size_mb = self._config.sandbox.workspace_size_mb
            workspaces.mount(paths.image, paths.workspace, size_mb, self._uid, self._gid)

    def _adoptable(self, paths: _Paths, info: ContainerInfo) -> bool:
        """A running container is adopted when its agent's directory is sealed and, if its
        workspace should be a file system of its own, that is mounted (else the container was
        made on the plain directory, and is made again); with sandbox.user_namespace on, a
        container without a user namespace (made before it was turned on) is made again."""
        if self._capped(paths) and not paths.workspace.is_mount():
            return False
        if self._userns and not (info.own_userns or self._daemon_maps):
            log.warning("replacing sandbox %r: it has no user namespace", info.labels[LABEL_KEY])
            return False
        return self._run_dir_is_sealed(paths)

    def _capped(self, paths: _Paths) -> bool:
        """Whether the workspace is a file system of its own: capped now, or before (its
        files live in the image)."""
        return bool(self._config.sandbox.workspace_size_mb) or paths.image.exists()

    def _seal_run_dir(self, paths: _Paths) -> None:
        """Once the agent listens, hand its socket directory to root, so that code in the
        sandbox (same uid as the agent) cannot replace the socket with a symlink that would
        steer the supervisor to another socket on the host."""
        os.chown(paths.run, 0, 0, follow_symlinks=False)
        os.chmod(paths.run, 0o755)

    def _run_dir_is_sealed(self, paths: _Paths) -> bool:
        try:
            run, sock = os.lstat(paths.run), os.lstat(paths.socket)
        except OSError:
            return False
        return run.st_uid == 0 and stat.S_ISDIR(run.st_mode) and stat.S_ISSOCK(sock.st_mode)

    def _agent_for(self, key: str) -> AgentConnection:
        return self._connect(self._paths(key).socket)

    def _paths(self, key: str) -> _Paths:
        return _paths_at(self._root / sandbox_id(key))

    def _labels(self) -> dict[str, str]:
        return {LABEL_MANAGED: "1", LABEL_INSTANCE: self._instance_id}

    def _owner_labels(self) -> dict[str, str]:
        """What another supervisor's orphan reaper needs to prove this one gone (owner.py)."""
        return {
            LABEL_STATE_DIR: str(self._config.state_dir.resolve()),
            LABEL_OWNER: self._owner.label(),
        }

    def container_name(self, key: str) -> str:
        return f"stockade-{self._instance_id[:8]}-{sandbox_id(key)}"

    def _agent_command(self) -> tuple[str, ...]:
        socket = f"{AGENT_SOCKET_DIR}/agent.sock"
        tools = self._config.tools
        return (
            *("--socket", socket, "--workspace", WORKSPACE),
            *("--user", f"{self._uid}:{self._gid}"),
            *(("--agent-user", f"{self._uid}:{self._gid}") if self._gvisor else ()),
            *("--max-output-bytes", str(tools.max_output_bytes)),
            *("--max-processes", str(tools.max_processes)),
            *("--process-log-bytes", str(tools.process_log_bytes)),
        )

    def _spec(self, key: str, paths: _Paths, network: SandboxNetwork) -> ContainerSpec:
        tenant, plain = split(key)
        labels = {LABEL_KEY: plain, LABEL_SANDBOX_ID: sandbox_id(key)}
        if tenant:
            labels[LABEL_TENANT] = tenant
        return self._spec_for(self.container_name(key), labels, paths, network)

    def _spec_for(
        self, name: str, labels: dict[str, str], paths: _Paths, network: SandboxNetwork
    ) -> ContainerSpec:
        sb = self._config.sandbox
        labels = {**self._labels(), **self._owner_labels(), **labels, **network.labels()}
        environment = dict(sb.secrets)
        if network.mode == "egress":
            environment.update(self._egress.environment)
        mounts = [
            BindMount(str(paths.workspace), WORKSPACE),
            BindMount(str(paths.run), AGENT_SOCKET_DIR),
        ]
        tmpfs = {"/tmp": sb.tmp_size_mb * 1024 * 1024}
        if self._host_tmp():
            mounts.append(BindMount(str(paths.tmp), "/tmp"))
            tmpfs = {}
        return ContainerSpec(
            name=name,
            image=self._image,
            command=self._agent_command(),
            labels=labels,
            mounts=tuple(mounts),
            user=CONTAINER_USER,
            cap_add=AGENT_CAPABILITIES,
            entrypoint=GVISOR_ENTRYPOINT if self._gvisor else (),
            read_only_root=sb.read_only_root,
            drop_all_capabilities=sb.drop_all_capabilities,
            no_new_privileges=sb.no_new_privileges,
            memory_bytes=sb.memory_mb * 1024 * 1024,
            nano_cpus=int(sb.cpus * 1e9),
            pids_limit=sb.pids,
            nofile=sb.nofile,
            nproc=sb.nproc,
            fsize=sb.max_file_size_mb * 1024 * 1024,
            tmpfs=tmpfs,
            tmpfs_inodes=sb.tmp_inodes,
            environment=environment,
            network="bridge" if network.mode == "open" else "none",
            seccomp_profile=self._seccomp,
            runtime=sb.runtime,
            user_namespace=self._userns,
        )

    # Housekeeping: one sweep removes idle and old containers, deletes workspaces past their
    # retention and reaps other instances' orphans; each step logs and records what it did.

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self._config.housekeeping.sweep_interval_s)
            try:
                await self.sweep()
            except StockadeError as exc:  # e.g. the engine is down: the next sweep retries
                log.warning("housekeeping sweep failed: %s", exc)
            except Exception:  # a bug must not end housekeeping for good
                log.exception("housekeeping sweep failed")

    async def sweep(self) -> None:
        sandboxes = [s for s in self._sandboxes.values() if _usable(s)]
        await asyncio.gather(*(self.check_health(s) for s in sandboxes))
        await self.prune()
        await self.expire_workspaces()
        if self._config.housekeeping.reap_orphans:
            await self.reap_orphans()
        if self._config.housekeeping.warm_pool:
            self._pool_wanted.set()  # replaces pool containers that failed or died

    async def prune(self) -> int:
        """Remove the containers of sandboxes idle or old past their limits (never one with
        a call in flight); their workspaces stay. How many were removed."""
        hk = self._config.housekeeping
        idle_now, now = time.monotonic(), time.time()
        due = []
        for sandbox in list(self._sandboxes.values()):
            idle, age = idle_now - sandbox.idle_since, now - sandbox.born
            if hk.idle_timeout_s and idle >= hk.idle_timeout_s:
                due.append(
                    (sandbox, f"idle for {idle:.0f} s (idle_timeout_s {hk.idle_timeout_s:g})")
                )
            elif hk.max_age_s and age >= hk.max_age_s:
                due.append((sandbox, f"{age:.0f} s old (max_age_s {hk.max_age_s:g})"))
        return sum([await self._retire(sandbox, why) for sandbox, why in due])

    async def _retire(self, sandbox: _Sandbox, why: str) -> bool:
        async with self._locks.setdefault(sandbox.key, asyncio.Lock()):
            if self._sandboxes.get(sandbox.key) is not sandbox or sandbox.in_flight:
                return False  # used or replaced while we waited for the lock
            del self._sandboxes[sandbox.key]  # from here a new call waits, then makes anew
            await sandbox.agent.close()
            await self._egress.detach(sandbox.sid)
            await asyncio.to_thread(self._backend.remove, sandbox.info.id)
            paths = self._paths(sandbox.key)
            await asyncio.to_thread(_unmount_dirs, paths)
            _stamp(paths.retired)
        log.info("removed the container of sandbox %r, %s; the workspace is kept", sandbox.key, why)
        self._record(sandbox.key, "remove container", why)
        return True

    async def expire_workspaces(self) -> int:
        """Delete workspaces that have had no container for workspace_retention_s. A
        workspace found without a container and without a stamp gets one now."""
        keep = self._config.housekeeping.workspace_retention_s
        if not keep:
            return 0
        expired = 0
        for key_file in sorted(self._root.glob("*/key")):
            paths = _paths_at(key_file.parent)
            key = key_file.read_text(encoding="utf-8", errors="surrogatepass")
            if key in self._sandboxes or sandbox_id(key) != paths.root.name:
                continue
            try:
                since = paths.retired.stat().st_mtime
            except FileNotFoundError:
                _stamp(paths.retired)
                continue
            if time.time() - since >= keep:
                expired += await self._expire(key, paths, f"no container for {keep:g} s")
        return expired

    async def _expire(self, key: str, paths: _Paths, why: str) -> bool:
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key in self._sandboxes or not paths.retired.exists():
                return False  # a call made a container meanwhile
            await asyncio.to_thread(_unmount_dirs, paths)
            await asyncio.to_thread(hostfs.remove_tree, paths.root)
        log.info("deleted the workspace of sandbox %r: %s", key, why)
        self._record(key, "delete workspace", why)
        return True

    async def reap_orphans(self) -> int:
        """Remove containers (and egress links) of other instances that have provably
        ended (owner.py says what counts as proof); how many containers."""
        found = await asyncio.to_thread(self._backend.list, {LABEL_MANAGED: "1"})
        theirs = [i for i in found if i.labels.get(LABEL_INSTANCE) != self._instance_id]
        if not theirs:
            return 0
        locked = await asyncio.to_thread(owner.locked_inodes)
        reaped, ended, alive = 0, set(), {self._instance_id[:8]}
        for info in theirs:
            labels = dict(info.labels)
            why = await asyncio.to_thread(owner.gone_because, labels, self._owner, locked)
            if why is None:
                alive.add(labels.get(LABEL_INSTANCE, "")[:8])
                continue
            instance = labels[LABEL_INSTANCE]
            ended.add(instance)
            if await asyncio.to_thread(self._backend.remove, info.id):
                reaped += 1
                log.warning("reaped container %s of instance %s: %s", info.name, instance, why)
                self._record(labels.get(LABEL_KEY, ""), "reap orphan", f"{info.name}: {why}")
        for instance in ended:
            if instance[:8] not in alive:  # links are named by the id's first 8 characters
                await self._egress.remove_instance(instance)
        return reaped

    # The warm pool: started containers with no key. A new key (no folder yet) takes one:
    # its folder is renamed to the key's (the bind mounts follow the folder) and the key is
    # written there, with the pool id, so that adoption after a restart finds the key.

    async def _fill_pool(self) -> None:
        size = self._config.housekeeping.warm_pool
        while not self._closing:
            await self._pool_wanted.wait()
            self._pool_wanted.clear()
            for pooled in list(self._pool):
                if not await pooled.agent.answers(POOL_PROBE_S) and pooled in self._pool:
                    self._pool.remove(pooled)
                    await self._drop_pooled(pooled)
            while len(self._pool) < size and not self._closing:
                try:
                    hk, state_dir = self._config.housekeeping, self._config.state_dir
                    await asyncio.to_thread(pressure.check, hk, state_dir)
                    pooled = await self._make_pooled()
                    self._pool.append(pooled)
                    log.info("warm pool: container %s ready", pooled.info.name)
                except (StockadeError, OSError) as exc:
                    log.warning("warm pool: no container added: %s", exc)
                    break  # the next sweep asks again

    async def _make_pooled(self) -> _Pooled:
        pool_id = secrets.token_hex(8)
        paths = _paths_at(self._root / f"{POOL_PREFIX}{pool_id}")
        paths.root.mkdir(mode=0o700)
        paths.pool_id.write_text(pool_id + "\n")
        self._prepare_subdirs(paths)
        network = self._network_for(None)
        name = f"stockade-{self._instance_id[:8]}-{POOL_PREFIX}{pool_id}"
        spec = self._spec_for(name, {LABEL_POOL: pool_id}, paths, network)
        await asyncio.to_thread(self._mount_dirs, paths)
        handed: list[tuple[int, int]] = []
        try:
            hand_over = partial(self._hand_over, paths, handed)
            info = await asyncio.to_thread(self._backend.run, spec, hand_over)
        except Exception:
            self.start_failures += 1
            await asyncio.to_thread(_unmount_dirs, paths)
            raise
        pooled = _Pooled(pool_id, info, self._connect(paths.socket), paths)
        try:
            self._check_mapped(info, handed[0])
            await pooled.agent.wait_ready(self._config.sandbox.start_timeout_s)
        except SandboxBroken:
            self.start_failures += 1
            await self._drop_pooled(pooled)
            raise
        self.starts += 1
        self._seal_run_dir(paths)
        return pooled

    async def _drop_pooled(self, pooled: _Pooled) -> None:
        await pooled.agent.close()
        await asyncio.to_thread(self._backend.remove, pooled.info.id)
        await asyncio.to_thread(_unmount_dirs, pooled.paths)
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(hostfs.remove_tree, pooled.paths.root)

    async def _take_pooled(self, key: str, network: SandboxNetwork) -> _Sandbox | None:
        """A pool container for a new key (no folder yet) with the default network; None
        when there is none to take (the caller then makes a container)."""
        paths = self._paths(key)
        if not self._pool or network != self._network_for(None) or paths.root.exists():
            return None
        pooled = self._pool.pop(0)
        self._pool_wanted.set()
        if not await pooled.agent.answers(POOL_PROBE_S):
            log.warning("warm pool: container %s does not answer; dropped", pooled.info.name)
            await self._drop_pooled(pooled)
            return None
        (pooled.paths.root / "key").write_text(key, encoding="utf-8", errors="surrogatepass")
        os.rename(pooled.paths.root, paths.root)
        await pooled.agent.close()
        sandbox = _Sandbox(key, sandbox_id(key), pooled.info, self._connect(paths.socket), network)
        sandbox.born = _born(pooled.info)
        try:
            await self._attach_network(sandbox)
            await sandbox.agent.wait_ready(self._config.sandbox.start_timeout_s)
        except SandboxBroken as exc:
            log.warning("sandbox %r: the pool container failed (%s); making one", key, exc)
            await self._discard(sandbox)
            return None
        log.info("sandbox %r took warm-pool container %s", key, pooled.info.name)
        return sandbox

    async def get(self, key: str) -> SandboxInfo:
        validate_key(key)
        sandbox = self._sandboxes.get(key)
        if sandbox is not None:
            await self._notice_deaths((sandbox,))
            await self.check_health(sandbox)
            return self._describe(sandbox)
        if self._paths(key).root.is_dir():
            return self._absent(key)
        raise SandboxNotFound(f"no sandbox for key {shown(key)!r}")

    async def list(self) -> list[SandboxInfo]:
        await self._notice_deaths(tuple(self._sandboxes.values()))
        infos = {k: self._describe(s) for k, s in self._sandboxes.items()}
        for key_file in sorted(self._root.glob("*/key")):
            key = key_file.read_text(encoding="utf-8", errors="surrogatepass")
            if key not in infos:
                infos[key] = self._absent(key)
        return sorted(infos.values(), key=lambda i: i.key)

    async def destroy(self, key: str, *, delete_workspace: bool) -> tuple[bool, bool]:
        """Remove the container; keep the workspace unless asked. (removed, deleted)"""
        validate_key(key)
        paths = self._paths(key)
        async with self._locks.setdefault(key, asyncio.Lock()):
            sandbox = self._sandboxes.pop(key, None)
            if sandbox is None and not paths.root.is_dir():
                raise SandboxNotFound(f"no sandbox for key {shown(key)!r}")
            if sandbox is not None:
                await sandbox.agent.close()
            await self._egress.detach(sandbox_id(key))
            name = sandbox.info.id if sandbox is not None else self.container_name(key)
            removed = await asyncio.to_thread(self._remove_own, name)
            await asyncio.to_thread(_unmount_dirs, paths)
            if delete_workspace:
                await asyncio.to_thread(hostfs.remove_tree, paths.root)
            else:
                _stamp(paths.retired)
            return removed, delete_workspace

    async def _notice_deaths(self, sandboxes: tuple[_Sandbox, ...]) -> None:
        """Mark sandboxes whose container stopped or vanished since their last call as
        lost, so that Get and List never report a dead container as RUNNING (the next call
        recreates it). One engine call; when the engine does not answer, what is known stays."""
        alive = [s for s in sandboxes if not s.lost]
        if not alive:
            return
        try:
            if len(alive) == 1:
                found = await asyncio.to_thread(self._backend.inspect, alive[0].info.id)
                infos = [found] if found is not None else []
            else:
                infos = await asyncio.to_thread(self._backend.list, self._labels())
        except EngineUnavailable:
            return
        running = {i.id for i in infos if i.running}
        for sandbox in alive:
            if sandbox.info.id not in running:
                sandbox.lost = True

    def _describe(self, sandbox: _Sandbox) -> SandboxInfo:
        return SandboxInfo(
            key=sandbox.key,
            container_id=sandbox.info.id,
            container_name=sandbox.info.name,
            engine=self._backend.engine,
            image=self._image,
            state=_state(sandbox),
            created_at=sandbox.info.created_at,
            last_used_at=sandbox.last_used_at,
            workspace_path=str(self._paths(sandbox.key).workspace),
            network_mode=sandbox.network.mode,
            network_allow=sandbox.network.allow,
            **self._heal_fields(sandbox),
        )

    def _heal_fields(self, sandbox: _Sandbox) -> dict[str, Any]:
        heal = self._heals.get(sandbox.key)
        return {
            "trouble": str(sandbox.trouble) if sandbox.broken and sandbox.trouble else "",
            "heals": heal.count if heal else 0,
            "last_heal_reason": str(heal.trouble) if heal else "",
            "last_healed_at": heal.at if heal else None,
        }

    def _absent(self, key: str) -> SandboxInfo:
        return SandboxInfo(
            key=key,
            container_id="",
            container_name="",
            engine=self._backend.engine,
            image=self._image,
            state=SandboxState.ABSENT,
            created_at=None,
            last_used_at=None,
            workspace_path=str(self._paths(key).workspace),
        )


def _labelled_key(labels: Mapping[str, str]) -> str:
    """The scoped key a container's labels name ("" when they name none that is valid)."""
    key = labels.get(LABEL_KEY, "")
    try:
        return scope(labels.get(LABEL_TENANT, ""), key) if key else ""
    except InvalidRequest:
        return ""


def _paths_at(root: Path) -> _Paths:
    run = root / "run"
    return _Paths(
        root, root / "workspace", run, run / "agent.sock", root / "key",
        root / "workspace.img", root / "tmp", root / "owner",
    )  # fmt: skip


def _unmount_dirs(paths: _Paths) -> None:
    """Undo _mount_dirs once the container is gone (no error when nothing is mounted)."""
    workspaces.unmount(paths.workspace)
    workspaces.unmount(paths.tmp)


def _born(info: ContainerInfo) -> float:
    return info.created_at.timestamp() if info.created_at is not None else time.time()


def _stamp(path: Path) -> None:
    """Write the time into `path` (its mtime is what counts)."""
    path.write_text(f"{time.time():.0f}\n")


def _usable(sandbox: _Sandbox) -> bool:
    return not (sandbox.lost or sandbox.broken)


def _state(sandbox: _Sandbox) -> SandboxState:
    if sandbox.lost:
        return SandboxState.EXITED
    return SandboxState.BROKEN if sandbox.broken else SandboxState.RUNNING


def _silent(seconds: float) -> str:
    return f"the sandbox's agent did not answer for {seconds:g} s while its container runs"


def _death_note(info: ContainerInfo | None) -> str:
    if info is None:
        return "the sandbox's container was removed during the call; the next call recreates it"
    why = " (out of memory)" if info.oom_killed else ""
    return (
        f"the sandbox's container exited during the call with code {info.exit_code}{why}; "
        "the next call recreates it with the same workspace"
    )


def _owner_of(folder: Path, default: tuple[int, int]) -> tuple[int, int]:
    """Who owns `folder` now: a workspace made before its owners file was kept (or by a
    version with another default sandbox user) is handed over from them; never from root
    (whatever root owns in a workspace stays root's)."""
    try:
        info = os.lstat(folder)
    except OSError:
        return default
    ok = stat.S_ISDIR(info.st_mode) and info.st_uid != 0 and info.st_gid != 0
    return (info.st_uid, info.st_gid) if ok else default


def _read_owners(path: Path) -> list[tuple[int, int]]:
    try:
        lines = path.read_text().split("\n")
    except FileNotFoundError:
        return []
    pairs = [line.split(":") for line in lines if line]
    return [(int(u), int(g)) for u, g in pairs]


def _write_owners(path: Path, owners: list[tuple[int, int]]) -> None:
    partial_file = path.with_name(path.name + ".partial")
    partial_file.write_text("".join(f"{u}:{g}\n" for u, g in owners))
    partial_file.rename(path)


def _check_mapped(info: ContainerInfo, uid: int, ids: tuple[int, int]) -> None:
    """The running container's own uid map (from the kernel) must give the sandbox user the
    host uid its workspace was handed to; else the agent could not use it."""
    try:
        text = Path(f"/proc/{info.pid}/uid_map").read_text()
    except OSError:  # not on this host's /proc (or already gone): the agent's start tells
        return
    host = userns.to_host(userns.parse_proc_map(text), uid)
    if host != ids[0]:
        raise SandboxBroken(
            f"the container maps uid {uid} to host uid {host}, not {ids[0]} as its engine "
            "said; its workspace was handed to the wrong ids"
        )


def _ignore(_decision: EgressDecision) -> None:
    pass


def _ignore_event(_key: str, _action: str, _reason: str) -> None:
    pass
