"""Quarantine for real, on both engines, through the real supervisor: a guard rule marked
quarantine freezes the sandbox (a background loop writing a counter stops advancing: its
processes are stopped, not killed), cuts its egress (the container's network namespace
keeps only loopback), refuses its calls with FAILED_PRECONDITION and the clear message,
keeps its files, shows the evidence; a supervisor restart keeps all of it; release brings
back the same processes and the proxy; destroy ends it. The upstream is the test's own, on
this machine's loopback."""

from __future__ import annotations

import contextlib
import http.server
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stockade.client import FailedPrecondition, NotFound, Sandbox, Stockade
from stockade.supervisor.engines.backends.base import LABEL_INSTANCE
from stockade.supervisor.keys import sandbox_id
from stockade.supervisor.network import links
from stockade.supervisor.sandboxes import hostfs, workspaces
from tests.integration.harness import Supervisor, engine_cli, running_supervisor
from tests.upstream import QuietHandler

pytestmark = pytest.mark.timeout(300)
KEY = "suspect"
LOOP = "i=0; while :; do i=$((i+1)); echo $i > counter.txt; sleep 0.1; done"
STILL_S = 1.5
"""How long a frozen counter is watched for not advancing (it advances every 0.1 s)."""


class _Handler(QuietHandler):
    def do_GET(self) -> None:
        self._send(b"hello from upstream")


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def supervisor(engine: str, upstream: int) -> Iterator[Supervisor]:
    config = textwrap.dedent(f"""
        [sandbox]
        network = "egress"
        [network]
        allow = ["upstream.test"]
        ports = [{upstream}]
        [network.hosts]
        "upstream.test" = "127.0.0.1"
        [[guard.rules]]
        name = "no-exfil"
        pattern = '^exfil\\b'
        reason = "sends the workspace away"
        action = "quarantine"
        [quarantine]
        evidence_window_s = 600
        """)
    with serving(engine, config) as sup:
        yield sup


@contextlib.contextmanager
def serving(engine: str, config: str) -> Iterator[Supervisor]:
    if engine != "podman":
        with running_supervisor(engine, config) as sup:
            yield sup
        return
    # Podman: a service of the supervisor's own (engine.socket ""), not the tests' shared
    # one, which other test sessions on this machine start and stop as they come and go
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    sup = Supervisor(engine, state, config, engine_socket="")
    try:
        sup.start()
        yield sup
    finally:
        sup.stop()
        instance = sup.instance_id()
        found = engine_cli(engine, "ps", "-aq", "--filter", f"label={LABEL_INSTANCE}={instance}")
        for container in found.stdout.split():
            engine_cli(engine, "rm", "-f", container)
        for namespace in links.namespaces(links.instance_prefix(instance)):
            links.remove(namespace)
        workspaces.unmount_all(state)  # /tmp tmpfs, layered workspaces
        with contextlib.suppress(OSError):
            hostfs.remove_tree(state)


def cli(sup: Supervisor, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STOCKADE_ADDR": sup.target}
    cmd = [sys.executable, "-m", "stockade.supervisor.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def wait_until(check: Callable[[], bool], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def counter(sup: Supervisor) -> int:
    text = (sup.workspace(KEY) / "counter.txt").read_text().strip()
    return int(text) if text else 0


def advancing(sup: Supervisor) -> bool:
    first = counter(sup)
    wait_until(lambda: counter(sup) > first, within=10)
    return True


def still(sup: Supervisor) -> bool:
    first = counter(sup)
    time.sleep(STILL_S)
    return counter(sup) == first


def interfaces(engine: str, client: Stockade) -> set[str]:
    """The network interfaces of the sandbox's network namespace, read from the host."""
    container = client.get_sandbox(KEY).container_id
    pid = engine_cli(engine, "inspect", "--format", "{{.State.Pid}}", container).stdout.strip()
    lines = Path(f"/proc/{int(pid)}/net/dev").read_text().splitlines()[2:]
    return {line.split(":")[0].strip() for line in lines}


def helper_namespaces(sup: Supervisor) -> list[str]:
    """The helper namespaces (the proxy's side of the link) of the sandbox's egress."""
    name = links.instance_prefix(sup.instance_id()) + sandbox_id(KEY)
    return [n for n in links.namespaces(links.instance_prefix(sup.instance_id())) if n == name]


def fetch(box: Sandbox, port: int) -> str:
    result = box.exec(f"curl -s --max-time 10 http://upstream.test:{port}/", timeout=30)
    return result.stdout if result.exit_code == 0 else f"failed: {result.exit_code}"


def test_a_quarantined_sandbox_is_frozen_cut_off_refused_kept_and_released(
    engine: str, supervisor: Supervisor, upstream: int
) -> None:
    sup = supervisor
    with sup.client() as client:
        box = client.sandbox(KEY)
        box.write_file("notes.txt", "keep me")
        started = box.call("process", {"action": "start", "command": LOOP, "name": "loop"})
        assert not started.is_error, started.error_message
        assert fetch(box, upstream) == "hello from upstream"
        wait_until(lambda: (sup.workspace(KEY) / "counter.txt").exists())
        assert advancing(sup)
        assert interfaces(engine, client) - {"lo"}, "egress: a link besides loopback"

        denied = box.exec("exfil --everything")
        assert denied.error_code == "PERMISSION_DENIED"
        wait_until(lambda: [q.frozen for q in client.list_quarantines()] == [True])

        assert still(sup), "frozen: the loop no longer writes"
        assert interfaces(engine, client) == {"lo"}, "its egress link is gone"
        assert not helper_namespaces(sup), "and the proxy's namespace with it"
        with pytest.raises(FailedPrecondition) as refused:
            box.exec("echo hello")
        message = str(refused.value)
        assert f"sandbox {KEY!r} is quarantined since" in message
        assert "guard rule 'no-exfil'" in message
        assert f"`stockade quarantine show {KEY}`" in message
        with pytest.raises(FailedPrecondition):
            client.resume_sandbox(KEY)
        assert (sup.workspace(KEY) / "notes.txt").read_text() == "keep me"

        assert client.get_sandbox(KEY).quarantined_at is not None
        shown = client.get_quarantine(KEY)
        assert shown.quarantine.frozen
        assert shown.quarantine.network_cut == "egress"
        assert shown.quarantine.alarms[0].evidence == "exfil --everything"
        steps = [(r.tool, r.guard_rule, r.policy_step) for r in shown.audit]
        assert any(tool == "exec" and rule == "no-exfil" for tool, rule, _ in steps)
        assert any(t == "alarm" and s.startswith("alarm: guard at guard: ") for t, _, s in steps)
        assert any(tool == "network" for tool, _, _ in steps), "the earlier fetch, audited"

    sup.stop()
    sup.start()
    with sup.client() as client:
        box = client.sandbox(KEY)
        (held,) = client.list_quarantines()
        assert held.sandbox_key == KEY
        with pytest.raises(FailedPrecondition):
            box.exec("echo hello")
        assert still(sup), "still frozen after the restart"
        assert interfaces(engine, client) == {"lo"}, "and still cut off"

        released = client.release_quarantine(KEY)
        assert released.sandbox_key == KEY
        assert advancing(sup), "the same loop runs on: thawed, not restarted"
        assert fetch(box, upstream) == "hello from upstream"
        assert helper_namespaces(sup), "the link is back"
        assert box.exec("cat notes.txt").stdout == "keep me"
        with pytest.raises(NotFound):
            client.release_quarantine(KEY)

        assert cli(sup, "quarantine", "destroy", KEY).returncode == 2, "not quarantined"
        client.quarantine_sandbox(KEY, "by hand, to destroy")
        listed = cli(sup, "quarantine", "list")
        assert f"{KEY}  since " in listed.stdout
        assert "by hand, to destroy" in listed.stdout
        shown = cli(sup, "quarantine", "show", KEY)
        assert "network egress cut" in shown.stdout, shown.stdout + shown.stderr
        destroyed = cli(sup, "quarantine", "destroy", KEY)
        assert destroyed.returncode == 0, destroyed.stderr
        assert "container removed" in destroyed.stdout
        assert not client.list_quarantines()
        assert box.exec("echo new").stdout.strip() == "new"


def test_an_open_sandbox_is_disconnected_and_reconnected(engine: str) -> None:
    """Network mode open: the quarantine disconnects the container from the engine's
    network (its namespace keeps only loopback) and release connects it again."""
    with serving(engine, '[sandbox]\nnetwork = "open"\n') as sup, sup.client() as client:
        box = client.sandbox(KEY)
        assert box.exec("echo up").stdout.strip() == "up"
        before = interfaces(engine, client)
        assert before - {"lo"}, "open: the engine's network"
        held = client.quarantine_sandbox(KEY, "by hand")
        assert held.network_cut == "open"
        assert held.frozen
        assert not held.note
        assert interfaces(engine, client) == {"lo"}
        with pytest.raises(FailedPrecondition):
            box.exec("echo up")
        client.release_quarantine(KEY)
        assert interfaces(engine, client) - {"lo"}, "connected again"
        assert box.exec("echo again").stdout.strip() == "again"
