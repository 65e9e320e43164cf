"""A real `stockade serve` subprocess on TCP 127.0.0.1, as users run it.

Its state directory is short and under /tmp (agent socket paths must stay below 107
bytes). On exit the supervisor is stopped and every container of its instance removed:
the supervisor itself leaves them running for the next start to adopt.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.engines import engine_url
from stockade.supervisor.backends import create_backend
from stockade.supervisor.backends.base import LABEL_INSTANCE

START_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Served:
    engine: str
    target: str
    """host:port for the client."""
    state_dir: Path
    pid: int


@contextlib.contextmanager
def served(engine: str) -> Iterator[Served]:
    state_dir = Path(tempfile.mkdtemp(prefix="stkb", dir="/tmp"))
    target = f"127.0.0.1:{free_port()}"
    config = state_dir / "stockade.toml"
    config.write_text(
        f'listen = "{target}"\nstate_dir = "{state_dir}"\n'
        f'[engine]\nkind = "{engine}"\nsocket = "{engine_url(engine)}"\n'
    )
    log_path = state_dir / "serve.log"
    cmd = [sys.executable, "-m", "stockade.supervisor.cli", "serve", "--config", str(config)]
    with log_path.open("ab") as log:
        # Own session: a Ctrl-C reaches only the bench, which then shuts this down in order.
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_serving(target, process, log_path)
        yield Served(engine, target, state_dir, process.pid)
    finally:
        stop(process)
        remove_instance(engine, state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_serving(target: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"stockade serve exited:\n{log_path.read_text()[-3000:]}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                time.sleep(0.1)
    raise RuntimeError(f"stockade serve did not become healthy:\n{log_path.read_text()[-3000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def remove_instance(engine: str, state_dir: Path) -> None:
    id_file = state_dir / "instance-id"
    if not id_file.exists():
        return
    backend = create_backend(engine, engine_url(engine))
    try:
        for info in backend.list({LABEL_INSTANCE: id_file.read_text().strip()}):
            backend.remove(info.id)
    finally:
        backend.close()
