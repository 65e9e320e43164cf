"""Sandboxes under gVisor (sandbox.runtime = runsc), skipped where runsc is not installed.

Docker: a private dockerd with runsc registered in its own daemon.json (the shared dockerd's
config is left alone), with --host-uds=create (the agent's socket, made inside the sandbox on
a bind mount, must answer on the host) and --network=none (runsc's netstack refuses the
namespace the engine gives it). Podman: the supervisor starts its own service with --runtime
(Podman 4.3's API ignores a container's runtime) and adds those flags itself.

The basic escape attempts of test_escapes.py run here again, under gVisor."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.client import Stockade
from stockade.supervisor.cli import launcher
from stockade.supervisor.engines.services import RUNSC_FLAGS
from stockade.supervisor.sandboxes import hostfs, workspaces
from tests.integration.harness import SANDBOX_UID, PrivateEngine, Supervisor, engine_url
from tests.security.test_escapes import (
    run,
    test_privileged_operations_fail,
    test_privileged_syscalls_are_refused,
    test_raw_and_packet_sockets_are_refused,
    test_user_namespaces_cannot_be_created,
)

pytestmark = pytest.mark.timeout(600)
RUNSC = shutil.which("runsc") or "/usr/bin/runsc"
RUNSC_ARGS = [f"--{flag}" for flag in RUNSC_FLAGS]

__all__ = [
    "test_privileged_operations_fail",
    "test_privileged_syscalls_are_refused",
    "test_raw_and_packet_sockets_are_refused",
    "test_user_namespaces_cannot_be_created",
]


@pytest.fixture(scope="module")
def supervisor(engine: str) -> Iterator[Supervisor]:
    """Overrides the shared one: a supervisor whose sandboxes run under runsc."""
    if not os.access(RUNSC, os.X_OK):
        pytest.skip("gVisor's runsc is not installed (apt-get install runsc)")
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    own: PrivateEngine | None = None
    if engine == "docker":
        runtimes: dict[str, dict[str, object]] = {
            "runsc": {"path": RUNSC, "runtimeArgs": RUNSC_ARGS}
        }
        root = Path(tempfile.mkdtemp(prefix="stke", dir="/tmp"))
        own = PrivateEngine(engine, root, runtimes=runtimes)
        own.start()
        sup = Supervisor(engine, state, '[sandbox]\nruntime = "runsc"\n', engine_socket=own.url)
    else:  # the supervisor's own Podman service, over the shared storage
        sup = Supervisor(engine, state, f'[sandbox]\nruntime = "{RUNSC}"\n', engine_socket="")
    try:
        sup.start()
        yield sup
    finally:
        sup.stop()
        url = own.url if own is not None else engine_url("podman")
        launcher.remove_instance_containers(engine, url, state)
        workspaces.unmount_all(state)
        with contextlib.suppress(OSError):
            hostfs.remove_tree(state)
        if own is not None:
            own.close()


def test_the_sandbox_runs_under_gvisor(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    kernel = run(box, "uname -r; dmesg")
    assert kernel.exit_code == 0, kernel.stderr
    release, *log = kernel.stdout.splitlines()
    assert release != os.uname().release, "not the host's kernel"
    assert any("Starting gVisor" in line for line in log), log
    assert run(box, "id -u").stdout == f"{SANDBOX_UID}\n"


def test_the_isolation_report_names_runsc_and_no_runc_verdict(
    engine: str, client: Stockade, key: str
) -> None:
    run(client.sandbox(key), "true")
    report = client.inspect_isolation(key).to_dict()
    expected = "runsc" if engine == "docker" else RUNSC
    assert report["outside"]["runtime"] == expected
    runtime = report["runtime"]
    assert runtime["name"] == expected
    assert runtime["path"] == RUNSC
    assert runtime["cves"], "each runc CVE is listed..."
    assert {c["verdict"] for c in runtime["cves"]} == {"NOT_APPLICABLE"}, "...as not runc's"


def test_workspace_tmp_and_caps_hold(supervisor: Supervisor, client: Stockade, key: str) -> None:
    """The bind-mounted workspace reaches the host; /tmp keeps its size and inode caps."""
    box = client.sandbox(key)
    box.write_file("from-inside.txt", "hello host")
    assert (supervisor.workspace(key) / "from-inside.txt").read_text() == "hello host"
    assert int(run(box, "df -k --output=size /tmp | tail -1").stdout) == 64 * 1024
    assert run(box, "df --output=itotal /tmp | tail -1").stdout.strip() == "65536"
    assert run(box, "touch /not-here").exit_code != 0, "the root stays read-only"
