"""Supervisor restarts adopt running containers; dead containers are recreated."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.client import Stockade, ToolResult
from stockade.supervisor.engines.image import image_ref
from tests.integration.harness import Supervisor, engine_cli, engine_url

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_restart_adopts_running_containers(own_supervisor: Supervisor, sig: int) -> None:
    with own_supervisor.client() as c:
        c.sandbox("a").write_file("f.txt", "A")
        c.sandbox("b").exec("echo B > g.txt")
        before = {s.key: s.container_id for s in c.list_sandboxes()}
    own_supervisor.stop(sig)
    own_supervisor.start()
    with own_supervisor.client() as c:
        after = {s.key: s.container_id for s in c.list_sandboxes()}
        assert after == before
        assert c.sandbox("a").read_file("f.txt") == "A"
        assert c.sandbox("b").exec("cat g.txt; echo $$").stdout.startswith("B\n")
        assert {s.key: s.container_id for s in c.list_sandboxes()} == before
    assert "adopted 2 running sandbox(es)" in own_supervisor.log()


@pytest.fixture
def changed_image(engine: str, tmp_path: Path) -> Iterator[str]:
    """An image built FROM the sandbox image with one more label, under a name of its own
    (removed afterwards): a new image, as `stockade image build` or [sandbox] image make."""
    ref = f"localhost/stockade-test-{uuid.uuid4().hex[:10]}:latest"
    (tmp_path / "Containerfile").write_text(
        f"FROM {image_ref(engine)}\nLABEL io.stockade.test-image={ref}\n"
    )
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    if engine == "docker":
        env["DOCKER_HOST"] = engine_url("docker")
    cmd = [engine, "build", "-t", ref, "-f", str(tmp_path / "Containerfile"), str(tmp_path)]
    if engine == "podman":
        cmd.insert(2, "--pull=never")
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert built.returncode == 0, built.stderr
    try:
        yield ref
    finally:
        engine_cli(engine, "rmi", "-f", ref)


def test_restart_recreates_a_container_of_another_image_with_its_workspace(
    own_supervisor: Supervisor, changed_image: str
) -> None:
    with own_supervisor.client() as c:
        box = c.sandbox("a")
        box.write_file("f.txt", "kept")
        box.exec("echo lost > /tmp/mark")
        old = box.info().container_id
    own_supervisor.stop()
    own_supervisor.extra_config += f'[sandbox]\nimage = "{changed_image}"\n'
    own_supervisor.start()
    with own_supervisor.client() as c:
        box = c.sandbox("a")
        info = box.info()
        assert info.state == "RUNNING"
        assert info.container_id != old
        assert box.read_file("f.txt") == "kept"
        assert box.exec("cat /tmp/mark").exit_code != 0, "a new container, not the old one"
        assert box.info().container_id == info.container_id
    labels = engine_cli(
        own_supervisor.engine, "inspect", "--format", "{{json .Config.Labels}}", info.container_id
    )
    assert changed_image in labels.stdout, "the new container runs the changed image"
    assert engine_cli(own_supervisor.engine, "inspect", old).returncode != 0, "the old is gone"
    [line] = [x for x in own_supervisor.log().splitlines() if "replacing sandbox 'a'" in x]
    assert "processes running in it are lost" in line


def test_killed_container_is_recreated_with_its_workspace(own_supervisor: Supervisor) -> None:
    with own_supervisor.client() as c:
        box = c.sandbox("k")
        box.write_file("data.txt", "survives")
        old = box.info().container_id
        assert engine_cli(own_supervisor.engine, "kill", old).returncode == 0
        assert box.read_file("data.txt") == "survives"
        new = box.info().container_id
        assert new != old
        assert box.info().state == "RUNNING"


def test_container_death_during_a_call_is_reported(own_supervisor: Supervisor) -> None:
    results: list[ToolResult] = []
    with own_supervisor.client() as c:
        box = c.sandbox("k")
        old = box.ensure().container_id
        started = threading.Event()

        def long_call() -> None:
            started.set()
            results.append(box.exec("sleep 60", timeout=120))

        worker = threading.Thread(target=long_call)
        worker.start()
        started.wait()
        box.exec("true")  # a second call on the key, so the long one is surely running
        assert engine_cli(own_supervisor.engine, "kill", old).returncode == 0
        worker.join(60)
        assert results, "the call in flight did not return"
        assert results[0].error_code == "SANDBOX_LOST"
        assert "recreates it" in results[0].error_message
        assert box.exec("echo back").stdout == "back\n"
        assert box.info().container_id != old


@pytest.mark.parametrize("streamed", [False, True], ids=["unary", "stream"])
def test_destroy_during_a_call_ends_it(client: Stockade, key: str, streamed: bool) -> None:
    """A call in flight when its sandbox is destroyed ends at once with SANDBOX_LOST (it
    used to wait forever: the closed agent channel cancelled the server's handler, which
    then sent the caller no status at all)."""
    box = client.sandbox(key)
    box.exec("true")
    results: list[ToolResult] = []

    def long_call() -> None:
        if streamed:
            events = list(client.call_stream(key, "exec", {"command": "sleep 100", "timeout": 120}))
            results.append(events[-1])  # type: ignore[arg-type]
        else:
            results.append(box.exec("sleep 100", timeout=120))

    worker = threading.Thread(target=long_call)
    worker.start()
    running = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"
    for _ in range(300):
        if "sleep 100" in box.exec(running).stdout:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the long call never started")
    assert box.destroy()
    worker.join(30)
    assert not worker.is_alive(), "the call in flight did not end when its sandbox was destroyed"
    assert isinstance(results[0], ToolResult)
    assert results[0].error_code == "SANDBOX_LOST"
    assert "destroyed" in results[0].error_message
    assert box.exec("echo back").stdout == "back\n"


def test_a_container_that_died_unobserved_is_not_listed_as_running(
    own_supervisor: Supervisor,
) -> None:
    """Get and List ask the engine: a sandbox whose container was killed between calls shows
    EXITED (never RUNNING), and its next call recreates it."""
    with own_supervisor.client() as c:
        a, b = c.sandbox("dies"), c.sandbox("lives")
        old = a.ensure().container_id
        b.ensure()
        assert engine_cli(own_supervisor.engine, "kill", old).returncode == 0
        states = {s.key: s.state for s in c.list_sandboxes()}
        assert states == {"dies": "EXITED", "lives": "RUNNING"}
        assert a.info().state == "EXITED"
        assert a.exec("echo again").stdout == "again\n"
        assert a.info().state == "RUNNING"
        assert a.info().container_id != old
