"""The sandbox manager: one long-lived container per key, created lazily, adopted after a
supervisor restart, recreated when it died. No gRPC and no SDK here: engines are behind
ContainerBackend and every blocking call goes through asyncio.to_thread."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

from stockade.supervisor import seccomp, workspaces
from stockade.supervisor.agent_client import (
    AgentCallFailed,
    AgentConnection,
    AgentOutput,
    AgentReply,
    AgentStarted,
)
from stockade.supervisor.backends.base import (
    LABEL_INSTANCE,
    LABEL_KEY,
    LABEL_MANAGED,
    LABEL_SANDBOX_ID,
    BindMount,
    ContainerBackend,
    ContainerInfo,
    ContainerSpec,
)
from stockade.supervisor.config import Config
from stockade.supervisor.errors import SandboxBroken, SandboxLost, SandboxNotFound
from stockade.supervisor.keys import sandbox_id, validate_key
from stockade.supervisor.models import SandboxInfo, SandboxState

AGENT_SOCKET_DIR = "/run/stockade"
TRANSFER_TIMEOUT_S = 3600.0
WORKSPACE = "/workspace"


@dataclass
class _Sandbox:
    key: str
    sid: str
    info: ContainerInfo
    agent: AgentConnection
    last_used_at: datetime | None = None
    lost: bool = False


@dataclass(frozen=True)
class _Paths:
    root: Path
    workspace: Path
    run: Path
    socket: Path
    key_file: Path
    image: Path
    """The workspace's file system when it is size-capped (sandbox.workspace_size_mb)."""


class SandboxManager:
    def __init__(
        self,
        config: Config,
        backend: ContainerBackend,
        *,
        instance_id: str,
        image: str,
        connect: Callable[[Path], AgentConnection] = AgentConnection,
    ) -> None:
        self._config = config
        self._backend = backend
        self._instance_id = instance_id
        self._image = image
        self._connect = connect
        self._root = config.state_dir / "sandboxes"
        self._seccomp = ""
        self._sandboxes: dict[str, _Sandbox] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        uid, _, gid = config.sandbox.user.partition(":")
        self._uid, self._gid = int(uid), int(gid or uid)

    @property
    def engine(self) -> str:
        return self._backend.engine

    @property
    def image(self) -> str:
        return self._image

    async def start(self) -> list[str]:
        """Check the engine and adopt this instance's running containers; return adopted keys."""
        await asyncio.to_thread(self._backend.ping)
        if self._config.sandbox.workspace_size_mb:
            await asyncio.to_thread(workspaces.check_support)
        self._root.mkdir(parents=True, exist_ok=True)
        os.chmod(self._root, 0o700)
        profile = seccomp.write_profile(self._config.state_dir / "seccomp.json")
        self._seccomp = str(profile) if profile else ""
        found = await asyncio.to_thread(self._backend.list, self._labels())
        adopted = []
        for info in found:
            key = info.labels.get(LABEL_KEY, "")
            if not key or info.labels.get(LABEL_SANDBOX_ID) != sandbox_id(key):
                continue
            if info.running and self._adoptable(self._paths(key)):
                self._sandboxes[key] = _Sandbox(key, sandbox_id(key), info, self._agent_for(key))
                adopted.append(key)
            else:
                await asyncio.to_thread(self._backend.remove, info.id)
        return adopted

    async def close(self) -> None:
        """Close agent channels; containers keep running for the next start to adopt."""
        for sandbox in self._sandboxes.values():
            await sandbox.agent.close()

    @asynccontextmanager
    async def _agent(
        self, key: str, *, pass_deadline: bool = True
    ) -> AsyncIterator[AgentConnection]:
        """The key's agent (its sandbox made ready), with a failed call turned into
        SandboxLost or SandboxBroken; a passed deadline is the caller's to report unless
        pass_deadline is off."""
        sandbox = await self.ensure(key)
        sandbox.last_used_at = datetime.now(UTC)
        try:
            yield sandbox.agent
        except AgentCallFailed as exc:
            if pass_deadline and exc.code.name == "DEADLINE_EXCEEDED":
                raise
            await self._diagnose(sandbox, exc)

    async def invoke(
        self, key: str, tool: str, arguments: dict[str, Any], timeout: float, request_id: str
    ) -> AgentReply:
        async with self._agent(key) as agent:
            return await agent.invoke(tool, arguments, timeout, request_id)

    async def invoke_stream(
        self, key: str, tool: str, arguments: dict[str, Any], timeout: float, request_id: str
    ) -> AsyncIterator[AgentStarted | AgentOutput | AgentReply]:
        async with self._agent(key) as agent:
            async for event in agent.invoke_stream(tool, arguments, timeout, request_id):
                yield event

    async def upload(
        self, key: str, path: str, tar: bool, mode: int, chunks: AsyncIterator[bytes]
    ) -> AgentReply:
        async with self._agent(key, pass_deadline=False) as agent:
            return await agent.upload(path, tar, mode, chunks, TRANSFER_TIMEOUT_S)

    async def download(self, key: str, path: str, tar: bool) -> AsyncIterator[bytes | AgentReply]:
        async with self._agent(key, pass_deadline=False) as agent:
            async for item in agent.download(path, tar, TRANSFER_TIMEOUT_S):
                yield item

    async def _diagnose(self, sandbox: _Sandbox, exc: AgentCallFailed) -> NoReturn:
        """The agent call failed: find out whether the container died."""
        for delay in (0.0, 0.05, 0.2, 0.5, 1.0):
            await asyncio.sleep(delay)
            info = await asyncio.to_thread(self._backend.inspect, sandbox.info.id)
            if info is None or not info.running:
                sandbox.lost = True
                raise SandboxLost(_death_note(info))
        raise SandboxBroken(f"the sandbox's agent failed: {exc}") from exc

    async def ensure(self, key: str) -> _Sandbox:
        """The running sandbox for key, created (or re-created) when needed."""
        sandbox = self._sandboxes.get(key)
        if sandbox is not None and not sandbox.lost and sandbox.agent.is_ready():
            return sandbox
        validate_key(key)
        async with self._locks.setdefault(key, asyncio.Lock()):
            sandbox = self._sandboxes.get(key)
            if sandbox is not None and await self._still_alive(sandbox):
                return sandbox
            if sandbox is not None:
                await self._discard(sandbox)
            sandbox = await self._create(key)
            self._sandboxes[key] = sandbox
            return sandbox

    async def _still_alive(self, sandbox: _Sandbox) -> bool:
        if sandbox.lost:
            return False
        if sandbox.agent.is_ready():
            return True
        info = await asyncio.to_thread(self._backend.inspect, sandbox.info.id)
        if info is None or not info.running:
            return False
        try:
            await sandbox.agent.wait_ready(self._config.sandbox.start_timeout_s)
        except SandboxBroken:
            return False
        return True

    async def _discard(self, sandbox: _Sandbox) -> None:
        self._sandboxes.pop(sandbox.key, None)
        await sandbox.agent.close()
        await asyncio.to_thread(self._backend.remove, sandbox.info.id)

    async def _create(self, key: str) -> _Sandbox:
        paths = self._prepare_dirs(key)
        spec = self._spec(key, paths)
        await asyncio.to_thread(self._backend.remove, spec.name)
        await asyncio.to_thread(self._mount_workspace, paths)
        info = await asyncio.to_thread(self._backend.run, spec)
        agent = self._connect(paths.socket)
        try:
            await agent.wait_ready(self._config.sandbox.start_timeout_s)
        except SandboxBroken as exc:
            await agent.close()
            await asyncio.to_thread(self._backend.remove, info.id)
            raise SandboxBroken(f"sandbox {key!r} did not start: {exc}") from exc
        self._seal_run_dir(paths)
        return _Sandbox(key, sandbox_id(key), info, agent)

    def _prepare_dirs(self, key: str) -> _Paths:
        paths = self._paths(key)
        paths.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        paths.key_file.write_text(key, encoding="utf-8", errors="surrogatepass")
        for directory in (paths.workspace, paths.run):
            directory.mkdir(exist_ok=True)
            os.chown(directory, self._uid, self._gid, follow_symlinks=False)
        os.chmod(paths.run, 0o700)
        paths.socket.unlink(missing_ok=True)
        return paths

    def _mount_workspace(self, paths: _Paths) -> None:
        """Mount the workspace's own file system when it is capped, or was capped before (its
        files live there); no container may be running on the directory meanwhile."""
        size_mb = self._config.sandbox.workspace_size_mb
        if size_mb or paths.image.exists():
            workspaces.mount(paths.image, paths.workspace, size_mb, self._uid, self._gid)

    def _adoptable(self, paths: _Paths) -> bool:
        """A running container is adopted when its agent's directory is sealed and, if its
        workspace should be a file system of its own, that is mounted (else the container was
        made on the plain directory, and is made again)."""
        capped = self._config.sandbox.workspace_size_mb or paths.image.exists()
        if capped and not paths.workspace.is_mount():
            return False
        return self._run_dir_is_sealed(paths)

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
        root = self._root / sandbox_id(key)
        run = root / "run"
        return _Paths(
            root, root / "workspace", run, run / "agent.sock", root / "key", root / "workspace.img"
        )

    def _labels(self) -> dict[str, str]:
        return {LABEL_MANAGED: "1", LABEL_INSTANCE: self._instance_id}

    def container_name(self, key: str) -> str:
        return f"stockade-{self._instance_id[:8]}-{sandbox_id(key)}"

    def _agent_command(self) -> tuple[str, ...]:
        socket = f"{AGENT_SOCKET_DIR}/agent.sock"
        tools = self._config.tools
        return (
            *("--socket", socket, "--workspace", WORKSPACE),
            *("--max-output-bytes", str(tools.max_output_bytes)),
            *("--max-processes", str(tools.max_processes)),
            *("--process-log-bytes", str(tools.process_log_bytes)),
        )

    def _spec(self, key: str, paths: _Paths) -> ContainerSpec:
        sb = self._config.sandbox
        labels = {**self._labels(), LABEL_KEY: key, LABEL_SANDBOX_ID: sandbox_id(key)}
        return ContainerSpec(
            name=self.container_name(key),
            image=self._image,
            command=self._agent_command(),
            labels=labels,
            mounts=(
                BindMount(str(paths.workspace), WORKSPACE),
                BindMount(str(paths.run), AGENT_SOCKET_DIR),
            ),
            user=sb.user,
            read_only_root=sb.read_only_root,
            drop_all_capabilities=sb.drop_all_capabilities,
            no_new_privileges=sb.no_new_privileges,
            memory_bytes=sb.memory_mb * 1024 * 1024,
            nano_cpus=int(sb.cpus * 1e9),
            pids_limit=sb.pids,
            nofile=sb.nofile,
            nproc=sb.nproc,
            fsize=sb.max_file_size_mb * 1024 * 1024,
            tmpfs={"/tmp": sb.tmp_size_mb * 1024 * 1024},
            environment=dict(sb.secrets),
            network=sb.network,
            seccomp_profile=self._seccomp,
        )

    async def get(self, key: str) -> SandboxInfo:
        validate_key(key)
        sandbox = self._sandboxes.get(key)
        if sandbox is not None:
            return self._describe(sandbox)
        if self._paths(key).root.is_dir():
            return self._absent(key)
        raise SandboxNotFound(f"no sandbox for key {key!r}")

    async def list(self) -> list[SandboxInfo]:
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
                raise SandboxNotFound(f"no sandbox for key {key!r}")
            if sandbox is not None:
                await sandbox.agent.close()
            removed = await asyncio.to_thread(self._backend.remove, self.container_name(key))
            await asyncio.to_thread(workspaces.unmount, paths.workspace)
            if delete_workspace:
                await asyncio.to_thread(shutil.rmtree, paths.root)
            return removed, delete_workspace

    def _describe(self, sandbox: _Sandbox) -> SandboxInfo:
        return SandboxInfo(
            key=sandbox.key,
            container_id=sandbox.info.id,
            container_name=sandbox.info.name,
            engine=self._backend.engine,
            image=self._image,
            state=SandboxState.EXITED if sandbox.lost else SandboxState.RUNNING,
            created_at=sandbox.info.created_at,
            last_used_at=sandbox.last_used_at,
            workspace_path=str(self._paths(sandbox.key).workspace),
        )

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


def _death_note(info: ContainerInfo | None) -> str:
    if info is None:
        return "the sandbox's container was removed during the call; the next call recreates it"
    why = " (out of memory)" if info.oom_killed else ""
    return (
        f"the sandbox's container exited during the call with code {info.exit_code}{why}; "
        "the next call recreates it with the same workspace"
    )
