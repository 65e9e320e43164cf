"""A supervisor whose engine cannot be reached says so clearly, and keeps serving the
sandboxes that already run (their agents are reached directly, not through the engine)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from stockade.client import Unavailable
from stockade.supervisor.cli import launcher
from stockade.supervisor.engines.services import ensure_podman_service
from stockade.supervisor.sandboxes import workspaces
from tests.integration.harness import Supervisor, bring_up, engine_url

pytestmark = pytest.mark.timeout(300)


def test_serve_refuses_to_start_without_an_engine(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        f'listen = "unix:{tmp_path}/api.sock"\nstate_dir = "{tmp_path}"\n'
        f'[engine]\nkind = "podman"\nsocket = "unix://{tmp_path}/nothing.sock"\n'
        "[auth]\nenabled = false\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "stockade.supervisor.cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "does not answer" in done.stderr
    assert "Traceback" not in done.stderr


def test_engine_down_gives_unavailable_and_running_sandboxes_keep_working() -> None:
    bring_up("podman")
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    socket = state / "podman.sock"
    service = ensure_podman_service(socket, state / "podman.log")
    assert service is not None
    sup = Supervisor("podman", state, engine_socket=f"unix://{socket}")
    sup.start()
    try:
        with sup.client() as c:
            assert c.sandbox("running").exec("echo up").stdout == "up\n"
            service.terminate()
            service.wait(10)
            assert c.sandbox("running").exec("echo still").stdout == "still\n"
            with pytest.raises(Unavailable) as info:
                c.sandbox("new").exec("true")
            assert "Podman" in str(info.value)
            assert info.value.reason == "ENGINE_UNAVAILABLE"
            service = ensure_podman_service(socket, state / "podman.log")
            assert c.sandbox("new").exec("echo back").stdout == "back\n"
    finally:
        sup.stop()
        launcher.remove_instance_containers("podman", engine_url("podman"), state)
        if service is not None:
            service.terminate()
            service.wait(10)
        workspaces.unmount_all(state)  # /tmp tmpfs, layered workspaces
        shutil.rmtree(state, ignore_errors=True)


def test_serve_starts_its_own_podman_service() -> None:
    """With no engine socket configured, `stockade serve` runs `podman system service` itself
    (the embedded default) and stops it on shutdown; its containers stay for the next start."""
    bring_up("podman")
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    sup = Supervisor("podman", state, engine_socket="")
    try:
        sup.start()
        with sup.client() as c:
            assert c.sandbox("k").exec("echo hi").stdout == "hi\n"
        assert (state / "podman.sock").is_socket()
        sup.stop()
        sup.start()
        with sup.client() as c:
            assert c.sandbox("k").info().state == "RUNNING"
            assert c.sandbox("k").exec("echo again").stdout == "again\n"
    finally:
        sup.stop()
        launcher.remove_instance_containers("podman", engine_url("podman"), state)
        workspaces.unmount_all(state)  # /tmp tmpfs, layered workspaces
        shutil.rmtree(state, ignore_errors=True)
