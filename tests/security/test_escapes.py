"""Escape attempts, each run as a tool call inside a sandbox: every one must fail, and the
host must be unchanged. The container is the security boundary; these prove it holds."""

from __future__ import annotations

import socket
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.client import Sandbox, Stockade, ToolResult
from tests.integration.harness import PODMAN_SOCKET, Supervisor

pytestmark = pytest.mark.timeout(300)


def run(box: Sandbox, command: str) -> ToolResult:
    """The attempt, from a script the guard never reads: these tests prove that the container
    refuses it (the guard would stop `echo b > /proc/sysrq-trigger` first)."""
    box.write_file(".attempt.sh", command + "\n")
    result = box.exec("sh .attempt.sh", timeout=60)
    assert result.exit_code is not None, f"{command!r}: {result.error_code} {result.for_llm}"
    return result


def python(box: Sandbox, program: str) -> ToolResult:
    box.write_file("attempt.py", textwrap.dedent(program))
    return run(box, "python3 attempt.py")


SYSCALLS = """
    import ctypes, errno, os
    libc = ctypes.CDLL(None, use_errno=True)
    def attempt(name, *args):
        result = getattr(libc, name)(*args)
        code = ctypes.get_errno() if result == -1 else 0
        print(name, "denied" if result == -1 else "ALLOWED", errno.errorcode.get(code, code))
"""


NOT_ROOT = ("must be superuser", "must be root", "operation not permitted")
NO_NAMESPACES = ("operation not permitted", "function not implemented")
READ_ONLY = ("read-only file system", "directory nonexistent", "permission denied")


@pytest.mark.parametrize(
    ("command", "refusals"),
    [
        ("mount -t tmpfs none /tmp", NOT_ROOT),
        ("mount --bind /workspace /tmp", NOT_ROOT),
        ("unshare -m true", NO_NAMESPACES),
        ("unshare -n true", NO_NAMESPACES),
        ("unshare -p -f true", NO_NAMESPACES),
        ("chroot / true", NOT_ROOT),
        ("mknod /tmp/mem c 1 1", NOT_ROOT),
        ("mknod /workspace/sda b 8 0", NOT_ROOT),
        ("echo b > /proc/sysrq-trigger", READ_ONLY),
        ("echo 1 > /proc/sys/kernel/sysrq", READ_ONLY),
        ("echo 1 > /proc/sys/vm/drop_caches", READ_ONLY),
        ("echo 1 > /sys/kernel/mm/ksm/run", READ_ONLY),
        ("echo x > /sys/fs/cgroup/pids/pids.max || echo x > /sys/fs/cgroup/pids.max",
         READ_ONLY),
        ("touch /etc/passwd", READ_ONLY),
        ("hostname evil", NOT_ROOT),
        ("date -s 2000-01-01", NOT_ROOT),
    ],
)  # fmt: skip
def test_privileged_operations_fail(
    client: Stockade, key: str, command: str, refusals: tuple[str, ...]
) -> None:
    result = run(client.sandbox(key), command)
    assert result.exit_code != 0
    said = (result.stdout + result.stderr).lower()
    assert any(refusal in said for refusal in refusals), said


def test_privileged_syscalls_are_refused(client: Stockade, key: str) -> None:
    program = (
        SYSCALLS
        + """
    attempt("mount", b"none", b"/tmp", b"tmpfs", 0, None)
    attempt("umount2", b"/workspace", 2)
    attempt("chroot", b"/tmp")
    attempt("unshare", 0x00020000)  # CLONE_NEWNS
    attempt("unshare", 0x40000000)  # CLONE_NEWNET
    attempt("init_module", None, 0, b"")
    attempt("syscall", 313, -1, b"", 0)  # finit_module
    attempt("syscall", 246, 0, 0, 0)  # kexec_load
    attempt("reboot", 0x01234567)
    attempt("sethostname", b"evil", 4)
    attempt("setuid", 0)
    attempt("setgid", 0)
    attempt("syscall", 298, 0, 0, 0, 0, 0)  # perf_event_open
    attempt("syscall", 321, 0, 0, 0)  # bpf
    attempt("swapon", b"/workspace/x", 0)
    attempt("acct", b"/workspace/acct")
    attempt("iopl", 3)
    """
    )
    lines = python(client.sandbox(key), program).stdout.splitlines()
    assert len(lines) == 17, lines
    assert all(" denied " in line for line in lines), lines


def test_raw_and_packet_sockets_are_refused(client: Stockade, key: str) -> None:
    program = """
    import socket
    for family, kind, proto in (
        (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
        (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW),
        (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
        (socket.AF_PACKET, socket.SOCK_RAW, 0),
    ):
        try:
            socket.socket(family, kind, proto).close()
            print("ALLOWED")
        except PermissionError:
            print("denied")
    """
    assert python(client.sandbox(key), program).stdout == "denied\n" * 4


def test_the_agent_cannot_be_traced_or_read(client: Stockade, key: str) -> None:
    """The agent serves the supervisor: sandbox code may not attach to it, read its memory
    or take its open descriptors (it runs as the same uid, so this rests on it being
    non-dumpable)."""
    program = (
        SYSCALLS
        + """
    agent = next(
        int(pid) for pid in os.listdir("/proc") if pid.isdigit()
        and open(f"/proc/{pid}/cmdline", "rb").read()
        .startswith(b"python3\\0-P\\0-m\\0stockade.agent")
    )
    attempt("ptrace", 16, agent, None, None)  # PTRACE_ATTACH
    attempt("ptrace", 0x4206, agent, None, None)  # PTRACE_SEIZE
    for path in (f"/proc/{agent}/mem", f"/proc/{agent}/environ", f"/proc/{agent}/fd/0"):
        try:
            open(path, "rb").read(1)
            print(path, "ALLOWED")
        except OSError as exc:
            print(path, "denied", exc.errno)
    try:
        print("fd dir", "ALLOWED", os.listdir(f"/proc/{agent}/fd"))
    except OSError:
        print("fd dir", "denied")
    """
    )
    box = client.sandbox(key)
    lines = python(box, program).stdout.splitlines()
    assert len(lines) == 6, lines
    assert all("denied" in line for line in lines), lines
    assert box.exec("echo alive").stdout == "alive\n"


def test_no_setuid_or_setgid_file_and_none_would_help(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    found = run(box, "find / -xdev \\( -perm -4000 -o -perm -2000 \\) -type f 2>/dev/null")
    assert found.stdout == ""
    # even a set-uid binary could not raise privileges: no_new_privs holds for every process
    status = run(box, "grep NoNewPrivs /proc/1/status /proc/self/status").stdout
    assert status.count("NoNewPrivs:\t1") == 2
    box.write_file("become-root.sh", "su -c id root </dev/null\n")  # past the guard
    assert run(box, "sh become-root.sh").exit_code != 0


def test_user_namespaces_cannot_be_created(client: Stockade, key: str) -> None:
    """A user namespace would give the sandbox every capability inside it: a door to kernel
    attack surface (mounts, netfilter) that the container otherwise keeps closed."""
    result = run(client.sandbox(key), "unshare -U -r id")
    assert result.exit_code != 0
    assert "uid=0" not in result.stdout
    program = (
        SYSCALLS
        + """
    attempt("unshare", 0x10000000)  # CLONE_NEWUSER
    """
    )
    assert " denied " in python(client.sandbox(key), program).stdout


def test_descriptors_and_proc_links_lead_nowhere_outside(client: Stockade, key: str) -> None:
    """No process in the sandbox holds a directory outside the container's own mounts (the
    runc CVE-2024-21626 shape: a leaked host directory as cwd or /proc/self/fd/N)."""
    program = """
    import os
    mounted = set()
    for line in open("/proc/self/mountinfo"):
        point = line.split()[4].encode().decode("unicode_escape")
        try:
            mounted.add(os.stat(point).st_dev)
        except OSError:
            pass
    outside = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        links = [f"/proc/{pid}/cwd", f"/proc/{pid}/root"]
        try:
            links += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            pass
        for link in links:
            try:
                st = os.stat(link)
            except OSError:
                continue
            if st.st_mode & 0o170000 == 0o040000 and st.st_dev not in mounted:
                outside.append((link, os.readlink(link)))
    print(outside)
    for fd in range(3, 64):
        try:
            os.chdir(f"/proc/self/fd/{fd}")
            print("chdir", fd, os.getcwd())
        except OSError:
            pass
    """
    lines = python(client.sandbox(key), program).stdout.splitlines()
    assert lines[0] == "[]"
    for line in lines[1:]:  # the only directory descriptors are the script's own, inside
        assert line.split()[2].startswith("/"), line


def test_host_sockets_and_paths_are_not_reachable(
    supervisor: Supervisor, client: Stockade, key: str
) -> None:
    paths = [
        "/var/run/docker.sock", "/run/docker.sock", "/run/podman/podman.sock",
        str(PODMAN_SOCKET), str(supervisor.socket), str(supervisor.state_dir),
        "/run/containerd/containerd.sock", "/proc/1/root/var/run/docker.sock",
    ]  # fmt: skip
    program = f"""
    import os, socket
    for path in {paths!r}:
        print(path, "EXISTS" if os.path.lexists(path) else "absent")
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            print(path, "CONNECTED")
        except OSError:
            pass
    """
    lines = python(client.sandbox(key), program).stdout.splitlines()
    assert lines == [f"{p} absent" for p in paths]


@pytest.fixture
def host_listener() -> Iterator[tuple[int, list[object]]]:
    """A TCP listener on the host's loopback that records every connection it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            accepted.append(peer)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


def _host_addresses() -> list[str]:
    """This machine's own IPv4 addresses on bridges the engines made (never other hosts)."""
    found = []
    for name in ("docker0", "cni-podman0", "podman0"):
        if Path(f"/sys/class/net/{name}").exists():
            shown = subprocess.run(
                ["ip", "-4", "-o", "addr", "show", "dev", name], capture_output=True, text=True
            )
            out = shown.stdout.split()
            found += [word.split("/")[0] for word in out if word.count(".") == 3 and "/" in word]
    return found


def test_no_host_address_is_reachable_without_network(
    client: Stockade, key: str, host_listener: tuple[int, list[object]]
) -> None:
    port, accepted = host_listener
    targets = ["127.0.0.1", *_host_addresses()]
    program = f"""
    import socket
    for host in {targets!r}:
        for port in ({port}, 50051, 22, 80):
            try:
                socket.create_connection((host, port), timeout=2).close()
                print(host, port, "CONNECTED")
            except OSError as exc:
                print(host, port, "failed", exc.errno)
    try:
        socket.getaddrinfo("example.com", 80)
        print("dns ALLOWED")
    except OSError:
        print("dns failed")
    """
    lines = python(client.sandbox(key), program).stdout.splitlines()
    assert len(lines) == len(targets) * 4 + 1
    assert all("failed" in line for line in lines), lines
    assert accepted == []
