"""The whole path of a call, for real: client -> gRPC -> supervisor -> engine -> agent."""

from __future__ import annotations

import json
import re
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from stockade.client import AsyncStockade, NotFound, Stockade, ToolError
from tests.integration.harness import SANDBOX_UID, Supervisor, backend

pytestmark = pytest.mark.timeout(300)


def test_exec_runs_in_the_container(client: Stockade, key: str) -> None:
    result = client.sandbox(key).exec("uname -a; id -u; hostname; pwd")
    assert not result.is_error, result.error_message
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Linux sandbox ")
    assert lines[1] == str(SANDBOX_UID)
    assert lines[2] == "sandbox"
    assert lines[3] == "/workspace"
    assert result.exit_code == 0
    assert result.for_llm.startswith("Linux sandbox")


def test_nonzero_exit_is_a_tool_error(client: Stockade, key: str) -> None:
    result = client.sandbox(key).exec("echo out; echo err >&2; exit 3")
    assert result.is_error
    assert result.error_code == "EXECUTION_FAILED"
    assert result.exit_code == 3
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert "[exit code 3]" in result.for_llm


def test_same_key_same_container_and_files(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    box.write_file("notes/a.txt", "hello\nworld\n")
    first = box.info()
    assert box.read_file("notes/a.txt") == "hello\nworld\n"
    assert box.exec("cat notes/a.txt").stdout == "hello\nworld\n"
    assert box.info().container_id == first.container_id
    assert first.state == "RUNNING"


def test_keys_cannot_see_each_other(client: Stockade, key: str) -> None:
    a, b = client.sandbox(key + "-a"), client.sandbox(key + "-b")
    a.write_file("secret.txt", "only-for-a")
    assert b.exec("ls -A /workspace").stdout == ""
    found = b.exec("grep -rl only-for-a / 2>/dev/null | head -5; true")
    assert "secret.txt" not in found.stdout
    assert a.info().container_id != b.info().container_id
    assert a.info().workspace_path != b.info().workspace_path


def status_fields(client: Stockade, key: str) -> dict[str, str]:
    status = client.sandbox(key).exec("cat /proc/self/status").stdout
    return dict(re.findall(r"^(\w+):\s+(\S+)", status, re.M))


def test_hardening_inside_the_sandbox(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    fields = status_fields(client, key)
    assert box.exec("id -u").stdout == f"{SANDBOX_UID}\n"
    assert int(fields["CapEff"], 16) == 0
    assert int(fields["CapPrm"], 16) == 0
    assert int(fields["CapBnd"], 16) == 0
    assert fields["NoNewPrivs"] == "1"
    assert fields["Seccomp"] == "2"
    root = box.exec("touch /rootfs-write")
    assert root.exit_code == 1
    assert "Read-only file system" in root.stderr
    assert box.exec("ls /sys/class/net").stdout.split() == ["lo"]
    assert box.exec("grep -c . /proc/net/route").stdout == "1\n"  # the header: no routes


def test_limits_apply(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    memory = box.exec(
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null"
        " || cat /sys/fs/cgroup/memory.max"
    )
    assert memory.stdout == f"{512 * 1024 * 1024}\n"
    pids = box.exec("cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max")
    assert pids.stdout == "256\n"
    assert box.exec("ulimit -n").stdout == "1024\n"
    tmp = box.exec("df -k --output=size /tmp | tail -1").stdout
    assert int(tmp) == 64 * 1024
    assert box.exec("echo x > /tmp/ok && cat /tmp/ok").stdout == "x\n"
    quota, period = box.exec(
        "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us"
        " 2>/dev/null || cat /sys/fs/cgroup/cpu.max"
    ).stdout.split()
    assert quota == period, "one CPU by default"


def test_list_glob_search_edit(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    box.write_file("src/app.py", "def main():\n    return 41\n")
    box.write_file("src/util.py", "X = 1\n")
    box.edit_file("src/app.py", "return 41", "return 42")
    assert "return 42" in box.read_file("src/app.py")
    names = [e["name"] for e in box.list_files("src")]
    assert names == ["app.py", "util.py"]
    assert box.glob("**/*.py") == ["src/app.py", "src/util.py"]
    hits = box.search(r"return \d+")
    assert [(h["file"], h["line"]) for h in hits] == [("src/app.py", 2)]
    assert box.read_file("src/app.py", start_line=2, end_line=2) == "    return 42\n"


def test_read_file_finds_lines_past_its_10_mib_read_cap(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    box.exec("seq 1 3000000 > big.log")  # 20.8 MB
    result = box.call("read_file", {"path": "big.log", "start_line": 2999999})
    assert not result.is_error, result.error_message
    assert result.data["content"] == "2999999\n3000000\n"
    assert (result.data["total_lines"], result.data["end_line"]) == (3000000, 3000000)
    past = box.call("read_file", {"path": "big.log", "start_line": 3000001})
    assert past.error_message == "start_line 3000001 is past the end of 'big.log' (3000000 lines)"


def test_sandbox_lifecycle_rpcs(client: Stockade, key: str) -> None:
    with pytest.raises(NotFound):
        client.get_sandbox(key)
    with pytest.raises(NotFound):
        client.destroy_sandbox(key)
    info = client.ensure_sandbox(key)
    assert info.state == "RUNNING"
    assert info.container_id
    assert info.engine in ("podman", "docker")
    assert key in [s.key for s in client.list_sandboxes()]
    client.sandbox(key).write_file("keep.txt", "kept")
    assert client.destroy_sandbox(key) is True
    assert client.get_sandbox(key).state == "ABSENT"
    assert client.sandbox(key).read_file("keep.txt") == "kept"
    client.destroy_sandbox(key, delete_workspace=True)
    with pytest.raises(NotFound):
        client.get_sandbox(key)


def test_concurrent_first_calls_make_one_container(
    supervisor: Supervisor, client: Stockade, key: str
) -> None:
    results: list[str] = []

    def call() -> None:
        with supervisor.client() as c:
            results.append(c.sandbox(key).exec("hostname").stdout)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["sandbox\n"] * 6
    be = backend(supervisor.engine)
    mine = [c for c in be.list({"io.stockade.key": key}) if c.running]
    assert len(mine) == 1


def test_many_keys_in_parallel(supervisor: Supervisor, key: str) -> None:
    outputs: dict[int, str] = {}

    def call(i: int) -> None:
        with supervisor.client() as c:
            outputs[i] = c.sandbox(f"{key}-{i}").exec(f"echo {i}").stdout

    threads = [threading.Thread(target=call, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outputs == {i: f"{i}\n" for i in range(5)}


def test_health_and_reflection(supervisor: Supervisor) -> None:
    with grpc.insecure_channel(supervisor.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "stockade.v1.ToolService", "stockade.v1.SandboxService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        reply = next(iter(stub.ServerReflectionInfo(iter([request]), timeout=5)))
        names = {s.name for s in reply.list_services_response.service}
        assert {"stockade.v1.ToolService", "stockade.v1.SandboxService"} <= names


def test_list_tools(client: Stockade) -> None:
    tools = {t.name: t for t in client.list_tools()}
    assert set(tools) == {
        "exec",
        "process",
        "read_file",
        "write_file",
        "edit_file",
        "apply_patch",
        "list_files",
        "glob",
        "search",
    }
    assert tools["exec"].group == "runtime"
    assert tools["process"].group == "runtime"
    assert tools["read_file"].group == "fs"
    assert tools["exec"].parameters["required"] == ["command"]
    assert json.dumps(tools["search"].parameters)


async def test_asyncio_client(supervisor: Supervisor, key: str) -> None:
    async with AsyncStockade(supervisor.target) as s:
        box = s.sandbox(key)
        await box.write_file("a.txt", "async")
        assert await box.read_file("a.txt") == "async"
        result = await box.exec("cat a.txt; exit 4")
        assert (result.stdout, result.exit_code) == ("async", 4)
        assert result.error_code == "EXECUTION_FAILED"
        assert (await box.info()).state == "RUNNING"
        assert "exec" in [t.name for t in await s.list_tools()]
        with pytest.raises(ToolError) as info:
            await box.read_file("missing")
        assert info.value.result.error_code == "FILE_NOT_FOUND"


def test_exec_kills_its_group_but_setsid_servers_survive(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    box.exec("sleep 101 & setsid sleep 102 > /dev/null 2>&1 < /dev/null &")
    alive = box.exec("ps -eo args --no-headers").stdout.splitlines()
    assert "sleep 102" in alive
    assert "sleep 101" not in alive
