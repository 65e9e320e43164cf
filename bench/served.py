"""A real `stockade serve` subprocess on TCP 127.0.0.1, as users run it.

Its state directory is short and under /tmp (agent socket paths must stay below 107
bytes). On exit the supervisor is stopped and every container of its instance removed:
the supervisor itself leaves them running for the next start to adopt.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.engines import engine_url
from stockade.supervisor.cli import launcher
from stockade.supervisor.sandboxes import workspaces


@dataclass(frozen=True)
class Served:
    engine: str
    target: str
    """host:port for the client."""
    state_dir: Path
    pid: int


@contextlib.contextmanager
def served(engine: str, extra_config: str = "") -> Iterator[Served]:
    state_dir = Path(tempfile.mkdtemp(prefix="stkb", dir="/tmp"))
    target = f"127.0.0.1:{free_port()}"
    config = state_dir / "stockade.toml"
    config.write_text(
        f'listen = "{target}"\nstate_dir = "{state_dir}"\n'
        f'[engine]\nkind = "{engine}"\nsocket = "{engine_url(engine)}"\n'
        # the full policy pipeline runs; only the rate limit would throttle a benchmark
        "[limits]\nrate_per_s = 1000000.0\nburst = 1000000\n"
        "[auth]\nenabled = false\n" + extra_config
    )
    log_path = state_dir / "serve.log"
    # Own session: a Ctrl-C reaches only the bench, which then shuts this down in order.
    process = launcher.spawn(config, log_path, own_session=True)
    try:
        launcher.wait_serving(target, process, log_path)
        yield Served(engine, target, state_dir, process.pid)
    finally:
        launcher.stop(process)
        launcher.remove_instance_containers(engine, engine_url(engine), state_dir)
        workspaces.unmount_all(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
