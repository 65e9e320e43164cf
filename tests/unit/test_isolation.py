"""The isolation report's parsers and the runc CVE verdicts, table-style, on real samples."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from stockade.client._core import isolation_from_pb
from stockade.supervisor.engines import isolation as iso
from stockade.supervisor.engines import procfs
from stockade.supervisor.engines.backends._common import (
    debian_package_version,
    parse_runc_version,
    view_from_inspect,
)
from stockade.supervisor.engines.backends.base import EngineView, RuntimeFacts
from stockade.supervisor.engines.runc_cves import assess, compare_versions, split_version
from stockade.supervisor.fronts.grpc.convert import fill_pb
from stockade.v1 import sandbox_pb2

STATUS = """Name:\tcat
Umask:\t0022
Uid:\t1000\t1001\t1002\t1003
Gid:\t2000\t2001\t2002\t2003
Groups:\t2000 27 
CapInh:\t0000000000000000
CapPrm:\t0000000000000000
CapEff:\t00000000a80425fb
CapBnd:\t000001ffffffffff
CapAmb:\t0000000000000000
NoNewPrivs:\t1
Seccomp:\t2
Seccomp_filters:\t3
"""

MOUNTINFO = (
    "127 77 0:51 / / ro,relatime master:3 - overlay overlay rw,lowerdir=/a:/b,upperdir=/c\n"
    "128 127 0:54 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
    "140 127 8:1 /srv/my\\040dir /work\\040space rw,relatime shared:1 master:2 - ext4 "
    "/dev/sda1 rw,errors=remount-ro\n"
    "garbage line without separator\n"
)

ROUTE = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    "eth0\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
    "eth0\t0000A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
    "eth0\tnothex\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
)

IPV6_ROUTE = (
    "00000000000000000000000000000001 80 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 00000000 00000001 00000000 80200001       lo\n"
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
    "fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth0\n"
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n"
)

NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     120       2    0    0    0     0          0         0      120       2    0    0    0     0       0          0
  eth0: 9876543      10    0    0    0     0          0         0     4321       5    0    0    0     0       0          0
"""  # noqa: E501

IF_INET6 = (
    "00000000000000000000000000000001 01 80 10 80       lo\n"
    "fe800000000000000000000000000001 02 40 20 80     eth0\n"
)

FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
     |-- 10.0.0.2
        /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
     |-- 127.0.0.1
        /32 host LOCAL
"""


def test_status_identity_capabilities_seccomp() -> None:
    status = procfs.parse_status(STATUS)
    assert procfs.identity(status) == procfs.Identity(1000, 1001, 2000, 2001, (2000, 27))
    caps = procfs.capabilities(status)
    assert caps.effective.mask == 0xA80425FB
    assert caps.effective.names == (
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FOWNER",
        "CAP_FSETID",
        "CAP_KILL",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETPCAP",
        "CAP_NET_BIND_SERVICE",
        "CAP_NET_RAW",
        "CAP_SYS_CHROOT",
        "CAP_MKNOD",
        "CAP_AUDIT_WRITE",
        "CAP_SETFCAP",
    )  # fmt: skip  (Docker's default set)
    assert len(caps.bounding.names) == 41
    assert caps.bounding.names[-1] == "CAP_CHECKPOINT_RESTORE"
    assert caps.permitted == procfs.CapabilitySet(0, ())
    assert procfs.seccomp(status) == procfs.SeccompInfo(2, "filter", 3)


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        ("0", ()),
        ("0000000000200000", ("CAP_SYS_ADMIN",)),
        ("0000020000000001", ("CAP_CHOWN", "CAP_41")),  # a bit this table does not know
        ("zz", ()),
    ],
)
def test_capability_masks(mask: str, names: tuple[str, ...]) -> None:
    assert procfs.capability_set(mask).names == names


def test_missing_status_is_not_root() -> None:
    ident = procfs.identity(procfs.parse_status(""))
    assert ident.uid == ident.gid == procfs.UNKNOWN_ID
    assert procfs.seccomp({}) == procfs.SeccompInfo(0, "unknown", -1)


def test_mountinfo() -> None:
    mounts = procfs.parse_mountinfo(MOUNTINFO)
    assert [(m.target, m.fs_type, m.read_only) for m in mounts] == [
        ("/", "overlay", True), ("/proc", "proc", False), ("/work space", "ext4", False),
    ]  # fmt: skip
    assert mounts[1].options == ("rw", "nosuid", "nodev", "noexec", "relatime")
    assert mounts[2].source == "/dev/sda1"
    assert mounts[2].super_options == ("rw", "errors=remount-ro")


def test_route_tables() -> None:
    assert procfs.parse_route(ROUTE) == [
        procfs.Route("ipv4", "eth0", "0.0.0.0/0", "192.168.0.1", 100, "UG"),
        procfs.Route("ipv4", "eth0", "192.168.0.0/24", "", 100, "U"),
    ]
    assert procfs.parse_ipv6_route(IPV6_ROUTE) == [
        procfs.Route("ipv6", "lo", "::1/128", "", 0, "U"),
        procfs.Route("ipv6", "eth0", "::/0", "fe80::1", 1024, "UG"),
        procfs.Route("ipv6", "lo", "::/0", "", 0xFFFFFFFF, "!"),
    ]


def test_interfaces_addresses() -> None:
    assert procfs.parse_net_dev(NET_DEV) == {"lo": (120, 120), "eth0": (9876543, 4321)}
    assert procfs.parse_if_inet6(IF_INET6) == {"lo": ["::1/128"], "eth0": ["fe80::1/64"]}
    assert procfs.parse_fib_trie_local(FIB_TRIE) == ["10.0.0.2", "127.0.0.1"]


def _reader(files: dict[str, str]):  # type: ignore[no-untyped-def]
    return files.get


def test_cgroup_v1_hybrid() -> None:
    limits = procfs.cgroup_limits(
        _reader({
            "/sys/fs/cgroup/memory/memory.limit_in_bytes": "536870912\n",
            "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes": "9223372036854771712\n",
            "/sys/fs/cgroup/pids/pids.max": "max\n",
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "150000\n",
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        })
    )  # fmt: skip
    assert limits.version == "v1"
    assert (limits.memory_bytes.value, limits.memory_bytes.unlimited) == (512 << 20, False)
    assert limits.swap_bytes.unlimited is True
    assert limits.pids.unlimited is True
    assert limits.cpu_quota_us.source == "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"
    assert limits.cpus == 1.5
    unlimited_cpu = procfs.cgroup_limits(_reader({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1"}))
    assert unlimited_cpu.cpu_quota_us.unlimited is True
    assert unlimited_cpu.cpus == 0.0


def test_cgroup_v2() -> None:
    limits = procfs.cgroup_limits(
        _reader({
            "/sys/fs/cgroup/cgroup.controllers": "cpu memory pids\n",
            "/sys/fs/cgroup/memory.max": "268435456\n",
            "/sys/fs/cgroup/memory.swap.max": "0\n",
            "/sys/fs/cgroup/pids.max": "256\n",
            "/sys/fs/cgroup/cpu.max": "50000 100000\n",
        })
    )  # fmt: skip
    assert limits.version == "v2"
    assert limits.memory_bytes.value == 256 << 20
    assert (limits.swap_bytes.value, limits.swap_bytes.unlimited) == (0, False)
    assert limits.pids.value == 256
    assert limits.cpus == 0.5
    assert procfs.cgroup_limits(_reader({})).version == ""


def test_inside_view_from_hostile_or_missing_input() -> None:
    facts = iso.InsideFacts(
        files={
            procfs.STATUS: b"\xff\xfe not a status",
            procfs.MOUNTINFO: "EACCES",
            procfs.NET_DEV: b"x",
        },
        links={"/proc/self/ns/net": "net:[12]", "/proc/self/ns/user": "bogus"},
        root_read_only=False,
        write_probe_error="",
    )
    view = iso.inside_view(facts)
    assert view.mounts == ()
    assert view.root == iso.RootFilesystem(False, False, "")
    assert f"{procfs.MOUNTINFO}: EACCES" in view.problems
    assert f"{procfs.MOUNTINFO}: not read" in view.problems
    namespaces = iso.namespaces(facts.links, {"net": 12, "user": 7})
    assert namespaces == (iso.NamespaceInfo("net", 12, 12, False),)


def test_namespaces_private_or_shared() -> None:
    links = {f"/proc/self/ns/{n}": f"{n}:[{i + 100}]" for i, n in enumerate(procfs.NAMESPACES)}
    host = {n: i + 100 for i, n in enumerate(procfs.NAMESPACES)} | {"net": 5, "pid": 0}
    found = {n.type: n for n in iso.namespaces(links, host)}
    assert found["net"].private is True
    assert found["user"].private is False
    assert found["pid"].private is False  # host side unknown: never claimed private


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("1.1.5+ds1-1+deb12u1", "1.1.5+ds1-1", 1),
        ("1.1.5+ds1-1+b1", "1.1.5+ds1-1+deb12u1", -1),  # a binNMU of the vulnerable build
        ("1.0.0~rc6", "1.0.0~rc7", -1),
        ("1.0.0~rc93+ds1-5+deb11u3", "1.0.0~rc7", 1),
        ("1.1.12+ds1-1", "1.1.12", 1),
        ("1.1.5+ds1", "1.1.12", -1),
        ("1:0.1", "9.9", 1),
        ("1.0~rc1", "1.0", -1),
        ("1.0a", "1.0+", -1),
        ("1.00", "1.0", 0),
    ],
)
def test_debian_version_comparison(a: str, b: str, expected: int) -> None:
    result = compare_versions(a, b)
    assert (result > 0) - (result < 0) == expected
    if shutil.which("dpkg"):  # the reference implementation agrees
        op = {1: "gt", 0: "eq", -1: "lt"}[expected]
        assert subprocess.run(["dpkg", "--compare-versions", a, op, b]).returncode == 0


def test_split_version() -> None:
    assert split_version("2:1.0-a-b") == (2, "1.0-a", "b")
    assert split_version("1.1.12") == (0, "1.1.12", "")


def _verdicts(runtime: str, version: str, package: str) -> dict[str, str]:
    return {s.id: s.verdict for s in assess(runtime, version, package)}


@pytest.mark.parametrize(
    ("runtime", "version", "package", "v2019", "v2024"),
    [
        ("runc", "1.1.5+ds1", "1.1.5+ds1-1+deb12u1", "fixed", "fixed"),  # bookworm, DSA-5615-1
        ("runc", "1.1.5+ds1", "1.1.5+ds1-1", "fixed", "vulnerable"),  # bookworm as released
        ("runc", "1.1.5+ds1", "1.1.5+ds1-1+b1", "fixed", "vulnerable"),
        ("runc", "", "1.0.0~rc93+ds1-5+deb11u3", "fixed", "fixed"),  # bullseye
        ("runc", "", "1.0.0~rc93+ds1-5+deb11u2", "fixed", "vulnerable"),
        ("runc", "", "1.0.0~rc6+dfsg1-3+deb10u3", "unknown", "fixed"),  # buster, DLA-3735-1
        ("runc", "", "1.1.7-0ubuntu1~22.04.1", "fixed", "unknown"),  # backports not known
        ("runc", "", "1.1.12+ds1-1", "fixed", "fixed"),
        ("runc", "1.1.12", "", "fixed", "fixed"),  # upstream builds: by version
        ("runc", "1.1.11", "", "fixed", "vulnerable"),
        ("runc", "1.0.0-rc6", "", "vulnerable", "vulnerable"),
        ("runc", "1.0.0-rc7", "", "fixed", "vulnerable"),
        ("io.containerd.runc.v2", "1.2.0-rc.1", "", "fixed", "fixed"),
        ("runc", "", "", "unknown", "unknown"),
        ("crun", "1.8", "", "not_applicable", "not_applicable"),
    ],
)
def test_runc_cve_verdicts(
    runtime: str, version: str, package: str, v2019: str, v2024: str
) -> None:
    assert _verdicts(runtime, version, package) == {
        "CVE-2019-5736": v2019,
        "CVE-2024-21626": v2024,
    }


def test_runtime_version_sources() -> None:
    text = "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\n"
    assert parse_runc_version(text) == ("1.1.5+ds1", "1.1.5+ds1-1+deb12u1")
    assert debian_package_version("1.1.5+ds1", "1.1.5+ds1-1+deb12u1") == "1.1.5+ds1-1+deb12u1"
    assert debian_package_version("1.1.12", "v1.1.12-0-g51d5e94") == ""  # upstream commit
    assert debian_package_version("", "1-1") == ""
    other = iso.runtime_info(RuntimeFacts("runc", "1.1.5+ds1", "1.1.5+ds1-1", "x", "/r"), "runsc")
    assert (other.name, other.version, other.package_version) == ("runsc", "", "")
    assert {c.verdict for c in other.cves} == {"not_applicable"}
    assert other.path == ""
    known = {"runc": "runc", "runsc": "/usr/bin/runsc"}
    facts = RuntimeFacts("runc", "1.1.5+ds1", "1.1.5+ds1-1", "x", "/r")
    named = iso.runtime_info(facts, "runsc", known)
    assert (named.name, named.version, named.path) == ("runsc", "", "/usr/bin/runsc")
    assert {c.verdict for c in named.cves} == {"not_applicable"}
    # Podman's service run with --runtime /usr/bin/runsc: its own facts, still not runc's
    text = "runsc version 0.0~20221219.0\nspec: 1.0.2-dev"
    assert parse_runc_version(text) == ("0.0~20221219.0", "")
    gvisor = RuntimeFacts(
        "/usr/bin/runsc", "0.0~20221219.0", "0.0~20221219.0-2+b3", "p", "/usr/bin/runsc"
    )
    own = iso.runtime_info(gvisor, "/usr/bin/runsc")
    assert (own.version, own.package_version) == ("0.0~20221219.0", "0.0~20221219.0-2+b3")
    assert {c.verdict for c in own.cves} == {"not_applicable"}
    # an unknown other runtime that is a runc: judged without a version (unknown), not fixed
    old = iso.runtime_info(facts, "runc-old", {"runc-old": "/opt/runc-old"})
    assert {c.verdict for c in old.cves} == {"unknown"}


def test_engine_view_from_docker_inspect() -> None:
    profile = '{"defaultAction": "SCMP_ACT_ERRNO"}'
    view = view_from_inspect(
        {
            "HostConfig": {
                "Runtime": "runc", "SecurityOpt": ["no-new-privileges", f"seccomp={profile}"],
                "CapDrop": ["ALL"], "ReadonlyRootfs": True, "NetworkMode": "none",
                "Memory": 512, "PidsLimit": 256, "Privileged": False, "CapAdd": None,
            },
            "Config": {"User": "1000:1000"},
            "State": {"Pid": 42},
        },
        "default",
    )  # fmt: skip
    assert view.no_new_privileges is True
    assert view.seccomp_profile.startswith("custom (sha256:")
    assert all(len(o) < 60 for o in view.security_options)
    assert (view.cap_drop, view.cap_add, view.host_pid) == (("ALL",), (), 42)
    assert view_from_inspect({"OCIRuntime": "crun", "HostConfig": {"Runtime": "oci"}}, "x") == (
        EngineView(runtime="crun", seccomp_profile="x")
    )


def test_report_survives_the_wire() -> None:
    """The domain report fills the message field by field; the client reads it back."""
    status = procfs.parse_status(STATUS)
    inside = iso.inside_view(
        iso.InsideFacts({procfs.STATUS: STATUS.encode(), procfs.MOUNTINFO: MOUNTINFO.encode()}, {},
                        True, "EROFS")
    )  # fmt: skip
    report = iso.IsolationReport(
        key="k", container_id="c1", engine="docker", inside=inside,
        outside=EngineView(runtime="runc", memory_bytes=1 << 40),
        namespaces=(iso.NamespaceInfo("net", 4026532255, 4026531840, True),),
        runtime=iso.runtime_info(RuntimeFacts("runc", "1.1.5+ds1", "1.1.5+ds1-1"), "runc"),
    )  # fmt: skip
    data = isolation_from_pb(fill_pb(sandbox_pb2.IsolationReport(), report)).to_dict()
    assert data["inside"]["identity"]["groups"] == list(procfs.identity(status).groups)
    assert data["inside"]["capabilities"]["effective"]["mask"] == 0xA80425FB
    assert data["inside"]["root"] == {"read_only": True, "mount_read_only": True,
                                      "write_error": "EROFS"}  # fmt: skip
    assert data["outside"]["memory_bytes"] == 1 << 40
    assert data["namespaces"][0]["inode"] == 4026532255
    assert [c["verdict"] for c in data["runtime"]["cves"]] == ["FIXED", "VULNERABLE"]
