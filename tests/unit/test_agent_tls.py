"""The real agent (a subprocess on this host) on a loopback TCP port with mutual TLS
(sandbox_image/agent/tls.py): a supervisor's certificate of the CA is served through the
supervisor's own AgentConnection; a certificate of the same CA without the supervisor's SAN
URI is refused on every kind of RPC, UNAUTHENTICATED; the command line refuses TCP without
TLS. The pod-level attacks (no certificate, another CA, a sandbox's own agent certificate,
plain text) are in tests/integration/test_kube_play.py, against the agent in a real pod."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from stockade.agent import tls
from stockade.agent.v1 import agent_pb2, agent_pb2_grpc
from stockade.supervisor.engines.addresses import TcpAddress
from stockade.supervisor.engines.backends.kubernetes.pki import (
    SUPERVISOR_URI,
    Authority,
    Issued,
    supervisor_tls,
)
from stockade.supervisor.sandboxes.agent_link import AgentConnection
from tests.unit.fakes import free_port

pytestmark = pytest.mark.timeout(120)
SID = "5ca1ab1e00000001"


def _agent(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stockade.agent", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def ca() -> Authority:
    return Authority.create()


def _install(tls_dir: Path, ca: Authority) -> None:
    """What the kubelet puts in the agent's TLS folder: the CA, the agent's certificate."""
    issued = ca.issue_agent(SID)
    for name, data in (("ca.crt", ca.cert_pem), ("tls.crt", issued.cert_pem)):
        (tls_dir / f".{name}").write_bytes(data)
        (tls_dir / f".{name}").replace(tls_dir / name)
    (tls_dir / ".tls.key").write_bytes(issued.key_pem)
    (tls_dir / ".tls.key").replace(tls_dir / "tls.key")


@contextlib.contextmanager
def _running_agent(root: Path, ca: Authority) -> Iterator[tuple[int, Path]]:
    """The real agent serving a workspace on 127.0.0.1 with sandbox SID's certificate of
    `ca`; its port and TLS folder."""
    tls_dir, workspace = root / "tls", root / "ws"
    tls_dir.mkdir()
    workspace.mkdir()
    _install(tls_dir, ca)
    port = free_port()
    flags = ["--listen", f"127.0.0.1:{port}", "--tls-dir", str(tls_dir)]
    agent = subprocess.Popen(
        [sys.executable, "-m", "stockade.agent", *flags, "--workspace", str(workspace)]
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert agent.poll() is None, "the agent exited"
            assert time.monotonic() < deadline, "the agent never listened"
            time.sleep(0.05)
        yield port, tls_dir
    finally:
        agent.terminate()
        try:
            assert agent.wait(timeout=20) == 0
        finally:
            agent.kill()
            agent.wait()


@pytest.fixture(scope="module")
def agent_port(ca: Authority, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with _running_agent(tmp_path_factory.mktemp("agent"), ca) as (port, _):
        yield port


def _client_cert(ca: Authority, san: x509.GeneralName) -> Issued:
    """A clientAuth certificate of the CA with `san` instead of the supervisor's URI."""
    return ca._issue(
        "not-a-supervisor", x509.SubjectAlternativeName([san]), ExtendedKeyUsageOID.CLIENT_AUTH, 1
    )


async def test_a_supervisor_is_served(ca: Authority, agent_port: int) -> None:
    tls_ = supervisor_tls(ca, SID, ca.issue_supervisor())
    conn = AgentConnection(TcpAddress("127.0.0.1", agent_port, tls_))
    try:
        await conn.wait_ready(20)
        reply = await conn.invoke("exec", {"command": "echo over-tls"}, 20, "r1")
        assert reply.error_code == "", reply
        assert reply.result is not None
        assert reply.result["stdout"] == "over-tls\n"
    finally:
        await conn.close()


async def test_an_other_sandboxes_name_is_not_this_agent(ca: Authority, agent_port: int) -> None:
    """The supervisor checks the agent's certificate for the sandbox it means to reach."""
    tls_ = supervisor_tls(ca, "0000000000000bad", ca.issue_supervisor())
    conn = AgentConnection(TcpAddress("127.0.0.1", agent_port, tls_))
    try:
        assert not await conn.answers(timeout=3)
    finally:
        await conn.close()


@pytest.fixture
async def stub_without_uri(ca: Authority, agent_port: int) -> AsyncIterator[Any]:
    """A channel with a valid client certificate of the CA whose SAN is another URI (what a
    certificate the CA issued for anything but a supervisor looks like to the agent)."""
    client = _client_cert(ca, x509.UniformResourceIdentifier("spiffe://stockade/sandbox"))
    credentials = grpc.ssl_channel_credentials(ca.cert_pem, client.key_pem, client.cert_pem)
    options = [("grpc.ssl_target_name_override", f"{SID}.agent.stockade.internal")]
    async with grpc.aio.secure_channel(f"127.0.0.1:{agent_port}", credentials, options) as ch:
        yield agent_pb2_grpc.AgentServiceStub(ch)


async def _run(call: Any) -> None:
    """Await a unary call, or read a streamed one to its end."""
    result = call()
    if hasattr(result, "__aiter__"):
        async for _ in result:
            pass
    else:
        await result


async def _unauthenticated(call: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _run(call)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, caught.value
    assert caught.value.details() == tls.REFUSED


async def test_a_certificate_without_the_supervisor_uri_is_refused_on_every_rpc(
    stub_without_uri: Any, agent_port: int, ca: Authority
) -> None:
    stub = stub_without_uri
    exec_ = agent_pb2.InvokeRequest(tool="exec", arguments_json=json.dumps({"command": "id"}))

    async def upload() -> AsyncIterator[Any]:
        yield agent_pb2.UploadChunk(header=agent_pb2.TransferHeader(path="x"))
        yield agent_pb2.UploadChunk(data=b"planted")

    await _unauthenticated(lambda: stub.Hello(agent_pb2.HelloRequest(), timeout=10))
    await _unauthenticated(lambda: stub.Invoke(exec_, timeout=10))
    await _unauthenticated(lambda: stub.InvokeStream(exec_, timeout=10))
    await _unauthenticated(lambda: stub.Upload(upload(), timeout=10))
    await _unauthenticated(lambda: stub.Download(agent_pb2.DownloadRequest(path="."), timeout=10))
    await _unauthenticated(lambda: stub.Inspect(agent_pb2.InspectRequest(), timeout=10))
    await _unauthenticated(
        lambda: stub.WatchFiles(agent_pb2.WatchFilesRequest(path="."), timeout=10)
    )


async def test_the_uri_as_a_dns_name_is_not_the_uri(ca: Authority, agent_port: int) -> None:
    """Only a URI SAN counts: the same text as a DNS name (grpc lists both kinds in
    x509_subject_alternative_name) is refused."""
    client = _client_cert(ca, x509.DNSName(SUPERVISOR_URI))
    credentials = grpc.ssl_channel_credentials(ca.cert_pem, client.key_pem, client.cert_pem)
    options = [("grpc.ssl_target_name_override", f"{SID}.agent.stockade.internal")]
    async with grpc.aio.secure_channel(f"127.0.0.1:{agent_port}", credentials, options) as ch:
        stub = agent_pb2_grpc.AgentServiceStub(ch)
        await _unauthenticated(lambda: stub.Hello(agent_pb2.HelloRequest(), timeout=10))


def test_listen_without_tls_is_refused(tmp_path: Path) -> None:
    done = _agent("--listen", "127.0.0.1:7443", "--workspace", str(tmp_path))
    assert done.returncode == 2
    assert "--listen needs --tls-dir: the agent never serves TCP without mutual TLS" in done.stderr


def test_tls_without_listen_and_both_endpoints_are_refused(tmp_path: Path) -> None:
    done = _agent("--socket", str(tmp_path / "a.sock"), "--tls-dir", str(tmp_path))
    assert done.returncode == 2
    assert "--tls-dir goes with --listen" in done.stderr
    done = _agent("--socket", str(tmp_path / "a.sock"), "--listen", "127.0.0.1:1", "--tls-dir", ".")
    assert done.returncode == 2
    assert "not allowed with argument" in done.stderr
    done = _agent("--workspace", str(tmp_path))
    assert done.returncode == 2
    assert "one of the arguments --socket --listen is required" in done.stderr


@pytest.mark.parametrize("listen", ["7443", "host:", ":7443", "h:70000", "h:x"])
def test_a_bad_listen_address_is_refused(tmp_path: Path, listen: str) -> None:
    done = _agent("--listen", listen, "--tls-dir", str(tmp_path))
    assert done.returncode == 2
    assert "--listen must be HOST:PORT" in done.stderr


def test_a_missing_tls_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("x")
    done = _agent("--listen", "127.0.0.1:7443", "--tls-dir", str(tmp_path))
    assert done.returncode == 1
    assert f"cannot read {tmp_path / 'tls.crt'}: No such file or directory" in done.stderr


def test_parse_listen() -> None:
    assert tls.parse_listen("0.0.0.0:7443") == ("0.0.0.0", 7443)
    assert tls.parse_listen("[::]:7443") == ("::", 7443)
    assert tls.parse_listen("[::1]:1") == ("::1", 1)


def test_no_one_else_can_bind_the_agent_port(agent_port: int) -> None:
    """The agent's port has no SO_REUSEPORT: another socket of the same uid (code in the pod)
    cannot bind it beside the agent to take a share of the supervisor's connections."""
    with socket.socket() as thief:
        thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        with pytest.raises(OSError, match="Address already in use"):
            thief.bind(("127.0.0.1", agent_port))


async def test_renewed_files_are_read_at_the_next_connection(tmp_path: Path) -> None:
    """The Secret's files replaced in place (a renewed certificate, here a new CA): new
    connections take the new ones; the old CA's supervisors are refused from then on."""
    old, new = Authority.create(), Authority.create()
    with _running_agent(tmp_path, old) as (port, tls_dir):
        first = AgentConnection(
            TcpAddress("127.0.0.1", port, supervisor_tls(old, SID, old.issue_supervisor()))
        )
        try:
            assert await first.answers(timeout=10)
        finally:
            await first.close()
        _install(tls_dir, new)
        for ca, served in ((new, True), (old, False)):
            conn = AgentConnection(
                TcpAddress("127.0.0.1", port, supervisor_tls(ca, SID, ca.issue_supervisor()))
            )
            try:
                assert await conn.answers(timeout=10) is served
            finally:
                await conn.close()


def test_the_agent_imports_no_cryptography() -> None:
    """The image has the standard library, grpcio and protobuf only."""
    code = (
        "import sys, stockade.agent.__main__, stockade.agent.server, stockade.agent.tls; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cryptography', 'OpenSSL')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"
