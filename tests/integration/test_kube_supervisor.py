"""`stockade serve` with engine.kind = "kubernetes" against the tests' cluster (kubelet.py:
kmock's API and pods played by `podman kube play` on loopback addresses): a tool call makes
the sandbox's Secret, claim and pod from the real sandbox image, and reaches its agent over
mutual TLS as the sandbox uid; a restarted supervisor adopts the pod; a pod that dies is made
again on its claim (the files kept); destroying with the workspace deletes the claim."""

from __future__ import annotations

import base64
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.supervisor.kube.pki import Authority
from tests.integration.harness import Supervisor, bring_up
from tests.integration.kubelet import Kubelet, MockApi, cluster

NAMESPACE = "stockade"
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def kube() -> Iterator[tuple[MockApi, Kubelet, Path]]:
    bring_up("podman")  # the sandbox image
    with cluster(NAMESPACE) as (api, kubelet, kubeconfig):
        ca = Authority.create()
        data = {"tls.crt": ca.cert_pem, "tls.key": ca.key_pem}
        api.request(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/secrets",
            {
                "metadata": {"name": "stockade-agent-ca", "namespace": NAMESPACE},
                "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
            },
        )
        yield api, kubelet, kubeconfig


def _items(api: MockApi, resource: str) -> list[str]:
    found = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/{resource}")
    return sorted(item["metadata"]["name"] for item in found.get("items", []))


def test_sandboxes_as_pods(kube: tuple[MockApi, Kubelet, Path]) -> None:
    api, kubelet, kubeconfig = kube
    state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))  # short: the API's unix socket
    config = (
        '[sandbox]\nimage = "localhost/stockade-sandbox:latest"\n'
        f'[kubernetes]\nnamespace = "{NAMESPACE}"\nkubeconfig = "{kubeconfig}"\n'
        'ready_timeout_s = 90\nimage_pull_policy = "Never"\n'
    )
    sup = Supervisor("kubernetes", state, config, engine_socket="")
    sup.start()
    try:
        with sup.client() as client:
            box = client.sandbox("demo")
            ran = box.exec("id -u; echo kept > notes.txt")
            assert (ran.exit_code, ran.stdout) == (0, "65532\n"), ran
            assert box.read_file("notes.txt") == "kept\n"
        [pod] = _items(api, "pods")
        assert _items(api, "persistentvolumeclaims") == [f"stockade-ws-{pod.rsplit('-', 1)[1]}"]

        sup.stop()
        sup.start()
        assert "adopted 1 running sandbox(es)" in sup.log_path.read_text()
        with sup.client() as client:
            assert client.sandbox("demo").exec("cat notes.txt").stdout == "kept\n"
            killed = subprocess.run(["podman", "pod", "kill", pod], capture_output=True, text=True)
            assert killed.returncode == 0, killed.stderr
            deadline = time.monotonic() + 60
            while client.get_sandbox("demo").state != "EXITED":
                assert time.monotonic() < deadline, "the dead pod was never noticed"
                time.sleep(0.5)
            healed = client.sandbox("demo").exec("cat notes.txt")
            assert (healed.exit_code, healed.stdout) == (0, "kept\n"), healed
            assert client.get_sandbox("demo").heals == 1
            assert client.destroy_sandbox("demo", delete_workspace=True)
        assert _items(api, "pods") == []
        assert _items(api, "persistentvolumeclaims") == []
        assert _items(api, "secrets") == ["stockade-agent-ca"]
        assert not [e for e in kubelet.errors if "kube play" in e], kubelet.errors
    finally:
        sup.stop()
        shutil.rmtree(state, ignore_errors=True)
