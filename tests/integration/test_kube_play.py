"""A sandbox pod as the manifests make it (supervisor/engines/backends/kubernetes/manifests.py),
run for real by `podman kube play` (tests/integration/podman_kubelet.py plays the kubelet's part
for volumes): the supervisor's own AgentConnection reaches its agent over TCP with mutual TLS on
loopback and runs the tool suite at the agent-link level; the security context is proven from
inside; and peers that are not a supervisor (no certificate, another CA's, the sandbox's own agent
certificate, plain text) get nothing done. Podman only: the pod is Podman's to play."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
import tarfile
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from stockade.agent.v1 import agent_pb2, agent_pb2_grpc
from stockade.supervisor.config.sandbox import KubernetesConfig
from stockade.supervisor.engines.addresses import TcpAddress
from stockade.supervisor.engines.backends.base import (
    LABEL_INSTANCE,
    LABEL_KEY,
    LABEL_MANAGED,
    LABEL_SANDBOX_ID,
    LABEL_TENANT,
    ContainerSpec,
)
from stockade.supervisor.engines.backends.kubernetes import manifests
from stockade.supervisor.engines.backends.kubernetes.pki import (
    Authority,
    Issued,
    agent_server_name,
    supervisor_tls,
)
from stockade.supervisor.engines.image import image_ref
from stockade.supervisor.errors import SandboxBroken
from stockade.supervisor.sandboxes.agent_link import (
    AgentConnection,
    AgentFileChange,
    AgentOutput,
    AgentReply,
    AgentStarted,
    AgentWatchStarted,
)
from tests.integration import podman_kubelet
from tests.integration.harness import free_tcp_address

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.parametrize("engine", ["podman"], indirect=True),  # Podman plays pods
]
UID = 65532
TMP_BYTES = 16 * 1024 * 1024
MEMORY_BYTES = 512 * 1024 * 1024
AGENT_ARGS = ("--max-output-bytes", str(1 << 20), "--max-processes", "5")
T = 30.0
CGROUP_LIMITS = (
    "cd /sys/fs/cgroup && if [ -e memory.max ]; then cat memory.max cpu.max; else "
    "cat memory/memory.limit_in_bytes cpu/cpu.cfs_quota_us cpu/cpu.cfs_period_us; fi"
)
"""The memory limit and the CPU quota and period, from cgroup v2 or v1."""


@dataclass
class Pod:
    played: podman_kubelet.PlayedPod
    sandbox_id: str
    port: int
    ca: Authority

    def connection(self, client: Issued | None = None) -> AgentConnection:
        tls = supervisor_tls(self.ca, self.sandbox_id, client or self.ca.issue_supervisor())
        return AgentConnection(TcpAddress("127.0.0.1", self.port, tls))


def _spec(sandbox_id: str) -> ContainerSpec:
    instance = uuid.uuid4().hex
    return ContainerSpec(
        name=manifests.pod_name(instance, sandbox_id),
        image=image_ref("podman"),
        command=(),
        labels={
            LABEL_MANAGED: "1",
            LABEL_INSTANCE: instance,
            LABEL_SANDBOX_ID: sandbox_id,
            LABEL_KEY: "team/a key",
            LABEL_TENANT: "acme",
        },
        mounts=(),
        user="",
        read_only_root=True,
        drop_all_capabilities=True,
        no_new_privileges=True,
        memory_bytes=MEMORY_BYTES,
        nano_cpus=1_000_000_000,
        pids_limit=256,
        nofile=1024,
        nproc=16384,
        tmpfs={"/tmp": TMP_BYTES},
        environment={"STOCKADE_TEST": "from-the-spec"},
    )


@pytest.fixture(scope="module")
def pod(engine: str) -> Iterator[Pod]:
    """One sandbox pod for the module: emptyDir workspace, its agent's port published on
    127.0.0.1 (a hostPort, for the test only: the manifests publish none)."""
    ca = Authority.create()
    sandbox_id = uuid.uuid4().hex[:16]
    kube = KubernetesConfig(workspace="emptydir", image_pull_policy="Never")
    secret = manifests.agent_secret(
        manifests.secret_name(sandbox_id), ca.issue_agent(sandbox_id), ca.cert_pem, {}
    )
    spec = manifests.sandbox_pod(
        _spec(sandbox_id),
        kube,
        sandbox_id=sandbox_id,
        agent_secret=manifests.secret_name(sandbox_id),
        workspace_claim=None,
        agent_args=AGENT_ARGS,
    )
    port = _free_port()
    spec = podman_kubelet.publish(spec, "127.0.0.1", port)
    with podman_kubelet.running(spec, {manifests.secret_name(sandbox_id): secret}) as played:
        yield Pod(played, sandbox_id, port, ca)


def _free_port() -> int:
    return int(free_tcp_address().rpartition(":")[2])


@pytest.fixture
async def agent(pod: Pod) -> AsyncIterator[AgentConnection]:
    async with _connected(pod) as conn:
        yield conn


@contextlib.asynccontextmanager
async def _connected(pod: Pod) -> AsyncIterator[AgentConnection]:
    conn = pod.connection()
    try:
        try:
            await conn.wait_ready(60)
        except SandboxBroken as exc:
            raise AssertionError(f"{exc}; the pod's log:\n{pod.played.logs()}") from exc
        yield conn
    finally:
        await conn.close()


async def _exec(agent: AgentConnection, command: str) -> dict[str, Any]:
    reply = await agent.invoke("exec", {"command": command}, T, "t")
    assert reply.error_code == "", reply
    assert reply.result is not None
    return reply.result


async def _call(agent: AgentConnection, tool: str, **args: Any) -> dict[str, Any]:
    reply = await agent.invoke(tool, args, T, "t")
    assert reply.error_code == "", reply
    assert reply.result is not None
    return reply.result


# the tool suite, through the supervisor's end of the link


async def test_exec(agent: AgentConnection) -> None:
    done = await _exec(agent, "id -u; id -g; pwd; echo $STOCKADE_TEST; hostname; echo err >&2")
    assert done["exit_code"] == 0
    assert done["stdout"] == f"{UID}\n{UID}\n/workspace\nfrom-the-spec\nsandbox\n"
    assert done["stderr"] == "err\n"
    assert (await _exec(agent, "exit 3"))["exit_code"] == 3


async def test_streamed_exec(agent: AgentConnection) -> None:
    events = [
        e
        async for e in agent.invoke_stream(
            "exec", {"command": "for i in 1 2 3; do echo line$i; sleep 0.1; done"}, T, "t"
        )
    ]
    assert isinstance(events[-1], AgentReply)
    assert events[-1].result is not None
    assert events[-1].result["exit_code"] == 0
    assert sum(isinstance(e, AgentStarted) for e in events) == 1
    out = b"".join(e.data for e in events if isinstance(e, AgentOutput) and e.fd == 1)
    assert out == b"line1\nline2\nline3\n"
    assert sum(isinstance(e, AgentOutput) for e in events) >= 2  # streamed, not at the end


async def test_a_background_process(agent: AgentConnection) -> None:
    started = await _call(
        agent, "process", action="start", command="echo bg-ready; sleep 300", name="bg"
    )
    pid = started["pid"]
    deadline = time.monotonic() + T
    while "bg-ready" not in (await _call(agent, "process", action="log", id=started["id"]))["data"]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    listed = await _call(agent, "process", action="list")
    assert [p["id"] for p in listed["processes"] if p["state"] == "running"] == [started["id"]]
    killed = await _call(agent, "process", action="kill", id=started["id"])
    assert killed["state"] == "exited"
    gone = await _exec(agent, f"kill -0 {pid} 2>&1; echo $?")
    assert gone["stdout"].endswith("1\n")
    await _call(agent, "process", action="remove", id=started["id"])


async def test_files(agent: AgentConnection) -> None:
    written = await _call(agent, "write_file", path="notes/a.txt", content="one\ntwo\n")
    assert written["created"] is True
    assert written["bytes_written"] == 8
    await _call(agent, "edit_file", path="notes/a.txt", old_text="two", new_text="deux")
    read = await _call(agent, "read_file", path="notes/a.txt")
    assert read["content"] == "one\ndeux\n"
    assert (await _exec(agent, "stat -c %u:%g notes/a.txt"))["stdout"] == f"{UID}:{UID}\n"
    listed = await _call(agent, "list_files", path="notes")
    assert "a.txt" in json.dumps(listed)
    escape = await agent.invoke("read_file", {"path": "../etc/passwd"}, T, "t")
    assert escape.error_code == "INVALID_PATH"


async def test_upload_and_download(agent: AgentConnection) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB, every byte value

    async def chunks() -> AsyncIterator[bytes]:
        for at in range(0, len(payload), 64 * 1024):
            yield payload[at : at + 64 * 1024]

    sent = await agent.upload("blob.bin", False, 0o600, chunks(), T)
    assert sent.error_code == "", sent
    got = [c async for c in agent.download("blob.bin", False, T)]
    assert isinstance(got[-1], AgentReply)
    assert got[-1].error_code == ""
    assert b"".join(c for c in got if isinstance(c, bytes)) == payload
    tarred = b"".join([c async for c in agent.download(".", True, T) if isinstance(c, bytes)])
    with tarfile.open(fileobj=io.BytesIO(tarred)) as tar:
        assert "./blob.bin" in tar.getnames() or "blob.bin" in tar.getnames()


async def test_an_interact_session(agent: AgentConnection) -> None:
    """What Interact does (calls/interact.py): start, attach, write stdin, close it, and
    see the process end with its output."""
    started = await _call(agent, "process", action="start", command="tr a-z A-Z", stdin=True)
    stream = agent.invoke_stream("process", {"action": "attach", "id": started["id"]}, T, "t")
    await _call(agent, "process", action="write", id=started["id"], data="hello pod\n")
    await _call(agent, "process", action="write", id=started["id"], eof=True)
    events = [e async for e in stream]
    out = b"".join(e.data for e in events if isinstance(e, AgentOutput))
    assert out == b"HELLO POD\n"
    assert isinstance(events[-1], AgentReply)
    assert events[-1].result is not None
    assert events[-1].result["exit_code"] == 0


async def test_the_file_watch(agent: AgentConnection) -> None:
    await _exec(agent, "mkdir -p watched")
    watch = agent.watch_files("watched", True)
    assert isinstance(watch, AsyncGenerator)
    first = await anext(watch)
    assert first == AgentWatchStarted("watched")
    await _exec(agent, "echo x > watched/new.txt")
    changes: list[AgentFileChange] = []
    async with asyncio.timeout(T):
        async for event in watch:
            assert isinstance(event, AgentFileChange)
            changes.append(event)
            if event.kind == "write":
                break
    await watch.aclose()
    assert ("create", "new.txt") in [(c.kind, c.name) for c in changes]


async def test_a_claimed_workspace_outlives_its_pod(engine: str) -> None:
    """The supervisor replaces a dead pod by a new one on the same claim: the files stay."""
    ca = Authority.create()
    sandbox_id = uuid.uuid4().hex[:16]
    claim = manifests.claim_name(sandbox_id)
    secrets = {
        manifests.secret_name(sandbox_id): manifests.agent_secret(
            manifests.secret_name(sandbox_id), ca.issue_agent(sandbox_id), ca.cert_pem, {}
        )
    }
    try:
        for generation in ("first", "second"):
            spec = manifests.sandbox_pod(
                _spec(sandbox_id),
                KubernetesConfig(image_pull_policy="Never"),
                sandbox_id=sandbox_id,
                agent_secret=manifests.secret_name(sandbox_id),
                workspace_claim=claim,
                agent_args=AGENT_ARGS,
            )
            port = _free_port()
            spec = podman_kubelet.publish(spec, "127.0.0.1", port)
            with podman_kubelet.running(spec, secrets) as played:
                async with _connected(Pod(played, sandbox_id, port, ca)) as conn:
                    if generation == "first":
                        await _call(conn, "write_file", path="kept.txt", content="kept\n")
                    else:
                        read = await _call(conn, "read_file", path="kept.txt")
                        assert read["content"] == "kept\n"
    finally:
        podman_kubelet.remove_claim(claim)


# the security context, proven from inside


async def test_the_agent_and_tools_hold_no_privilege(agent: AgentConnection) -> None:
    for who in ("self", "1", "$PPID"):  # a tool, tini (PID 1), the agent
        status = (await _exec(agent, f"cat /proc/{who}/status"))["stdout"]
        fields = dict(line.split(":", 1) for line in status.splitlines())
        assert fields["Uid"].split() == [str(UID)] * 4, (who, fields["Uid"])
        assert fields["Gid"].split() == [str(UID)] * 4, (who, fields["Gid"])
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(fields[cap], 16) == 0, (who, cap, fields[cap])
        assert fields["NoNewPrivs"].strip() == "1", who
        assert fields["Seccomp"].strip() == "2", who
    agent_cmd = (await _exec(agent, "tr '\\0' ' ' < /proc/$PPID/cmdline"))["stdout"]
    assert agent_cmd.startswith("python3 -P -m stockade.agent --listen 0.0.0.0:7443 --tls-dir")


async def test_the_root_is_read_only_and_tmp_is_capped(agent: AgentConnection) -> None:
    root = await _exec(agent, "touch /planted 2>&1; echo $?")
    assert "Read-only file system" in root["stdout"]
    assert root["stdout"].endswith("1\n")
    size = await _exec(agent, "stat -f -c '%b %S' /tmp")
    blocks, block = map(int, size["stdout"].split())
    assert blocks * block == TMP_BYTES
    fill = await _exec(agent, "head -c 20M /dev/zero 2>&1 >/tmp/fill; echo $?; rm -f /tmp/fill")
    assert "No space left on device" in fill["stdout"]
    limits = await _exec(agent, CGROUP_LIMITS)
    assert limits["stdout"].split() == [str(MEMORY_BYTES), "100000", "100000"]
    su = await _exec(agent, "su -c id root </dev/null 2>&1; echo $?")
    assert not su["stdout"].endswith("0\n")


async def test_the_tls_files_are_the_agents_only(agent: AgentConnection) -> None:
    """The Secret's files: read-only, not writable by the sandbox (mode 0440, group fsGroup:
    the kubelet's doing, played by podman_kubelet)."""
    listing = await _exec(agent, "stat -c '%n %a %u %g' /run/stockade/tls/*")
    assert listing["stdout"].splitlines() == [
        f"/run/stockade/tls/{name} 440 0 {UID}" for name in ("ca.crt", "tls.crt", "tls.key")
    ]
    write = await _exec(agent, "echo x > /run/stockade/tls/ca.crt 2>&1; echo $?")
    assert not write["stdout"].endswith("0\n")


# attacks on the agent's port: none gets a call served


async def _attempt(pod: Pod, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    """Ask the agent to plant a file with these credentials (None: plain text); the status
    it ended with."""
    target = f"127.0.0.1:{pod.port}"
    options = [("grpc.ssl_target_name_override", agent_server_name(pod.sandbox_id))]
    channel = (
        grpc.aio.secure_channel(target, credentials, options)
        if credentials is not None
        else grpc.aio.insecure_channel(target)
    )
    async with channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        request = agent_pb2.InvokeRequest(
            tool="exec", arguments_json=json.dumps({"command": "touch /workspace/pwned"})
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Invoke(request, timeout=10)
    return refused.value.code()


async def _not_planted(agent: AgentConnection) -> None:
    assert (await _exec(agent, "ls /workspace/pwned 2>&1; true"))["stdout"].endswith(
        "No such file or directory\n"
    )


async def test_a_client_without_a_certificate_is_refused(pod: Pod, agent: AgentConnection) -> None:
    code = await _attempt(pod, grpc.ssl_channel_credentials(pod.ca.cert_pem))
    assert code == grpc.StatusCode.UNAVAILABLE  # the handshake fails
    await _not_planted(agent)


async def test_a_certificate_of_another_ca_is_refused(pod: Pod, agent: AgentConnection) -> None:
    stranger = Authority.create().issue_supervisor()  # the right SAN URI, the wrong CA
    credentials = grpc.ssl_channel_credentials(pod.ca.cert_pem, stranger.key_pem, stranger.cert_pem)
    assert await _attempt(pod, credentials) == grpc.StatusCode.UNAVAILABLE
    await _not_planted(agent)
    # and the supervisor's link, holding that certificate, never gets ready
    conn = pod.connection(stranger)
    try:
        assert not await conn.answers(timeout=5)
    finally:
        await conn.close()


async def test_the_sandboxes_own_agent_certificate_is_refused(
    pod: Pod, agent: AgentConnection
) -> None:
    """Code in the sandbox can read its agent's key (one uid in a pod); with it, it is still
    no supervisor: a serverAuth certificate without the supervisor's SAN URI."""
    cert = (await _exec(agent, "cat /run/stockade/tls/tls.crt"))["stdout"].encode()
    key = (await _exec(agent, "cat /run/stockade/tls/tls.key"))["stdout"].encode()
    assert b"PRIVATE KEY" in key
    credentials = grpc.ssl_channel_credentials(pod.ca.cert_pem, key, cert)
    code = await _attempt(pod, credentials)
    # refused by TLS (no clientAuth EKU) or, were that ever let through, by the SAN URI check
    assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
    await _not_planted(agent)


async def test_plain_text_gets_nothing(pod: Pod, agent: AgentConnection) -> None:
    assert await _attempt(pod, None) == grpc.StatusCode.UNAVAILABLE
    with socket.create_connection(("127.0.0.1", pod.port), timeout=10) as raw:
        raw.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        answer = b""
        try:
            while chunk := raw.recv(4096):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    # no HTTP/2 frame comes back: at most a TLS alert record (content type 21), then close
    assert answer == b"" or answer[0] == 0x15, answer[:32]
    await _not_planted(agent)
