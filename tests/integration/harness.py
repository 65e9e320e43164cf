"""Real parts for integration tests: engines brought up for real, the real `stockade serve`
in a subprocess, the real client over gRPC."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stockade.client import TLS, Sandbox, Stockade
from stockade.supervisor import database
from stockade.supervisor.cli import launcher
from stockade.supervisor.engines.backends import create_backend
from stockade.supervisor.engines.backends.base import (
    LABEL_INSTANCE,
    LABEL_MANAGED,
    ContainerBackend,
    ContainerInfo,
)
from stockade.supervisor.engines.image import build_image, default_cache_dir, image_ref
from stockade.supervisor.engines.services import ensure_dockerd, ensure_podman_service
from stockade.supervisor.sandboxes import hostfs, workspaces

ENGINES = ("podman", "docker")
SANDBOX_UID = 65532
"""The sandbox user every tool runs as by default (the agent runs as config.AGENT_UID)."""
RUN_DIR = Path("/tmp/stockade-tests")
PODMAN_SOCKET = RUN_DIR / "podman.sock"
DOCKER_SOCKET = Path("/var/run/docker.sock")
NO_RATE_LIMIT = "[limits]\nrate_per_s = 1000000.0\nburst = 1000000\n"
"""Config for load and fault tests: the full policy pipeline runs, but the per-key rate limit
would turn many quick calls into RATE_LIMITED results."""
NO_AUTH = "[auth]\nenabled = false\n"
"""What the tests' supervisors run with unless a test gives its own [auth]: they listen on a
unix socket, where authentication may be switched off (explicitly)."""


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


RUNNING: dict[int, Supervisor] = {}
"""The supervisors started and not stopped (tests/conftest.py asks them where they wait when
a test times out)."""


@dataclass
class Supervisor:
    """A `stockade serve` subprocess on a unix socket (or `listen`), with its own state
    directory."""

    engine: str
    state_dir: Path
    extra_config: str = ""
    engine_socket: str | None = None
    """The engine's API address; None: the shared test service for that engine; "": none
    configured (Podman: the supervisor starts its own service)."""
    listen: str = ""
    """host:port to serve on instead of the unix socket (for clients that cannot reach one)."""
    process: subprocess.Popen[bytes] | None = None
    auth_config: str = NO_AUTH
    """The [auth] section (and anything else) written after extra_config."""
    token: str | None = None
    """What client() sends as its bearer token."""
    tls: TLS | None = None
    """The client side of TLS, when the [auth] section makes the server speak it."""
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.state_dir / "serve.log"
        self.socket = self.state_dir / "api.sock"

    @property
    def target(self) -> str:
        return self.listen or f"unix:{self.socket}"

    def config_file(self) -> Path:
        socket = engine_url(self.engine) if self.engine_socket is None else self.engine_socket
        if self.engine == "kubernetes":
            socket = ""  # [kubernetes] in extra_config says where the cluster is
        path = self.state_dir / "stockade.toml"
        path.write_text(
            f'listen = "{self.target}"\nstate_dir = "{self.state_dir}"\n'
            f'[engine]\nkind = "{self.engine}"\nsocket = "{socket}"\n'
            + self.extra_config
            + self.auth_config
        )
        return path

    def start(self) -> None:
        self.process = launcher.spawn(self.config_file(), self.log_path)
        RUNNING[id(self)] = self
        tls = (self.tls.credentials(), self.tls.options()) if self.tls else None
        launcher.wait_serving(self.target, self.process, self.log_path, tls=tls)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None:
            launcher.stop(self.process, sig)
        self.process = None
        RUNNING.pop(id(self), None)

    def waits(self, within: float = 3.0) -> str:
        """What the running supervisor's suspended awaits wait on (SIGUSR2, observe/waits.py),
        as its log says it: for a test that timed out. "" when it is not running."""
        if self.process is None or self.process.poll() is not None:
            return ""
        mark = self.log_path.stat().st_size if self.log_path.exists() else 0
        os.kill(self.process.pid, signal.SIGUSR2)
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(mark)
                text = f.read(64 * 1024).decode(errors="replace")
            at = text.find("chain(s) of suspended awaits")
            if at >= 0:
                time.sleep(0.2)  # the rest of the record
                with open(self.log_path, "rb") as f:
                    f.seek(mark)
                    return f.read(64 * 1024).decode(errors="replace")
            time.sleep(0.05)
        return f"(no report of its suspended awaits within {within:g} s)"

    def client(self, token: str | None = None, tls: TLS | None = None) -> Stockade:
        return Stockade(self.target, token=token or self.token, tls=tls or self.tls)

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


def free_tcp_address() -> str:
    """127.0.0.1 and a port nothing listens on at the moment."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@contextmanager
def running_supervisor(
    engine: str,
    extra_config: str = "",
    listen: str = "",
    *,
    auth_config: str = NO_AUTH,
    tls: TLS | None = None,
) -> Iterator[Supervisor]:
    """A supervisor with a fresh, short state directory (agent socket paths stay short);
    on exit it is stopped and every container of its instance is removed. `tls`: the
    client side, when auth_config makes the server speak TLS."""
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    sup = Supervisor(engine, state, extra_config, listen=listen, auth_config=auth_config, tls=tls)
    try:
        sup.start()
        yield sup
    finally:
        sup.stop()
        if engine != "kubernetes":  # pods: the tests' cluster removes its own (kubelet.py)
            launcher.remove_instance_containers(engine, engine_url(engine), state)
        workspaces.unmount_all(state)
        with contextlib.suppress(OSError):  # no recursion: sandboxes may leave deep trees
            hostfs.remove_tree(state)


@contextmanager
def serving_front(
    engine: str,
    folder: Path,
    table: str,
    config: str = "",
    tenants: tuple[str, ...] = ("acme", "other"),
) -> Iterator[tuple[Supervisor, str, list[str]]]:
    """A supervisor serving the front `table` ("mcp", "e2b") on a free loopback address, with
    `config` after that table's listen line, its callers `tenants` by bearer tokens from a
    tokens file in `folder` (the gRPC API takes them too): the supervisor, the address, and
    the tenants' tokens in their order."""
    tokens = [secrets.token_hex(20) for _ in tenants]
    path = folder / "tokens"
    path.write_text(
        "".join(f"{token} {name}\n" for token, name in zip(tokens, tenants, strict=True))
    )
    path.chmod(0o600)
    address = free_tcp_address()
    with running_supervisor(
        engine,
        f'[{table}]\nlisten = "{address}"\n{config}',
        auth_config=f'[auth]\ntokens_file = "{path}"\n',
    ) as sup:
        yield sup, address, tokens


def process(box: Sandbox, action: str, **args: Any) -> dict[str, Any]:
    """The process tool's `action` in `box`, which must not fail: its data."""
    result = box.call("process", {"action": action, **args})
    assert not result.is_error, result.error_message
    return result.data


def an_approver_connected(client: Stockade, within: float = 10.0) -> None:
    """Wait until the ApprovalService has an approver of `client`'s tenant connected."""
    deadline = time.monotonic() + within
    while client.list_approvals().approvers < 1:
        assert time.monotonic() < deadline, "the approver did not connect"
        time.sleep(0.02)


def inspected(engine: str, container_id: str) -> ContainerInfo:
    """What the engine says of the container (which must exist)."""
    be = backend(engine)
    try:
        info = be.inspect(container_id)
    finally:
        be.close()
    assert info is not None
    return info


def backend(engine: str) -> ContainerBackend:
    return create_backend(engine, engine_url(engine))


def engine_cli(engine: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if engine == "docker":
        env["DOCKER_HOST"] = engine_url("docker")
    return subprocess.run([engine, *args], capture_output=True, text=True, timeout=60, env=env)


def instance_containers(engine: str, url: str, sup: Supervisor) -> list[ContainerInfo]:
    """Every container (running or not) that carries this supervisor's labels: what a leak
    check counts."""
    be = create_backend(engine, url)
    try:
        return be.list({LABEL_MANAGED: "1", LABEL_INSTANCE: sup.instance_id()})
    finally:
        be.close()


PRIVATE_BRIDGE = "stkprivate0"


@dataclass
class PrivateEngine:
    """An engine service of a test's own, on its own socket, that the test may kill and
    restart without disturbing the shared services. Podman: `podman system service` over the
    shared storage. Docker: a second dockerd with its own data and exec roots, a bridge of
    its own and no iptables rules (the sandbox image is copied in on the first start). Not
    `--bridge none`: a dockerd started so deletes the host's docker0, the shared dockerd's."""

    engine: str
    root: Path
    process: subprocess.Popen[bytes] | None = None
    runtimes: dict[str, dict[str, object]] = field(default_factory=dict)
    """Docker: OCI runtimes to register in its daemon.json ("runtimes"), name -> {"path",
    "runtimeArgs"} (the shared dockerd's config stays untouched)."""
    userns_remap: bool = False
    """Docker: `--userns-remap=default` (dockerd makes the `dockremap` user and its /etc/subuid
    range; images live per remap root, so the image is copied into this one)."""
    bridge: str = PRIVATE_BRIDGE
    """Docker: the bridge of its own (tests that may run beside test_faults use another)."""

    @property
    def socket(self) -> Path:
        return self.root / f"{self.engine}.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        log = self.root / f"{self.engine}.log"
        if self.engine == "podman":
            self.process = ensure_podman_service(self.socket, log)
            return
        self._add_bridge()
        if self.userns_remap:  # the remapped root must be able to pass through to its data
            self.root.chmod(0o711)
        self.process = ensure_dockerd(log, self.socket, self._dockerd_args())
        ref = image_ref("docker")
        env = {**os.environ, "DOCKER_HOST": self.url}
        if subprocess.run(
            ["docker", "image", "inspect", ref], env=env, capture_output=True
        ).returncode:
            save = subprocess.Popen(
                ["docker", "save", ref],
                stdout=subprocess.PIPE,
                env={**env, "DOCKER_HOST": engine_url("docker")},
            )
            subprocess.run(
                ["docker", "load", "-q"],
                stdin=save.stdout,
                env=env,
                check=True,
                capture_output=True,
                timeout=300,
            )
            assert save.stdout is not None
            save.stdout.close()
            assert save.wait(60) == 0

    def _dockerd_args(self) -> list[str]:
        config = self.root / "daemon.json"
        config.write_text(json.dumps({"runtimes": self.runtimes} if self.runtimes else {}) + "\n")
        return [
            *("--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec")),
            *("--pidfile", str(self.root / "dockerd.pid"), "--config-file", str(config)),
            *("--bridge", self.bridge, "--iptables=false", "--ip-masq=false"),
            *(["--userns-remap=default"] if self.userns_remap else []),
        ]

    def _add_bridge(self) -> None:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            if not ipr.link_lookup(ifname=self.bridge):
                ipr.link("add", ifname=self.bridge, kind="bridge")

    def kill(self) -> None:
        """Kill the service (by the id of the process this test started). Podman's gets
        SIGKILL (its containers live on under conmon). dockerd gets SIGTERM and stops its
        containers: killed, it leaves containerd shims whose state a restarted dockerd often
        fails to load in time on a busy host (`timeout waiting for containerd to start`)."""
        assert self.process is not None
        if self.engine == "podman":
            self.process.kill()
        else:
            self.process.terminate()
        self.process.wait(90)
        self.process = None

    def close(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
            self.process = None
        for mount in _mounts_under(self.root):  # dockerd bind-mounts its data root
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        if self.engine == "docker":
            from pyroute2 import IPRoute

            with IPRoute() as ipr:
                for index in ipr.link_lookup(ifname=self.bridge):
                    ipr.link("del", index=index)


def _mounts_under(root: Path) -> list[str]:
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted((p for p in points if p.startswith(f"{root}/")), reverse=True)


def refused_rows(sup: Supervisor, tool: str, front: str) -> list[tuple[str, str, str]]:
    """(caller, policy_step, arguments) of the refusals of kind `tool` (observe/refusals.py:
    refused authentication, refused bodies, caps) at `front`: records of no tenant, read from
    the supervisor's database (no caller's query reaches them)."""
    db = database.reader(sup.state_dir / "stockade.db")
    try:
        rows = db.execute(
            "SELECT caller, policy_step, arguments_json FROM audit WHERE tool = ? AND front = ?",
            (tool, front),
        ).fetchall()
        return [(str(a), str(b), str(c)) for a, b, c in rows]
    finally:
        db.close()
