"""The egress link of one sandbox, built with pyroute2 (blocking: call through a thread).

    container netns            helper netns (one per sandbox)
    eth0 10.213.0.2/30  <-veth->  proxy0 10.213.0.1/30  + the proxy's listening socket

The helper namespace holds nothing but the far end of the link and the proxy's listening
socket (made there, served by the supervisor), so the only thing a sandbox can reach is the
proxy: no route leads anywhere else, no host service listens there, and nothing forwards.
A token bucket (tc tbf) on each end caps the bandwidth in both directions; the sandbox has
no CAP_NET_ADMIN to lift it."""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

NETNS_DIR = Path("/var/run/netns")
CLONE_NEWNET = 0x40000000
MS_BIND = 4096
MS_REC = 16384
MS_SHARED = 1 << 20
MNT_DETACH = 2
T = TypeVar("T")
PROXY_IFNAME = "proxy0"
SANDBOX_IFNAME = "eth0"
TBF_LATENCY = "50ms"


class LinkError(Exception):
    """The link could not be built."""


@dataclass(frozen=True)
class LinkPlan:
    namespace: str
    """Name of the helper namespace (under /var/run/netns)."""
    proxy_address: str
    sandbox_address: str
    prefixlen: int
    proxy_port: int
    bandwidth_kbit: int = 0

    @classmethod
    def for_subnet(
        cls, namespace: str, subnet: str, proxy_port: int, bandwidth_kbit: int
    ) -> LinkPlan:
        network = ipaddress.IPv4Network(subnet)
        hosts = network.hosts()
        first, second = next(hosts), next(hosts)
        return cls(
            namespace, str(first), str(second), network.prefixlen, proxy_port, bandwidth_kbit
        )


def build(plan: LinkPlan, container_pid: int) -> socket.socket:
    """A fresh helper namespace, the veth pair into the container's namespace, addresses,
    the bandwidth caps, and the proxy's listening socket (returned, bound in the helper
    namespace). Whatever an earlier build left is removed first.

    Runs in a one-off thread that moves between namespaces (setns and unshare act on the
    calling thread only), so nothing forks: pyroute2's own namespace support forks a Python
    child, which is unsafe in a process that runs gRPC threads."""
    if container_pid <= 0:
        raise LinkError("the container has no process to attach a link to")
    remove(plan.namespace)
    try:
        return _in_thread(lambda: _build(plan, container_pid))
    except (NetlinkError, OSError, IndexError) as exc:
        remove(plan.namespace)
        raise LinkError(f"cannot build the egress link: {exc}") from exc


def _build(plan: LinkPlan, container_pid: int) -> socket.socket:
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    container = os.open(f"/proc/{container_pid}/ns/net", os.O_RDONLY)
    try:
        # the kernel tears a removed namespace down later, and with it the old veth pair:
        # the container's end of an earlier link may still be there (EEXIST on the add)
        _check(libc.setns(container, CLONE_NEWNET), "setns into the container")
        with IPRoute() as inside:
            for index in inside.link_lookup(ifname=SANDBOX_IFNAME):
                inside.link("del", index=index)
        _check(libc.unshare(CLONE_NEWNET), "unshare")
        _pin(libc, plan.namespace)
        with IPRoute() as helper:  # this thread is in the helper namespace now
            helper.link("set", index=helper.link_lookup(ifname="lo")[0], state="up")
            peer = {"ifname": SANDBOX_IFNAME, "net_ns_pid": container_pid}
            helper.link("add", ifname=PROXY_IFNAME, kind="veth", peer=peer)
            _configure(helper, PROXY_IFNAME, plan.proxy_address, plan)
        sock = _listen(plan.proxy_address, plan.proxy_port)
        try:
            _check(libc.setns(container, CLONE_NEWNET), "setns into the container")
            with IPRoute() as inside:
                _configure(inside, SANDBOX_IFNAME, plan.sandbox_address, plan)
        except BaseException:
            sock.close()
            raise
        return sock
    finally:
        try:
            _check(libc.setns(home, CLONE_NEWNET), "setns back")  # else this thread just ends
        finally:
            os.close(home)
            os.close(container)


def _pin(libc: ctypes.CDLL, namespace: str) -> None:
    """Give the calling thread's network namespace a name, as `ip netns add` does: a bind
    mount of it on /var/run/netns/NAME (that directory a shared mount point)."""
    NETNS_DIR.mkdir(parents=True, exist_ok=True)
    directory = bytes(NETNS_DIR)
    if libc.mount(b"", directory, b"none", MS_SHARED | MS_REC, None) != 0:
        _check(libc.mount(directory, directory, b"none", MS_BIND | MS_REC, None), "mount")
        _check(libc.mount(b"", directory, b"none", MS_SHARED | MS_REC, None), "mount")
    path = NETNS_DIR / namespace
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
    _check(libc.mount(b"/proc/thread-self/ns/net", bytes(path), b"none", MS_BIND, None), "mount")


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _in_thread(work: Callable[[], T]) -> T:
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # handed to the caller
            error.append(exc)

    thread = threading.Thread(target=run, name="stockade-netns", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def _listen(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _configure(ipr: IPRoute, ifname: str, address: str, plan: LinkPlan) -> None:
    index = ipr.link_lookup(ifname=ifname)[0]
    ipr.addr("add", index=index, address=address, prefixlen=plan.prefixlen)
    ipr.link("set", index=index, state="up")
    if plan.bandwidth_kbit:
        burst = max(16 * 1024, plan.bandwidth_kbit * 1000 // 8 // 50)  # ~20 ms of traffic
        rate = f"{plan.bandwidth_kbit}kbit"
        ipr.tc("add", "tbf", index, rate=rate, burst=burst, latency=TBF_LATENCY)


def instance_prefix(instance_id: str) -> str:
    """Helper namespaces of one supervisor instance are named with this prefix."""
    return f"stockade-{instance_id[:8]}-"


def remove(namespace: str) -> None:
    """Remove a helper namespace (and with it the link); no error when there is none."""
    path = NETNS_DIR / namespace
    if path.exists():
        libc = ctypes.CDLL(None, use_errno=True)
        libc.umount2(bytes(path), MNT_DETACH)
        with contextlib.suppress(OSError):
            path.unlink()


def namespaces(prefix: str) -> list[str]:
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))
    except FileNotFoundError:
        return []
