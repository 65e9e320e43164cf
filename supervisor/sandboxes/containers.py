"""The containers behind sandboxes: what each is made from (ContainerSpec), one start for
keyed and warm-pool containers alike, one stop. Every blocking engine call runs in a
thread."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from stockade.supervisor.config import Config
from stockade.supervisor.engines.addresses import AgentAddress, UnixAddress
from stockade.supervisor.engines.backends.base import (
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_PROFILE,
    LABEL_STATE_DIR,
    BindMount,
    ContainerBackend,
    ContainerInfo,
    ContainerSpec,
)
from stockade.supervisor.engines.userns import IdMaps
from stockade.supervisor.errors import SandboxBroken
from stockade.supervisor.keys import shown
from stockade.supervisor.sandboxes import layout
from stockade.supervisor.sandboxes.agent_link import AgentLink
from stockade.supervisor.sandboxes.layout import Layout, Paths
from stockade.supervisor.sandboxes.network_modes import Networks
from stockade.supervisor.sandboxes.profiles import SandboxProfile
from stockade.supervisor.sandboxes.runtime import Runtime
from stockade.supervisor.sandboxes.sandbox import Container, SandboxNetwork

log = logging.getLogger("stockade")

AGENT_SOCKET_DIR = "/run/stockade"
WORKSPACE = "/workspace"
CONTAINER_USER = "0:0"
"""The container starts as root only for the image's entry point (setpriv), which at once
makes tini and the agent the image's stockade-agent (config.AGENT_UID) with the three
capabilities below; the agent takes the sandbox user as effective ids and drops them all."""
AGENT_CAPABILITIES = ("SETUID", "SETGID", "SETPCAP")
GVISOR_ENTRYPOINT = ("/usr/bin/tini", "--", "python3", "-P", "-m", "stockade.agent")
"""gVisor has no ambient capabilities, so setpriv cannot pass the three on: there tini stays
root (gVisor's own, inside its kernel) and the agent starts as root and becomes the sandbox
user itself (`--agent-user`: gVisor resets effective ids on exec, so it cannot keep a user of
its own and start commands as another; identity.py). `-P` as in the image's entry point: the
working folder (the workspace) is never on the agent's sys.path."""

Connect = Callable[[AgentAddress], AgentLink]
AddressOf = Callable[[ContainerInfo, Paths], AgentAddress]
"""Where a container's agent is reached: the host kind's choice (see agent_link)."""


class StageClock:
    """The times of a container's start by stage, in ms: prepare (its spec, the old
    container's removal, the workspace's mount), create (the engine makes the container),
    hand over (its folders given to its ids), start (the engine starts it), agent ready (id
    map check, network, the agent's first answer). Logged as `up in T ms: prepare a, ...`."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self._started = self._last
        self.stages: dict[str, float] = {}

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + (now - self._last) * 1000
        self._last = now

    def around(self, call: Callable[[IdMaps], None], before: str) -> Callable[[IdMaps], None]:
        """`call` (run between the engine's create and start) with the time until it counted
        as `before`, its own as "hand over"."""

        def timed(maps: IdMaps) -> None:
            self.lap(before)
            call(maps)
            self.lap("hand over")

        return timed

    def __str__(self) -> str:
        total = (self._last - self._started) * 1000
        parts = ", ".join(f"{stage} {ms:.1f}" for stage, ms in self.stages.items())
        return f"up in {total:.1f} ms: {parts}"


def socket_address(info: ContainerInfo, paths: Paths) -> AgentAddress:
    """Containers on this host: the agent's unix socket in the sandbox's run folder."""
    return UnixAddress(paths.socket)


class Containers:
    def __init__(
        self,
        config: Config,
        backend: ContainerBackend,
        layout_: Layout,
        networks: Networks,
        connect: Connect,
        *,
        address_of: AddressOf = socket_address,
        instance_id: str,
        image: str,
        owner_label: Callable[[], str],
        decoy_env: Callable[[str, SandboxProfile | None], dict[str, str]] | None = None,
    ) -> None:
        self._config = config
        self._backend = backend
        self._layout = layout_
        self._networks = networks
        self._connect = connect
        self._address_of = address_of
        self.instance_id = instance_id
        self.image = image
        self._owner_label = owner_label
        self._decoy_env = decoy_env
        """The honeytoken variable of a key's container (decoys.py), when one is planted."""
        self.runtime = Runtime()
        self.starts = 0
        """Containers started (and answered by their agent) since this supervisor started."""
        self.start_failures = 0
        """Container starts that failed: the engine refused, or the agent never answered."""

    def labels(self) -> dict[str, str]:
        """The labels every container of this instance carries (what list() looks for)."""
        return {LABEL_MANAGED: "1", LABEL_INSTANCE: self.instance_id}

    def name(self, ident: str) -> str:
        """A container's name: a prefix of the instance id and a sandbox or pool id."""
        return f"stockade-{self.instance_id[:8]}-{ident}"

    def link(self, info: ContainerInfo, paths: Paths) -> AgentLink:
        """A channel to the agent of the container `info` (on `paths`): not yet connected."""
        return self._connect(self._address_of(info, paths))

    async def carry(self, agent: AgentLink, info: ContainerInfo, paths: Paths) -> AgentLink:
        """The link to the agent of `info`, whose folder is now `paths` (renamed: a warm-pool
        container taken by a key): `agent`, moved there with its greeted connections, or,
        when it cannot follow, a new link (not yet connected) and `agent` closed."""
        if agent.moved_to(self._address_of(info, paths)):
            return agent
        await agent.close()
        return self.link(info, paths)

    async def start(
        self,
        name: str,
        labels: dict[str, str],
        paths: Paths,
        network: SandboxNetwork,
        *,
        key: str = "",
        sid: str = "",
        profile: SandboxProfile | None = None,
    ) -> Container:
        """Make and start a container on `paths`, wait for its agent, seal its socket folder.
        With a key (and its sandbox id), the container of its own name is replaced and its
        network attached; a warm-pool container gets both when a key takes it. Anything that
        fails undoes what was done and raises (SandboxBroken when the agent never answered).
        Its stages' times are logged (StageClock: what bench/coldstart.py reads)."""
        clock = StageClock()
        spec = await asyncio.to_thread(self.spec, name, labels, paths, network, profile, key, sid)
        if key and self._decoy_env is not None and (decoy := self._decoy_env(key, profile)):
            spec = replace(spec, environment={**decoy, **spec.environment})
        if key:
            await asyncio.to_thread(self.remove_own, name)
        await asyncio.to_thread(self._layout.mount, paths)
        handed: list[tuple[int, int]] = []
        clock.lap("prepare")
        try:
            hand_over = clock.around(partial(self._layout.hand_over, paths, handed), "create")
            info = await asyncio.to_thread(self._backend.run, spec, hand_over)
            clock.lap("start")
        except Exception:
            self.start_failures += 1
            await asyncio.to_thread(layout.unmount, paths, workspace=not key)
            raise
        container = Container(info, self.link(info, paths), paths, sid)
        try:
            await self.ready(container, network, key, handed[0])
        except SandboxBroken as exc:
            self.start_failures += 1
            await self.stop(container, keep_workspace_mounted=bool(key))
            if not key:
                raise
            raise SandboxBroken(f"sandbox {shown(key)!r} did not start: {exc}") from exc
        self.starts += 1
        layout.seal_run_dir(paths)
        clock.lap("agent ready")
        log.info("container %s %s", name, clock)
        return container

    async def ready(
        self,
        container: Container,
        network: SandboxNetwork,
        key: str,
        ids: tuple[int, int] | None,
        *,
        greeted: bool = False,
    ) -> None:
        """Check the container's id map, attach its network (with a key), wait for the agent
        (`greeted`: its link answered Hello just now, over a connection it keeps)."""
        if ids is not None and not self.runtime.gvisor:
            # under gVisor the container's host process is gVisor's kernel, whose uid map says
            # nothing about the sandbox user's: the agent's start tells instead
            self._layout.check_mapped(container.info, ids)
        if key:
            await self._networks.attach(key, container, network)
        if not greeted:
            await container.agent.wait_ready(self._config.sandbox.start_timeout_s)

    async def stop(self, container: Container, *, keep_workspace_mounted: bool = False) -> None:
        """The one teardown: close the agent link, remove the egress link and the container,
        unmount what was mounted for it (the workspace's file system stays when a new
        container follows at once)."""
        await container.agent.close()
        await self._networks.detach(container)
        await asyncio.to_thread(self._backend.remove, container.info.id)
        await asyncio.to_thread(
            layout.unmount, container.paths, workspace=not keep_workspace_mounted
        )

    def remove_own(self, name: str) -> bool:
        """Remove the container of that name if it is this instance's. Names carry only a
        prefix of the instance id: another supervisor's container may hold the name (then
        creating ours fails on the conflict, which is better than removing theirs)."""
        info = self._backend.inspect(name)
        if info is None or info.labels.get(LABEL_INSTANCE) != self.instance_id:
            return False
        return self._backend.remove(info.id)

    def spec(
        self,
        name: str,
        labels: dict[str, str],
        paths: Paths,
        network: SandboxNetwork,
        profile: SandboxProfile | None = None,
        key: str = "",
        sid: str = "",
    ) -> ContainerSpec:
        """The container of a sandbox on `network` with `profile`'s image, CPUs and memory
        (None: [sandbox]'s); with a key (and its sandbox id), the placeholders of its
        brokered secrets and the trust bundle that goes with them (brokering.py: writes the
        bundle into its folder)."""
        sb = self._config.sandbox
        labels = {**self.labels(), **self._owner_labels(), **labels, **network.labels()}
        if profile is not None and profile.name:
            labels[LABEL_PROFILE] = profile.name
        proxies = self._networks.environment(network)
        brokered = self._networks.brokering.container_parts(
            key, sid, profile.name if profile else "", network.mode, paths.root
        )
        environment = {**sb.secrets, **proxies, **brokered.environment}
        mounts = [
            BindMount(str(paths.workspace), WORKSPACE),
            BindMount(str(paths.run), AGENT_SOCKET_DIR),
            *brokered.mounts,
        ]
        tmpfs = {"/tmp": sb.tmp_size_mb * 1024 * 1024}
        if self._layout.host_tmp:
            mounts.append(BindMount(str(paths.tmp), "/tmp"))
            tmpfs = {}
        return ContainerSpec(
            name=name,
            image=profile.image if profile is not None else self.image,
            command=self._agent_command(),
            labels=labels,
            mounts=tuple(mounts),
            user=CONTAINER_USER,
            cap_add=AGENT_CAPABILITIES,
            entrypoint=GVISOR_ENTRYPOINT if self.runtime.gvisor else (),
            read_only_root=sb.read_only_root,
            drop_all_capabilities=sb.drop_all_capabilities,
            no_new_privileges=sb.no_new_privileges,
            memory_bytes=(profile.memory_mb if profile else sb.memory_mb) * 1024 * 1024,
            nano_cpus=int((profile.cpus if profile else sb.cpus) * 1e9),
            pids_limit=sb.pids,
            nofile=sb.nofile,
            nproc=sb.nproc,
            fsize=sb.max_file_size_mb * 1024 * 1024,
            tmpfs=tmpfs,
            tmpfs_inodes=sb.tmp_inodes,
            environment=environment,
            secret_names=frozenset(sb.secrets) - proxies.keys(),
            network="bridge" if network.mode == "open" else "none",
            seccomp_profile=self.runtime.seccomp,
            runtime=sb.runtime,
            user_namespace=self.runtime.userns,
        )

    def _owner_labels(self) -> dict[str, str]:
        """What another supervisor's orphan reaper needs to prove this one gone (owner.py)."""
        return {
            LABEL_STATE_DIR: str(self._config.state_dir.resolve()),
            LABEL_OWNER: self._owner_label(),
        }

    def _agent_command(self) -> tuple[str, ...]:
        uid, gid, tools = self._layout.uid, self._layout.gid, self._config.tools
        return (
            *("--socket", f"{AGENT_SOCKET_DIR}/agent.sock", "--workspace", WORKSPACE),
            *("--user", f"{uid}:{gid}"),
            *(("--agent-user", f"{uid}:{gid}") if self.runtime.gvisor else ()),
            *("--max-output-bytes", str(tools.max_output_bytes)),
            *("--max-processes", str(tools.max_processes)),
            *("--process-log-bytes", str(tools.process_log_bytes)),
        )
