"""A real `stockade serve` subprocess on TCP 127.0.0.1, as users run it.

Its state directory is short and under /tmp (agent socket paths must stay below 107
bytes). On exit the supervisor is stopped and every container of its instance removed:
the supervisor itself leaves them running for the next start to adopt. `tree` runs another
checkout's supervisor (its src/ first on PYTHONPATH) in this venv, as `--compare` does.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.engines import engine_url
from bench.timing import progress
from stockade.supervisor.cli import launcher
from stockade.supervisor.sandboxes import workspaces


@dataclass(frozen=True)
class Served:
    engine: str
    target: str
    """host:port for the client."""
    state_dir: Path
    pid: int

    @property
    def log(self) -> Path:
        """The supervisor's log (stdout and stderr)."""
        return self.state_dir / "serve.log"


STATE_PARENT = "STOCKADE_BENCH_DIR"
"""The folder the served supervisors' state directories are made in (default /tmp): its file
system is what snapshots, restores and forks write to."""


def state_parent() -> Path:
    """Where served() makes state directories (STOCKADE_BENCH_DIR, else /tmp)."""
    return Path(os.environ.get(STATE_PARENT, "/tmp"))


def without_journal(path: Path) -> bool:
    """Whether `path` is on an ext4 file system without a journal: one that makes each new
    inode skip every one deleted in the last minute (docs/benchmarks.md, layered
    workspaces), so that creating files right after deleting many is slow there."""
    try:
        dev = os.stat(path).st_dev
        with open("/proc/self/mountinfo") as mounts:
            for line in mounts:
                fields = line.split()
                major, minor = fields[2].split(":")
                if os.makedev(int(major), int(minor)) != dev:
                    continue
                after = fields[fields.index("-") + 1 :]
                name = os.path.basename(after[1])
                if after[0] == "ext4" and os.path.isdir(f"/proc/fs/ext4/{name}"):
                    return not os.path.exists(f"/proc/fs/jbd2/{name}-8")
    except (OSError, ValueError, IndexError):
        return False
    return False


@contextlib.contextmanager
def served(
    engine: str,
    extra_config: str = "",
    *,
    tree: Path | None = None,
    auth: str = "[auth]\nenabled = false\n",
) -> Iterator[Served]:
    """`auth`: the [auth] table (none by default; bench/console_cost.py gives a tokens file,
    which the console needs)."""
    state_dir = Path(tempfile.mkdtemp(prefix="stkb", dir=state_parent()))
    target = f"127.0.0.1:{free_port()}"
    config = state_dir / "stockade.toml"
    config.write_text(
        f'listen = "{target}"\nstate_dir = "{state_dir}"\n'
        f'[engine]\nkind = "{engine}"\nsocket = "{engine_url(engine)}"\n'
        # the full policy pipeline runs; only the rate limit would throttle a benchmark
        "[limits]\nrate_per_s = 1000000.0\nburst = 1000000\n" + auth + extra_config
    )
    log_path = state_dir / "serve.log"
    process = None
    try:
        # Own session: a Ctrl-C reaches only the bench, which then shuts this down in order.
        if tree is None:
            process = launcher.spawn(config, log_path, own_session=True)
        else:
            process = spawn_from(tree, config, log_path)
        launcher.wait_serving(target, process, log_path)
        yield Served(engine, target, state_dir, process.pid)
    finally:
        if process is not None:
            launcher.stop(process)
        sweep(engine, state_dir)


def sweep(engine: str, state_dir: Path) -> None:
    """Remove the instance's containers, workspaces and state. When the engine cannot be
    reached (its service went away meanwhile) the state dir stays, and the message names it:
    the figures measured before are not lost to a failed clean-up."""
    try:
        launcher.remove_instance_containers(engine, engine_url(engine), state_dir)
    except Exception as exc:
        instance = (state_dir / "instance-id").read_text().strip()
        progress(
            f"could not remove the {engine} containers of instance {instance} (label "
            f"io.stockade.instance); {state_dir} is kept: {type(exc).__name__}: {exc}"
        )
        workspaces.unmount_all(state_dir)
        return
    workspaces.unmount_all(state_dir)
    shutil.rmtree(state_dir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn_from(tree: Path, config: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """`stockade serve` from the checkout at `tree`; refused unless it imports from there."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    probe = "import stockade.supervisor as s; print(s.__file__)"
    found = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=config.parent,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    loaded = Path(found.stdout.strip()).resolve()
    if found.returncode != 0 or not loaded.is_relative_to(tree.resolve()):
        raise RuntimeError(f"stockade from {tree} loads {loaded}: {found.stderr.strip()[-500:]}")
    cmd = [sys.executable, "-m", "stockade.supervisor.cli", "serve", "--config", str(config)]
    with log_path.open("ab") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env, cwd=config.parent,
        )  # fmt: skip
