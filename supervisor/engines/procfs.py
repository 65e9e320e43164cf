"""Parsers of what the agent read inside a sandbox: /proc and /sys files (identity,
capabilities, seccomp, mounts, network, cgroup limits, namespaces), into frozen facts.
Each parser takes text and never raises on odd input (it skips what it cannot read)."""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass

STATUS = "/proc/self/status"
MOUNTINFO = "/proc/self/mountinfo"
NET_DEV = "/proc/net/dev"
NET_ROUTE = "/proc/net/route"
NET_IF_INET6 = "/proc/net/if_inet6"
NET_IPV6_ROUTE = "/proc/net/ipv6_route"
FIB_TRIE = "/proc/net/fib_trie"
UID_MAP = "/proc/self/uid_map"
GID_MAP = "/proc/self/gid_map"
CG = "/sys/fs/cgroup"
CGROUP_V2 = {
    "controllers": f"{CG}/cgroup.controllers",
    "memory": f"{CG}/memory.max",
    "swap": f"{CG}/memory.swap.max",
    "pids": f"{CG}/pids.max",
    "cpu": f"{CG}/cpu.max",
}
CGROUP_V1 = {
    "memory": (f"{CG}/memory/memory.limit_in_bytes",),
    "swap": (f"{CG}/memory/memory.memsw.limit_in_bytes",),
    "pids": (f"{CG}/pids/pids.max",),
    "quota": (f"{CG}/cpu/cpu.cfs_quota_us", f"{CG}/cpu,cpuacct/cpu.cfs_quota_us"),
    "period": (f"{CG}/cpu/cpu.cfs_period_us", f"{CG}/cpu,cpuacct/cpu.cfs_period_us"),
}
NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts")
UNKNOWN_ID = 0xFFFFFFFF
"""(uid_t)-1: the id could not be read."""
V1_UNLIMITED = 1 << 62
"""cgroup v1 reports "no limit" as a huge page-aligned number (0x7FFFFFFFFFFFF000)."""

CAPABILITIES = (  # bit n of a capability mask is CAPABILITIES[n]
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)  # fmt: skip
_ROUTE_FLAGS = ((0x1, "U"), (0x2, "G"), (0x4, "H"), (0x10, "D"), (0x20, "M"), (0x200, "!"))
_ROUTE6_FLAGS = (*_ROUTE_FLAGS, (0x40000, "A"), (0x1000000, "C"))


@dataclass(frozen=True)
class Identity:
    uid: int
    euid: int
    gid: int
    egid: int
    groups: tuple[int, ...]


@dataclass(frozen=True)
class CapabilitySet:
    mask: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class Capabilities:
    effective: CapabilitySet
    permitted: CapabilitySet
    inheritable: CapabilitySet
    bounding: CapabilitySet
    ambient: CapabilitySet


@dataclass(frozen=True)
class SeccompInfo:
    mode: int
    mode_name: str
    filters: int


@dataclass(frozen=True)
class MountInfo:
    target: str
    fs_type: str
    source: str
    options: tuple[str, ...]
    super_options: tuple[str, ...]
    read_only: bool


@dataclass(frozen=True)
class CgroupLimit:
    source: str = ""
    unlimited: bool = False
    value: int = 0


@dataclass(frozen=True)
class CgroupLimits:
    version: str
    memory_bytes: CgroupLimit
    swap_bytes: CgroupLimit
    pids: CgroupLimit
    cpu_quota_us: CgroupLimit
    cpu_period_us: CgroupLimit
    cpus: float


@dataclass(frozen=True)
class Route:
    family: str
    interface: str
    destination: str
    gateway: str
    metric: int
    flags: str


def parse_status(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip()] = value.strip()
    return fields


def capability_set(mask_hex: str) -> CapabilitySet:
    try:
        mask = int(mask_hex, 16)
    except ValueError:
        mask = 0
    names = tuple(
        f"CAP_{CAPABILITIES[bit]}" if bit < len(CAPABILITIES) else f"CAP_{bit}"
        for bit in range(mask.bit_length())
        if mask >> bit & 1
    )
    return CapabilitySet(mask, names)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split() if v.isdigit()]


def identity(status: Mapping[str, str]) -> Identity:
    uids = [*_ints(status.get("Uid", "")), UNKNOWN_ID, UNKNOWN_ID]
    gids = [*_ints(status.get("Gid", "")), UNKNOWN_ID, UNKNOWN_ID]
    return Identity(uids[0], uids[1], gids[0], gids[1], tuple(_ints(status.get("Groups", ""))))


def capabilities(status: Mapping[str, str]) -> Capabilities:
    def cap(name: str) -> CapabilitySet:
        return capability_set(status.get(name, "0"))

    return Capabilities(cap("CapEff"), cap("CapPrm"), cap("CapInh"), cap("CapBnd"), cap("CapAmb"))


def seccomp(status: Mapping[str, str]) -> SeccompInfo:
    mode_text = status.get("Seccomp", "")
    mode = int(mode_text) if mode_text.isdigit() else -1
    name = {0: "disabled", 1: "strict", 2: "filter"}.get(mode, "unknown")
    filters = status.get("Seccomp_filters", "")
    return SeccompInfo(max(mode, 0), name, int(filters) if filters.isdigit() else -1)


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo."""
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        chunk = text[i + 1 : i + 4]
        if text[i] == "\\" and len(chunk) == 3 and all(c in "01234567" for c in chunk):
            out.append(chr(int(chunk, 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[MountInfo]:
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(" "), tail.split(" ")
        if not sep or len(fields) < 6 or len(rest) < 3:
            continue
        options = tuple(fields[5].split(","))
        mounts.append(
            MountInfo(
                target=_unescape(fields[4]),
                fs_type=rest[0],
                source=_unescape(rest[1]),
                options=options,
                super_options=tuple(rest[2].split(",")),
                read_only="ro" in options,
            )
        )
    return mounts


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """Interface -> (rx_bytes, tx_bytes)."""
    found = {}
    for line in text.splitlines()[2:]:
        name, sep, counters = line.partition(":")
        values = counters.split()
        if sep and len(values) >= 9 and values[0].isdigit() and values[8].isdigit():
            found[name.strip()] = (int(values[0]), int(values[8]))
    return found


def parse_if_inet6(text: str) -> dict[str, list[str]]:
    """Interface -> IPv6 addresses with prefix length."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 6:
            continue
        try:
            address = ipaddress.IPv6Address(bytes.fromhex(fields[0]))
            prefix = int(fields[2], 16)
        except ValueError:
            continue
        found.setdefault(fields[5], []).append(f"{address}/{prefix}")
    return found


def _flags(value: int, table: tuple[tuple[int, str], ...]) -> str:
    return "".join(letter for bit, letter in table if value & bit)


def _ipv4(hex_le: str) -> str:
    return socket.inet_ntoa(struct.pack("<I", int(hex_le, 16)))


def parse_route(text: str) -> list[Route]:
    """/proc/net/route: addresses are little-endian hex."""
    routes = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 8:
            continue
        try:
            prefix = bin(int(f[7], 16)).count("1")
            destination = f"{_ipv4(f[1])}/{prefix}"
            gateway = _ipv4(f[2])
            flags, metric = int(f[3], 16), int(f[6])
        except (ValueError, struct.error):
            continue
        gateway = "" if gateway == "0.0.0.0" else gateway
        routes.append(
            Route("ipv4", f[0], destination, gateway, metric, _flags(flags, _ROUTE_FLAGS))
        )
    return routes


def parse_ipv6_route(text: str) -> list[Route]:
    """/proc/net/ipv6_route: dest, dest prefix, src, src prefix, next hop, metric, refcount,
    use, flags, interface; all hex."""
    routes = []
    for line in text.splitlines():
        f = line.split()
        if len(f) != 10:
            continue
        try:
            destination = f"{ipaddress.IPv6Address(bytes.fromhex(f[0]))}/{int(f[1], 16)}"
            gateway = ipaddress.IPv6Address(bytes.fromhex(f[4]))
            metric, flags = int(f[5], 16), int(f[8], 16)
        except ValueError:
            continue
        hop = "" if gateway.is_unspecified else str(gateway)
        routes.append(Route("ipv6", f[9], destination, hop, metric, _flags(flags, _ROUTE6_FLAGS)))
    return routes


def parse_fib_trie_local(text: str) -> list[str]:
    """The local IPv4 addresses in /proc/net/fib_trie (the "/32 host LOCAL" leaves)."""
    found, last = set(), ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("|--", "+--")):
            last = stripped[3:].strip().split(" ")[0]
        elif stripped == "/32 host LOCAL" and last:
            found.add(last)
    return sorted(found, key=lambda a: tuple(int(p) for p in a.split(".") if p.isdigit()))


def cgroup_value(text: str, source: str) -> CgroupLimit:
    """One limit file: "max" (v2), -1 (v1 CPU quota) or the v1 "no limit" number."""
    value = text.strip().split(" ")[0] if text.strip() else ""
    if value == "max":
        return CgroupLimit(source, True, 0)
    try:
        number = int(value)
    except ValueError:
        return CgroupLimit()
    return CgroupLimit(source, number < 0 or number >= V1_UNLIMITED, max(number, 0))


def cgroup_limits(read: Callable[[str], str | None]) -> CgroupLimits:
    """The limits in force, from v2 files when the unified hierarchy is mounted, else v1
    (hybrid hosts give containers v1 controllers)."""
    if read(CGROUP_V2["controllers"]) is not None:
        return _cgroup_v2(read)
    return _cgroup_v1(read)


def _first(read: Callable[[str], str | None], paths: tuple[str, ...]) -> CgroupLimit:
    for path in paths:
        text = read(path)
        if text is not None:
            return cgroup_value(text, path)
    return CgroupLimit()


def _cpus(quota: CgroupLimit, period: CgroupLimit) -> float:
    if quota.unlimited or not quota.source or not period.value:
        return 0.0
    return quota.value / period.value


def _cgroup_v1(read: Callable[[str], str | None]) -> CgroupLimits:
    limits = {name: _first(read, paths) for name, paths in CGROUP_V1.items()}
    version = "v1" if any(limit.source for limit in limits.values()) else ""
    quota, period = limits["quota"], limits["period"]
    return CgroupLimits(
        version, limits["memory"], limits["swap"], limits["pids"], quota, period,
        _cpus(quota, period),
    )  # fmt: skip


def _cgroup_v2(read: Callable[[str], str | None]) -> CgroupLimits:
    def one(name: str) -> CgroupLimit:
        text = read(CGROUP_V2[name])
        return CgroupLimit() if text is None else cgroup_value(text, CGROUP_V2[name])

    cpu_path = CGROUP_V2["cpu"]
    cpu = (read(cpu_path) or "").split()
    quota = cgroup_value(cpu[0], cpu_path) if cpu else CgroupLimit()
    period = cgroup_value(cpu[1], cpu_path) if len(cpu) > 1 else CgroupLimit()
    return CgroupLimits(
        "v2", one("memory"), one("swap"), one("pids"), quota, period, _cpus(quota, period)
    )


def namespace_inode(link: str) -> int:
    """ "net:[4026531840]" -> 4026531840 (0 when it does not read like that)."""
    _, sep, rest = link.partition(":[")
    number = rest.rstrip("]")
    return int(number) if sep and number.isdigit() else 0
