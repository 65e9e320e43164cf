"""The tests' cluster (kubelet.py) itself: a pod stored in kmock runs under Podman, gets a
loopback address of its own once its readiness probe passes, reads its Secret volume as
files, keeps its claim's data for the next pod, and is removed when deleted from the API."""

from __future__ import annotations

import base64
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.harness import bring_up
from tests.integration.kubelet import Kubelet, MockApi, cluster

NAMESPACE = "kubelet-test"
PORT = 7443


@pytest.fixture(scope="module")
def kube() -> Iterator[tuple[MockApi, Kubelet]]:
    bring_up("podman")  # the image
    with cluster(NAMESPACE) as (api, kubelet, _config):
        yield api, kubelet


def pod(name: str, script: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "fsGroup": 65532},
            "containers": [
                {
                    "name": "main",
                    "image": "localhost/stockade-sandbox:latest",
                    "command": ["/usr/bin/tini", "--", "sh", "-c", script],
                    "ports": [{"containerPort": PORT}],
                    "readinessProbe": {"tcpSocket": {"port": PORT}},
                    "securityContext": {"readOnlyRootFilesystem": True},
                    "volumeMounts": [
                        {"name": "tls", "mountPath": "/run/tls", "readOnly": True},
                        {"name": "data", "mountPath": "/data"},
                        {"name": "tmp", "mountPath": "/tmp"},
                    ],
                }
            ],
            "volumes": [
                {"name": "tls", "secret": {"secretName": f"{name}-s", "defaultMode": 0o440}},
                {"name": "data", "persistentVolumeClaim": {"claimName": claim}},
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    }


def secret(name: str, value: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {"key.pem": base64.b64encode(value).decode()},
    }


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return str(reply.read().decode())


def test_a_pod_runs_reads_its_secret_keeps_its_claim_and_goes(
    kube: tuple[MockApi, Kubelet],
) -> None:
    api, kubelet = kube
    base = f"/api/v1/namespaces/{NAMESPACE}"
    serve = (
        "cat /run/tls/key.pem > /tmp/k; stat -c '%a %u %g' /run/tls/key.pem >> /tmp/k; "
        "cat /data/note 2>/dev/null >> /tmp/k; echo kept > /data/note; id -u >> /tmp/k; "
        f"exec python3 -m http.server {PORT} --directory /tmp"
    )
    api.request("POST", f"{base}/secrets", secret("one-s", b"s3cret\n"))
    api.request("POST", f"{base}/pods", pod("one", serve, "claim-a"))
    played = kubelet.wait_ready("one")
    assert played.ready, kubelet.errors
    status = api.request("GET", f"{base}/pods/one")["status"]
    assert status["phase"] == "Running"
    assert status["podIP"] == played.address
    assert played.address.startswith("127.0.0.")
    assert played.address != "127.0.0.1"
    assert get(f"http://{played.address}:{PORT}/k").split("\n") == [
        "s3cret", "440 0 65532", "65532", "",
    ]  # fmt: skip
    api.request("DELETE", f"{base}/pods/one")
    deadline = time.monotonic() + 30
    while "one" in kubelet.pods and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "one" not in kubelet.pods
    assert subprocess.run(["podman", "pod", "exists", "one"]).returncode == 1
    api.request("POST", f"{base}/secrets", secret("two-s", b"other\n"))
    api.request("POST", f"{base}/pods", pod("two", serve, "claim-a"))
    played = kubelet.wait_ready("two")
    assert get(f"http://{played.address}:{PORT}/k").split("\n")[2] == "kept"
    assert not kubelet.errors


def test_a_pod_whose_process_ends_is_reported_failed(kube: tuple[MockApi, Kubelet]) -> None:
    api, kubelet = kube
    base = f"/api/v1/namespaces/{NAMESPACE}"
    api.request("POST", f"{base}/secrets", secret("three-s", b"x"))
    api.request("POST", f"{base}/pods", pod("three", "exit 3", "claim-b"))
    played = kubelet.wait_ready("three")
    assert played.ended
    assert api.request("GET", f"{base}/pods/three")["status"]["phase"] == "Failed"
