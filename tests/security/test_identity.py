"""What keeps a sandbox alive is out of the sandbox user's reach: tini (PID 1) and the agent
run as stockade-agent, tools as the sandbox user. Each attempt runs from a script the guard
never reads (the guard would stop `kill 1` first), on Podman and Docker; each must fail, the
sandbox must keep working, and the user's own processes must stay traceable (gdb, strace).
With the defaults, Podman gives each sandbox a range of ids of its own, and Docker (no
userns-remap here) runs it as an id of no host account."""

from __future__ import annotations

import json
import pwd
import textwrap
from pathlib import Path
from typing import Any

import pytest

from stockade.client import Sandbox, Stockade
from stockade.supervisor.config import AGENT_UID
from stockade.supervisor.keys import sandbox_id
from tests.integration.harness import SANDBOX_UID, Supervisor, engine_cli
from tests.security.test_escapes import python, run

pytestmark = pytest.mark.timeout(300)

PIDS = "AGENT=$(pgrep -U 65533 -f 'python3 -P -m stockade.agent' | grep -vx 1)"
"""The agent's pid (tini's command line names the agent too: PID 1 is left out)."""


def agent_pid(box: Sandbox) -> int:
    return int(run(box, f"{PIDS}; echo $AGENT").stdout.split()[0])


def ids_of(box: Sandbox, pid: int | str) -> dict[str, list[int]]:
    text = run(box, f"grep -E '^(Uid|Gid|CapEff|CapPrm|CapBnd|CapAmb):' /proc/{pid}/status")
    fields = dict(line.split(":", 1) for line in text.stdout.splitlines())
    return {
        name: [int(v, 16 if name.startswith("Cap") else 10) for v in value.split()]
        for name, value in fields.items()
    }


def state_of(box: Sandbox, pid: int) -> str:
    return run(box, f"cut -d' ' -f3 /proc/{pid}/stat").stdout.strip()


def test_tools_run_as_the_sandbox_user_and_the_agent_as_its_own(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    agent = agent_pid(box)
    tool = ids_of(box, "self")
    assert tool["Uid"] == tool["Gid"] == [SANDBOX_UID] * 4
    assert tool["CapEff"] == tool["CapPrm"] == tool["CapBnd"] == tool["CapAmb"] == [0]
    own = ids_of(box, agent)  # real, effective, saved, file system
    assert own["Uid"] == [AGENT_UID, SANDBOX_UID, AGENT_UID, SANDBOX_UID]
    assert own["Gid"] == [AGENT_UID, SANDBOX_UID, AGENT_UID, SANDBOX_UID]
    assert own["CapEff"] == own["CapPrm"] == own["CapBnd"] == own["CapAmb"] == [0]
    assert ids_of(box, 1)["Uid"] == [AGENT_UID] * 4
    # every other way a process starts: background processes, search's ripgrep, uploads
    started = box.call("process", {"action": "start", "command": "sleep 30"})
    assert not started.is_error, started.for_llm
    listed = run(box, "ps -o ruser=,user=,args= -u 65532 -U 65532 | grep 'sleep 30$'")
    assert listed.stdout.split()[:2] == ["sandbox", "sandbox"]
    box.write_file("hit.txt", "needle\n")
    assert [h["file"] for h in box.search("needle")] == ["hit.txt"]


@pytest.mark.parametrize(
    "attempt",
    [
        "kill -STOP 1",
        "kill -KILL 1",
        "kill -TERM 1",
        "kill -STOP $AGENT",
        "kill -KILL $AGENT",
        "kill -TERM $AGENT",
        "kill -HUP -1 2>&1; kill -0 $AGENT",  # everything the user may signal: not the agent
        "kill -STOP -$AGENT",  # the agent's process group
    ],
)
def test_signals_to_init_and_the_agent_are_refused(
    client: Stockade, key: str, attempt: str
) -> None:
    box = client.sandbox(key)
    box.exec("true")
    result = run(box, f"{PIDS}; {attempt}; echo rc=$?")
    if "kill -0" in attempt:
        assert "Operation not permitted" in result.stderr, result.for_llm
    assert "rc=1" in result.stdout, result.for_llm
    agent = agent_pid(box)
    assert state_of(box, 1) in ("S", "R")
    assert state_of(box, agent) in ("S", "R")
    assert box.exec("echo alive").stdout == "alive\n"


TRACE = """
    import ctypes, errno, os, subprocess, sys
    libc = ctypes.CDLL(None, use_errno=True)
    PTRACE_ATTACH, PTRACE_SEIZE, PTRACE_DETACH = 16, 0x4206, 17
    agent = int(sys.argv[1])
    for pid in (1, agent):
        for request in (PTRACE_ATTACH, PTRACE_SEIZE):
            result = libc.ptrace(request, pid, 0, 0)
            code = errno.errorcode.get(ctypes.get_errno(), "?") if result else "ALLOWED"
            print(pid, request, code)
            if not result:
                libc.ptrace(PTRACE_DETACH, pid, 0, 0)
        for name in ("mem", "environ", "cmdline", "maps", "fd", "cwd", "root", "syscall"):
            path = f"/proc/{pid}/{name}"
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    os.listdir(path)
                elif name in ("cwd", "root"):
                    os.listdir(path + "/")
                else:
                    with open(path, "rb") as file:
                        file.read(16)
                print(path, "READ")
            except OSError as exc:
                print(path, errno.errorcode.get(exc.errno, exc.errno))
"""


def test_ptrace_and_proc_of_init_and_the_agent_are_refused(client: Stockade, key: str) -> None:
    """The wedge a user found: attach to PID 1 and exit, leaving init stopped. Every ptrace
    request and every /proc file that gives memory, environment, descriptors or folders of
    init or the agent must be refused; cmdline stays world-readable (as for any process)."""
    box = client.sandbox(key)
    agent = agent_pid(box)
    box.write_file("trace.py", textwrap.dedent(TRACE))
    result = run(box, f"python3 trace.py {agent}")
    lines = result.stdout.splitlines()
    assert not [line for line in lines if "ALLOWED" in line], result.stdout
    readable = [line for line in lines if line.endswith(" READ")]
    assert readable == [f"/proc/{pid}/cmdline READ" for pid in (1, agent)], result.stdout
    for tool in ("strace -p 1 -e trace=none", f"strace -p {agent}", f"gdb -p {agent} -batch"):
        traced = run(box, f"timeout 20 {tool} 2>&1")
        assert "Operation not permitted" in traced.stdout, traced.stdout
    assert state_of(box, 1) in ("S", "R")
    assert box.exec("echo alive").stdout == "alive\n"


def test_the_users_own_processes_can_be_traced(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    script = (
        "sleep 60 & pid=$!\n"
        "timeout 20 strace -p $pid -e trace=none 2>&1 & sleep 1; kill $!\n"
        "timeout 60 gdb -p $pid -batch -ex 'info registers rip' 2>&1 | grep -c '^rip'\n"
        "kill $pid\n"
    )
    result = run(box, script)
    assert "strace: Process " in result.stdout, result.stdout
    assert " attached" in result.stdout, result.stdout
    assert result.stdout.strip().splitlines()[-1] == "1", result.stdout  # gdb read rip


def test_a_wedge_attempt_leaves_the_sandbox_usable(client: Stockade, key: str) -> None:
    """The reported route, end to end: a process that attaches to PID 1 and exits, then a
    crowd of orphans that only a working init reaps. Init refuses the attach, so it goes on
    reaping, and calls keep working without anyone destroying the sandbox."""
    box = client.sandbox(key)
    box.write_file("keep.txt", "kept\n")
    before = client.get_sandbox(key).container_id
    python(
        box,
        """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        print("attach", libc.ptrace(16, 1, 0, 0), ctypes.get_errno())
        """,
    )
    run(box, "for i in $(seq 100); do (sh -c 'exit 0' &); done; sleep 1")
    zombies = run(box, "ps -eo stat= | grep -c '^Z' || true").stdout.strip()
    assert int(zombies) == 0
    assert state_of(box, 1) in ("S", "R")
    for _ in range(3):
        assert box.exec("echo ok").stdout == "ok\n"
    assert box.read_file("keep.txt") == "kept\n"
    assert client.get_sandbox(key).container_id == before


# ---- whose ids the sandboxes have on the host


def _host_pid(engine: str, container: str) -> int:
    done = engine_cli(engine, "inspect", container)
    assert done.returncode == 0, done.stderr
    attrs: dict[str, Any] = json.loads(done.stdout)[0]
    return int(attrs["State"]["Pid"])


def _map(text: str) -> list[tuple[int, int, int]]:
    return [(int(a), int(b), int(c)) for a, b, c in (line.split() for line in text.splitlines())]


def test_default_ids_on_the_host(
    engine: str, supervisor: Supervisor, client: Stockade, key: str
) -> None:
    """Podman (the default makes a user namespace): two sandboxes get disjoint ranges, read
    from inside (/proc/self/uid_map) and from the host (/proc/PID/uid_map of the container's
    init); workspace files belong to the mapped ids. Docker (no userns-remap here): the ids
    are the host's, and neither the sandbox's nor the agent's is a host account."""
    boxes = [client.sandbox(key), client.sandbox(key + "-2")]
    inside, outside, owners = [], [], []
    for box in boxes:
        box.write_file("mine.txt", "x")
        inside.append(_map(run(box, "cat /proc/self/uid_map").stdout))
        pid = _host_pid(engine, client.get_sandbox(box.key).container_id)
        outside.append(_map(Path(f"/proc/{pid}/uid_map").read_text()))
        workspace = supervisor.state_dir / "sandboxes" / sandbox_id(box.key) / "workspace"
        owners.append((workspace / "mine.txt").stat().st_uid)
    assert inside == outside
    if engine == "podman":
        (a,), (b,) = inside
        assert a[0] == b[0] == 0
        assert a[2] == b[2] == 65536
        assert a[1] + 65536 <= b[1] or b[1] + 65536 <= a[1], inside  # disjoint
        assert owners == [a[1] + SANDBOX_UID, b[1] + SANDBOX_UID]
    else:
        assert inside == [[(0, 0, 4294967295)]] * 2
        assert owners == [SANDBOX_UID, SANDBOX_UID]
        for uid in (SANDBOX_UID, AGENT_UID):
            with pytest.raises(KeyError):
                pwd.getpwuid(uid)
    for box in boxes[1:]:
        client.destroy_sandbox(box.key, delete_workspace=True)
