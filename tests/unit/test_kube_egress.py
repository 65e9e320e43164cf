"""Egress for sandboxes as pods: whose a connection to the supervisors' egress listener is,
known by its source address (the pod's IP), and the connection served by that sandbox's
proxy or refused.

First the lookup (sandboxes/pod_egress.py) against kmock's API over real HTTP, pods made
there as the backend makes them: found by IP, refused when unknown, of another mode, of
another installation, not running, or wider than today's allowlist; the API listed at most
once a second whatever unknown sources do. Then the real listener through the real sandbox
manager: a sandbox made in mode egress is a pod told the proxy, and a client socket bound to
the pod's address (the test kubelet gives pods 127.0.0.N, all of it loopback) is "the pod":
its CONNECT to an allowed name reaches a TLS server of the test, a name off its allowlist, a
source that is no pod, and a pod of mode none are refused, and each decision is recorded."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import trustme

from stockade.supervisor.config import Config, EngineConfig, SandboxConfig
from stockade.supervisor.config.sandbox import KubernetesConfig, NetworkConfig
from stockade.supervisor.engines.backends.base import (
    LABEL_INSTANCE,
    LABEL_KEY,
    LABEL_MANAGED,
    LABEL_NETWORK,
    LABEL_NETWORK_ALLOW,
    LABEL_SANDBOX_ID,
    LABEL_TENANT,
    ContainerInfo,
)
from stockade.supervisor.engines.backends.kubernetes.api import KubeApi, Timeouts, load_client
from stockade.supervisor.engines.backends.kubernetes.backend import KubernetesBackend
from stockade.supervisor.errors import ConfigError, EngineUnavailable
from stockade.supervisor.keys import sandbox_id, scope
from stockade.supervisor.models import NetworkRequest
from stockade.supervisor.network.proxy import EgressDecision
from stockade.supervisor.network.shared_proxy import Client, Refusal, source_address
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.supervisor.sandboxes.network_modes import Networks, resolved
from stockade.supervisor.sandboxes.pod_egress import PodDirectory
from tests.unit.fakes import free_port
from tests.unit.kube_mock import NAMESPACE, Kubelet, KubeMock

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("kube_ca")]
INSTANCE = "inst0001aaaa"
FAST = Timeouts(connect_s=2, read_s=5, attempts=2, backoff_s=0.05, watch_window_s=5)
SERVICE = "stockade-egress.stockade.svc:3128"
OURS = {LABEL_MANAGED: "1", LABEL_INSTANCE: INSTANCE}


def _kubernetes(kube: KubeMock, tmp_path: Path, **settings: Any) -> KubernetesConfig:
    return KubernetesConfig(
        namespace=NAMESPACE,
        kubeconfig=str(kube.kubeconfig(tmp_path)),
        ready_timeout_s=60,
        egress_proxy=SERVICE,
        egress_listen=f"127.0.0.1:{free_port()}",
        **settings,
    )


def _config(kubernetes: KubernetesConfig, tmp_path: Path, **network: Any) -> Config:
    return Config(
        state_dir=tmp_path / "state",
        engine=EngineConfig(kind="kubernetes"),
        kubernetes=kubernetes,
        sandbox=SandboxConfig(user="65532:65532", network="egress", tmp_inodes=0),
        network=NetworkConfig(**{"allow": ("up.test", "*.wild.test"), **network}),
    )


def _backend(kubernetes: KubernetesConfig) -> KubernetesBackend:
    return KubernetesBackend(kubernetes, KubeApi(load_client(kubernetes), NAMESPACE, FAST))


# The lookup.


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Directory:
    kube: KubeMock
    lookup: PodDirectory
    clock: Clock
    made: list[str] = field(default_factory=list)

    def pod(
        self,
        ip: str,
        key: str,
        *,
        mode: str = "egress",
        allow: str = "up.test",
        tenant: str = "",
        instance: str = INSTANCE,
        ready: bool = True,
    ) -> str:
        """A pod as the backend makes one (the key and allowlist as annotations), Ready at
        `ip` as the kubelet reports it."""
        sid = sandbox_id(scope(tenant, key))
        name = f"stockade-{instance[:8]}-{sid}"
        labels = {**OURS, LABEL_INSTANCE: instance, LABEL_NETWORK: mode, LABEL_SANDBOX_ID: sid}
        annotations = {LABEL_KEY: key, LABEL_NETWORK_ALLOW: allow}
        if tenant:
            labels[LABEL_TENANT] = tenant
        meta = {"name": name, "namespace": NAMESPACE, "labels": labels}
        body = {"metadata": {**meta, "annotations": annotations}, "spec": {"containers": []}}
        self.kube.put("pod", body)
        if ready:
            self.kube.set_ready(name, ip)
        self.made.append(name)
        return name


@pytest.fixture
def directory(kube: KubeMock, tmp_path: Path) -> Iterator[Directory]:
    kubernetes = _kubernetes(kube, tmp_path)
    config = _config(kubernetes, tmp_path, ports=(443,))
    backend = _backend(kubernetes)
    clock = Clock()
    networks = Networks(config, INSTANCE)
    lookup = PodDirectory(backend.list, OURS, networks.choose, (443,), clock=clock)
    try:
        yield Directory(kube, lookup, clock)
    finally:
        backend.close()


async def test_a_pod_is_known_by_its_ip(directory: Directory) -> None:
    directory.pod("127.0.0.5", "k")
    directory.pod("127.0.0.6", "k", tenant="acme", allow="up.test,a.wild.test")
    found = await directory.lookup.identify("127.0.0.5")
    assert isinstance(found, Client), found
    assert (found.key, found.allowlist.patterns) == ("k", ("up.test",))
    other = await directory.lookup.identify("127.0.0.6")
    assert isinstance(other, Client), other
    assert other.key == scope("acme", "k")  # the tenant's key, as the audit knows it
    assert sorted(other.allowlist.patterns) == ["a.wild.test", "up.test"]
    assert other.allowlist.decide("up.test", 443).allowed
    assert not other.allowlist.decide("up.test", 80).allowed  # [network] ports
    assert not other.allowlist.decide("b.wild.test", 443).allowed
    assert directory.lookup.lists == 1  # the second was answered from what the first listed
    mapped = await directory.lookup.identify("::ffff:127.0.0.5")  # a dual-stack listener's view
    assert isinstance(mapped, Client)
    assert mapped.key == "k"


async def test_an_unknown_source_is_refused_and_lists_the_pods_at_most_once_a_second(
    directory: Directory,
) -> None:
    """Misses share one list; a miss sooner than a second after the last list waits for the
    next (so a pod made a moment ago is found), which all misses meanwhile share."""
    directory.pod("127.0.0.5", "k")
    many = await asyncio.gather(*(directory.lookup.identify(f"10.9.0.{n}") for n in range(50)))
    assert all(isinstance(r, Refusal) and r.status == 403 and not r.key for r in many)
    assert "10.9.0.7 is no running sandbox pod of this installation" in str(many[7])
    assert directory.lookup.lists == 1
    directory.clock.now += 0.5
    directory.pod("127.0.0.6", "new")
    more = await asyncio.gather(
        directory.lookup.identify("127.0.0.6"),
        *(directory.lookup.identify(f"10.9.1.{n}") for n in range(50)),
    )
    assert isinstance(more[0], Client)
    assert more[0].key == "new"
    assert all(isinstance(r, Refusal) for r in more[1:])
    assert directory.lookup.lists == 2
    found = await directory.lookup.identify("127.0.0.5")  # a hit: no list
    assert isinstance(found, Client)
    assert directory.lookup.lists == 2


async def test_a_new_pod_is_found_on_a_miss_and_a_gone_one_when_its_entry_ages(
    directory: Directory,
) -> None:
    first = directory.pod("127.0.0.5", "k")
    assert isinstance(await directory.lookup.identify("127.0.0.5"), Client)
    directory.pod("127.0.0.6", "new")
    directory.clock.now += 1.5  # a miss lists again (not sooner than a second after)
    found = await directory.lookup.identify("127.0.0.6")
    assert isinstance(found, Client)
    assert found.key == "new"
    # the first pod goes and its IP is given to a pod of another key, in mode none
    status, _ = directory.kube._http("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{first}")
    assert status == 200
    directory.pod("127.0.0.5", "reused", mode="none")
    directory.clock.now += 5
    still = await directory.lookup.identify("127.0.0.5")  # the window: MAX_AGE_S
    assert isinstance(still, Client)
    assert still.key == "k"
    directory.clock.now += 6
    now = await directory.lookup.identify("127.0.0.5")
    assert isinstance(now, Refusal), now
    assert now.key == "reused"


@pytest.mark.parametrize("mode", ["none", "open", "Egress", "x" * 300])
async def test_a_pod_not_in_egress_mode_is_refused_naming_its_key(
    directory: Directory, mode: str
) -> None:
    directory.pod("127.0.0.5", "k", mode=mode[:63])
    found = await directory.lookup.identify("127.0.0.5")
    assert isinstance(found, Refusal), found
    assert (found.status, found.key) == (403, "k")
    assert "not egress" in found.reason
    assert len(found.reason) < 300


@pytest.mark.parametrize("allow", ["evil.test", "up.test,*.test", "*.wild.test,10.0.0.1"])
async def test_a_pod_wider_than_todays_allowlist_is_refused(
    directory: Directory, allow: str
) -> None:
    """Its annotation is the supervisor's, out of the sandbox's reach; whoever may patch pods
    may not widen a sandbox's way out past the configuration with it."""
    directory.pod("127.0.0.5", "k", allow=allow)
    found = await directory.lookup.identify("127.0.0.5")
    assert isinstance(found, Refusal), found
    assert (found.status, found.key) == (403, "k")
    assert "not allowed now" in found.reason


async def test_pods_of_another_installation_or_not_ready_are_unknown(
    directory: Directory,
) -> None:
    directory.pod("127.0.0.5", "k", instance="otherinst999")
    directory.pod("127.0.0.6", "pending", ready=False)
    for address in ("127.0.0.5", "127.0.0.6"):
        found = await directory.lookup.identify(address)
        assert isinstance(found, Refusal), found
        assert (found.status, found.key) == (403, "")


@pytest.mark.parametrize(
    "address", ["", "nowhere", "127.0.0.5:80", "x" * 100_000, "127.0.0.5\r\nX: y", "::"]
)
async def test_hostile_addresses_are_refused_plainly(directory: Directory, address: str) -> None:
    directory.pod("127.0.0.5", "k")
    found = await directory.lookup.identify(address)
    assert isinstance(found, Refusal), found
    assert found.status == 403
    assert len(found.reason) < 200


async def test_a_failing_api_refuses_the_connection_never_serves_it() -> None:
    def broken(_labels: Mapping[str, str]) -> list[ContainerInfo]:
        raise EngineUnavailable("the API server at https://k8s.test does not answer")

    config = Config(
        engine=EngineConfig(kind="kubernetes"),
        kubernetes=KubernetesConfig(egress_proxy=SERVICE),
        sandbox=SandboxConfig(network="egress"),
    )
    lookup = PodDirectory(broken, OURS, Networks(config, INSTANCE).choose, (443,))
    found = await lookup.identify("127.0.0.5")
    assert isinstance(found, Refusal), found
    assert found.status == 503
    assert "does not answer" in found.reason


def test_source_addresses() -> None:
    assert source_address(("127.0.0.5", 4000)) == "127.0.0.5"
    assert source_address(("::ffff:10.1.2.3", 4000, 0, 0)) == "10.1.2.3"
    assert source_address(("fe80::1%eth0", 4000, 0, 2)) == "fe80::1"
    assert source_address(("not an address", 1)) == ""
    assert source_address(None) == ""
    assert source_address(()) == ""


# The real listener, through the real manager, pods played by the test kubelet.


@dataclass
class Upstream:
    port: int
    ca: trustme.CA


@pytest_asyncio.fixture
async def upstream() -> AsyncIterator[Upstream]:
    """An HTTPS server of the test on 127.0.0.1 (the allowlist pins up.test there): it
    answers each line with itself."""
    ca = trustme.CA()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("up.test", "other.test").configure_cert(context)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(line)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=context)
    yield Upstream(int(server.sockets[0].getsockname()[1]), ca)
    server.close()
    await server.wait_closed()


@dataclass
class Cluster:
    manager: SandboxManager
    kube: KubeMock
    kubelet: Kubelet
    upstream: Upstream
    decisions: list[EgressDecision]

    @property
    def listener_port(self) -> int:
        listener = self.manager.networks.listener
        assert listener is not None, "the manager serves no egress listener"
        return listener.port

    def pod_of(self, key: str) -> str:
        return f"stockade-{INSTANCE[:8]}-{sandbox_id(key)}"

    async def connect(
        self, source: str, target: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        """A connection from `source` (bound there first: "the pod") asking CONNECT target;
        the proxy's answer head."""
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.listener_port, local_addr=(source, 0)
        )
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        return reader, writer, head

    async def tunnel(self, source: str, name: str = "up.test") -> asyncio.StreamWriter:
        """A TLS session with the upstream through the proxy, checked with a line."""
        reader, writer, head = await self.connect(source, f"{name}:{self.upstream.port}")
        assert head.startswith(b"HTTP/1.1 200"), head
        context = ssl.create_default_context()
        self.upstream.ca.configure_trust(context)
        await writer.start_tls(context, server_hostname=name)
        writer.write(b"hello through the pod's proxy\n")
        line = await asyncio.wait_for(reader.readline(), 10)
        assert line == b"hello through the pod's proxy\n"
        return writer

    async def close(self, writer: asyncio.StreamWriter, left: int = 0) -> None:
        """Close a tunnel and wait until the proxy has let it go (its cap counts it): until
        `left` sandboxes have connections."""
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()
        listener = self.manager.networks.listener
        for _ in range(200):
            if listener is None or listener.proxies() == left:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the proxy kept a closed tunnel")

    async def unasked(self, source: str) -> bytes:
        """What the proxy says to a connection that has sent nothing yet (a refusal comes
        before the request is read: nothing unread is left to reset the connection)."""
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.listener_port, local_addr=(source, 0)
        )
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return answer

    async def refused(self, source: str, target: str) -> bytes:
        reader, writer, head = await self.connect(source, target)
        body = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return head + body


@pytest_asyncio.fixture
async def cluster(kube: KubeMock, tmp_path: Path, upstream: Upstream) -> AsyncIterator[Cluster]:
    agent_port = free_port()
    kubelet = Kubelet(kube, tmp_path / "nodes", agent_port)
    kubernetes = _kubernetes(kube, tmp_path, agent_port=agent_port)
    config = _config(
        kubernetes,
        tmp_path,
        ports=(upstream.port,),
        hosts={"up.test": "127.0.0.1", "other.test": "127.0.0.1"},
        allow_private_addresses=True,
        max_connections=1,
    )
    decisions: list[EgressDecision] = []
    backend = _backend(kubernetes)
    manager = SandboxManager(
        config,
        backend,
        instance_id=INSTANCE,
        image="stockade-sandbox:test",
        address_of=backend.address_of,
        record_egress=decisions.append,
        host_mounts=False,
    )
    await manager.start()
    try:
        yield Cluster(manager, kube, kubelet, upstream, decisions)
    finally:
        await manager.close()
        kubelet.close()


async def test_an_egress_pod_is_told_the_proxy_and_served_from_its_address(
    cluster: Cluster,
) -> None:
    """The pod's environment as its spec says (this kubelet runs the agent as a process, not
    the pod: tests/integration/test_kube_egress.py sees it from inside a played pod)."""
    await cluster.manager.ensure("k")
    pod = cluster.kube.get("pod", cluster.pod_of("k"))
    assert pod is not None
    assert pod["metadata"]["labels"][LABEL_NETWORK] == "egress"  # what the NetworkPolicy selects
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    proxies = {k: v for k, v in env.items() if k.lower().endswith("_proxy")}
    assert proxies == {
        **{name: f"http://{SERVICE}" for name in ("HTTP_PROXY", "HTTPS_PROXY")},
        **{name: f"http://{SERVICE}" for name in ("http_proxy", "https_proxy")},
        **{name: "localhost,127.0.0.1,::1" for name in ("NO_PROXY", "no_proxy")},
    }
    address = cluster.kubelet.played[cluster.pod_of("k")]
    assert address.startswith("127.0.0.")
    assert address != "127.0.0.1"

    await cluster.close(await cluster.tunnel(address))
    allowed = [d for d in cluster.decisions if d.allowed]
    assert [(d.sandbox_key, d.method, d.host) for d in allowed] == [("k", "CONNECT", "up.test")]

    # a name off its allowlist (other.test is pinned, served, and not allowed)
    refused = await cluster.refused(address, f"other.test:{cluster.upstream.port}")
    assert refused.startswith(b"HTTP/1.1 403"), refused
    assert b"not on the allowlist" in refused
    last = cluster.decisions[-1]
    assert (last.sandbox_key, last.host, last.allowed) == ("k", "other.test", False)

    # a source that is no pod: refused, logged, nothing recorded for a sandbox
    count = len(cluster.decisions)
    refused = await cluster.refused("127.0.0.250", f"up.test:{cluster.upstream.port}")
    assert refused.startswith(b"HTTP/1.1 403"), refused
    assert b"127.0.0.250 is no running sandbox pod" in refused
    assert len(cluster.decisions) == count


async def test_a_pod_of_another_mode_is_refused_and_recorded(cluster: Cluster) -> None:
    await cluster.manager.ensure("quiet", NetworkRequest(mode="none"))
    address = cluster.kubelet.played[cluster.pod_of("quiet")]
    pod = cluster.kube.get("pod", cluster.pod_of("quiet"))
    assert pod is not None
    assert not [e for e in pod["spec"]["containers"][0]["env"] if "PROXY" in e["name"].upper()]
    refused = await cluster.refused(address, f"up.test:{cluster.upstream.port}")
    assert refused.startswith(b"HTTP/1.1 403"), refused
    assert b"network mode 'none', not egress" in refused
    [decision] = cluster.decisions
    assert (decision.sandbox_key, decision.allowed) == ("quiet", False)


async def test_a_narrowed_allowlist_holds_through_the_shared_listener(cluster: Cluster) -> None:
    await cluster.manager.ensure("narrow", NetworkRequest(mode="egress", allow=("a.wild.test",)))
    address = cluster.kubelet.played[cluster.pod_of("narrow")]
    refused = await cluster.refused(address, f"up.test:{cluster.upstream.port}")
    assert refused.startswith(b"HTTP/1.1 403"), refused
    assert b"not on the allowlist" in refused


async def test_the_per_sandbox_cap_counts_across_connections_of_the_pod(
    cluster: Cluster,
) -> None:
    """max_connections = 1: the pod's second tunnel while its first is open is refused, one
    after it closed is served; another pod is not counted against it."""
    await cluster.manager.ensure("a")
    await cluster.manager.ensure("b")
    first, second = (cluster.kubelet.played[cluster.pod_of(k)] for k in ("a", "b"))
    held = await cluster.tunnel(first)
    refused = await cluster.unasked(first)
    assert refused.startswith(b"HTTP/1.1 503"), refused
    assert b"connection cap (1 open)" in refused
    await cluster.close(await cluster.tunnel(second), left=1)
    await cluster.close(held)
    await cluster.close(await cluster.tunnel(first))


async def test_hostile_input_from_no_pod_leaves_the_listener_serving(cluster: Cluster) -> None:
    """A megabyte of garbage from an address of no pod: answered 403 (or reset, once the
    listener has read what it reads of a refused connection), recorded for no sandbox; the
    listener serves a pod afterwards."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", cluster.listener_port, local_addr=("127.0.0.251", 0)
    )
    got = b""
    try:
        writer.write(b"\x16\x03\x01" + b"A" * 1_000_000)
        got = await asyncio.wait_for(reader.read(), 10)
    except ConnectionError:
        pass
    writer.close()
    assert got == b"" or got.startswith(b"HTTP/1.1 403"), got[:200]
    assert cluster.decisions == []
    await cluster.manager.ensure("k")
    await cluster.close(await cluster.tunnel(cluster.kubelet.played[cluster.pod_of("k")]))


async def test_a_source_refused_again_and_again_is_logged_once(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", "stockade.egress")
    for _ in range(5):
        answer = await cluster.unasked("127.0.0.252")
        assert answer.startswith(b"HTTP/1.1 403"), answer
    logged = [r for r in caplog.records if "egress deny from 127.0.0.252" in r.getMessage()]
    assert len(logged) == 1


async def test_the_listener_is_served_only_when_egress_may_be_chosen(
    kube: KubeMock, tmp_path: Path
) -> None:
    """Mode none: nothing listens. Mode open with the Service: a request may narrow to
    egress, so the listener serves. An address taken: a ConfigError naming the setting."""
    kubernetes = _kubernetes(kube, tmp_path)
    for mode, serves in (("none", False), ("open", True)):
        config = _config(kubernetes, tmp_path)
        config = replace(config, sandbox=replace(config.sandbox, network=mode))
        networks = Networks(config, INSTANCE)
        assert networks.serves_pods() is serves
        await networks.serve_pods(lambda _labels: [], OURS)
        try:
            assert (networks.listener is not None) is serves
        finally:
            await networks.close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = replace(kubernetes, egress_listen=f"127.0.0.1:{taken.getsockname()[1]}")
        networks = Networks(_config(busy, tmp_path), INSTANCE)
        with pytest.raises(ConfigError, match=r"kubernetes\.egress_listen '127\.0\.0\.1:"):
            await networks.serve_pods(lambda _labels: [], OURS)
        assert networks.listener is None


async def test_pods_are_told_the_proxy_service_by_address_so_they_need_no_dns() -> None:
    """The egress NetworkPolicy gives sandbox pods no DNS (a resolver that forwards names
    outside is a way out): the supervisors resolve the Service's name and tell pods its
    address; a name that does not resolve is passed on as it is (and logged)."""
    assert await resolved("localhost:3128") in ("127.0.0.1:3128", "[::1]:3128")
    assert await resolved("10.96.0.17:3128") == "10.96.0.17:3128"
    assert await resolved("[fd00::5]:3128") == "[fd00::5]:3128"
    assert await resolved("no-such-name.invalid:3128") == "no-such-name.invalid:3128"
