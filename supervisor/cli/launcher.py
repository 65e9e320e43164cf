"""Run `stockade serve` as a child process: start, wait for gRPC health, stop, and sweep the
containers of its instance. Used by the integration tests and the benchmark."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stockade.supervisor.engines.backends import create_backend
from stockade.supervisor.engines.backends.base import LABEL_INSTANCE
from stockade.supervisor.network import links

START_TIMEOUT_S = 90.0


def spawn(config: Path, log_path: Path, *, own_session: bool = False) -> subprocess.Popen[bytes]:
    """Start `stockade serve --config CONFIG` with its output in log_path."""
    cmd = [sys.executable, "-m", "stockade.supervisor.cli", "serve", "--config", str(config)]
    with log_path.open("ab") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=own_session,
        )  # fmt: skip


def wait_serving(
    target: str,
    process: subprocess.Popen[bytes],
    log_path: Path,
    timeout: float = START_TIMEOUT_S,
    *,
    tls: tuple[grpc.ChannelCredentials, list[tuple[str, Any]]] | None = None,
) -> None:
    """Wait until the server's health check says SERVING; raise with its log otherwise.
    `tls`: credentials and options for a server that speaks TLS."""
    deadline = time.monotonic() + timeout
    channel = grpc.secure_channel(target, *tls) if tls else grpc.insecure_channel(target)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"stockade serve exited:\n{_tail(log_path)}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                time.sleep(0.1)
    raise RuntimeError(f"stockade serve did not become healthy:\n{_tail(log_path)}")


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def remove_instance_containers(engine: str, engine_url: str, state_dir: Path) -> int:
    """Remove every container of the instance whose state dir this is, and the egress links
    it left (a stopped supervisor keeps them for its next start to rebuild); how many
    containers."""
    id_file = state_dir / "instance-id"
    if not id_file.exists():
        return 0
    instance = id_file.read_text().strip()
    backend = create_backend(engine, engine_url)
    try:
        found = backend.list({LABEL_INSTANCE: instance})
        return sum(backend.remove(info.id) for info in found)
    finally:
        backend.close()
        for namespace in links.namespaces(links.instance_prefix(instance)):
            links.remove(namespace)


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:]
