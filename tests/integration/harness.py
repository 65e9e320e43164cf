"""Real parts for integration tests: engines brought up for real, the real `stockade serve`
in a subprocess, the real client over gRPC."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from stockade.client import Stockade
from stockade.supervisor import launcher, workspaces
from stockade.supervisor.backends import create_backend
from stockade.supervisor.backends.base import ContainerBackend
from stockade.supervisor.engines import ensure_dockerd, ensure_podman_service
from stockade.supervisor.image import build_image, default_cache_dir

ENGINES = ("podman", "docker")
RUN_DIR = Path("/tmp/stockade-tests")
PODMAN_SOCKET = RUN_DIR / "podman.sock"
DOCKER_SOCKET = Path("/var/run/docker.sock")


def engine_url(engine: str) -> str:
    return f"unix://{PODMAN_SOCKET if engine == 'podman' else DOCKER_SOCKET}"


_started: dict[str, subprocess.Popen[bytes]] = {}
"""Engine services this test session started (held, so they are stopped, not leaked)."""


def bring_up(engine: str) -> None:
    """Start the engine's service if nothing answers, and build the image if stale."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    if engine == "podman":
        service = ensure_podman_service(PODMAN_SOCKET, RUN_DIR / "podman-service.log")
    else:
        service = ensure_dockerd(RUN_DIR / "dockerd.log")
    if service is not None:
        _started[engine] = service
    build_image(engine, cache_dir=default_cache_dir(), log=lambda _line: None)  # type: ignore[arg-type]


def stop_started_services() -> None:
    """Stop the engine services bring_up started, leaving the machine as the session found it."""
    while _started:
        _engine, service = _started.popitem()
        service.terminate()
        try:
            service.wait(60)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait(10)


@dataclass
class Supervisor:
    """A `stockade serve` subprocess on a unix socket, with its own state directory."""

    engine: str
    state_dir: Path
    extra_config: str = ""
    engine_socket: str | None = None
    """The engine's API address; None: the shared test service for that engine; "": none
    configured (Podman: the supervisor starts its own service)."""
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.state_dir / "serve.log"
        self.socket = self.state_dir / "api.sock"

    @property
    def target(self) -> str:
        return f"unix:{self.socket}"

    def config_file(self) -> Path:
        socket = engine_url(self.engine) if self.engine_socket is None else self.engine_socket
        path = self.state_dir / "stockade.toml"
        path.write_text(
            f'listen = "{self.target}"\nstate_dir = "{self.state_dir}"\n'
            f'[engine]\nkind = "{self.engine}"\nsocket = "{socket}"\n' + self.extra_config
        )
        return path

    def start(self) -> None:
        self.process = launcher.spawn(self.config_file(), self.log_path)
        launcher.wait_serving(self.target, self.process, self.log_path)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None:
            launcher.stop(self.process, sig)
        self.process = None

    def client(self) -> Stockade:
        return Stockade(self.target)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def instance_id(self) -> str:
        return (self.state_dir / "instance-id").read_text().strip()

    def workspace(self, key: str) -> Path:
        from stockade.supervisor.keys import sandbox_id

        return self.state_dir / "sandboxes" / sandbox_id(key) / "workspace"

    def rss_bytes(self) -> int:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")


@contextmanager
def running_supervisor(engine: str, extra_config: str = "") -> Iterator[Supervisor]:
    """A supervisor with a fresh, short state directory (agent socket paths stay short);
    on exit it is stopped and every container of its instance is removed."""
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    sup = Supervisor(engine, state, extra_config)
    sup.start()
    try:
        yield sup
    finally:
        sup.stop()
        launcher.remove_instance_containers(engine, engine_url(engine), state)
        workspaces.unmount_all(state)
        shutil.rmtree(state, ignore_errors=True)


def backend(engine: str) -> ContainerBackend:
    return create_backend(engine, engine_url(engine))


def engine_cli(engine: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if engine == "docker":
        env["DOCKER_HOST"] = engine_url("docker")
    return subprocess.run([engine, *args], capture_output=True, text=True, timeout=60, env=env)
