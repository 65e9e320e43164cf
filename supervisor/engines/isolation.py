"""The isolation report: what a sandbox's processes see from inside (raw files the agent
read, parsed here, on the supervisor's side: the agent's word is data, not a verdict) and
what the engine and runtime say from outside, assembled into one report; procfs.py parses
the files. Pure parsing; no gRPC, no SDK."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from stockade.supervisor.engines.backends.base import EngineView, RuntimeFacts
from stockade.supervisor.engines.procfs import (
    CGROUP_V1,
    CGROUP_V2,
    FIB_TRIE,
    GID_MAP,
    MOUNTINFO,
    NAMESPACES,
    NET_DEV,
    NET_IF_INET6,
    NET_IPV6_ROUTE,
    NET_ROUTE,
    STATUS,
    UID_MAP,
    Capabilities,
    CgroupLimits,
    Identity,
    MountInfo,
    Route,
    SeccompInfo,
    capabilities,
    cgroup_limits,
    identity,
    namespace_inode,
    parse_fib_trie_local,
    parse_if_inet6,
    parse_ipv6_route,
    parse_mountinfo,
    parse_net_dev,
    parse_route,
    parse_status,
    seccomp,
)
from stockade.supervisor.engines.runc_cves import CveStatus, assess
from stockade.supervisor.engines.userns import IdMap, is_identity, parse_proc_map

FILES = (
    STATUS,
    MOUNTINFO,
    NET_DEV,
    NET_ROUTE,
    NET_IF_INET6,
    NET_IPV6_ROUTE,
    FIB_TRIE,
    UID_MAP,
    GID_MAP,
    *CGROUP_V2.values(),
    *(path for paths in CGROUP_V1.values() for path in paths),
)
LINKS = tuple(f"/proc/self/ns/{ns}" for ns in NAMESPACES)


@dataclass(frozen=True)
class RootFilesystem:
    read_only: bool
    mount_read_only: bool
    write_error: str


@dataclass(frozen=True)
class NetworkInterface:
    name: str
    rx_bytes: int
    tx_bytes: int
    ipv6: tuple[str, ...]


@dataclass(frozen=True)
class InsideView:
    identity: Identity
    capabilities: Capabilities
    no_new_privs: bool
    seccomp: SeccompInfo
    root: RootFilesystem
    mounts: tuple[MountInfo, ...]
    cgroup: CgroupLimits
    interfaces: tuple[NetworkInterface, ...]
    routes: tuple[Route, ...]
    local_ipv4: tuple[str, ...]
    problems: tuple[str, ...]
    uid_map: IdMap = ()
    gid_map: IdMap = ()
    user_namespace: bool = False
    """The maps are not the identity: the sandbox's ids are other ids on the host."""


@dataclass(frozen=True)
class NamespaceInfo:
    type: str
    inode: int
    host_inode: int
    private: bool


@dataclass(frozen=True)
class RuntimeInfo:
    name: str
    version: str
    package_version: str
    package_source: str
    path: str
    cves: tuple[CveStatus, ...]


@dataclass(frozen=True)
class IsolationReport:
    key: str
    container_id: str
    engine: str
    inside: InsideView
    outside: EngineView
    namespaces: tuple[NamespaceInfo, ...]
    runtime: RuntimeInfo


@dataclass(frozen=True)
class InsideFacts:
    """The raw answer from inside: path -> bytes, or the errno name (str) of a failed read."""

    files: Mapping[str, bytes | str]
    links: Mapping[str, str]
    root_read_only: bool
    write_probe_error: str


def host_namespaces() -> dict[str, int]:
    """The supervisor's own namespaces: the host's, unless the supervisor is contained."""
    found = {}
    for ns in NAMESPACES:
        try:
            found[ns] = namespace_inode(os.readlink(f"/proc/self/ns/{ns}"))
        except OSError:
            found[ns] = 0
    return found


def inside_view(facts: InsideFacts) -> InsideView:
    problems = [
        f"{path}: {content}"
        for path, content in facts.files.items()
        if isinstance(content, str) and content != "ENOENT"
    ]

    def text(path: str) -> str | None:
        content = facts.files.get(path)
        return content.decode("utf-8", "replace") if isinstance(content, bytes) else None

    for required in (STATUS, MOUNTINFO, UID_MAP, GID_MAP):
        if text(required) is None:
            problems.append(f"{required}: not read")
    status = parse_status(text(STATUS) or "")
    mounts = parse_mountinfo(text(MOUNTINFO) or "")
    root = [m for m in mounts if m.target == "/"]
    counters = parse_net_dev(text(NET_DEV) or "")
    ipv6 = parse_if_inet6(text(NET_IF_INET6) or "")
    interfaces = [
        NetworkInterface(name, rx, tx, tuple(ipv6.get(name, ())))
        for name, (rx, tx) in sorted(counters.items())
    ]
    routes = parse_route(text(NET_ROUTE) or "") + parse_ipv6_route(text(NET_IPV6_ROUTE) or "")
    uid_map, gid_map = parse_proc_map(text(UID_MAP) or ""), parse_proc_map(text(GID_MAP) or "")
    return InsideView(
        identity=identity(status),
        capabilities=capabilities(status),
        no_new_privs=status.get("NoNewPrivs") == "1",
        seccomp=seccomp(status),
        root=RootFilesystem(
            facts.root_read_only, bool(root) and root[-1].read_only, facts.write_probe_error
        ),
        mounts=tuple(mounts),
        cgroup=cgroup_limits(text),
        interfaces=tuple(interfaces),
        routes=tuple(routes),
        local_ipv4=tuple(parse_fib_trie_local(text(FIB_TRIE) or "")),
        problems=tuple(problems),
        uid_map=uid_map,
        gid_map=gid_map,
        user_namespace=bool(uid_map) and not (is_identity(uid_map) and is_identity(gid_map)),
    )


def namespaces(links: Mapping[str, str], host: Mapping[str, int]) -> tuple[NamespaceInfo, ...]:
    found = []
    for ns in NAMESPACES:
        inode = namespace_inode(links.get(f"/proc/self/ns/{ns}", ""))
        if not inode:
            continue
        host_inode = host.get(ns, 0)
        found.append(NamespaceInfo(ns, inode, host_inode, bool(host_inode) and inode != host_inode))
    return tuple(found)


def runtime_info(
    facts: RuntimeFacts, container_runtime: str, known: Mapping[str, str] | None = None
) -> RuntimeInfo:
    """The runtime and its CVE verdicts; the container's own runtime name wins over the
    engine's default (a container may run under another runtime: then only its path, from
    the engine's list, is known, and runc verdicts are given for a runc alone)."""
    name = container_runtime or facts.name
    same = not container_runtime or not facts.name or container_runtime == facts.name
    version, package = (facts.version, facts.package_version) if same else ("", "")
    path = facts.path if same else (known or {}).get(name, "")
    return RuntimeInfo(
        name=name,
        version=version,
        package_version=package,
        package_source=facts.package_source if same else "",
        path=path,
        cves=tuple(assess(name, version, package)),
    )
