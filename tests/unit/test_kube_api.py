"""engines/backends/kubernetes/api.py against an emulated API server over real HTTP (kmock,
tests/unit/kube_mock.py), through the official client: reads, creates, deletes and lists, a pod's
watch until Ready (including 410 Gone and broken streams), retries on 5xx, 429 and slow answers,
and the errors an operator gets when the server cannot be reached or refuses."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import kmock
import pytest

from stockade.supervisor.config.sandbox import KubernetesConfig
from stockade.supervisor.engines.backends.kubernetes.api import KubeApi, Timeouts, load_client
from stockade.supervisor.errors import ConfigError, EngineUnavailable, SandboxBroken
from tests.unit.kube_mock import NAMESPACE, KubeMock

FAST = Timeouts(connect_s=2, read_s=1, attempts=4, backoff_s=0.02, watch_window_s=2)
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def api_for(kube: KubeMock, tmp_path: Path, timeouts: Timeouts = FAST) -> KubeApi:
    config = KubernetesConfig(namespace=NAMESPACE, kubeconfig=str(kube.kubeconfig(tmp_path)))
    return KubeApi(load_client(config), NAMESPACE, timeouts)


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {"containers": [{"name": "agent", "image": "stockade-sandbox:test"}]},
    }


def later(seconds: float, act: Any) -> threading.Thread:
    """Do `act` after a while on another thread (the kubelet's part, while the API waits)."""

    def run() -> None:
        time.sleep(seconds)
        act()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_read_create_list_delete(kube: KubeMock, tmp_path: Path) -> None:
    api = api_for(kube, tmp_path)
    assert api.version() == "v1.30.0-kmock"
    assert api.read("pod", "p1") is None
    made = api.create("pod", pod("p1", app="stockade", owner="a"))
    assert made is not None
    assert made["metadata"]["name"] == "p1"
    assert api.create("pod", pod("p1")) is None  # 409: one of that name is there
    api.create("pod", pod("p2", app="stockade", owner="b"))
    found = api.list("pod", {"app": "stockade", "owner": "a"})
    assert [p["metadata"]["name"] for p in found] == ["p1"]  # kmock ignores the selector
    assert any("labelSelector=app=stockade,owner=a" in path for _, path in kube.requests())
    assert api.delete("pod", "p1") is True
    assert api.delete("pod", "p1") is False
    assert kube.names("pod") == ["p2"]


def test_secrets_and_claims(kube: KubeMock, tmp_path: Path) -> None:
    api = api_for(kube, tmp_path)
    api.create("secret", {"metadata": {"name": "s1"}, "data": {"tls.crt": "Y2VydA=="}})
    api.create(
        "claim",
        {
            "metadata": {"name": "c1"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    assert (api.read("secret", "s1") or {})["data"] == {"tls.crt": "Y2VydA=="}
    assert (api.read("claim", "c1") or {})["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert api.delete("claim", "c1")
    assert api.read("claim", "c1") is None


def test_5xx_then_success_is_retried(kube: KubeMock, tmp_path: Path) -> None:
    api = api_for(kube, tmp_path)
    kube.put("pod", pod("p1"))
    kube.react(lambda k: k[f"get {PODS}/p1"][:2] << 503)
    assert (api.read("pod", "p1") or {})["metadata"]["name"] == "p1"
    assert [m for m, p in kube.requests() if p == f"{PODS}/p1"] == ["GET"] * 3


def test_429_honours_retry_after(kube: KubeMock, tmp_path: Path) -> None:
    api = api_for(kube, tmp_path)
    kube.put("pod", pod("p1"))
    kube.react(lambda k: k[f"get {PODS}/p1"][:1] << 429 << {"Retry-After": "1"})
    started = time.monotonic()
    assert api.read("pod", "p1") is not None
    assert time.monotonic() - started >= 0.9  # the server's pause, not the 0.02 s backoff


def test_a_create_whose_answer_failed_is_found_on_retry(kube: KubeMock, tmp_path: Path) -> None:
    """The server made the pod but answered 500: the retry meets 409, which is the caller's
    to judge (None), not an error."""
    api = api_for(kube, tmp_path)
    kube.react(lambda k: k[f"post {PODS}"][:1] << 500)
    assert api.create("pod", pod("p1")) is None
    assert kube.names("pod") == ["p1"]


def test_persistent_5xx_is_engine_unavailable(kube: KubeMock, tmp_path: Path) -> None:
    api = api_for(kube, tmp_path)
    kube.react(lambda k: k[f"get {PODS}/p1"] << 500 << {"message": "etcd is down"})
    with pytest.raises(EngineUnavailable, match=r"failed to read pod p1 after 4 tries: 500"):
        api.read("pod", "p1")
    assert len([p for _, p in kube.requests() if p == f"{PODS}/p1"]) == 4


def test_forbidden_is_not_retried_and_names_the_role(kube: KubeMock, tmp_path: Path) -> None:
    api = api_for(kube, tmp_path)
    status = {"kind": "Status", "code": 403, "message": 'pods is forbidden: User "x" cannot list'}
    kube.react(lambda k: k[f"get {PODS}"] << 403 << status)
    with pytest.raises(EngineUnavailable) as caught:
        api.list("pod", {"a": "b"})
    assert "refuses to list pods in namespace stockade (403: pods is forbidden" in str(caught.value)
    assert "pods create, get, list, watch, patch, delete" in str(caught.value)
    assert "deploy/kubernetes/rbac.yaml" in str(caught.value)
    assert len([p for _, p in kube.requests() if p.startswith(PODS)]) == 1


def test_a_slow_answer_times_out_and_is_asked_again(kube: KubeMock, tmp_path: Path) -> None:
    api = api_for(kube, tmp_path)
    kube.put("pod", pod("p1"))
    kube.react(lambda k: k[f"get {PODS}/p1"][:1] << (lambda: asyncio.sleep(3)) << {})
    started = time.monotonic()
    assert (api.read("pod", "p1") or {})["metadata"]["name"] == "p1"
    assert 1 <= time.monotonic() - started < 3  # the read timeout (1 s), not the 3 s answer


def test_an_answer_that_never_comes_is_engine_unavailable(kube: KubeMock, tmp_path: Path) -> None:
    api = api_for(kube, tmp_path, Timeouts(connect_s=1, read_s=0.5, attempts=2, backoff_s=0.01))
    kube.react(lambda k: k[f"get {PODS}/p1"] << (lambda: asyncio.sleep(5)) << {})
    started = time.monotonic()
    with pytest.raises(EngineUnavailable, match="cannot be reached to read pod p1"):
        api.read("pod", "p1")
    assert time.monotonic() - started < 2.5


def test_no_server_is_engine_unavailable(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a loopback port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: m, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: m, user: u}}]\n"
    )
    api = KubeApi(load_client(KubernetesConfig(kubeconfig=str(config))), NAMESPACE, FAST)
    with pytest.raises(EngineUnavailable, match=rf"127.0.0.1:{port} cannot be reached"):
        api.version()


def test_a_kubeconfig_that_cannot_be_loaded_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot load kubernetes\.kubeconfig"):
        load_client(KubernetesConfig(kubeconfig=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="in-cluster service account"):
        load_client(KubernetesConfig())  # not in a pod


def test_wait_ready_follows_the_watch(kube: KubeMock, tmp_path: Path) -> None:
    api = api_for(kube, tmp_path)
    kube.put("pod", pod("p1"))
    kube.put("pod", pod("other"))
    kubelet = later(0.5, lambda: (kube.set_ready("other", "127.0.0.9"), kube.set_ready("p1")))
    ready = api.wait_ready("p1", 10)
    kubelet.join()
    assert ready["status"]["podIP"] == "127.0.0.5"
    watches = [p for _, p in kube.requests() if "watch=true" in p]
    assert len(watches) == 1
    assert "fieldSelector=metadata.name=p1" in watches[0]


def test_a_410_gone_watch_is_started_again_from_a_fresh_read(
    kube: KubeMock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "stockade")
    api = api_for(kube, tmp_path)
    kube.put("pod", {**pod("p1"), "metadata": {"name": "p1", "resourceVersion": "10"}})
    gone = {
        "type": "ERROR",
        "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
    }

    async def expire(request: kmock.Request) -> bytes:
        moved = {"metadata": {"resourceVersion": "20"}}  # the pod moved on meanwhile
        async with kube.handler.patch(f"{PODS}/p1", json=moved) as response:
            assert response.status == 200
        return json.dumps(gone).encode() + b"\n"  # one event, as a server streams it

    kube.react(lambda k: k[kmock.action.WATCH, kmock.resource("v1/pods")][:1] << expire)
    kubelet = later(1.0, lambda: kube.set_ready("p1"))
    assert api.wait_ready("p1", 10)["status"]["podIP"] == "127.0.0.5"
    kubelet.join()
    seen = kube.requests()
    watches = [p for _, p in seen if "watch=true" in p]
    # the error event was understood: a read and the second watch came at once, before
    # the pod was ready (not after a quiet window)
    assert [m for m, p in seen if p.endswith("/pods/p1/status")] == ["PATCH"]
    ready_at = seen.index(("PATCH", f"{PODS}/p1/status"))
    assert ("GET", watches[1]) in seen[:ready_at]
    assert "watch of pod p1 expired (410 Gone)" in caplog.text
    assert "resourceVersion=10" in watches[0]
    assert "resourceVersion=20" in watches[1]


def test_a_quiet_or_broken_watch_is_read_again(kube: KubeMock, tmp_path: Path) -> None:
    """A watch that ends without news (the window) or breaks (a 500 on the stream) is
    followed by a read: a Ready missed meanwhile is still seen."""
    api = api_for(kube, tmp_path, Timeouts(read_s=1, attempts=4, backoff_s=0.02, watch_window_s=1))
    kube.put("pod", pod("p1"))
    kube.react(lambda k: k[kmock.action.WATCH, kmock.resource("v1/pods")][:1] << 500)
    kubelet = later(1.5, lambda: kube.set_ready("p1"))
    assert api.wait_ready("p1", 10)["status"]["podIP"] == "127.0.0.5"
    kubelet.join()
    assert len([p for _, p in kube.requests() if "watch=true" in p]) >= 2


def test_wait_ready_times_out_saying_why(kube: KubeMock, tmp_path: Path) -> None:
    api = api_for(kube, tmp_path)
    kube.put("pod", pod("p1"))
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient memory.",
    }
    pending = {"status": {"phase": "Pending", "conditions": [unschedulable]}}
    kube.patch("pod", "p1", pending, "status")
    started = time.monotonic()
    with pytest.raises(SandboxBroken) as caught:
        api.wait_ready("p1", 1.5)
    assert time.monotonic() - started < 4
    assert "not ready within 1.5 s" in str(caught.value)
    assert "Unschedulable 0/3 nodes are available: 3 Insufficient memory." in str(caught.value)


@pytest.mark.parametrize(
    ("status", "words"),
    [
        ({"phase": "Failed", "message": "OOMKilled"}, r"ended \(Failed\): phase Failed; OOMKilled"),
        (
            {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "agent",
                        "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "no"}},
                    }
                ],
            },
            "cannot start: phase Pending; container agent waiting: ErrImageNeverPull",
        ),
    ],
)
def test_a_pod_that_never_serves_is_given_up_at_once(
    kube: KubeMock, tmp_path: Path, status: dict[str, Any], words: str
) -> None:
    api = api_for(kube, tmp_path)
    kube.put("pod", pod("p1"))
    kubelet = later(0.3, lambda: kube.patch("pod", "p1", {"status": status}, "status"))
    started = time.monotonic()
    with pytest.raises(SandboxBroken, match=words):
        api.wait_ready("p1", 30)
    kubelet.join()
    assert time.monotonic() - started < 5


def test_a_pod_deleted_while_waited_for(kube: KubeMock, tmp_path: Path) -> None:
    api = api_for(kube, tmp_path)
    kube.put("pod", pod("p1"))
    deleter = later(0.3, lambda: kube._http("DELETE", f"{PODS}/p1"))
    with pytest.raises(SandboxBroken, match="deleted before it was ready"):
        api.wait_ready("p1", 30)
    deleter.join()


def test_a_missing_namespace(kube: KubeMock, tmp_path: Path) -> None:
    """Listing in a namespace with nothing (kmock: not even the resource) finds nothing;
    creating there says which namespace is missing."""
    config = KubernetesConfig(namespace="elsewhere", kubeconfig=str(kube.kubeconfig(tmp_path)))
    api = KubeApi(load_client(config), "elsewhere", FAST)
    kube.react(lambda k: k["post /api/v1/namespaces/elsewhere/pods"] << 404)
    kube.react(lambda k: k["get /api/v1/namespaces/elsewhere/pods"] << 404)
    assert api.list("pod", {"a": "b"}) == []
    with pytest.raises(EngineUnavailable, match=r"namespace elsewhere .* does not exist"):
        api.create("pod", pod("p1"))


def _patches(kube: KubeMock) -> list[tuple[str, str, Any]]:
    """(path, content type, body) of every PATCH served so far."""

    async def run() -> list[tuple[str, str, Any]]:
        return [
            (r.url.path, r.headers.get("Content-Type", ""), json.loads(r.body or b"null"))
            for r in list(kube.handler)
            if str(r.method.value) == "PATCH"
        ]

    return asyncio.run_coroutine_threadsafe(run(), kube._loop).result(10)


def test_a_patch_is_a_json_merge_patch(kube: KubeMock, tmp_path: Path) -> None:
    """The official client would send a dict as json-patch+json, which a server refuses: the
    content type is set to merge-patch+json, and a null removes a label."""
    api = api_for(kube, tmp_path)
    api.create("pod", pod("p1", a="1", b="2"))
    body = {"metadata": {"labels": {"a": "one", "b": None, "c": "3"}}}
    patched = api.patch("pod", "p1", body)
    assert patched is not None
    assert patched["metadata"]["labels"] == {"a": "one", "c": "3"}
    assert _patches(kube) == [(f"{PODS}/p1", "application/merge-patch+json", body)]
    assert api.patch("pod", "gone", body) is None  # 404: no such pod


def test_a_patch_conflict_or_failure_is_engine_unavailable(kube: KubeMock, tmp_path: Path) -> None:
    api = api_for(kube, tmp_path)
    api.create("pod", pod("p1"))
    kube.react(lambda k: k[f"patch {PODS}/p1"][:1] << 409 << {"message": "changed"})
    with pytest.raises(EngineUnavailable, match=r"patch pod p1: it was changed meanwhile \(409"):
        api.patch("pod", "p1", {"metadata": {"labels": {"a": "b"}}})
    kube.react(lambda k: k[f"patch {PODS}/p1"] << 500 << {"message": "etcd is down"})
    with pytest.raises(EngineUnavailable, match=r"failed to patch pod p1 after 4 tries: 500"):
        api.patch("pod", "p1", {"metadata": {"labels": {"a": "b"}}})
    assert len([p for m, p in kube.requests() if m == "PATCH"]) == 5  # 409 is not asked again
