"""Network mode egress for sandboxes as pods, end to end: `stockade serve` with engine.kind
kubernetes on the tests' cluster (kubelet.py: kmock's API, pods played by `podman kube play`
on loopback addresses of their own) and [sandbox] network = "egress".

EnsureSandbox makes a pod whose processes see the egress Service as their proxy (read from
inside the played pod), labelled for the egress NetworkPolicy. The supervisor serves its egress
listener on loopback; a client socket bound to the pod's address (127.0.0.N) before it
connects is "the pod": no played pod connects anywhere, the proxy is exercised with
connections from pod addresses on loopback, never from a pod on a cluster network. From the
pod's address a CONNECT to the allowed name reaches the test's TLS server (pinned on
127.0.0.1) and is audited under the sandbox's key; a name off the list, a source of no pod,
and the pod of a sandbox in mode none are refused."""

from __future__ import annotations

import shutil
import socket
import socketserver
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.integration.harness import Supervisor
from tests.integration.kubelet import Kubelet, MockApi, free_port

NAMESPACE = "stockade"
SERVICE = "stockade-egress.stockade.svc:3128"
pytestmark = pytest.mark.timeout(600)


class _Echo(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for line in self.rfile:
            self.wfile.write(line)
            self.wfile.flush()


class _TlsServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    context: ssl.SSLContext

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, peer = super().get_request()
        return self.context.wrap_socket(sock, server_side=True), peer


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[int, trustme.CA]]:
    """The test's HTTPS server on 127.0.0.1, for up.test (pinned there by [network] hosts)."""
    ca = trustme.CA()
    server = _TlsServer(("127.0.0.1", 0), _Echo, bind_and_activate=True)
    server.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("up.test", "other.test").configure_cert(server.context)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], ca
    finally:
        server.shutdown()
        server.server_close()


def _config(kubeconfig: Path, upstream_port: int, listen_port: int) -> str:
    return (
        '[sandbox]\nimage = "localhost/stockade-sandbox:latest"\nnetwork = "egress"\n'
        f'[network]\nallow = ["up.test"]\nports = [{upstream_port}]\n'
        "allow_private_addresses = true\n"
        '[network.hosts]\n"up.test" = "127.0.0.1"\n"other.test" = "127.0.0.1"\n'
        f'[kubernetes]\nnamespace = "{NAMESPACE}"\nkubeconfig = "{kubeconfig}"\n'
        'ready_timeout_s = 90\nimage_pull_policy = "Never"\n'
        f'egress_proxy = "{SERVICE}"\negress_listen = "127.0.0.1:{listen_port}"\n'
    )


def _connect(source: str, port: int, target: str) -> tuple[socket.socket, bytes]:
    """A connection to the egress listener from `source` (bound first), asking CONNECT
    target: the socket and the answer's head."""
    sock = socket.socket()
    sock.settimeout(30)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            break
        head += chunk
    return sock, head


def _answer(source: str, port: int, target: str) -> bytes:
    sock, head = _connect(source, port, target)
    with sock:
        rest = b""
        while chunk := sock.recv(4096):
            rest += chunk
    return head + rest


def _pod_ip(api: MockApi, key: str) -> str:
    from stockade.supervisor.keys import sandbox_id

    found = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
    (pod,) = [
        p for p in found.get("items", []) if p["metadata"]["name"].endswith(f"-{sandbox_id(key)}")
    ]
    return str(pod["status"]["podIP"])


def test_an_egress_pod_goes_out_through_the_supervisors_proxy(
    kube: tuple[MockApi, Kubelet, Path], upstream: tuple[int, trustme.CA]
) -> None:
    api, kubelet, kubeconfig = kube
    upstream_port, ca = upstream
    listen_port = free_port()
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
    sup = Supervisor(
        "kubernetes", state, _config(kubeconfig, upstream_port, listen_port), engine_socket=""
    )
    sup.start()
    try:
        with sup.client() as client:
            box = client.sandbox("web")
            seen = box.exec("env | grep -i _proxy= | sort")
            assert seen.exit_code == 0, seen
            assert seen.stdout.splitlines() == [
                f"HTTPS_PROXY=http://{SERVICE}",
                f"HTTP_PROXY=http://{SERVICE}",
                "NO_PROXY=localhost,127.0.0.1,::1",
                f"http_proxy=http://{SERVICE}",
                f"https_proxy=http://{SERVICE}",
                "no_proxy=localhost,127.0.0.1,::1",
            ]
            info = client.get_sandbox("web")
            assert (info.network_mode, info.network_allow) == ("egress", ("up.test",))
            address = _pod_ip(api, "web")
            assert address.startswith("127.0.0.")
            assert address != "127.0.0.1"

            # from the pod's address: the allowed name, TLS to the test's server, verified
            sock, head = _connect(address, listen_port, f"up.test:{upstream_port}")
            assert head.startswith(b"HTTP/1.1 200"), head
            context = ssl.create_default_context()
            ca.configure_trust(context)
            with context.wrap_socket(sock, server_hostname="up.test") as tls:
                tls.sendall(b"out through the pod's proxy\n")
                assert tls.recv(100) == b"out through the pod's proxy\n"

            refused = _answer(address, listen_port, f"other.test:{upstream_port}")
            assert refused.startswith(b"HTTP/1.1 403"), refused
            assert b"not on the allowlist" in refused
            refused = _answer("127.0.0.250", listen_port, f"up.test:{upstream_port}")
            assert refused.startswith(b"HTTP/1.1 403"), refused
            assert b"127.0.0.250 is no running sandbox pod" in refused

            quiet = client.ensure_sandbox("quiet", network="none")
            assert quiet.network_mode == "none"
            refused = _answer(_pod_ip(api, "quiet"), listen_port, f"up.test:{upstream_port}")
            assert refused.startswith(b"HTTP/1.1 403"), refused
            assert b"network mode 'none', not egress" in refused

            deadline = time.monotonic() + 30
            while True:  # the audit is written in batches
                records = client.list_audit(sandbox_key="web", tool="network")
                quiet_records = client.list_audit(sandbox_key="quiet", tool="network")
                if (len(records) >= 2 and quiet_records) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            steps = sorted((r.is_error, r.policy_step) for r in records)
            assert steps == [
                (False, "egress: allowed by up.test"),
                (True, "egress: other.test is not on the allowlist"),
            ], steps
            (record,) = client.list_audit(sandbox_key="quiet", tool="network")
            assert record.is_error
            assert "network mode 'none', not egress" in record.policy_step
            for key in ("web", "quiet"):
                assert client.destroy_sandbox(key, delete_workspace=True)
        assert "egress proxy for pods on 127.0.0.1" in sup.log()
        assert not [e for e in kubelet.errors if "kube play" in e], kubelet.errors
    finally:
        sup.stop()
        shutil.rmtree(state, ignore_errors=True)
