"""SandboxService.InspectIsolation and `stockade doctor --sandbox` against real sandboxes: the
report is compared with what the sandbox shows to ordinary tool calls, with the engine's own
inspect and with the host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

import pytest

from stockade.client import InvalidArgument, NotFound, Stockade
from stockade.supervisor.config import AGENT_UID
from tests.integration.harness import SANDBOX_UID, Supervisor, engine_cli, running_supervisor
from tests.integration.test_cli import cli

pytestmark = pytest.mark.timeout(300)
MiB = 1 << 20


def run(client: Stockade, key: str, command: str) -> str:
    result = client.sandbox(key).exec(command)
    assert result.exit_code == 0, (command, result.stderr)
    return result.stdout


def status_of(client: Stockade, key: str) -> dict[str, str]:
    text = run(client, key, "cat /proc/self/status")
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


@pytest.fixture
def report(client: Stockade, key: str) -> dict[str, Any]:
    run(client, key, "true")
    found = client.inspect_isolation(key)
    assert found.key == key
    return found.to_dict()


def test_identity_capabilities_seccomp_match_proc_status(
    client: Stockade, key: str, report: dict[str, Any]
) -> None:
    inside = report["inside"]
    status = status_of(client, key)
    ident = inside["identity"]  # the agent's: its own user, the sandbox user's effective ids
    assert [int(v) for v in status["Uid"].split()] == [SANDBOX_UID] * 4  # a tool's: all four
    assert [int(v) for v in status["Gid"].split()] == [SANDBOX_UID] * 4
    assert [ident["uid"], ident["euid"]] == [AGENT_UID, SANDBOX_UID]
    assert [ident["gid"], ident["egid"]] == [AGENT_UID, SANDBOX_UID]
    assert ident["groups"] == []
    assert run(client, key, "id -G").split() == [str(SANDBOX_UID)]
    assert ident["euid"] == int(run(client, key, "id -u")) == SANDBOX_UID
    caps = inside["capabilities"]
    for kind, line in (("effective", "CapEff"), ("permitted", "CapPrm"), ("bounding", "CapBnd"),
                       ("ambient", "CapAmb"), ("inheritable", "CapInh")):  # fmt: skip
        assert caps[kind]["mask"] == int(status[line], 16), kind
        assert caps[kind]["names"] == [], kind  # all capabilities dropped
    assert inside["no_new_privs"] is (status["NoNewPrivs"] == "1") is True
    assert inside["seccomp"]["mode"] == int(status["Seccomp"]) == 2
    assert inside["seccomp"]["mode_name"] == "filter"
    assert inside["seccomp"]["filters"] == int(status.get("Seccomp_filters", "-1"))
    assert inside["seccomp"]["filters"] >= 1


def test_root_and_mounts_match_what_the_sandbox_sees(
    client: Stockade, key: str, report: dict[str, Any]
) -> None:
    root = report["inside"]["root"]
    assert root["read_only"] is True
    assert root["mount_read_only"] is True
    assert root["write_error"] == "EROFS"
    failed = client.sandbox(key).exec("touch /probe-from-a-tool")
    assert failed.exit_code != 0
    assert "Read-only file system" in failed.stderr
    lines = run(client, key, "cat /proc/self/mountinfo").splitlines()
    seen = [(f[4], f[f.index("-") + 1]) for f in (line.split() for line in lines)]
    assert [(m["target"], m["fs_type"]) for m in report["inside"]["mounts"]] == seen
    targets = {m["target"]: m for m in report["inside"]["mounts"]}
    assert "ro" in targets["/"]["options"]
    assert targets["/tmp"]["fs_type"] == "tmpfs"
    assert "/workspace" in targets


def test_network_matches_proc_net(client: Stockade, key: str, report: dict[str, Any]) -> None:
    inside = report["inside"]
    dev = run(client, key, "cat /proc/net/dev").splitlines()[2:]
    names = sorted(line.split(":")[0].strip() for line in dev)
    assert [i["name"] for i in inside["interfaces"]] == names == ["lo"]  # network none
    route4 = run(client, key, "cat /proc/net/route").splitlines()[1:]
    route6 = run(client, key, "cat /proc/net/ipv6_route").splitlines()
    families = [r["family"] for r in inside["routes"]]
    assert families.count("ipv4") == len(route4)
    assert families.count("ipv6") == len(route6)
    assert {r["interface"] for r in inside["routes"]} <= {"lo"}
    assert all(not r["gateway"] for r in inside["routes"])
    assert inside["local_ipv4"] in ([], ["127.0.0.1"])
    inet6 = run(client, key, "cat /proc/net/if_inet6").split()
    assert sum(len(i["ipv6"]) for i in inside["interfaces"]) == len(inet6) // 6


def _cgroup_file(client: Stockade, key: str, v1: str, v2: str) -> str:
    return run(client, key, f"cat {v1} 2>/dev/null || cat {v2}").split()[0]


def test_cgroup_limits_match_files_and_engine(
    client: Stockade, key: str, report: dict[str, Any]
) -> None:
    cg, outside = report["inside"]["cgroup"], report["outside"]
    cgv1, cgv2 = "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"
    memory = _cgroup_file(client, key, cgv1, cgv2)
    assert cg["memory_bytes"]["value"] == int(memory) == outside["memory_bytes"] == 512 * MiB
    pids = _cgroup_file(client, key, "/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max")
    assert cg["pids"]["value"] == int(pids) == outside["pids_limit"] == 256
    assert cg["version"] in ("v1", "v2")
    assert cg["cpus"] == pytest.approx(1.0)
    assert cg["memory_bytes"]["unlimited"] is cg["pids"]["unlimited"] is False


def test_namespaces_compared_with_the_host(
    engine: str, client: Stockade, key: str, report: dict[str, Any]
) -> None:
    by_type = {n["type"]: n for n in report["namespaces"]}
    for ns in ("mnt", "net", "pid", "ipc", "uts", "user", "cgroup"):
        inside = run(client, key, f"readlink /proc/self/ns/{ns}").strip()
        host = os.readlink(f"/proc/self/ns/{ns}")
        assert by_type[ns]["inode"] == int(inside.split("[")[1].rstrip("]")), ns
        assert by_type[ns]["host_inode"] == int(host.split("[")[1].rstrip("]")), ns
        assert by_type[ns]["private"] is (inside != host), ns
    for ns in ("mnt", "net", "pid", "ipc", "uts"):
        assert by_type[ns]["private"] is True, ns
    # user namespaces are on by default where the engine gives each sandbox a range: Podman
    assert by_type["user"]["private"] is (engine == "podman")


def test_outside_matches_the_engines_inspect(engine: str, report: dict[str, Any]) -> None:
    done = engine_cli(engine, "inspect", report["container_id"])
    assert done.returncode == 0, done.stderr
    attrs = json.loads(done.stdout)[0]
    host, outside = attrs["HostConfig"], report["outside"]
    assert outside["privileged"] is host["Privileged"] is False
    assert outside["read_only_root"] is host["ReadonlyRootfs"] is True
    assert outside["network_mode"] == host["NetworkMode"] == "none"
    # the entry point starts as root only to make tini and the agent AGENT_UID at once
    assert outside["user"] == attrs["Config"]["User"] == "0:0"
    kept = ["SETGID", "SETPCAP", "SETUID"]  # for the entry point; the agent drops them all
    if engine == "docker":
        assert sorted(outside["cap_add"]) == sorted(host["CapAdd"]) == kept
    else:  # Podman lists what it dropped of its defaults, and what is left
        assert sorted(attrs["EffectiveCaps"]) == [f"CAP_{name}" for name in kept]
    assert outside["memory_bytes"] == host["Memory"]
    assert outside["memory_swap_bytes"] == host["MemorySwap"] == 512 * MiB
    assert outside["pids_limit"] == host["PidsLimit"]
    assert outside["host_pid"] == attrs["State"]["Pid"] > 0
    assert outside["no_new_privileges"] is True
    assert "no-new-privileges" in outside["security_options"]
    assert outside["runtime"] == (attrs.get("OCIRuntime") or host["Runtime"]) == "runc"
    if engine == "docker":
        assert outside["cap_drop"] == host["CapDrop"] == ["ALL"]
        assert outside["seccomp_profile"].startswith("custom (sha256:")
    else:
        assert outside["cap_drop"] == host["CapDrop"]
        assert "CAP_SYS_ADMIN" not in host["CapAdd"]
        assert outside["seccomp_profile"] == "not reported by Podman's inspect"


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs dpkg-query")
def test_runtime_version_and_cves(report: dict[str, Any]) -> None:
    runtime = report["runtime"]
    assert runtime["name"] == "runc"
    version = subprocess.run(["runc", "--version"], capture_output=True, text=True, check=True)
    assert runtime["version"] == version.stdout.splitlines()[0].removeprefix("runc version ")
    package = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "runc"], capture_output=True, text=True
    )
    if package.returncode == 0:
        assert runtime["package_version"] == package.stdout
    cves = {c["id"]: c for c in runtime["cves"]}
    assert set(cves) == {"CVE-2019-5736", "CVE-2024-21626"}
    if runtime["package_version"] == "1.1.5+ds1-1+deb12u1":  # this machine: Debian bookworm
        assert cves["CVE-2024-21626"]["verdict"] == "FIXED"
        assert "DSA-5615-1" in cves["CVE-2024-21626"]["reason"]
        assert cves["CVE-2019-5736"]["verdict"] == "FIXED"


def test_unknown_and_malformed_keys(client: Stockade, key: str) -> None:
    with pytest.raises(NotFound):
        client.inspect_isolation(key)
    assert client.list_sandboxes() == [] or key not in {s.key for s in client.list_sandboxes()}
    for bad in ("", "k" * 300):
        with pytest.raises(InvalidArgument):
            client.inspect_isolation(bad)
    run(client, key, "true")
    client.destroy_sandbox(key)
    with pytest.raises(NotFound, match="only a workspace"):
        client.inspect_isolation(key)  # never recreates the container
    assert client.get_sandbox(key).state == "ABSENT"


def test_policy_cannot_block_it(engine: str, key: str) -> None:
    """The report is gathered around the tool pipeline: a policy that allows no tool at all
    neither blocks it nor sees it."""
    with (
        running_supervisor(engine, '[tools]\ndeny = ["group:runtime", "group:fs"]\n') as sup,
        sup.client() as client,
    ):
        client.ensure_sandbox(key)
        denied = client.sandbox(key).exec("true")
        assert denied.is_error
        assert denied.error_code == "PERMISSION_DENIED"
        report = client.inspect_isolation(key).to_dict()
        assert report["inside"]["identity"]["euid"] == SANDBOX_UID
        assert report["inside"]["problems"] == []


def test_doctor_sandbox_cli(supervisor: Supervisor, client: Stockade, key: str) -> None:
    run(client, key, "true")
    done = cli(supervisor, "doctor", "--sandbox", key)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"sandbox {key} on {supervisor.engine}, container ")
    text = done.stdout
    agent, tools = AGENT_UID, SANDBOX_UID
    assert f"  identity      uid {agent} (euid {tools}), gid {agent} (egid {tools})" in text
    assert "  no_new_privs  yes" in text
    assert "  seccomp       filter, " in text
    assert "  root          read-only (mount ro; creating a file: EROFS)" in text
    assert "effective none; permitted none" in text
    assert "CVE-2024-21626" in text
    as_json = cli(supervisor, "doctor", "--sandbox", key, "--json")
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["key"] == key
    assert data["inside"]["capabilities"]["effective"]["mask"] == 0
    missing = cli(supervisor, "doctor", "--sandbox", "no-such-key-here")
    assert missing.returncode == 2
    assert "unknown" in missing.stderr


def test_machine_doctor_still_works(supervisor: Supervisor) -> None:
    done = cli(supervisor, "doctor", "--config", str(supervisor.config_file()))
    assert f"[ok  ] engine: {supervisor.engine} " in done.stdout, done.stdout + done.stderr
    assert "[ok  ] sandbox image: " in done.stdout
    wrong = cli(supervisor, "doctor", "--json")
    assert wrong.returncode == 2
    assert "--json goes with --sandbox KEY" in wrong.stderr
