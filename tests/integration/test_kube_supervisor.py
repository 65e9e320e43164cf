"""`stockade serve` with engine.kind = "kubernetes" against the tests' cluster (kubelet.py:
kmock's API and pods played by `podman kube play` on loopback addresses): a tool call makes
the sandbox's Secret, claim and pod from the real sandbox image, and reaches its agent over
mutual TLS as the sandbox uid; a restarted supervisor adopts the pod; a pod that dies is made
again on its claim (the files kept); destroying with the workspace deletes the claim; with a
warm pool, a new key's first call runs in a pod started ahead."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from stockade.client import ApprovalRequest
from tests.integration.harness import Supervisor
from tests.integration.kubelet import Kubelet, MockApi
from tests.integration.test_shared_state import ASKER, Approver, until
from tests.pg import postgres_server

NAMESPACE = "stockade"
pytestmark = pytest.mark.timeout(600)


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


GREETER = "python3 -c \"name = input('name? '); print('hello', name)\""


def _config(kubeconfig: Path, extra: str = "") -> str:
    return (
        '[sandbox]\nimage = "localhost/stockade-sandbox:latest"\n'
        f'[kubernetes]\nnamespace = "{NAMESPACE}"\nkubeconfig = "{kubeconfig}"\n'
        'ready_timeout_s = 90\nimage_pull_policy = "Never"\n' + extra
    )


@contextmanager
def _supervisors(kubeconfig: Path, count: int, extra: str = "") -> Iterator[list[Supervisor]]:
    """`count` replicas of one installation: each its own state directory, one namespace."""
    started: list[Supervisor] = []
    try:
        for _ in range(count):
            state = Path(tempfile.mkdtemp(prefix="stk", dir="/tmp"))
            sup = Supervisor("kubernetes", state, _config(kubeconfig, extra), engine_socket="")
            started.append(sup)
            sup.start()
        yield started
    finally:
        for sup in started:
            sup.stop()
            print(sup.log_path.read_text()[-3000:]) if sup.log_path.exists() else None
            shutil.rmtree(sup.state_dir, ignore_errors=True)


def _pod_of(api: MockApi, name: str) -> dict[str, Any]:
    return dict(api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"))


def test_the_tool_suite_runs_in_a_restricted_pod(
    kube: tuple[MockApi, Kubelet, Path], tmp_path: Path
) -> None:
    """Every kind of call through the one pipeline reaches the pod's agent over mutual TLS,
    and the pod is what Pod Security "restricted" asks, seen from inside and in its spec."""
    api, _kubelet, kubeconfig = kube
    with _supervisors(kubeconfig, 1) as [sup], sup.client() as client:
        key = "suite"
        box = client.sandbox(key)
        ran = box.exec("id -g; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status")
        assert ran.exit_code == 0, ran
        assert ran.stdout.startswith("65532\n")
        assert "CapEff:\t0000000000000000" in ran.stdout
        assert "CapBnd:\t0000000000000000" in ran.stdout
        assert "NoNewPrivs:\t1" in ran.stdout
        assert "Seccomp:\t2" in ran.stdout
        assert box.exec("touch /etc/x").exit_code != 0  # read-only root file system

        box.write_file("notes/a.txt", "one\ntwo\n")
        box.edit_file("notes/a.txt", "two", "three")
        assert box.read_file("notes/a.txt") == "one\nthree\n"
        assert "notes/a.txt" in str(box.glob("**/*.txt"))
        assert "three" in str(box.search("thr"))

        streamed = list(client.call_stream(key, "exec", {"command": "echo a; echo b >&2"}))
        assert streamed

        with box.interact(GREETER) as session:
            assert session.read_until("name? ") == "name? "
            session.send("pod\n")
            assert session.read_until("\n") == "hello pod\n"
            assert not session.wait().is_error

        source = tmp_path / "up.bin"
        source.write_bytes(bytes(range(256)) * 400)
        assert client.upload(key, "data/up.bin", source).size == 102_400
        client.download(key, "data/up.bin", tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == source.read_bytes()

        started = box.call("process", {"action": "start", "command": "sleep 300"})
        assert not started.is_error, started.error_message
        killed = box.call("process", {"action": "kill", "id": started.data["id"]})
        assert not killed.is_error, killed.error_message

        spec = _pod_of(api, box.info().container_name)["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["enableServiceLinks"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        agent = spec["containers"][0]
        assert agent["securityContext"]["allowPrivilegeEscalation"] is False
        assert agent["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert agent["securityContext"]["readOnlyRootFilesystem"] is True
        assert "--listen" in agent["command"]
        assert "--tls-dir" in agent["command"]
        assert client.destroy_sandbox(key, delete_workspace=True)


def test_two_replicas_serve_one_key_from_one_pod(kube: tuple[MockApi, Kubelet, Path]) -> None:
    """Any replica serves any key: the second takes over the pod the first made (a Get
    through it, before any call there, already sees it), and destroys it."""
    api, _kubelet, kubeconfig = kube
    with _supervisors(kubeconfig, 2) as [one, two], one.client() as first, two.client() as second:
        first.sandbox("shared").write_file("from-one.txt", "1\n")
        name = first.sandbox("shared").info().container_name
        assert second.get_sandbox("shared").container_name == name  # before any call there
        assert second.sandbox("shared").exec("cat from-one.txt").stdout == "1\n"
        assert [p for p in _items(api, "pods") if p == name] == [name]
        assert second.destroy_sandbox("shared", delete_workspace=True)
        assert name not in _items(api, "pods")


def test_concurrent_first_calls_through_two_replicas_make_one_pod(
    kube: tuple[MockApi, Kubelet, Path],
) -> None:
    """Two replicas sharing PostgreSQL (state.url): first calls of one new key through both
    at once make one pod, and both calls run in it. The key's lock is every replica's (its
    unit test: test_manager_shared_state.py); the API server's unique pod names back it up
    (a replica whose create meets the other's pod takes that pod:
    engines/backends/kubernetes/backend.py)."""
    api, _kubelet, kubeconfig = kube
    with postgres_server() as pg:
        extra = f'[state]\nurl = "{pg.url}"\n'
        with _supervisors(kubeconfig, 2, extra) as sups, ExitStack() as stack:
            clients = [stack.enter_context(s.client()) for s in sups]
            for round_ in range(3):
                key = f"race-{round_}"
                with ThreadPoolExecutor(2) as pool:
                    calls = [
                        pool.submit(c.sandbox(key).exec, "cat /proc/sys/kernel/hostname")
                        for c in clients
                    ]
                    outs = [c.result() for c in calls]
                assert [o.exit_code for o in outs] == [0, 0], outs
                names = {c.sandbox(key).info().container_name for c in clients}
                assert len(names) == 1
                made = [p for p in _items(api, "pods") if p in names]
                assert len(made) == 1
                assert clients[0].destroy_sandbox(key, delete_workspace=True)


def test_a_pod_idle_at_every_replica_is_removed_and_its_workspace_kept(
    kube: tuple[MockApi, Kubelet, Path],
) -> None:
    """Replicas share the pod; only its agent sees every replica's calls. A replica whose
    own calls stopped lets the pod go while the other still calls it, and the pod is removed
    once the agent too has served nobody for idle_timeout_s; the next call makes it again on
    the same claim, files kept."""
    api, _kubelet, kubeconfig = kube
    with postgres_server() as pg:
        extra = (
            f'[state]\nurl = "{pg.url}"\n[housekeeping]\nidle_timeout_s = 4\nsweep_interval_s = 1\n'
        )
        with _supervisors(kubeconfig, 2, extra) as [one, two], ExitStack() as stack:
            first, second = stack.enter_context(one.client()), stack.enter_context(two.client())
            first.sandbox("idle").write_file("kept.txt", "1\n")
            name = first.sandbox("idle").info().container_name
            for _ in range(8):  # two keeps calling past one's idle timeout
                assert second.sandbox("idle").exec("true").exit_code == 0
                time.sleep(1)
            assert name in _items(api, "pods")  # one let it go; it was never idle everywhere
            until(lambda: name not in _items(api, "pods"), "the idle pod removed", timeout=30)
            assert "stockade-ws-" + name.split("-", 2)[2] in _items(api, "persistentvolumeclaims")
            assert first.sandbox("idle").exec("cat kept.txt").stdout == "1\n"
            assert first.destroy_sandbox("idle", delete_workspace=True)


def test_sandbox_secrets_reach_the_pod_through_its_secret(
    kube: tuple[MockApi, Kubelet, Path],
) -> None:
    """[sandbox] secrets: the tools see the variable, the pod object the API serves (readable
    by whoever may read pods) holds only a reference to the sandbox's Secret, and both go with
    the sandbox. Output still has the value scrubbed, so the test compares its digest."""
    api, _kubelet, kubeconfig = kube
    value = "sk-e2e-" + secrets.token_hex(12)
    extra = f'[sandbox.secrets]\nAPI_KEY = "{value}"\n'
    with _supervisors(kubeconfig, 1, extra) as [sup], sup.client() as client:
        box = client.sandbox("secretive")
        shown = box.exec("printenv API_KEY")
        assert shown.exit_code == 0, shown
        assert value not in shown.stdout  # scrubbed from output, as on the host kinds
        digest = box.exec("printenv API_KEY | tr -d '\\n' | sha256sum")
        assert digest.stdout.split()[0] == hashlib.sha256(value.encode()).hexdigest(), digest
        assert box.exec("ls /run/stockade/tls").stdout.split() == ["ca.crt", "tls.crt", "tls.key"]

        info = client.get_sandbox("secretive")
        sid = info.container_name.rsplit("-", 1)[1]
        assert info.workspace_path == f"pvc://{NAMESPACE}/stockade-ws-{sid}"
        pod = json.dumps(_pod_of(api, info.container_name))
        assert value not in pod
        assert base64.b64encode(value.encode()).decode() not in pod
        secret = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/stockade-agent-{sid}")
        assert base64.b64decode(secret["data"]["env.API_KEY"]).decode() == value
        assert client.destroy_sandbox("secretive", delete_workspace=True)
    assert _items(api, "secrets") == ["stockade-agent-ca"]
    deadline = time.monotonic() + 30  # the kubelet's copy goes with the pod, when it sees it
    while f"stockade-agent-{sid}" in _podman_secrets():
        assert time.monotonic() < deadline, "the kubelet's Podman secret outlived the pod"
        time.sleep(0.2)


def _podman_secrets() -> str:
    listed = subprocess.run(
        ["podman", "secret", "ls", "--format", "{{.Name}}"], capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr
    return listed.stdout


def test_an_approval_asked_through_one_replica_is_answered_through_the_other(
    kube: tuple[MockApi, Kubelet, Path],
) -> None:
    """Replicas share the installation's instance id (their pods' names) but are each their
    own in the shared state: a call waiting on one proceeds when the other's approver says
    yes."""
    with postgres_server() as pg:
        extra = (
            f'[state]\nurl = "{pg.url}"\n'
            '[agents.asker]\napprovals = "always"\n[approvals]\ntimeout_s = 60.0\n'
        )
        with _supervisors(kubeconfig_of(kube), 2, extra) as [one, two], one.client() as asking:
            approver = Approver(two.client(), "allow-once")
            try:
                until(lambda: asking.list_approvals().approvers == 1, "one never saw two's")
                result = asking.call("ap", "exec", {"command": "echo approved"}, context=ASKER)
                assert result.stdout == "approved\n", result
                requests = [e for e in approver.events if isinstance(e, ApprovalRequest)]
                assert [r.command for r in requests] == ["echo approved"]
            finally:
                approver.close()
            assert asking.destroy_sandbox("ap", delete_workspace=True)


def kubeconfig_of(kube: tuple[MockApi, Kubelet, Path]) -> Path:
    return kube[2]


def _pod(api: MockApi, name: str) -> dict[str, Any]:
    found: dict[str, Any] = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    return found


def _pool_pods(api: MockApi, ready: bool = True) -> list[str]:
    """The unclaimed warm-pool pods (Ready ones only, unless told)."""
    found = []
    for name in _items(api, "pods"):
        pod = _pod(api, name)
        labels = pod["metadata"].get("labels") or {}
        conditions = (pod.get("status") or {}).get("conditions") or []
        is_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        unclaimed = "io.stockade.pool" in labels and "io.stockade.sandbox-id" not in labels
        if unclaimed and (is_ready or not ready):
            found.append(name)
    return found


def _wait_for_pool(api: MockApi, but: set[str], what: str) -> str:
    deadline = time.monotonic() + 120
    while True:
        fresh = [name for name in _pool_pods(api) if name not in but]
        if fresh:
            return fresh[0]
        assert time.monotonic() < deadline, f"no {what} warm-pool pod came: {_items(api, 'pods')}"
        time.sleep(0.5)


def test_a_new_keys_first_call_is_served_by_the_warm_pool(
    kube: tuple[MockApi, Kubelet, Path],
) -> None:
    """With warm_pool = 1 a pod is started ahead; the first call of a new key runs in that very
    pod, relabeled as the key's (its address and workspace claim unchanged), and the pool
    fills again with another."""
    api, kubelet, kubeconfig = kube
    extra = "[housekeeping]\nwarm_pool = 1\n"
    with _supervisors(kubeconfig, 1, extra) as [sup], sup.client() as client:
        pooled = _wait_for_pool(api, set(), "first")
        address = kubelet.pods[pooled].address
        claim = next(
            v["persistentVolumeClaim"]["claimName"]
            for v in _pod(api, pooled)["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        )
        assert claim == "stockade-ws-" + pooled.split("-", 2)[2]  # its own, by pool id

        box = client.sandbox("fresh")
        ran = box.exec("id -u; echo mine > notes.txt; cat notes.txt")
        assert (ran.exit_code, ran.stdout) == (0, "65532\nmine\n"), ran
        assert box.info().container_name == pooled
        labels = _pod(api, pooled)["metadata"]["labels"]
        assert labels["io.stockade.key"] == "fresh"
        sid = labels["io.stockade.sandbox-id"]
        assert "io.stockade.replica" not in labels
        assert kubelet.pods[pooled].address == address  # the same pod, never played again
        assert f"stockade-{pooled.split('-')[1]}-{sid}" not in _items(api, "pods")
        assert client.get_sandbox("fresh").workspace_path == f"pvc://{NAMESPACE}/{claim}"

        again = _wait_for_pool(api, {pooled}, "second")  # the pool refills
        assert again != pooled
        assert box.read_file("notes.txt") == "mine\n"
        assert client.destroy_sandbox("fresh", delete_workspace=True)
        assert pooled not in _items(api, "pods")
        assert claim not in _items(api, "persistentvolumeclaims")
    # at stop the unclaimed pool pod goes, with its claim and Secret
    assert _items(api, "pods") == []
    assert _items(api, "persistentvolumeclaims") == []
    assert _items(api, "secrets") == ["stockade-agent-ca"]
    assert not [e for e in kubelet.errors if "kube play" in e], kubelet.errors
