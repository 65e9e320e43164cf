"""The engines on this machine: bring them up, reach their CLIs, clean up what we made.

Every container the bench makes outside Stockade carries the label BENCH_LABEL=<run id>,
so a final sweep removes them whatever happened before.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from stockade.supervisor.engines.image import build_image, default_cache_dir, image_ref
from stockade.supervisor.engines.services import ensure_dockerd, ensure_podman_service

ENGINES = ("podman", "docker")
RUN_DIR = Path("/tmp/stockade-tests")
PODMAN_SOCKET = RUN_DIR / "podman.sock"
DOCKER_SOCKET = Path("/var/run/docker.sock")
BENCH_LABEL = "io.stockade.bench-run"
DEBIAN_DOCKER = Path("/usr/bin/docker")


def engine_url(engine: str) -> str:
    return f"unix://{PODMAN_SOCKET if engine == 'podman' else DOCKER_SOCKET}"


def bring_up(engine: str) -> str:
    """Start the engine's API service if nothing answers, build the image if stale; the ref."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    if engine == "podman":
        ensure_podman_service(PODMAN_SOCKET, RUN_DIR / "podman-service.log")
    else:
        ensure_dockerd(RUN_DIR / "dockerd.log")
    kind: Literal["podman", "docker"] = "podman" if engine == "podman" else "docker"
    build_image(kind, cache_dir=default_cache_dir(), log=lambda _line: None)
    return image_ref(engine)


def cli_path(engine: str) -> str:
    """The engine's CLI: for Docker the Debian client (same release as dockerd) if present."""
    if engine == "docker" and DEBIAN_DOCKER.exists():
        return str(DEBIAN_DOCKER)
    found = shutil.which(engine)
    if found is None:
        raise RuntimeError(f"no {engine} CLI on PATH")
    return found


def cli(engine: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the engine's CLI against the local engine; raise with its stderr on failure."""
    proc = subprocess.run(
        [cli_path(engine), *args], capture_output=True, text=True, timeout=timeout, env=cli_env()
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} {' '.join(args)}: {proc.stderr.strip()[-500:]}")
    return proc


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["DOCKER_HOST"] = engine_url("docker")
    env.pop("CONTAINER_HOST", None)  # podman: the local engine, never a remote one
    return env


def remove_labelled(engine: str, run_id: str) -> int:
    """Remove every container of this run (by label); how many there were."""
    try:
        listed = cli(engine, "ps", "-aq", "--filter", f"label={BENCH_LABEL}={run_id}")
    except (RuntimeError, OSError, subprocess.SubprocessError):
        return 0
    ids = listed.stdout.split()
    for cid in ids:
        remove_container(engine, cid)
    return len(ids)


def remove_container(engine: str, cid: str) -> None:
    """Kill and remove at once (`sleep` as PID 1 ignores SIGTERM: a stop would wait 10 s)."""
    force = ["rm", "-f", "-t", "0"] if engine == "podman" else ["rm", "-f"]
    subprocess.run([cli_path(engine), *force, cid], capture_output=True, env=cli_env(), timeout=60)
