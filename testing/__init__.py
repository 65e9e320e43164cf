"""A testcontainers module for your integration tests: the Stockade supervisor image, started
against the engine testcontainers uses, with a connected client.

    from stockade.testing import StockadeContainer

    with StockadeContainer() as s:
        print(s.client.sandbox("k").exec("echo hi").stdout)  # hi

The engine is the one testcontainers talks to (DOCKER_HOST, else Docker's default socket); it
may be Docker or Podman (its Docker-compatible service). It must run on this machine: the
supervisor gives the engine host paths in its state directory, a temporary folder here that is
mounted at the same path in the supervisor's container. The API is a unix socket in that
folder, so the supervisor's container needs no network. Stopping removes the supervisor's
container and every sandbox container it made (found by its instance label), then the folder.

Where the Ryuk reaper image cannot be pulled, set TESTCONTAINERS_RYUK_DISABLED=true.
Needs `pip install 'stockade[testing]'`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, Self

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from testcontainers.core.container import DockerContainer

from stockade.client import Stockade

__all__ = ["StockadeContainer"]

Engine = Literal["docker", "podman"]
ENGINE_SOCKET_INSIDE = "/run/stockade/engine.sock"
LABEL_INSTANCE = "io.stockade.instance"
DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"


class StockadeContainer(DockerContainer):
    """The supervisor image as a testcontainers container.

    image: the supervisor image (default: the one `stockade image build --supervisor` makes).
    build: build the supervisor and sandbox images when they are missing or stale; needs a
      checkout of the repository. Default: when running from one.
    config: extra TOML for the supervisor's config file (state_dir, listen and [engine] are
      set here). Without an [auth] section the supervisor runs without authentication (its
      API is a unix socket in the state directory); with one, pass the client's token.
    start_timeout: seconds to wait for the gRPC health check to say SERVING.
    """

    def __init__(
        self,
        image: str | None = None,
        *,
        build: bool | None = None,
        config: str = "",
        token: str | None = None,
        start_timeout: float = 120.0,
        **kwargs: Any,
    ) -> None:
        from stockade.supervisor.engines.image import supervisor_image_ref

        super().__init__(image or supervisor_image_ref(), **kwargs)
        self._build = build
        self._config = config
        self._token = token
        self._start_timeout = start_timeout
        self._client: Stockade | None = None
        self.state_dir = Path(tempfile.mkdtemp(prefix="stockade-tc-", dir="/tmp"))
        """The supervisor's state directory: the same path here and in its container."""
        self.engine: Engine = self._engine_kind()

    @property
    def target(self) -> str:
        """The supervisor's gRPC address (a unix socket in the state directory)."""
        return f"unix:{self.state_dir}/api.sock"

    @property
    def client(self) -> Stockade:
        """A client connected to the supervisor (closed by stop())."""
        if self._client is None:
            raise RuntimeError("the StockadeContainer is not started")
        return self._client

    def instance_id(self) -> str:
        """The supervisor's instance id: the label on every sandbox container it makes."""
        return (self.state_dir / "instance-id").read_text().strip()

    def start(self) -> Self:
        self._ensure_images()
        state = str(self.state_dir)
        config = self.state_dir / "stockade.toml"
        config.write_text(self._config)
        self.with_volume_mapping(self._engine_socket(), ENGINE_SOCKET_INSIDE, "rw")
        self.with_volume_mapping(state, state, "rw")
        self.with_envs(
            STOCKADE_ENGINE=self.engine,
            STOCKADE_ENGINE_SOCKET=f"unix://{ENGINE_SOCKET_INSIDE}",
            STOCKADE_STATE_DIR=state,
            STOCKADE_LISTEN=self.target,
        )
        # the API is a unix socket only its owner can reach; an [auth] section of the
        # caller's own config (then pass token=) replaces that
        no_auth = [] if "[auth]" in self._config else ["--no-auth"]
        self.with_command(["serve", "--config", str(config), *no_auth])
        # `network`, not `network_mode`: testcontainers, when it thinks it runs in a
        # container, picks a network of its own for containers created without `network`
        self._kwargs = {"network": "none", **self._kwargs}
        super().start()
        self._wait_serving()
        self._client = Stockade(self.target, token=self._token)
        return self

    def stop(self, force: bool = True, delete_volume: bool = True) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        try:
            if self._container is not None:  # first the supervisor, so it makes no more
                with contextlib.suppress(Exception):
                    self._container.stop(timeout=10)
                self._remove_sandboxes()
            super().stop(force, delete_volume)
        finally:
            self._remove_state_dir()

    def _engine_kind(self) -> Engine:
        version = self.get_docker_client().client.version()
        names = [str(c.get("Name", "")) for c in version.get("Components") or []]
        platform = str((version.get("Platform") or {}).get("Name", ""))
        return "podman" if "podman" in " ".join([platform, *names]).lower() else "docker"

    def _engine_socket(self) -> str:
        """The engine's socket on this machine, to mount into the supervisor's container."""
        url = self.get_docker_client().client.api.base_url
        host = os.environ.get("DOCKER_HOST", "")
        if host.startswith("unix://"):
            return host.removeprefix("unix://")
        if not host and "localhost" in url:  # docker-py's name for the default unix socket
            return DEFAULT_DOCKER_SOCKET
        raise RuntimeError(
            f"StockadeContainer needs an engine on this machine, reached over a unix socket "
            f"(DOCKER_HOST=unix:///path), not {host or url}: the supervisor gives the engine "
            "host paths in its state directory"
        )

    def _ensure_images(self) -> None:
        from stockade.supervisor.engines.image import (
            REPO,
            build_image,
            build_supervisor_image,
            default_cache_dir,
        )

        build = self._build if self._build is not None else (REPO / "Containerfile").is_file()
        if not build:
            return
        for builder in (build_image, build_supervisor_image):
            builder(self.engine, cache_dir=default_cache_dir(), log=lambda _line: None)

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + self._start_timeout
        with grpc.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                container = self.get_wrapped_container()
                container.reload()
                if container.status in ("exited", "dead"):
                    raise RuntimeError(f"the supervisor exited:\n{self._logs()}")
                with contextlib.suppress(grpc.RpcError):
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                time.sleep(0.2)
        raise RuntimeError(f"the supervisor did not become healthy:\n{self._logs()}")

    def _logs(self) -> str:
        out, err = self.get_logs()
        return (out + err).decode(errors="replace")[-3000:]

    def _remove_sandboxes(self) -> None:
        id_file = self.state_dir / "instance-id"
        if not id_file.is_file():
            return
        label = f"{LABEL_INSTANCE}={id_file.read_text().strip()}"
        containers = self.get_docker_client().client.containers
        for container in containers.list(all=True, filters={"label": label}):
            container.remove(force=True)

    def _remove_state_dir(self) -> None:
        from stockade.supervisor.sandboxes import hostfs

        with contextlib.suppress(OSError):  # sandboxes may leave root-owned or deep trees
            hostfs.remove_tree(self.state_dir)
