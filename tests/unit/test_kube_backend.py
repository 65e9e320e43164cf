"""KubernetesBackend (engines/backends/kubernetes/backend.py) against kmock's emulated API server
over HTTP, the test playing the kubelet: what run() makes (the agent Secret, the claim, the pod)
and how it waits, 409 conflicts (its own pod, another supervisor's, a claim not Stockade's), a pod
that never gets ready, removal that keeps the claim, adoption's list by labels (annotation-carried
ones too), the views of a pod, and what a pod cannot do."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from stockade.supervisor.config.sandbox import KubernetesConfig
from stockade.supervisor.engines.backends import create_backend
from stockade.supervisor.engines.backends.base import (
    LABEL_INSTANCE,
    LABEL_KEY,
    LABEL_MANAGED,
    LABEL_SANDBOX_ID,
    LABEL_STATE_DIR,
    ContainerSpec,
)
from stockade.supervisor.engines.backends.kubernetes.api import KubeApi, Timeouts, load_client
from stockade.supervisor.engines.backends.kubernetes.backend import (
    KubernetesBackend,
    pod_agent_args,
)
from stockade.supervisor.engines.backends.kubernetes.pki import Authority, agent_server_name
from stockade.supervisor.engines.userns import IdMaps
from stockade.supervisor.errors import ConfigError, EngineUnavailable, SandboxBroken, Unsupported
from tests.unit.kube_mock import NAMESPACE, Kubelet, KubeMock

SID = "0123456789abcdef"
INSTANCE = "inst0001aaaa"
POD = f"stockade-{INSTANCE[:8]}-{SID}"
FAST = Timeouts(connect_s=2, read_s=2, attempts=3, backoff_s=0.02, watch_window_s=2)
COMMAND = (
    *("--socket", "/run/stockade/agent.sock", "--workspace", "/workspace"),
    *("--user", "65532:65532", "--max-output-bytes", "4096", "--max-processes", "3"),
)


@pytest.fixture
def ca(kube: KubeMock) -> Authority:
    """The installation's CA, in its Secret as the deployment keeps it."""
    authority = Authority.create()
    data = {"tls.crt": authority.cert_pem, "tls.key": authority.key_pem}
    kube.put(
        "secret",
        {
            "metadata": {"name": "stockade-agent-ca", "namespace": NAMESPACE},
            "type": "kubernetes.io/tls",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        },
    )
    return authority


def backend_for(
    kube: KubeMock, tmp_path: Path, ready_timeout_s: float = 10, **settings: Any
) -> KubernetesBackend:
    config = KubernetesConfig(
        namespace=NAMESPACE,
        kubeconfig=str(kube.kubeconfig(tmp_path)),
        ready_timeout_s=ready_timeout_s,
        **settings,
    )
    return KubernetesBackend(config, KubeApi(load_client(config), NAMESPACE, FAST))


def spec(instance: str = INSTANCE, sid: str = SID) -> ContainerSpec:
    return ContainerSpec(
        name=f"stockade-{instance[:8]}-{sid}",
        image="stockade-sandbox:test",
        command=COMMAND,
        labels={
            LABEL_MANAGED: "1",
            LABEL_INSTANCE: instance,
            LABEL_KEY: "team/a key",  # not a label value: carried as an annotation
            LABEL_SANDBOX_ID: sid,
            LABEL_STATE_DIR: "/var/lib/stockade",
        },
        mounts=(),
        user="0:0",
        read_only_root=True,
        drop_all_capabilities=True,
        no_new_privileges=True,
        memory_bytes=512 << 20,
        nano_cpus=1_500_000_000,
        pids_limit=256,
        nofile=1024,
        nproc=16384,
        tmpfs={"/tmp": 64 << 20},
    )


def prepared() -> tuple[list[IdMaps], Any]:
    seen: list[IdMaps] = []
    return seen, seen.append


def test_run_makes_secret_claim_and_pod_and_waits_for_ready(
    kube: KubeMock, ca: Authority, tmp_path: Path
) -> None:
    backend = backend_for(kube, tmp_path)
    assert backend.ping() == "v1.30.0-kmock"
    seen, prepare = prepared()
    kubelet = Kubelet(kube, tmp_path, 7443, agents=False)
    try:
        info = backend.run(spec(), prepare)
    finally:
        kubelet.close()
    assert len(seen) == 1  # the host folder's hand-over, before the pod exists
    assert info.name == info.id == POD
    assert info.running
    assert info.address == kubelet.played[POD]
    assert info.labels[LABEL_KEY] == "team/a key"  # annotation-carried, merged back
    assert info.labels[LABEL_SANDBOX_ID] == SID
    pod = kube.get("pod", POD)
    assert pod is not None
    container = pod["spec"]["containers"][0]
    assert container["command"][-4:] == ["--max-output-bytes", "4096", "--max-processes", "3"]
    assert "--socket" not in container["command"]
    assert "--user" not in container["command"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["workspace"]["persistentVolumeClaim"]["claimName"] == f"stockade-ws-{SID}"
    assert volumes["tls"]["secret"]["secretName"] == f"stockade-agent-{SID}"
    secret = kube.get("secret", f"stockade-agent-{SID}")
    assert secret is not None
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [agent_server_name(SID)]
    assert base64.b64decode(secret["data"]["ca.crt"]) == ca.cert_pem
    claim = kube.get("claim", f"stockade-ws-{SID}")
    assert claim is not None
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    tls = backend.address_of(info)
    assert (tls.host, tls.port, tls.tls.server_name) == (info.address, 7443, agent_server_name(SID))


def test_an_emptydir_workspace_makes_no_claim(
    kube: KubeMock, ca: Authority, tmp_path: Path
) -> None:
    backend = backend_for(kube, tmp_path, workspace="emptydir")
    kubelet = Kubelet(kube, tmp_path, 7443, agents=False)
    try:
        backend.run(spec(), prepared()[1])
    finally:
        kubelet.close()
    assert kube.names("claim") == []
    pod = kube.get("pod", POD)
    assert pod is not None
    assert "emptyDir" in pod["spec"]["volumes"][0]


def test_a_pod_made_by_a_try_whose_answer_was_lost_is_taken(
    kube: KubeMock, ca: Authority, tmp_path: Path
) -> None:
    """The server made the pod and answered 500; the retry's 409 finds this supervisor's own
    pod, which is waited for like a new one."""
    backend = backend_for(kube, tmp_path)
    kube.react(lambda k: k[f"post /api/v1/namespaces/{NAMESPACE}/pods"][:1] << 500)
    kubelet = Kubelet(kube, tmp_path, 7443, agents=False)
    try:
        info = backend.run(spec(), prepared()[1])
    finally:
        kubelet.close()
    assert info.running
    posts = [p for m, p in kube.requests() if m == "POST" and p.endswith("/pods")]
    assert len(posts) == 2
    assert kube.names("pod") == [POD]


def test_another_supervisors_pod_of_the_name_is_left_alone(
    kube: KubeMock, ca: Authority, tmp_path: Path
) -> None:
    backend = backend_for(kube, tmp_path)
    theirs = {
        "metadata": {"name": POD, "labels": {LABEL_INSTANCE: "inst0001bbbb", LABEL_MANAGED: "1"}},
        "spec": {"containers": [{"name": "sandbox", "image": "theirs"}]},
    }
    kube.put("pod", theirs)
    with pytest.raises(EngineUnavailable, match="belongs to another supervisor"):
        backend.run(spec(), prepared()[1])
    pod = kube.get("pod", POD)
    assert pod is not None
    assert pod["spec"]["containers"][0]["image"] == "theirs"
    assert kube.names("secret") == ["stockade-agent-ca"]  # nothing of that sandbox touched


def test_a_claim_that_is_not_stockades_is_not_used(
    kube: KubeMock, ca: Authority, tmp_path: Path
) -> None:
    backend = backend_for(kube, tmp_path)
    kube.put("claim", {"metadata": {"name": f"stockade-ws-{SID}"}, "spec": {}})
    with pytest.raises(EngineUnavailable, match="is not Stockade's"):
        backend.run(spec(), prepared()[1])
    assert kube.names("pod") == []
    assert kube.names("secret") == ["stockade-agent-ca"]
    assert kube.names("claim") == [f"stockade-ws-{SID}"]


def test_a_pod_never_ready_is_removed_and_its_claim_kept(
    kube: KubeMock, ca: Authority, tmp_path: Path
) -> None:
    backend = backend_for(kube, tmp_path, ready_timeout_s=1)
    with pytest.raises(SandboxBroken, match=rf"pod {POD} was not ready within 1 s"):
        backend.run(spec(), prepared()[1])
    assert kube.names("pod") == []
    assert kube.names("secret") == ["stockade-agent-ca"]
    assert kube.names("claim") == [f"stockade-ws-{SID}"]


def test_remove_keeps_the_claim_and_remove_workspace_deletes_it(
    kube: KubeMock, ca: Authority, tmp_path: Path
) -> None:
    backend = backend_for(kube, tmp_path)
    kubelet = Kubelet(kube, tmp_path, 7443, agents=False)
    try:
        info = backend.run(spec(), prepared()[1])
        assert backend.remove(info.id) is True
        assert backend.remove(info.id) is False
        assert backend.inspect(info.id) is None
        assert kube.names("secret") == ["stockade-agent-ca"]
        assert kube.names("claim") == [f"stockade-ws-{SID}"]
        again = backend.run(spec(), prepared()[1])  # the next pod finds the key's claim
    finally:
        kubelet.close()
    assert again.running
    assert kube.names("claim") == [f"stockade-ws-{SID}"]
    backend.remove(again.id)
    assert backend.remove_workspace(SID) is True
    assert backend.remove_workspace(SID) is False
    assert kube.names("claim") == []


def test_list_selects_by_labels_and_annotations(
    kube: KubeMock, ca: Authority, tmp_path: Path
) -> None:
    backend = backend_for(kube, tmp_path)
    kubelet = Kubelet(kube, tmp_path, 7443, agents=False)
    try:
        mine = backend.run(spec(), prepared()[1])
        other = backend.run(spec(instance="inst0002aaaa", sid="fedcba9876543210"), prepared()[1])
    finally:
        kubelet.close()
    ours = {LABEL_MANAGED: "1", LABEL_INSTANCE: INSTANCE}
    assert [i.name for i in backend.list(ours)] == [mine.name]
    assert {i.name for i in backend.list({LABEL_MANAGED: "1"})} == {mine.name, other.name}
    by_key = backend.list({LABEL_MANAGED: "1", LABEL_KEY: "team/a key"})  # an annotation
    assert {i.name for i in by_key} == {mine.name, other.name}
    assert backend.list({LABEL_MANAGED: "1", LABEL_KEY: "team/other"}) == []
    listed = backend.list(ours)[0]
    assert listed.labels == mine.labels
    assert listed.address == mine.address


def test_views_of_a_pod(kube: KubeMock, ca: Authority, tmp_path: Path) -> None:
    backend = backend_for(kube, tmp_path, runtime_class="gvisor")
    kubelet = Kubelet(kube, tmp_path, 7443, agents=False)
    try:
        info = backend.run(spec(), prepared()[1])
    finally:
        kubelet.close()
    view = backend.security_view(info.id)
    assert view is not None
    assert view.runtime == "gvisor"
    assert view.cap_drop == ("ALL",)
    assert view.cap_add == ()
    assert not view.privileged
    assert view.read_only_root
    assert view.no_new_privileges
    assert view.seccomp_profile == "RuntimeDefault"
    assert view.user == "65532:65532"
    assert view.memory_bytes == 512 << 20
    assert view.nano_cpus == 1_500_000_000
    assert backend.mounts(info.id) == ()
    assert backend.mounts("stockade-nothing") is None
    assert backend.security_view("stockade-nothing") is None
    assert backend.runtime_facts().name == "gvisor"
    assert backend.runtimes() == {"gvisor": ""}
    assert backend.image_exists("anything")


def test_what_a_pod_cannot_do(kube: KubeMock, ca: Authority, tmp_path: Path) -> None:
    backend = backend_for(kube, tmp_path)
    with pytest.raises(Unsupported, match="a pod cannot be paused"):
        backend.pause(POD)
    with pytest.raises(Unsupported, match="NetworkPolicy"):
        backend.set_connected(POD, False)
    with pytest.raises(ConfigError, match="user_namespace"):
        backend.check_user_namespace(True)
    assert backend.check_user_namespace(False) is None
    pooled = spec()
    pooled = ContainerSpec(**{**pooled.__dict__, "labels": {LABEL_MANAGED: "1"}})
    with pytest.raises(ConfigError, match="sandbox id or a warm-pool id"):
        backend.run(pooled, prepared()[1])


def test_a_missing_or_bad_ca_secret_is_said_at_start(kube: KubeMock, tmp_path: Path) -> None:
    backend = backend_for(kube, tmp_path)
    with pytest.raises(ConfigError, match=r"stockade/stockade-agent-ca .* does not exist"):
        backend.ping()
    kube.put("secret", {"metadata": {"name": "stockade-agent-ca"}, "data": {"tls.crt": "eA=="}})
    with pytest.raises(ConfigError, match=r"tls\.crt and tls\.key"):
        backend_for(kube, tmp_path).ping()


def test_create_backend_makes_the_kubernetes_kind(kube: KubeMock, tmp_path: Path) -> None:
    config = KubernetesConfig(namespace=NAMESPACE, kubeconfig=str(kube.kubeconfig(tmp_path)))
    backend = create_backend("kubernetes", "", config)
    try:
        assert backend.engine == "kubernetes"
        assert backend.inspect(POD) is None
    finally:
        backend.close()


def test_pod_agent_args_keep_the_limits_only() -> None:
    assert pod_agent_args(COMMAND) == ("--max-output-bytes", "4096", "--max-processes", "3")
    assert pod_agent_args(("--user=1:1", "--agent-user", "2:2", "--process-log-bytes", "9")) == (
        "--process-log-bytes",
        "9",
    )


def test_a_stale_agent_secret_is_replaced(kube: KubeMock, ca: Authority, tmp_path: Path) -> None:
    """A Secret left by an earlier pod (a supervisor that died before removing it) holds a
    key this supervisor does not have: the new pod gets a fresh certificate."""
    stale = {"tls.crt": base64.b64encode(b"old").decode()}
    kube.put("secret", {"metadata": {"name": f"stockade-agent-{SID}"}, "data": stale})
    backend = backend_for(kube, tmp_path)
    kubelet = Kubelet(kube, tmp_path, 7443, agents=False)
    try:
        backend.run(spec(), prepared()[1])
    finally:
        kubelet.close()
    secret = kube.get("secret", f"stockade-agent-{SID}")
    assert secret is not None
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    assert cert.issuer == x509.load_pem_x509_certificate(ca.cert_pem).subject


def test_an_ended_pod_of_the_name_is_replaced(
    kube: KubeMock, ca: Authority, tmp_path: Path
) -> None:
    backend = backend_for(kube, tmp_path)
    dead = {
        "metadata": {"name": POD, "labels": {LABEL_INSTANCE: INSTANCE, LABEL_MANAGED: "1"}},
        "spec": {"containers": [{"name": "sandbox", "image": "old"}]},
    }
    kube.put("pod", dead)
    kube.patch("pod", POD, {"status": {"phase": "Failed"}}, "status")
    kubelet = Kubelet(kube, tmp_path, 7443, agents=False)
    try:
        info = backend.run(spec(), prepared()[1])
    finally:
        kubelet.close()
    assert info.running
    assert info.image == "stockade-sandbox:test"  # the new pod, not the dead one


def test_secret_environment_goes_in_the_agent_secret_not_the_pod(
    kube: KubeMock, ca: Authority, tmp_path: Path
) -> None:
    """[sandbox] secrets: the pod the API holds names them (secretKeyRef), its Secret holds
    them, and both go with the pod."""
    value = "sk-backend-5a4b3c2d1e"
    backend = backend_for(kube, tmp_path)
    secretive = replace(
        spec(),
        environment={"API_KEY": value, "LANG": "C.UTF-8"},
        secret_names=frozenset({"API_KEY"}),
    )
    kubelet = Kubelet(kube, tmp_path, 7443, agents=False)
    try:
        info = backend.run(secretive, prepared()[1])
    finally:
        kubelet.close()
    pod = kube.get("pod", POD)
    assert pod is not None
    assert value not in json.dumps(pod)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["LANG"] == {"name": "LANG", "value": "C.UTF-8"}
    assert env["API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == f"stockade-agent-{SID}"
    secret = kube.get("secret", f"stockade-agent-{SID}")
    assert secret is not None
    key = env["API_KEY"]["valueFrom"]["secretKeyRef"]["key"]
    assert base64.b64decode(secret["data"][key]).decode() == value
    assert backend.remove(info.id) is True
    assert kube.names("secret") == ["stockade-agent-ca"]


def test_workspace_of_names_the_claim_or_an_emptydir(kube: KubeMock, tmp_path: Path) -> None:
    """What SandboxInfo.workspace_path shows of a pod's workspace: no API call."""
    assert backend_for(kube, tmp_path).workspace_of(SID) == f"pvc://{NAMESPACE}/stockade-ws-{SID}"
    assert backend_for(kube, tmp_path, workspace="emptydir").workspace_of(SID) == "emptyDir"
