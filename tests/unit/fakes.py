"""Fakes for unit tests of the domain core: an in-memory engine (FakeBackend) and agent link
(FakeAgent, an AgentLink), a SandboxManager on them (fake_manager), and the set-up the unit
tests share: free_port, listening_socket, make_folder (a workspace or an outside folder),
tokens_file, served_config, quiet_housekeeping, mcp_front_in_process (the MCP endpoint with
no engine), audit_record, and STATE (the `state_dir` fixture's folder)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from stockade.supervisor.app import build_policy
from stockade.supervisor.auth import Authenticator
from stockade.supervisor.calls.pipeline import HostPolicy, ToolPipeline
from stockade.supervisor.config import Config, HousekeepingConfig, load_config
from stockade.supervisor.engines.addresses import AgentAddress
from stockade.supervisor.engines.backends._common import HostFolderWorkspaces
from stockade.supervisor.engines.backends.base import (
    BindMount,
    ContainerInfo,
    ContainerSpec,
    EngineView,
    RuntimeFacts,
)
from stockade.supervisor.engines.hosts import LOCAL, HostKind
from stockade.supervisor.engines.userns import NO_USERNS, IdMaps
from stockade.supervisor.errors import ConfigError, EngineUnavailable, SandboxBroken
from stockade.supervisor.fronts.e2b.context import E2bContext
from stockade.supervisor.fronts.e2b.records import Records
from stockade.supervisor.fronts.mcp.server import Endpoint, McpFront, build_app
from stockade.supervisor.observe.audit import AuditRecord
from stockade.supervisor.observe.refusals import Refusals
from stockade.supervisor.sandboxes.agent_link import (
    AgentCallFailed,
    AgentFacts,
    AgentLink,
    AgentOutput,
    AgentReply,
    AgentStarted,
    AgentWatchEvent,
)
from stockade.supervisor.sandboxes.lease import Deadline
from stockade.supervisor.sandboxes.manager import SandboxManager

SHARED = replace(LOCAL, name="shared", shared=True, host_room=False, rlimits=False)
"""The fake engine as a host kind whose sandboxes any replica reaches (as pods are), its
other choices (snapshots, host folders, a proxy per sandbox) the local engines'."""


class FakeBackend(HostFolderWorkspaces):
    engine = "fake"
    tmpfs_inodes = True
    host: HostKind = LOCAL
    """SHARED in tests of a host kind whose sandboxes any replica reaches (pods)."""

    def __init__(self) -> None:
        self.containers: dict[str, ContainerInfo] = {}
        self.container_mounts: dict[str, tuple[BindMount, ...]] = {}
        """Mounts of containers the fake did not make (the supervisor's own, say)."""
        self.runs = 0
        self.image_ids: dict[str, str] = {}
        self.made: dict[str, ContainerSpec] = {}
        """What each container was made with."""
        """What an image reference names now (default: id-of-REF)."""
        self.stale_inspects = 0
        """How many more inspects report a dead container as running."""
        self._next = 0
        self.maps: IdMaps | None = None
        """Daemon-wide id maps, as a remapping dockerd has."""
        self.per_container = False
        """User namespaces per container, as Podman's (identity maps given to `prepare`)."""
        self.agent_facts: dict[str, bytes | str] = {}
        """What the agents' Inspect reads: path -> content, or an errno name (default ENOENT)."""
        self.agent_frozen = False
        self.hello_refused = False
        self.engine_down = False
        """Inspect raises EngineUnavailable (the engine's service restarting)."""
        self.agent_idle_s: float | None = 0.0
        """What agents say of their idle time (0: some replica just called)."""
        self.run_dirs: dict[str, str] = {}
        """Container id -> the folder mounted at the agent's socket directory."""
        self.pause_calls: list[tuple[str, bool]] = []
        self.connect_calls: list[tuple[str, bool]] = []
        """(container, connected) for every set_connected (open networks, quarantine)."""
        """(container, paused) for every pause and unpause asked of the engine."""
        """The agent answers Hello with another protocol version (an attacker on its socket)."""
        """Stopped agents: Hello goes unanswered and calls run into their deadline."""

    def ping(self) -> str:
        return "1.0"

    def image_exists(self, ref: str) -> bool:
        return True

    def image_id(self, ref: str) -> str | None:
        return self.image_ids.get(ref, f"id-of-{ref}") or None

    def check_user_namespace(self, wanted: bool) -> IdMaps | None:
        if wanted and self.maps is None and not self.per_container:
            raise ConfigError("the fake engine has no user namespaces")
        return self.maps

    def run(self, spec: ContainerSpec, prepare: Callable[[IdMaps], None]) -> ContainerInfo:
        prepare(self.maps or NO_USERNS)
        self.runs += 1
        self._next += 1
        info = ContainerInfo(
            id=f"c{self._next}", name=spec.name, running=True, status="running",
            labels=dict(spec.labels), image=spec.image, image_id=self.image_id(spec.image) or "",
            own_userns=spec.user_namespace,
        )  # fmt: skip
        self.containers[info.id] = info
        self.made[info.id] = spec
        self.run_dirs[info.id] = spec.mounts[1].source
        os.mknod(Path(spec.mounts[1].source, "agent.sock"), stat.S_IFSOCK | 0o600)
        return info

    def inspect(self, name_or_id: str) -> ContainerInfo | None:
        if self.engine_down:
            raise EngineUnavailable("the fake engine is down")
        for info in self.containers.values():
            if name_or_id in (info.id, info.name):
                if self.stale_inspects > 0:  # an engine that has not noticed a death yet
                    self.stale_inspects -= 1
                    return replace(info, running=True, status="running", exit_code=None)
                return info
        return None

    def list(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        return [
            i
            for i in self.containers.values()
            if all(i.labels.get(k) == v for k, v in labels.items())
        ]

    def remove(self, name_or_id: str) -> bool:
        info = self.inspect(name_or_id)
        if info is None:
            return False
        del self.containers[info.id]
        return True

    def kill(self, container_id: str) -> None:
        self.containers[container_id] = replace(
            self.containers[container_id],
            running=False, paused=False, status="exited", exit_code=137,
        )  # fmt: skip

    def pause(self, name_or_id: str) -> bool:
        return self._set_paused(name_or_id, True)

    def unpause(self, name_or_id: str) -> bool:
        return self._set_paused(name_or_id, False)

    def _set_paused(self, name_or_id: str, paused: bool) -> bool:
        self.pause_calls.append((name_or_id, paused))
        info = self.inspect(name_or_id)
        if info is None or not info.running:
            return False
        status = "paused" if paused else "running"
        self.containers[info.id] = replace(info, paused=paused, status=status)
        return True

    def set_connected(self, name_or_id: str, connected: bool) -> bool:
        self.connect_calls.append((name_or_id, connected))
        return self.inspect(name_or_id) is not None

    def mounts(self, name_or_id: str) -> tuple[BindMount, ...] | None:
        info = self.inspect(name_or_id)
        return None if info is None else self.container_mounts.get(info.id, ())

    def security_view(self, name_or_id: str) -> EngineView | None:
        return EngineView(runtime="runc") if self.inspect(name_or_id) else None

    def runtime_facts(self) -> RuntimeFacts:
        return RuntimeFacts("runc", "1.1.12")

    def runtimes(self) -> dict[str, str]:
        return {"runc": ""}

    def close(self) -> None:
        pass


class FakeAgent:
    """Answers like the agent; dies when its container is not running."""

    def __init__(self, backend: FakeBackend, address: object) -> None:
        self.backend = backend
        self.address = address
        self.ready = False
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def _alive(self) -> bool:
        return any(i.running for i in self.backend.containers.values())

    def _frozen(self) -> bool:
        """Agents are stopped, or this agent's container (the one whose run folder holds its
        socket) is paused."""
        folder = str(Path(str(getattr(self.address, "path", self.address))).parent)
        mine = [
            i for c, i in self.backend.containers.items() if self.backend.run_dirs.get(c) == folder
        ]
        return self.backend.agent_frozen or any(i.paused for i in mine)

    def is_ready(self) -> bool:
        return self.ready and self._alive()

    async def wait_ready(self, timeout: float) -> None:
        await asyncio.sleep(0.01)
        if not self._alive():
            raise SandboxBroken("agent does not answer")
        if self.backend.hello_refused:
            raise SandboxBroken("agent speaks protocol 0, supervisor 1")
        self.ready = True

    async def answers(self, timeout: float = 0.5) -> bool:
        if self._frozen():
            await asyncio.sleep(timeout)
        return self._alive() and not self._frozen()

    async def idle_s(self, timeout: float = 2.0) -> float | None:
        """What the agent says of its idle time: the backend's `agent_idle_s` (0: a call was
        just served; None: it does not answer)."""
        if not self._alive() or self._frozen():
            return None
        return self.backend.agent_idle_s

    async def inspect(
        self, files: list[str], links: list[str], write_probe: str, timeout: float
    ) -> AgentFacts:
        return AgentFacts(
            {p: self.backend.agent_facts.get(p, "ENOENT") for p in files}, {}, True, ""
        )

    async def invoke(
        self, tool: str, arguments: dict[str, Any], timeout: float, request_id: str
    ) -> AgentReply:
        self.calls.append((tool, arguments))
        if self._frozen():
            await asyncio.sleep(timeout)
            raise AgentCallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        if arguments.get("no_start") and self.backend.agent_facts:
            return AgentReply("EXECUTION_FAILED", "could not start the command: EAGAIN", None)
        if (hold := arguments.get("hold")) is not None:  # an asyncio.Event: a call in flight
            await hold.wait()
            if self._frozen():  # its container was paused meanwhile: the deadline passes
                raise AgentCallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        if arguments.get("die"):
            for cid in list(self.backend.containers):
                self.backend.kill(cid)
            raise AgentCallFailed(grpc.StatusCode.UNAVAILABLE, "socket closed")
        if arguments.get("break"):
            raise AgentCallFailed(grpc.StatusCode.RESOURCE_EXHAUSTED, "reply too large")
        result = {"exit_code": 0, "stdout": tool, "stderr": ""}
        if arguments.get("crowded"):
            result["pids_crowded"] = True
        return AgentReply("", "", result)

    async def invoke_stream(
        self, tool: str, arguments: dict[str, Any], timeout: float, request_id: str
    ) -> AsyncIterator[AgentStarted | AgentOutput | AgentReply]:
        """The reply of `invoke`, as a stream's last event."""
        yield await self.invoke(tool, arguments, timeout, request_id)

    async def upload(
        self,
        path: str,
        tar: bool,
        mode: int,
        chunks: AsyncIterator[bytes],
        timeout: float,
        wide: bool = False,
    ) -> AgentReply:
        raise NotImplementedError("the fake agent keeps no files")

    async def download(
        self, path: str, tar: bool, timeout: float, wide: bool = False
    ) -> AsyncIterator[bytes | AgentReply]:
        raise NotImplementedError("the fake agent keeps no files")
        yield b""  # an async generator, as the real agent link's

    async def watch_files(self, path: str, recursive: bool) -> AsyncIterator[AgentWatchEvent]:
        raise NotImplementedError("the fake agent keeps no files")
        yield AgentReply("", "", None)  # an async generator, as the real agent link's

    def moved_to(self, address: AgentAddress | Path) -> bool:
        """As the real link: kept, now at `address`, unless closed."""
        if not self.ready:
            return False
        self.address = address
        return True

    async def close(self) -> None:
        self.ready = False


def _is_an_agent_link(backend: FakeBackend, address: AgentAddress) -> AgentLink:
    """Type-checked only: mypy says here when FakeAgent no longer satisfies AgentLink."""
    return FakeAgent(backend, address)


def fake_manager(
    config: Config,
    backend: FakeBackend,
    *,
    instance_id: str = "inst0001",
    image: str = "img",
    **options: Any,
) -> SandboxManager:
    """A SandboxManager on `backend` whose agents are FakeAgents on it (unless `options` give
    another `connect`); `options` are SandboxManager's other keyword arguments."""
    options.setdefault("connect", lambda address: FakeAgent(backend, address))
    return SandboxManager(config, backend, instance_id=instance_id, image=image, **options)


def idle_pipeline(config: Config, policy: HostPolicy) -> ToolPipeline:
    """The one pipeline of a front whose test runs no call through it: on a fake engine."""
    return ToolPipeline(config, fake_manager(config, FakeBackend()), policy)


def e2b_context(
    config: Config,
    records: Records,
    authenticator: Authenticator | None = None,
    refusals: Refusals | None = None,
) -> E2bContext:
    """The E2B front's context on a fake engine, its policy built from `config` (its state in
    config.state_dir), for a test that runs no call and touches no sandbox; `refusals`: where
    its refused authentications go."""
    policy = build_policy(config)
    if refusals is not None:
        policy = replace(policy, refusals=refusals)
    manager = fake_manager(config, FakeBackend())
    pipeline = ToolPipeline(config, manager, policy)
    return E2bContext(config, pipeline, policy, authenticator, manager, records)


def tokens_file(tmp_path: Path, tokens: str) -> Path:
    """tmp_path / "tokens", holding `tokens` (lines of "TOKEN tenant"), for its owner only."""
    path = tmp_path / "tokens"
    path.write_text(tokens)
    path.chmod(0o600)
    return path


def served_config(tmp_path: Path, tokens: str, **settings: Any) -> Config:
    """The loaded Config of a supervisor serving on a free loopback port: its tokens `tokens`
    (tokens_file), its state in tmp_path / "state", sandboxes as 1000:1000, housekeeping that
    never finds the host short; `settings`: more dotted settings."""
    return load_config(
        None,
        {
            "state_dir": str(tmp_path / "state"),
            "listen": "127.0.0.1:0",
            "auth.tokens_file": str(tokens_file(tmp_path, tokens)),
            "sandbox.user": "1000:1000",
            "housekeeping.min_free_memory_mb": 0,
            "housekeeping.min_free_disk_mb": 0,
            **settings,
        },
    )


def quiet_housekeeping(**housekeeping: Any) -> HousekeepingConfig:
    """Housekeeping that never finds the host short of memory or disk, with `housekeeping`'s
    other settings."""
    return HousekeepingConfig(**{"min_free_memory_mb": 0, "min_free_disk_mb": 0, **housekeeping})


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


STATE: list[Path] = []
"""The running test's tmp_path (last) while it uses the `state_dir` fixture (conftest.py): for
factories called without one (STATE[-1])."""


@contextlib.asynccontextmanager
async def mcp_front_in_process(
    tmp_path: Path, refusals: Refusals | None = None, **settings: Any
) -> AsyncIterator[tuple[McpFront, Endpoint]]:
    """The MCP endpoint (build_app, with no engine and no auth unless `settings` (dotted
    config keys) say otherwise, its state in tmp_path) started on a free loopback port;
    stopped, and its audit log closed, after. `refusals`: where its refusals go."""
    overrides = {"state_dir": str(tmp_path), "mcp.listen": "127.0.0.1:0", "auth.enabled": False}
    config = load_config(None, {**overrides, **settings})
    policy = build_policy(config)
    if refusals is not None:
        policy = replace(policy, refusals=refusals)
    authenticator = Authenticator(config.auth) if config.auth.enabled else None
    endpoint = build_app(config, idle_pipeline(config, policy), policy, authenticator)
    front = McpFront(endpoint, config.mcp.listen, config.http)
    await front.start()
    try:
        yield front, endpoint
    finally:
        await front.stop(1)
        if policy.audit is not None:
            policy.audit.close()


def audit_record(**fields: object) -> AuditRecord:
    """An AuditRecord of an allowed exec call now, with `fields` in place of its defaults."""
    base: dict[str, object] = {
        "time": time.time(), "request_id": "r", "caller": "c", "sandbox_key": "k",
        "agent_id": "a", "provider": "p", "tool": "exec", "arguments_json": "{}",
        "policy_step": "allowed",
    }  # fmt: skip
    return AuditRecord(**{**base, **fields})  # type: ignore[arg-type]


def listening_socket() -> socket.socket:
    """A non-blocking TCP socket listening on a free loopback port (what a proxy starts on)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    return sock


def make_folder(
    path: Path, files: Mapping[str, str] | None = None, dirs: tuple[str, ...] = ()
) -> Path:
    """`path` made (with its parents), then its sub-folders `dirs`, then `files` (a relative
    path each, its text) written in order: a test's workspace or a folder outside it."""
    path.mkdir(parents=True, exist_ok=True)
    for name in dirs:
        (path / name).mkdir(parents=True, exist_ok=True)
    for name, text in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


async def invoke(
    mgr: SandboxManager, key: str, tool: str, args: dict[str, Any], timeout: float, rid: str
) -> AgentReply:
    """One agent call through a lease, as the pipeline makes it (exec ends a command at its
    own timeout: a deadline it lets pass is the agent's fault)."""
    async with mgr.lease(key) as lease:
        deadline: Deadline = "agent" if tool == "exec" else "caller"
        return await lease.invoke(tool, args, timeout, rid, deadline=deadline)


def config_from(tmp_path: Path, text: str) -> Config:
    """The configuration that loading a file holding `text` gives."""
    path = tmp_path / "stockade.toml"
    path.write_text(text)
    return load_config(path)


def refused_config(tmp_path: Path, text: str) -> str:
    """The message of the ConfigError that loading a file holding `text` raises."""
    with pytest.raises(ConfigError) as refused:
        config_from(tmp_path, text)
    return str(refused.value)


class Audited:
    """Stands in for the AuditLog where only what is recorded matters: `records`."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def record(self, rec: AuditRecord) -> None:
        self.records.append(rec)

    def tools(self) -> list[str]:
        return [r.tool for r in self.records]
