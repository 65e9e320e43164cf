"""The agent link is transport-neutral: a call through the lease reaches a (fake) agent over a
unix socket or over TCP with mutual TLS on loopback by the same code, the address chosen by
the host kind (SandboxManager's `address_of`). The TLS is real: a supervisor without a client
certificate of the CA, an agent with a certificate for another name or of another CA, and an
agent that speaks plain TCP are all refused."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme

from stockade.agent.v1 import agent_pb2, agent_pb2_grpc
from stockade.supervisor.config import Config
from stockade.supervisor.engines.addresses import AgentAddress, MutualTls, TcpAddress, UnixAddress
from stockade.supervisor.engines.backends.base import ContainerInfo
from stockade.supervisor.errors import SandboxBroken
from stockade.supervisor.sandboxes.agent_link import (
    PROTOCOL_VERSION,
    AgentConnection,
    AgentOutput,
    AgentReply,
    AgentStarted,
)
from stockade.supervisor.sandboxes.layout import Paths
from stockade.supervisor.sandboxes.manager import SandboxManager
from tests.unit.fakes import FakeBackend

AGENT_NAME = "agent.stockade.test"
"""The name the agent's certificate is issued for; the address dialled is an IP."""


class FakeAgentService(agent_pb2_grpc.AgentServiceServicer):
    """Answers Hello with our protocol and runs `exec` by echoing its command; records the
    client certificate of each call (empty over a unix socket)."""

    def __init__(self) -> None:
        self.peers: list[str] = []

    def _peer(self, context: grpc.aio.ServicerContext) -> None:
        certs = context.auth_context().get("x509_pem_cert", [b""])
        self.peers.append(certs[0].decode())

    async def Hello(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self._peer(context)
        return agent_pb2.HelloResponse(protocol_version=PROTOCOL_VERSION, pid=2, uid=1000)

    async def Invoke(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self._peer(context)
        return agent_pb2.InvokeResponse(result_json=json.dumps(_ran(request)))

    async def InvokeStream(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self._peer(context)
        result = _ran(request)
        yield agent_pb2.InvokeEvent(started=agent_pb2.Started(pid=42))
        yield agent_pb2.InvokeEvent(output=agent_pb2.Output(fd=1, data=result["stdout"].encode()))
        yield agent_pb2.InvokeEvent(result=agent_pb2.InvokeResponse(result_json=json.dumps(result)))


def _ran(request: Any) -> dict[str, Any]:
    command = json.loads(request.arguments_json)["command"]
    return {"exit_code": 0, "stdout": f"ran {command}\n", "stderr": "", "duration_ms": 1}


class Pki:
    """One CA for both ends, as a host kind would hand out; and a stranger's CA."""

    def __init__(self) -> None:
        self.ca = trustme.CA()
        self.stranger = trustme.CA()
        self.agent_cert = self.ca.issue_cert(AGENT_NAME)
        self.supervisor_cert = self.ca.issue_cert("stockade-supervisor")

    def supervisor(self, *, ca: trustme.CA | None = None, name: str = AGENT_NAME) -> MutualTls:
        """What the supervisor holds: the CA it trusts, its own certificate and key."""
        cert = (ca or self.ca).issue_cert("stockade-supervisor") if ca else self.supervisor_cert
        return MutualTls(
            ca=self.ca.cert_pem.bytes(),
            cert_chain=b"".join(b.bytes() for b in cert.cert_chain_pems),
            private_key=cert.private_key_pem.bytes(),
            server_name=name,
        )

    def agent_credentials(self, ca: trustme.CA | None = None) -> grpc.ServerCredentials:
        """The agent's end: its certificate, and client certificates required, of this CA."""
        cert = (ca or self.ca).issue_cert(AGENT_NAME) if ca else self.agent_cert
        chain = b"".join(b.bytes() for b in cert.cert_chain_pems)
        return grpc.ssl_server_credentials(
            [(cert.private_key_pem.bytes(), chain)],
            root_certificates=self.ca.cert_pem.bytes(),
            require_client_auth=True,
        )


@pytest.fixture
def pki() -> Pki:
    return Pki()


async def _serve(
    bind: Callable[[grpc.aio.Server], int],
) -> AsyncIterator[tuple[FakeAgentService, int]]:
    server = grpc.aio.server()
    service = FakeAgentService()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)
    port = bind(server)
    await server.start()
    try:
        yield service, port
    finally:
        await server.stop(grace=None)


@pytest.fixture
async def tls_agent(pki: Pki) -> AsyncIterator[tuple[FakeAgentService, int]]:
    async for served in _serve(lambda s: s.add_secure_port("127.0.0.1:0", pki.agent_credentials())):
        yield served


@pytest.fixture
async def unix_agent(tmp_path: Path) -> AsyncIterator[tuple[FakeAgentService, Path]]:
    sock = tmp_path / "fake-agent.sock"
    async for service, _ in _serve(lambda s: s.add_insecure_port(f"unix:{sock}")):
        yield service, sock


def _manager(tmp_path: Path, address: AgentAddress) -> SandboxManager:
    """The real manager, lease and AgentConnection; only the engine is faked, and the host
    kind's choice of address is `address` for every container."""
    sandbox = Config().sandbox.__class__(user="1000:1000", network="none")
    config = Config(state_dir=tmp_path / "state", sandbox=sandbox)

    def address_of(info: ContainerInfo, paths: Paths) -> AgentAddress:
        assert info.running
        assert paths.socket.name == "agent.sock"
        return address

    return SandboxManager(
        config,
        FakeBackend(),
        instance_id="inst0001",
        image="img",
        address_of=address_of,
    )


async def _call_through_lease(mgr: SandboxManager) -> tuple[AgentReply, list[object]]:
    async with mgr.lease("k") as lease:
        reply = await lease.invoke("exec", {"command": "uname -a"}, 10.0, "rid-1", deadline="agent")
        events = [
            event
            async for event in lease.stream(
                "exec", {"command": "id"}, 10.0, "rid-2", deadline="agent"
            )
        ]
    return reply, events


async def test_a_call_through_the_lease_reaches_an_agent_over_mutual_tls(
    tmp_path: Path, pki: Pki, tls_agent: tuple[FakeAgentService, int]
) -> None:
    service, port = tls_agent
    mgr = _manager(tmp_path, TcpAddress("127.0.0.1", port, pki.supervisor()))
    try:
        reply, events = await _call_through_lease(mgr)
    finally:
        await mgr.close()
    assert reply.error_code == ""
    assert reply.result is not None
    assert reply.result["stdout"] == "ran uname -a\n"
    assert events[0] == AgentStarted(42)
    assert events[1] == AgentOutput(1, b"ran id\n")
    assert isinstance(events[2], AgentReply)
    assert events[2].result is not None
    assert events[2].result["stdout"] == "ran id\n"
    # the handshake, the call and the stream, each with the supervisor's certificate
    assert service.peers == [pki.supervisor_cert.cert_chain_pems[0].bytes().decode()] * 3


async def test_the_same_code_reaches_an_agent_on_a_unix_socket(
    tmp_path: Path, unix_agent: tuple[FakeAgentService, Path]
) -> None:
    service, sock = unix_agent
    mgr = _manager(tmp_path, UnixAddress(sock))
    try:
        reply, events = await _call_through_lease(mgr)
    finally:
        await mgr.close()
    assert reply.result is not None
    assert reply.result["stdout"] == "ran uname -a\n"
    assert len(events) == 3
    assert service.peers == [""] * 3


async def _refused(address: TcpAddress) -> str:
    agent = AgentConnection(address)
    try:
        with pytest.raises(SandboxBroken) as caught:
            await agent.wait_ready(1.5)
    finally:
        await agent.close()
    return str(caught.value)


async def test_a_supervisor_without_a_certificate_of_the_ca_is_refused(
    pki: Pki, tls_agent: tuple[FakeAgentService, int]
) -> None:
    service, port = tls_agent
    assert "does not answer" in await _refused(
        TcpAddress("127.0.0.1", port, pki.supervisor(ca=pki.stranger))
    )
    assert service.peers == []  # no call reached the agent


async def test_an_agent_with_a_certificate_for_another_name_is_refused(
    pki: Pki, tls_agent: tuple[FakeAgentService, int]
) -> None:
    service, port = tls_agent
    await _refused(TcpAddress("127.0.0.1", port, pki.supervisor(name="other.stockade.test")))
    assert service.peers == []


async def test_an_agent_with_a_certificate_of_another_ca_is_refused(pki: Pki) -> None:
    bind = lambda s: s.add_secure_port("127.0.0.1:0", pki.agent_credentials(pki.stranger))  # noqa: E731
    async for service, port in _serve(bind):
        await _refused(TcpAddress("127.0.0.1", port, pki.supervisor()))
        assert service.peers == []


async def test_an_agent_on_plain_tcp_is_refused(pki: Pki) -> None:
    async for service, port in _serve(lambda s: s.add_insecure_port("127.0.0.1:0")):
        await _refused(TcpAddress("127.0.0.1", port, pki.supervisor()))
        assert service.peers == []


def test_addresses_are_checked_and_keys_never_shown(pki: Pki, tmp_path: Path) -> None:
    tls = pki.supervisor()
    assert str(TcpAddress("::1", 7000, tls)) == "[::1]:7000"
    assert str(TcpAddress("10.0.0.7", 7000, tls)) == "10.0.0.7:7000"
    for host, port in [("", 7000), ("10.0.0.7", 0), ("10.0.0.7", 65536)]:
        with pytest.raises(ValueError, match="not an agent address"):
            TcpAddress(host, port, tls)
    with pytest.raises(ValueError, match="needs a CA"):
        MutualTls(ca=b"", cert_chain=tls.cert_chain, private_key=tls.private_key, server_name="x")
    assert b"PRIVATE KEY" in tls.private_key
    assert "PRIVATE" not in repr(tls)
    assert "PRIVATE" not in repr(TcpAddress("h", 1, tls))
    with pytest.raises(SandboxBroken, match="longer than"):
        AgentConnection(UnixAddress(tmp_path / ("x" * 120)))


async def test_a_path_is_a_unix_socket(tmp_path: Path) -> None:
    agent = AgentConnection(tmp_path / "agent.sock")
    try:
        assert agent.address == UnixAddress(tmp_path / "agent.sock")
    finally:
        await agent.close()
