"""`stockade doctor`: is this machine ready to run sandboxes? Each check says how to fix it."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from stockade.supervisor.config import Config

SETUP = "run `scripts/setup.sh run` (or `make run`)"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def run_checks(config: Config) -> list[Check]:
    checks = [_cgroups()]
    if config.engine.kind == "podman":
        checks.append(_podman_runtime())
    engine = _engine(config)
    checks.append(engine)
    if engine.ok:
        checks.append(_image(config))
    checks.append(_tool("debootstrap", "needed by `stockade image build` when no base image"))
    return checks


def _cgroups() -> Check:
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    memory = v2 or Path("/sys/fs/cgroup/memory").is_dir()
    pids = v2 or Path("/sys/fs/cgroup/pids").is_dir()
    layout = "v2 (unified)" if v2 else "v1 (hybrid or legacy)"
    ok = memory and pids
    return Check(
        "cgroups",
        ok,
        f"{layout}; memory controller {'present' if memory else 'MISSING'}, "
        f"pids controller {'present' if pids else 'MISSING'}",
        "" if ok else "enable the memory and pids cgroup controllers in the kernel",
    )


def _podman_runtime() -> Check:
    from stockade.supervisor.engines import podman_config_problems

    try:
        problems = podman_config_problems()
    except Exception as exc:
        return Check("podman runtime", False, f"cannot read `podman info`: {exc}", SETUP)
    if problems:
        return Check("podman runtime", False, "; ".join(problems), SETUP)
    return Check("podman runtime", True, "runc runtime and ulimits fit this host")


def _engine(config: Config) -> Check:
    from stockade.supervisor.backends import create_backend
    from stockade.supervisor.errors import StockadeError

    url = _engine_url(config)
    if url is None:
        return Check(
            "engine",
            shutil.which("podman") is not None,
            "podman (the supervisor starts `podman system service` itself)",
            SETUP,
        )
    try:
        version = create_backend(config.engine.kind, url).ping()
    except StockadeError as exc:
        return Check("engine", False, str(exc), SETUP)
    return Check("engine", True, f"{config.engine.kind} {version} at {url}")


def _engine_url(config: Config) -> str | None:
    from stockade.supervisor.app import DOCKER_SOCKET
    from stockade.supervisor.engines import ping

    if config.engine.socket:
        return config.engine.socket
    if config.engine.kind == "docker":
        return DOCKER_SOCKET
    for candidate in (config.state_dir / "podman.sock", Path("/run/podman/podman.sock")):
        if ping(candidate):
            return f"unix://{candidate}"
    return None


def _image(config: Config) -> Check:
    import subprocess

    from stockade.supervisor.app import sandbox_image

    ref = sandbox_image(config)
    kind = config.engine.kind
    found = (
        subprocess.run([kind, "image", "inspect", ref], capture_output=True, timeout=60).returncode
        == 0
    )
    fix = f"stockade image build --engine {kind}"
    return Check("sandbox image", found, ref if found else f"{ref} is missing", fix)


def _tool(name: str, why: str) -> Check:
    path = shutil.which(name)
    return Check(
        name, path is not None, path or f"not installed ({why})", f"apt-get install {name}"
    )
