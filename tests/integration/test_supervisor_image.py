"""The supervisor image, run as the README shows (the `docker run` / `podman run` lines are
read from README.md), on both engines: sandboxes get workspaces that are the right host
folders, a restart of the supervisor's container adopts them, and the supervisor refuses to
start when the state directory is not mounted at the same path, or asks for what cannot work
in a container. And `stockade.testing.StockadeContainer`, run exactly as the README shows."""

from __future__ import annotations

import contextlib
import re
import shlex
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stockade.client import Stockade
from stockade.supervisor.cli import launcher
from stockade.supervisor.engines.image import build_supervisor_image, default_cache_dir
from stockade.supervisor.keys import sandbox_id
from stockade.supervisor.sandboxes import hostfs
from tests.integration.harness import (
    PODMAN_SOCKET,
    backend,
    engine_cli,
    engine_url,
)

pytestmark = pytest.mark.timeout(600)

README = Path(__file__).resolve().parents[2] / "README.md"
DEFAULT_STATE = "/var/lib/stockade"
PODMAN_SOCKET_IN_README = "/run/podman/podman.sock"


@pytest.fixture(scope="module")
def image(engine: str) -> str:
    return build_supervisor_image(engine, cache_dir=default_cache_dir(), log=lambda _l: None)


def readme_run_line(engine: str) -> list[str]:
    """The README's `ENGINE run ...` command, as argv."""
    found = re.search(
        rf"^{engine} run .*?localhost/stockade-supervisor:latest$", README.read_text(), re.M | re.S
    )
    assert found, f"no `{engine} run` line in the README"
    return shlex.split(found.group(0).replace("\\\n", " "))


def run_line(engine: str, state: Path, name: str, *, mount_at: str | None = None) -> list[str]:
    """The README line for a state directory of the test's own, as the README says to move
    it (mounted at the same path; STOCKADE_STATE_DIR and STOCKADE_LISTEN set), or with the
    folder mounted at `mount_at` and the state directory left at the image's default."""
    argv = readme_run_line(engine)
    out: list[str] = []
    for arg in argv:
        if arg == f"{DEFAULT_STATE}:{DEFAULT_STATE}":
            arg = f"{state}:{mount_at or state}"
        elif arg == f"{PODMAN_SOCKET_IN_README}:{PODMAN_SOCKET_IN_README}":
            arg = f"{PODMAN_SOCKET}:{PODMAN_SOCKET_IN_README}"  # the shared test service
        elif arg == "stockade" and out[-1] == "--name":
            arg = name
        out.append(arg)
    image_at = out.index("localhost/stockade-supervisor:latest")
    if mount_at is None:
        env = [f"STOCKADE_STATE_DIR={state}", f"STOCKADE_LISTEN=unix:{state}/api.sock"]
        out[image_at:image_at] = [x for e in env for x in ("-e", e)]
    return out


@dataclass
class ImageRun:
    engine: str
    state: Path
    name: str

    @property
    def target(self) -> str:
        return f"unix:{self.state}/api.sock"

    def logs(self) -> str:
        proc = engine_cli(self.engine, "logs", self.name)
        return proc.stdout + proc.stderr

    def wait_serving(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                with contextlib.suppress(grpc.RpcError):
                    reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                state = engine_cli(self.engine, "inspect", "-f", "{{.State.Running}}", self.name)
                if state.stdout.strip() == "false":
                    raise AssertionError(f"the supervisor exited:\n{self.logs()}")
                time.sleep(0.3)
        raise AssertionError(f"the supervisor did not become healthy:\n{self.logs()}")


@contextlib.contextmanager
def state_dir() -> Iterator[Path]:
    state = Path(tempfile.mkdtemp(prefix="stkimg", dir="/tmp"))
    try:
        yield state
    finally:
        with contextlib.suppress(OSError):
            hostfs.remove_tree(state)


@pytest.fixture
def image_run(engine: str, image: str) -> Iterator[ImageRun]:
    """The supervisor image started with the README's line; removed afterwards with every
    sandbox of its instance."""
    with state_dir() as state:
        run = ImageRun(engine, state, f"stkimg-{uuid.uuid4().hex[:10]}")
        proc = engine_cli(engine, *run_line(engine, state, run.name)[1:])
        assert proc.returncode == 0, proc.stderr
        try:
            run.wait_serving()
            yield run
        finally:
            engine_cli(engine, "rm", "-f", run.name)
            launcher.remove_instance_containers(engine, engine_url(engine), state)


def test_documented_run_line_serves_sandboxes_on_host_workspaces(image_run: ImageRun) -> None:
    workspace = image_run.state / "sandboxes" / sandbox_id("k") / "workspace"
    with Stockade(image_run.target) as client:
        box = client.sandbox("k")
        box.write_file("from-sandbox.txt", "inside\n")
        assert (workspace / "from-sandbox.txt").read_text() == "inside\n"
        (workspace / "from-host.txt").write_text("outside\n")
        assert box.exec("cat /workspace/from-host.txt").stdout == "outside\n"
        info = box.info()
    be = backend(image_run.engine)
    try:  # the engine's own record: the sandbox's workspace is that host folder
        mounts = be.mounts(info.container_id)
    finally:
        be.close()
    assert mounts is not None
    assert {m.target: m.source for m in mounts}["/workspace"] == str(workspace)
    assert f"the state directory {image_run.state} is the host's" in image_run.logs()


def test_restarted_supervisor_container_adopts_its_sandboxes(image_run: ImageRun) -> None:
    with Stockade(image_run.target) as client:
        client.sandbox("k").write_file("kept.txt", "kept")
        before = client.sandbox("k").info().container_id
    assert engine_cli(image_run.engine, "restart", image_run.name).returncode == 0
    image_run.wait_serving()
    with Stockade(image_run.target) as client:
        assert {s.key: s.container_id for s in client.list_sandboxes()} == {"k": before}
        assert client.sandbox("k").read_file("kept.txt") == "kept"
        assert client.sandbox("k").info().container_id == before


def refused(engine: str, argv: list[str]) -> str:
    """Run the line in the foreground; assert it exits non-zero; return its output."""
    argv = [a for a in argv if a != "-d"]
    argv.insert(argv.index("run") + 1, "--rm")
    proc = engine_cli(engine, *argv[1:])
    assert proc.returncode != 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_state_dir_at_another_path_is_refused(engine: str, image: str) -> None:
    with state_dir() as state:
        name = f"stkimg-{uuid.uuid4().hex[:10]}"
        output = refused(engine, run_line(engine, state, name, mount_at=DEFAULT_STATE))
        assert f"the state directory {DEFAULT_STATE} is {state} on the host" in output
        assert f"-v {state}:{state}" in output
        assert not (state / "api.sock").exists()
        assert not (state / "sandboxes").exists()


def test_state_dir_not_mounted_is_refused(engine: str, image: str) -> None:
    with state_dir() as state:
        argv = run_line(engine, state, f"stkimg-{uuid.uuid4().hex[:10]}")
        at = argv.index(f"{state}:{state}")
        del argv[at - 1 : at + 1]  # the -v and its value
        output = refused(engine, argv)
        assert f"the state directory {state} is not mounted from the host" in output


def test_state_dir_with_a_foreign_mount_inside_is_refused(engine: str, image: str) -> None:
    with state_dir() as state, state_dir() as other:
        argv = run_line(engine, state, f"stkimg-{uuid.uuid4().hex[:10]}")
        at = argv.index(f"{state}:{state}")
        argv[at + 1 : at + 1] = ["-v", f"{other}:{state}/sandboxes"]
        output = refused(engine, argv)
        assert f"{state}/sandboxes, inside the state directory {state}, is mounted from" in output


def test_what_cannot_work_in_a_container_is_refused(engine: str, image: str) -> None:
    with state_dir() as state:
        config = state / "stockade.toml"
        config.write_text('[sandbox]\nnetwork = "egress"\n[network]\nallow = ["example.com"]\n')
        argv = run_line(engine, state, f"stkimg-{uuid.uuid4().hex[:10]}")
        argv += ["serve", "--config", str(config), "--no-auth"]
        output = refused(engine, argv)
        assert 'sandbox.network = "egress"' in output
        assert "cannot reach" in output


def without_env(argv: list[str], prefix: str) -> list[str]:
    """argv without its `-e NAME=VALUE` pairs whose NAME starts with prefix."""
    out: list[str] = []
    for arg in argv:
        if arg.startswith(prefix) and out and out[-1] == "-e":
            out.pop()
            continue
        out.append(arg)
    return out


def test_podman_without_a_socket_is_refused(engine: str, image: str) -> None:
    with state_dir() as state:
        argv = run_line(engine, state, f"stkimg-{uuid.uuid4().hex[:10]}")
        argv = without_env(argv, "STOCKADE_ENGINE")
        argv[argv.index("run") + 1 : argv.index("run") + 1] = ["-e", "STOCKADE_ENGINE=podman"]
        output = refused(engine, argv)
        assert "engine.socket is empty" in output
        assert "STOCKADE_ENGINE_SOCKET" in output


def readme_testcontainers_snippet() -> str:
    found = re.search(
        r"```python\n(from stockade\.testing import StockadeContainer\n.*?)```",
        README.read_text(),
        re.S,
    )
    assert found, "no StockadeContainer snippet in the README"
    return found.group(1)


@pytest.fixture
def testcontainers_engine(engine: str, image: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """testcontainers pointed at the engine, without Ryuk (its image cannot be pulled here)."""
    monkeypatch.setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
    if engine == "podman":
        monkeypatch.setenv("DOCKER_HOST", engine_url("podman"))
    else:
        monkeypatch.delenv("DOCKER_HOST", raising=False)  # testcontainers' default: Docker
    return engine


def test_readme_testcontainers_snippet(testcontainers_engine: str) -> None:
    namespace: dict[str, object] = {}
    exec(readme_testcontainers_snippet(), namespace)
    test = namespace["test_hello"]
    assert callable(test)
    test()


def test_stockade_container_cleans_up_after_itself(testcontainers_engine: str) -> None:
    from stockade.testing import StockadeContainer

    with StockadeContainer() as s:
        assert s.engine == testcontainers_engine
        assert s.client.sandbox("k").exec("echo hi").stdout == "hi\n"
        assert s.client.sandbox("j").exec("pwd").stdout == "/workspace\n"
        instance, state = s.instance_id(), s.state_dir
        supervisor = s.get_wrapped_container()
        assert supervisor.attrs["HostConfig"]["NetworkMode"] == "none"  # no way in but the socket
    be = backend(testcontainers_engine)
    try:
        assert be.list({"io.stockade.instance": instance}) == []
        assert be.inspect(supervisor.id) is None
    finally:
        be.close()
    assert not state.exists()
