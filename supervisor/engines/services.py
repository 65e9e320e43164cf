"""Start the container engines' API services, and check Podman's set-up.

Podman needs no daemon, but the REST API the SDKs speak is served by
`podman system service`; Debian's `dockerd` has no init system to start it on
these machines. Both `ensure_*` functions start the service only when nothing
answers on its socket, and return the process (or None) so the caller can stop
what it started.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import shutil
import socket
import subprocess
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DOCKER_SOCKET = Path("/var/run/docker.sock")
DROP_IN = Path("/etc/containers/containers.conf.d/stockade.conf")
SETUP_HINT = "run scripts/setup.sh (docs/operations.md says what it sets up)"
# Podman 4.3 asks for these limits when containers.conf sets none.
PODMAN_DEFAULT_LIMIT = 1048576
CAP_SYS_RESOURCE = 24
ULIMITS = {"nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC}


class EngineServiceError(Exception):
    """An engine's API service is not installed, does not start, or does not answer."""


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self._path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


def ping(socket_path: Path, timeout: float = 2.0) -> bool:
    """True if a Docker-compatible API answers `GET /_ping` with OK on socket_path."""
    conn = _UnixHTTPConnection(socket_path, timeout)
    try:
        conn.request("GET", "/_ping")
        response = conn.getresponse()
        return response.status == 200 and response.read().strip() == b"OK"
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def ensure_podman_service(
    socket_path: Path, log_path: Path, global_args: Sequence[str] = ()
) -> subprocess.Popen[bytes] | None:
    """Start `podman system service` on socket_path unless something answers there;
    global_args go before `system` (e.g. --runtime: the runtime of all its containers)."""
    if ping(socket_path):
        return None
    podman = _require("podman", "apt-get install podman runc catatonit")
    cmd = [podman, *global_args, "system", "service", "--time=0", f"unix://{socket_path}"]
    return _start(cmd, socket_path, log_path, wait=20.0)


def ensure_dockerd(
    log_path: Path, socket_path: Path = DOCKER_SOCKET, args: Sequence[str] = ()
) -> subprocess.Popen[bytes] | None:
    """Start dockerd (listening on socket_path, with extra command-line args) unless
    something answers there."""
    if ping(socket_path):
        return None
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if not os.access(dockerd, os.X_OK):
        raise EngineServiceError("dockerd is not installed: apt-get install docker.io")
    cmd = [dockerd] if socket_path == DOCKER_SOCKET else [dockerd, "-H", f"unix://{socket_path}"]
    return _start([*cmd, *args], socket_path, log_path, wait=30.0)


def _require(program: str, install: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise EngineServiceError(f"{program} is not installed: {install}")
    return path


def _start(
    cmd: list[str], socket_path: Path, log_path: Path, *, wait: float
) -> subprocess.Popen[bytes]:
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    if socket_path.is_socket():  # nothing answered: a leftover of a dead service
        socket_path.unlink()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        # conmon, started by Podman's service, writes a file named `oom` into its working
        # directory when a container is OOM-killed: keep that out of the caller's folder
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=socket_path.parent,
        )  # fmt: skip
    _wait_for_ping(proc, Path(cmd[0]).name, socket_path, log_path, wait)
    return proc


def _wait_for_ping(
    proc: subprocess.Popen[bytes], name: str, socket_path: Path, log_path: Path, wait: float
) -> None:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if ping(socket_path, timeout=0.5):
            return
        if proc.poll() is not None:
            raise EngineServiceError(
                f"{name} exited with status {proc.returncode} before answering on "
                f"{socket_path}; its log ({log_path}) ends with:\n{_tail(log_path)}"
            )
        time.sleep(0.1)
    _stop(proc)
    raise EngineServiceError(
        f"{name} did not answer on {socket_path} within {wait:.0f} s (stopped it); "
        f"its log ({log_path}) ends with:\n{_tail(log_path)}"
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def podman_config_problems() -> list[str]:
    """What in Podman's set-up keeps sandboxes from starting here; empty when all is well."""
    podman = shutil.which("podman")
    if podman is None:
        return [f"podman is not installed: {SETUP_HINT}"]
    proc = subprocess.run(
        [podman, "info", "--format", "json"], capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        return [f"`podman info` failed: {proc.stderr.strip()[-500:]}"]
    host: dict[str, Any] = json.loads(proc.stdout)["host"]
    return _host_problems(host) + _ulimit_problems(_configured_ulimits())


def _host_problems(host: dict[str, Any]) -> list[str]:
    problems = []
    runtime = host.get("ociRuntime", {}).get("name", "?")
    if host.get("cgroupVersion") == "v1" and runtime != "runc":
        problems.append(
            f"podman uses the {runtime} runtime, which fails on this cgroup v1 layout: "
            f'set runtime = "runc" under [engine] in {DROP_IN}; {SETUP_HINT}'
        )
    if host.get("cgroupManager") == "systemd" and not Path("/run/systemd/system").is_dir():
        problems.append(
            f"podman uses the systemd cgroup manager but systemd is not running: set "
            f'cgroup_manager = "cgroupfs" under [engine] in {DROP_IN}'
        )
    return problems


def _conf_files() -> list[Path]:
    """containers.conf files in the order Podman reads them (later ones win)."""
    if "CONTAINERS_CONF" in os.environ:
        return [Path(os.environ["CONTAINERS_CONF"])]
    files = [Path("/usr/share/containers/containers.conf"), Path("/etc/containers/containers.conf")]
    for folder in (Path("/usr/share/containers/containers.conf.d"), DROP_IN.parent):
        files += sorted(folder.glob("*.conf")) if folder.is_dir() else []
    return [f for f in files if f.is_file()]


def configured_runtimes() -> dict[str, str]:
    """Runtimes listed under [engine.runtimes] in this host's containers.conf files (name ->
    the first listed path that exists; names with none are left out)."""
    listed: dict[str, list[str]] = {}
    for path in _conf_files():
        try:
            with path.open("rb") as f:
                runtimes = tomllib.load(f).get("engine", {}).get("runtimes", {})
        except (OSError, tomllib.TOMLDecodeError):
            continue
        if isinstance(runtimes, dict):
            listed.update(
                {str(k): [str(p) for p in v] for k, v in runtimes.items() if isinstance(v, list)}
            )
    found = {}
    for name, paths in listed.items():
        existing = [p for p in paths if os.access(p, os.X_OK)]
        if existing:
            found[name] = existing[0]
    return found


RUNSC_FLAGS = ("host-uds=create", "network=none", "oci-seccomp")
"""What gVisor's runsc needs under Stockade: host-uds=create, so that the agent's socket, made
inside the sandbox on a bind mount, answers on the host; network=none, as its netstack refuses
the namespace the engines give it; oci-seccomp, so that the sandbox's seccomp profile (no
namespaces, no mount, ...) holds inside gVisor too (runsc ignores it otherwise)."""


def podman_service_args(runtime: str) -> list[str]:
    """Global flags for a Podman service whose containers run under `runtime` (its API
    ignores a container's own runtime); runsc gets RUNSC_FLAGS."""
    if not runtime:
        return []
    args = [f"--runtime={runtime}"]
    if Path(runtime).name == "runsc":
        args += [f"--runtime-flag={flag}" for flag in RUNSC_FLAGS]
    return args


def _configured_ulimits() -> dict[str, int]:
    """Hard limit per name from the last `default_ulimits` set in containers.conf."""
    limits: list[str] = []
    for path in _conf_files():
        with path.open("rb") as f:
            limits = tomllib.load(f).get("containers", {}).get("default_ulimits", limits)
    parsed = {}
    for item in limits:
        name, _, values = item.partition("=")
        parsed[name.strip()] = int(values.split(":")[-1])
    return parsed


def _can_raise_limits() -> bool:
    """True if this process holds CAP_SYS_RESOURCE (so the runtime may exceed hard limits)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    return False


def _ulimit_problems(configured: dict[str, int]) -> list[str]:
    problems: list[str] = []
    if _can_raise_limits():
        return problems
    for name, rlimit in ULIMITS.items():
        host_hard = resource.getrlimit(rlimit)[1]
        wanted = configured.get(name, PODMAN_DEFAULT_LIMIT)
        if host_hard != resource.RLIM_INFINITY and wanted > host_hard:
            problems.append(
                f"podman would set {name} to {wanted}, above this host's hard limit "
                f"{host_hard} ('setrlimit ... not permitted'): add "
                f'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"] under '
                f"[containers] in {DROP_IN}"
            )
    return problems
