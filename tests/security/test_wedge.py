"""Sandbox code trying to make its own sandbox unusable for good (docs/operations.md,
"Wedge routes").

Each attack runs as a tool call inside a sandbox, on both engines. Whatever the attack call
itself returns, afterwards the sandbox must never have been wedged or have been healed by the
supervisor: the next call succeeds, the workspace is intact, and nobody destroyed the
sandbox (when its container changed, the supervisor recorded a heal). These hold whether or
not sandbox code can reach init and the agent at all (they run as another user there).

The heals themselves are proven by faults injected from the host as root, which no change
inside the container can forbid: init or the agent stopped through their host pid, the pids
cgroup filled with processes the agent cannot end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.client import Sandbox, SandboxInfo, Stockade, ToolResult
from tests.integration.harness import (
    NO_RATE_LIMIT,
    Supervisor,
    engine_cli,
    inspected,
    running_supervisor,
)

pytestmark = pytest.mark.timeout(300)
CONFIG = (
    """
[sandbox]
pids = 128
memory_mb = 256
workspace_size_mb = 64
tmp_size_mb = 16
tmp_inodes = 4096
max_file_size_mb = 32
[guard]
enabled = false
"""
    + NO_RATE_LIMIT
)
PRECIOUS = "precious work\n"
AGENT = (
    "agent=; for s in /proc/[0-9]*/stat; do read -r l < $s || continue; set -- $l; "
    '[ "$4" = 1 ] && [ "$2" = "(python3)" ] && agent=$1; done; echo "agent=$agent"; '
)
"""Shell: $agent is the agent's pid (the python3 child of init), printed as agent=PID."""
PTRACE = (
    "python3 -c 'import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
    'print("ptrace", libc.ptrace(16, int(sys.argv[1]), 0, 0), ctypes.get_errno())\''
)
"""Shell: PTRACE_ATTACH to the pid given, then exit at once (the tracee stays stopped)."""
ORPHANS = (
    "i=0; while [ $i -lt 300 ]; do (sleep 0 &) 2>/dev/null; i=$((i+1)); done; echo orphans made; "
)
"""Shell: 300 orphans, reparented to init: zombies for good when init reaps no more."""
HOLD_ZOMBIES = (
    "setsid sh -c 'i=0; while [ $i -lt 300 ]; do sleep 0 & i=$((i+1)); done 2>/dev/null; "
    "exec sleep 600' & sleep 3; "
)
"""Shell: a stray that fills the pids limit with children it never reaps."""

ROUTES = {
    # init (PID 1, tini)
    "ptrace_init_and_exit": f"{PTRACE} 1; sleep 0.5; grep State /proc/1/status; {ORPHANS}",
    "sigstop_init": f"kill -STOP 1; grep State /proc/1/status; {ORPHANS}",
    "sigkill_init": "kill -KILL 1; sleep 1; echo still here",
    "sigterm_init": "kill -TERM 1; sleep 5; echo still here",
    # the agent
    "sigkill_agent": f"{AGENT} kill -KILL $agent; sleep 2",
    "sigstop_agent": f"{AGENT} kill -STOP $agent; sleep 2",
    "sigstop_every_process": f"{AGENT} kill -STOP -1",
    "ptrace_agent": f"{AGENT} {PTRACE} $agent; sleep 0.5",
    "read_agent_memory": f"{AGENT} head -c 64 /proc/$agent/mem; head -c 64 /proc/$agent/environ",
    "agent_fds": f"{AGENT} ls /proc/$agent/fd; : > /proc/$agent/fd/0",
    "prlimit_agent_nofile": f"{AGENT} prlimit --pid $agent --nofile=4:4",
    "prlimit_agent_nproc": f"{AGENT} prlimit --pid $agent --nproc=1:1",
    "prlimit_agent_cpu": f"{AGENT} prlimit --pid $agent --cpu=1:1; sleep 3",
    "prlimit_agent_memory": f"{AGENT} prlimit --pid $agent --as=50000000:50000000",
    "renice_and_ionice_agent": f"{AGENT} renice -n 19 -p $agent; ionice -c 3 -p $agent",
    # the agent's socket
    "replace_agent_socket": (
        "S=/run/stockade/agent.sock.frames; rm -f $S; mv $S /tmp/x; ln -sf /tmp/x $S; "
        "ln -sf /tmp/x /run/stockade/agent.sock; ls -la /run/stockade"
    ),
    # pids
    "zombies_held_by_a_stray": HOLD_ZOMBIES,
    "setsid_sleepers_fill_pids": (
        "i=0; while [ $i -lt 300 ]; do setsid sleep 600 & i=$((i+1)); done 2>/dev/null; sleep 1"
    ),
    "fork_bomb": "timeout 10 sh -c 'f() { f | f & }; f' 2>/dev/null; sleep 10",
    "detached_fork_bomb": "setsid sh -c 'f() { f | f & }; f' 2>/dev/null & sleep 5",
    # memory
    "memory_bomb": "python3 -c 'b = b\"x\" * (1 << 30)'",
    "detached_memory_hogs": (
        'for i in 1 2 3; do setsid python3 -c \'b = b"x" * (100 << 20); import time; '
        "time.sleep(600)' & done; sleep 5"
    ),
    # disk and inodes
    "fill_workspace_bytes": "dd if=/dev/zero of=fill bs=1M count=100 2>&1 | tail -1",
    "fill_workspace_inodes": "mkdir many && cd many && i=0; while : > f$i; do i=$((i+1)); done",
    "fill_tmp_bytes": "dd if=/dev/zero of=/tmp/fill bs=1M count=100 2>&1 | tail -1",
    "fill_tmp_inodes": "mkdir /tmp/many && cd /tmp/many && i=0; while : > f$i; do i=$((i+1)); done",
    # file descriptors, permissions, busy files
    "exhaust_own_fds": "python3 -c 'fs = [open(\"/dev/null\") for _ in range(100000)]'",
    "chmod_000_workspace": "chmod 000 /workspace; chmod 000 /tmp; ls /workspace",
    "chown_workspace": "chown 0:0 /workspace /workspace/keep.txt; chmod 000 keep.txt",
    "remove_workspace_root": (
        "cd /; rmdir /workspace; rm -d /workspace; ln -sfn /tmp /workspace; "
        "touch /workspace.new; ls -ld /workspace"
    ),
    "hold_workspace_busy": (
        "setsid sh -c 'cd /workspace && exec sleep 600' < keep.txt > /dev/null 2>&1 & "
        "setsid flock keep.txt sleep 600 > /dev/null 2>&1 & sleep 1"
    ),
    "hold_output_pipes_open": "setsid sleep 600 & head -c 50000000 /dev/zero",
    "setrlimit_own_shell": "ulimit -n 3; ulimit -u 1; ulimit -v 1000; echo limited",
    # cgroups
    "cgroup_freeze": (
        "echo 1 > /sys/fs/cgroup/cgroup.freeze; echo FROZEN > /sys/fs/cgroup/freezer/freezer.state;"
        " echo 1 > /sys/fs/cgroup/pids.max; echo 1 > /sys/fs/cgroup/memory.max; echo tried"
    ),
}
RECOVERY = (
    "chmod 755 /workspace /tmp 2>/dev/null; chmod 644 keep.txt 2>/dev/null; "
    "rm -rf fill many /tmp/fill /tmp/many; cat keep.txt"
)
"""The next call: what a user whose code did the attack would run (each undoes only what the
sandbox user may undo) and the check that the workspace is intact."""


@pytest.fixture(scope="module")
def supervisor(engine: str) -> Iterator[Supervisor]:
    """Overrides the shared one: small pids, memory and disk limits, no rate limit, and no
    shell-command guard (it is no boundary: the attacks must reach the sandbox)."""
    with running_supervisor(engine, extra_config=CONFIG) as sup:
        yield sup


def prepared(client: Stockade, key: str) -> tuple[Sandbox, SandboxInfo]:
    box = client.sandbox(key)
    box.write_file("keep.txt", PRECIOUS)
    return box, box.info()


def assert_serves(box: Sandbox, before: SandboxInfo, command: str = "cat keep.txt") -> SandboxInfo:
    """The next call succeeds with the workspace intact; a new container means a recorded
    heal (no one else re-created it: the tests never destroy a sandbox). A wedge that no call
    met yet but GetSandbox's probe finds (the agent's CPU limit lowered) shows as BROKEN with
    its reason, and the call after heals it."""
    result = box.exec(command, timeout=60)
    assert result.exit_code == 0, f"{result.error_code} {result.for_llm} {result.data}"
    assert result.stdout.endswith(PRECIOUS)
    info = box.info()
    if info.state == "BROKEN":  # GetSandbox's probe found a wedge the call did not meet yet
        assert info.trouble, "BROKEN without a reason"
        assert box.exec("cat keep.txt", timeout=60).stdout == PRECIOUS
        info = box.info()
    assert info.state == "RUNNING", info
    if info.container_id != before.container_id:
        assert info.heals > before.heals, "the container changed without a heal"
        assert info.last_heal_reason
        assert info.last_healed_at is not None
    return info


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_attack_from_inside_never_wedges_for_good(client: Stockade, key: str, route: str) -> None:
    box, before = prepared(client, key)
    attack = box.exec(ROUTES[route], timeout=30)
    if attack.exit_code is not None and "$agent" in ROUTES[route]:
        assert "agent=" in attack.stdout, attack.stdout
        assert "agent=\n" not in attack.stdout, "the agent's pid was not found"
    after = assert_serves(box, before, RECOVERY)
    assert box.exec("echo again", timeout=60).stdout == "again\n"
    healed = after.container_id != before.container_id
    print(f"outcome {route}: {'healed: ' + after.last_heal_reason if healed else 'never wedged'}")


# Faults injected from the host, as root: what the supervisor must notice and heal.


CAP_SYS_RESOURCE = 24


def host_capable(cap: int) -> bool:
    """Whether this test process has the capability (some hosts withhold a few from root)."""
    status = Path("/proc/self/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("CapEff:"))
    return bool(int(line.split()[1], 16) >> cap & 1)


def agent_pid_inside(host_pid: int) -> str:
    """The agent's pid in the container's pid namespace (the last NSpid)."""
    status = Path(f"/proc/{host_pid}/status").read_text()
    return next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[-1]


def host_pids(engine: str, container_id: str) -> tuple[int, int]:
    """(init, agent): their pids on the host."""
    info = inspected(engine, container_id)
    assert info.pid
    children = Path(f"/proc/{info.pid}/task/{info.pid}/children").read_text().split()
    assert len(children) == 1, f"init has children {children}"
    return info.pid, int(children[0])


def wait_broken(client: Stockade, key: str) -> SandboxInfo:
    """GetSandbox probes the sandbox: it must report it BROKEN, with the reason."""
    deadline = time.monotonic() + 60
    while (info := client.sandbox(key).info()).state != "BROKEN":
        assert time.monotonic() < deadline, f"never noticed: {info}"
        time.sleep(0.5)
    return info


def wait_state(pid: int, state: str) -> None:
    """Until the host's /proc shows the process in `state` (a signal is delivered later)."""
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != state:
        assert time.monotonic() < deadline, f"pid {pid} never reached state {state}"
        time.sleep(0.05)


@pytest.mark.skipif(os.geteuid() != 0, reason="signals a container's processes from the host")
def test_init_stopped_from_the_host_is_healed(client: Stockade, key: str) -> None:
    box, before = prepared(client, key)
    init, _agent = host_pids(client_engine(client, key), before.container_id)
    os.kill(init, signal.SIGSTOP)
    wait_state(init, "T")
    broken = wait_broken(client, key)
    assert broken.trouble.startswith("init_stopped:"), broken.trouble
    after = assert_serves(box, before)
    assert after.container_id != before.container_id
    assert after.last_heal_reason.startswith("init_stopped:")


@pytest.mark.skipif(os.geteuid() != 0, reason="signals a container's processes from the host")
def test_init_stopped_and_zombies_at_the_pids_limit_heal_the_same_call(
    client: Stockade, key: str
) -> None:
    """The issue's route: init stopped, orphans fill the pids limit as zombies; the call that
    cannot start its command finds the sandbox wedged, and runs again on a new container."""
    box, before = prepared(client, key)
    init, _agent = host_pids(client_engine(client, key), before.container_id)
    os.kill(init, signal.SIGSTOP)
    box.exec(ORPHANS, timeout=60)
    after = assert_serves(box, before)
    assert after.container_id != before.container_id
    assert after.last_heal_reason.startswith("init_stopped:"), after.last_heal_reason


@pytest.mark.skipif(os.geteuid() != 0, reason="signals a container's processes from the host")
def test_agent_stopped_from_the_host_is_healed(client: Stockade, key: str) -> None:
    box, before = prepared(client, key)
    _init, agent = host_pids(client_engine(client, key), before.container_id)
    os.kill(agent, signal.SIGSTOP)
    broken = wait_broken(client, key)
    assert broken.trouble.startswith("agent_unresponsive:"), broken.trouble
    after = assert_serves(box, before)
    assert after.last_heal_reason.startswith("agent_unresponsive:")


@pytest.mark.skipif(os.geteuid() != 0, reason="signals a container's processes from the host")
def test_a_call_to_an_agent_stopped_from_the_host_ends_and_the_next_heals(
    client: Stockade, key: str
) -> None:
    box, before = prepared(client, key)
    _init, agent = host_pids(client_engine(client, key), before.container_id)
    os.kill(agent, signal.SIGSTOP)
    began = time.monotonic()
    stuck = box.exec("echo never", timeout=2)
    assert stuck.error_code == "SANDBOX_LOST", stuck.for_llm  # by its deadline or the sweep
    assert time.monotonic() - began < 60
    after = assert_serves(box, before)
    assert after.last_heal_reason.startswith("agent_unresponsive:")


FILL_PIDS_AS_ROOT = "while :; do sleep 600 & done 2>/dev/null"
"""Root's shell (the engine's exec) takes every pid, and each one freed at once: bounded by
the sandbox's CPU and pids limits, ended with its container by the heal."""


def test_pids_held_by_processes_the_agent_cannot_end_are_healed(
    supervisor: Supervisor, client: Stockade, key: str
) -> None:
    """Root's processes fill the pids cgroup: the agent's sweep cannot end them. A command
    that cannot start runs again on a new container; one whose shell got a freed pid but
    could not fork fails, and the sandbox is marked for the next call."""
    box, before = prepared(client, key)
    fill = ("exec", "-d", "-u", "0", before.container_id, "sh", "-c", FILL_PIDS_AS_ROOT)
    done = engine_cli(supervisor.engine, *fill)
    assert done.returncode == 0, done.stderr
    time.sleep(3)
    first = box.exec("cat keep.txt", timeout=60)
    if first.exit_code != 0:
        assert "Cannot fork" in first.stderr, first.for_llm
        marked = client.get_sandbox(key)
        assert marked.trouble.startswith("pids_exhausted:"), marked
    after = assert_serves(box, before)
    assert after.container_id != before.container_id
    assert after.last_heal_reason.startswith("pids_exhausted:"), after.last_heal_reason


@pytest.mark.parametrize("streamed", [False, True])
def test_a_call_that_cannot_start_runs_again_on_the_new_container(
    supervisor: Supervisor, client: Stockade, key: str, streamed: bool
) -> None:
    """The agent's open-files limit lowered from the host (nothing inside may: the agent's
    ids are not the sandbox user's, and the container has no CAP_SYS_RESOURCE): no pipe for
    a command, so it never starts; the same call, streamed or not, runs on the re-created
    container."""
    box, before = prepared(client, key)
    _init, agent = host_pids(supervisor.engine, before.container_id)
    inside = box.exec(f"prlimit --pid {agent_pid_inside(agent)} --nofile=4:4", timeout=30)
    assert inside.exit_code != 0, "the sandbox user lowered the agent's limits"
    own_userns = (
        Path(f"/proc/{agent}/ns/user").stat().st_ino != Path("/proc/self/ns/user").stat().st_ino
    )
    if not (own_userns or host_capable(CAP_SYS_RESOURCE)):
        pytest.skip(
            "prlimit of another user's process needs CAP_SYS_RESOURCE, which this host lacks"
        )
    done = subprocess.run(
        ["prlimit", "--pid", str(agent), "--nofile=4:4"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    arguments = {"command": "cat keep.txt", "timeout": 60}
    if streamed:
        result = list(client.call_stream(key, "exec", arguments))[-1]
    else:
        result = client.call(key, "exec", arguments)
    assert isinstance(result, ToolResult)
    assert result.exit_code == 0, result.for_llm
    assert result.stdout == PRECIOUS
    info = box.info()
    assert info.container_id != before.container_id
    assert info.last_heal_reason.startswith("agent_limits_lowered:"), info.last_heal_reason


def test_heals_are_audited_and_counted(supervisor: Supervisor, client: Stockade, key: str) -> None:
    box, before = prepared(client, key)
    init, _agent = host_pids(supervisor.engine, before.container_id)
    os.kill(init, signal.SIGTERM)  # from the host: tini passes it on, the container exits
    time.sleep(2)
    assert_serves(box, before)
    deadline = time.monotonic() + 10  # the audit log is written in batches
    while not (heals := audit_heals(client, key)):
        assert time.monotonic() < deadline, "no audit record of the heal"
        time.sleep(0.1)
    assert heals[0].startswith("housekeeping: heal: container_exited:"), heals


def audit_heals(client: Stockade, key: str) -> list[str]:
    records = client.list_audit(sandbox_key=key, tool="housekeeping")
    return [r.policy_step for r in records if r.policy_step.startswith("housekeeping: heal:")]


def client_engine(client: Stockade, key: str) -> str:
    return client.sandbox(key).info().engine
