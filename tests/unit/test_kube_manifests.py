"""The objects of a sandbox on Kubernetes (supervisor/engines/backends/kubernetes/manifests.py):
every field Pod Security "restricted" asks for, the volumes, the limits, the split of labels
between labels and annotations, and that each object is what the `kubernetes` client's models take
(deserialized into them and serialized back unchanged: a misspelt or misplaced field would be
dropped)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client as k8s

from stockade.supervisor.config.sandbox import KubernetesConfig
from stockade.supervisor.engines.backends.base import (
    LABEL_INSTANCE,
    LABEL_KEY,
    LABEL_MANAGED,
    LABEL_NETWORK_ALLOW,
    LABEL_OWNER,
    LABEL_SANDBOX_ID,
    LABEL_STATE_DIR,
    BindMount,
    ContainerSpec,
)
from stockade.supervisor.engines.backends.kubernetes import manifests
from stockade.supervisor.engines.backends.kubernetes.manifests import (
    agent_secret,
    carried_labels,
    claim_name,
    pod_name,
    sandbox_pod,
    secret_name,
    split_labels,
    workspace_claim,
)
from stockade.supervisor.engines.backends.kubernetes.pki import Authority
from tests.unit.pod_security import restricted_violations

SID = "0123456789abcdef"
INSTANCE = "a1b2c3d4e5f60718"
AGENT_ARGS = ("--max-output-bytes", "1000", "--max-processes", "5")
LONG_KEY = "k" * 64


def _spec(**changes: Any) -> ContainerSpec:
    spec = ContainerSpec(
        name=pod_name(INSTANCE, SID),
        image="localhost/stockade-sandbox:latest",
        command=(),
        labels={
            LABEL_MANAGED: "1",
            LABEL_INSTANCE: INSTANCE,
            LABEL_SANDBOX_ID: SID,
            LABEL_KEY: "team/alpha",
            LABEL_STATE_DIR: "/var/lib/stockade",
            LABEL_OWNER: "boot=1 pid=2",
            LABEL_NETWORK_ALLOW: "pypi.org,github.com",
        },
        mounts=(BindMount("/host/ws", "/workspace"),),
        user="0:0",
        read_only_root=True,
        drop_all_capabilities=True,
        no_new_privileges=True,
        memory_bytes=512 * 1024 * 1024,
        nano_cpus=1_500_000_000,
        pids_limit=256,
        nofile=1024,
        nproc=16384,
        tmpfs={"/tmp": 64 * 1024 * 1024},
        environment={"B_VAR": "2", "A_VAR": "1"},
    )
    return replace(spec, **changes)


def _pod(kube: KubernetesConfig | None = None, **changes: Any) -> dict[str, Any]:
    return sandbox_pod(
        _spec(**changes),
        kube or KubernetesConfig(),
        sandbox_id=SID,
        agent_secret=secret_name(SID),
        workspace_claim=claim_name(SID),
        agent_args=AGENT_ARGS,
        sandbox_uid=65532,
    )


def _round_trip(obj: dict[str, Any], model: str) -> None:
    """The client's model takes `obj` (types checked) and gives back exactly `obj`."""
    api = k8s.ApiClient()
    parsed = api.deserialize(json.dumps(obj), model, "application/json")
    assert type(parsed).__name__ == model
    assert api.sanitize_for_serialization(parsed) == obj


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    [container] = pod["spec"]["containers"]
    return dict(container)


def test_names() -> None:
    assert pod_name(INSTANCE, SID) == f"stockade-a1b2c3d4-{SID}"
    assert claim_name(SID) == f"stockade-ws-{SID}"
    assert secret_name(SID) == f"stockade-agent-{SID}"


def test_the_pod_is_a_v1_pod() -> None:
    _round_trip(_pod(), "V1Pod")
    _round_trip(_pod(KubernetesConfig(runtime_class="gvisor", seccomp_profile="p.json")), "V1Pod")
    _round_trip(
        sandbox_pod(
            _spec(),
            KubernetesConfig(workspace="emptydir"),
            sandbox_id=SID,
            agent_secret=secret_name(SID),
            workspace_claim=None,
            agent_args=(),
        ),
        "V1Pod",
    )


@pytest.mark.parametrize(
    "kube",
    [
        KubernetesConfig(),
        KubernetesConfig(workspace="emptydir", runtime_class="gvisor"),
        KubernetesConfig(seccomp_profile="stockade/agent.json"),
    ],
)
def test_the_pod_passes_pod_security_admission(kube: KubernetesConfig) -> None:
    """The restricted profile as admission checks it (tests/unit/pod_security.py)."""
    assert restricted_violations(_pod(kube)["spec"]) == []


def test_the_pod_meets_restricted_pod_security() -> None:
    """Each field the "restricted" profile (and "baseline" in it) is about, as designed."""
    pod = _pod()
    spec = pod["spec"]
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        assert spec[field] is False
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never"
    assert "runtimeClassName" not in spec
    pod_security = spec["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] == pod_security["runAsGroup"] == 65532
    assert pod_security["fsGroup"] == 65532
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "supplementalGroups" not in pod_security
    assert "initContainers" not in spec
    assert "ephemeralContainers" not in spec
    container = _container(pod)
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == security["runAsGroup"] == 65532
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "procMount" not in security
    assert "seLinuxOptions" not in security
    # no host ports, host paths or other volume kinds than restricted allows
    assert all("hostPort" not in p for p in container["ports"])
    allowed = {"emptyDir", "persistentVolumeClaim", "secret", "configMap", "projected"}
    for volume in spec["volumes"]:
        assert set(volume) - {"name"} <= allowed, volume


def test_runtime_class_and_a_localhost_seccomp_profile() -> None:
    pod = _pod(KubernetesConfig(runtime_class="gvisor", seccomp_profile="stockade/agent.json"))
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    wanted = {"type": "Localhost", "localhostProfile": "stockade/agent.json"}
    assert pod["spec"]["securityContext"]["seccompProfile"] == wanted
    assert _container(pod)["securityContext"]["seccompProfile"] == wanted


def test_the_agent_command() -> None:
    container = _container(_pod(KubernetesConfig(agent_port=9443)))
    assert container["command"] == [
        "/usr/bin/tini",
        "--",
        "python3",
        "-P",
        "-m",
        "stockade.agent",
        "--listen",
        "0.0.0.0:9443",
        "--tls-dir",
        "/run/stockade/tls",
        "--workspace",
        "/workspace",
        *AGENT_ARGS,
    ]
    assert "args" not in container
    assert container["ports"] == [{"name": "agent", "containerPort": 9443, "protocol": "TCP"}]
    assert container["readinessProbe"]["tcpSocket"] == {"port": 9443}
    assert container["image"] == "localhost/stockade-sandbox:latest"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["env"] == [{"name": "A_VAR", "value": "1"}, {"name": "B_VAR", "value": "2"}]


def test_limits() -> None:
    pod = _pod(KubernetesConfig(ephemeral_storage_mb=2048))
    resources = _container(pod)["resources"]
    wanted = {"cpu": "1500m", "memory": "512Mi", "ephemeral-storage": "2048Mi"}
    assert resources == {"limits": wanted, "requests": wanted}
    odd = _container(_pod(memory_bytes=1000, nano_cpus=1))["resources"]["limits"]
    assert (odd["memory"], odd["cpu"]) == ("1000", "1m")
    with pytest.raises(ValueError, match="CPU limit must be positive"):
        _pod(nano_cpus=0)


def test_volumes_with_a_claim() -> None:
    pod = _pod(tmpfs={"/tmp": 32 * 1024 * 1024, "/run/x": 1024 * 1024})
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["workspace"] == {
        "name": "workspace",
        "persistentVolumeClaim": {"claimName": claim_name(SID)},
    }
    assert volumes["tmp"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Mi"}
    assert volumes["tls"]["secret"] == {
        "secretName": secret_name(SID),
        "defaultMode": 0o440,
        "optional": False,
        "items": [{"key": k, "path": k} for k in ("ca.crt", "tls.crt", "tls.key")],
    }
    assert volumes["tmpfs-0"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Mi"}
    mounts = {m["mountPath"]: m for m in _container(pod)["volumeMounts"]}
    assert mounts["/workspace"]["name"] == "workspace"
    assert mounts["/tmp"]["name"] == "tmp"
    assert mounts["/run/stockade/tls"] == {
        "name": "tls",
        "mountPath": "/run/stockade/tls",
        "readOnly": True,
    }
    assert mounts["/run/x"]["name"] == "tmpfs-0"
    # the host kinds' bind mounts never reach a pod
    assert "/host/ws" not in json.dumps(pod)


def test_an_emptydir_workspace() -> None:
    pod = sandbox_pod(
        _spec(tmpfs={}),
        KubernetesConfig(workspace="emptydir", workspace_size_mb=300),
        sandbox_id=SID,
        agent_secret=secret_name(SID),
        workspace_claim=None,
        agent_args=(),
    )
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["workspace"] == {"name": "workspace", "emptyDir": {"sizeLimit": "300Mi"}}
    # /tmp is never left on the read-only root: the default size without a spec'd one
    assert volumes["tmp"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Mi"}
    assert pod["spec"]["securityContext"]["runAsUser"] == 65532


def test_labels_and_annotations() -> None:
    pod = _pod(labels={**_spec().labels, LABEL_KEY: LONG_KEY})
    meta = pod["metadata"]
    assert meta["name"] == pod_name(INSTANCE, SID)
    assert meta["namespace"] == "stockade"
    assert meta["labels"] == {
        "app.kubernetes.io/name": "stockade",
        "app.kubernetes.io/component": "sandbox",
        LABEL_MANAGED: "1",
        LABEL_INSTANCE: INSTANCE,
        LABEL_SANDBOX_ID: SID,
    }
    assert meta["annotations"] == {
        LABEL_KEY: LONG_KEY,  # over 63 characters
        LABEL_STATE_DIR: "/var/lib/stockade",
        LABEL_OWNER: "boot=1 pid=2",
        LABEL_NETWORK_ALLOW: "pypi.org,github.com",
    }
    assert carried_labels(meta) == {
        **_spec().labels,
        LABEL_KEY: LONG_KEY,
        **manifests.COMPONENT_LABELS,
    }


@pytest.mark.parametrize(
    ("value", "as_label"),
    [
        ("demo", True),
        ("", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("team/alpha", False),
        ("tenant\x00key", False),
        ("-lead", False),
        ("trail.", False),
        ("with space", False),
        ("ключ", False),
    ],
)
def test_which_keys_are_labels(value: str, as_label: bool) -> None:
    labels, annotations = split_labels({LABEL_KEY: value})
    assert (LABEL_KEY in labels) is as_label
    assert (LABEL_KEY in annotations) is not as_label


def test_label_names_are_checked_too() -> None:
    labels, annotations = split_labels({"Not/A/Name": "x", "x" * 64: "y", "ok.io/n": "v"})
    assert labels == {"ok.io/n": "v"}
    assert set(annotations) == {"Not/A/Name", "x" * 64}


def test_the_spec_must_be_for_the_sandbox() -> None:
    with pytest.raises(ValueError, match="another sandbox"):
        sandbox_pod(
            _spec(),
            KubernetesConfig(),
            sandbox_id="ffffffffffffffff",
            agent_secret="s",
            workspace_claim=None,
            agent_args=(),
        )
    with pytest.raises(ValueError, match="not be root"):
        sandbox_pod(
            _spec(),
            KubernetesConfig(),
            sandbox_id=SID,
            agent_secret="s",
            workspace_claim=None,
            agent_args=(),
            sandbox_uid=0,
        )


def test_the_agent_secret() -> None:
    ca = Authority.create()
    issued = ca.issue_agent(SID)
    secret = agent_secret(secret_name(SID), issued, ca.cert_pem, _spec().labels, "stockade")
    _round_trip(secret, "V1Secret")
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert data == {"ca.crt": ca.cert_pem, "tls.crt": issued.cert_pem, "tls.key": issued.key_pem}
    assert secret["metadata"]["namespace"] == "stockade"
    assert secret["metadata"]["annotations"][LABEL_KEY] == "team/alpha"
    assert "namespace" not in agent_secret("s", issued, ca.cert_pem, {})["metadata"]


SECRET_VALUE = "sk-live-0f1e2d3c4b5a"


def test_secret_environment_is_referenced_and_never_in_the_pod() -> None:
    """[sandbox] secrets (spec.secret_names) reach the pod by secretKeyRef into the agent's
    Secret; the rest of the environment (the proxy variables) stays plain."""
    spec = _spec(
        environment={"API_KEY": SECRET_VALUE, "HTTPS_PROXY": "http://proxy:3128"},
        secret_names=frozenset({"API_KEY"}),
    )
    pod = sandbox_pod(
        spec,
        KubernetesConfig(),
        sandbox_id=SID,
        agent_secret=secret_name(SID),
        workspace_claim=None,
        agent_args=AGENT_ARGS,
    )
    _round_trip(pod, "V1Pod")
    text = json.dumps(pod)
    assert SECRET_VALUE not in text
    assert base64.b64encode(SECRET_VALUE.encode()).decode() not in text
    ref = {"name": secret_name(SID), "key": "env.API_KEY", "optional": False}
    assert _container(pod)["env"] == [
        {"name": "API_KEY", "valueFrom": {"secretKeyRef": ref}},
        {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
    ]
    # the Secret's volume projects the TLS files alone: the value is no file there
    [tls] = [v for v in pod["spec"]["volumes"] if v["name"] == "tls"]
    assert {item["key"] for item in tls["secret"]["items"]} == {"ca.crt", "tls.crt", "tls.key"}

    ca = Authority.create()
    issued = ca.issue_agent(SID)
    env = manifests.secret_environment(spec)
    assert env == {"API_KEY": SECRET_VALUE}
    secret = agent_secret(secret_name(SID), issued, ca.cert_pem, {}, "stockade", env)
    _round_trip(secret, "V1Secret")
    assert base64.b64decode(secret["data"]["env.API_KEY"]).decode() == SECRET_VALUE
    assert set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key", "env.API_KEY"}


def test_the_workspace_claim() -> None:
    kube = KubernetesConfig(workspace_size_mb=2048, storage_class="fast-ssd")
    claim = workspace_claim(claim_name(SID), kube, {LABEL_KEY: "demo", LABEL_MANAGED: "1"})
    _round_trip(claim, "V1PersistentVolumeClaim")
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "2048Mi"}},
        "storageClassName": "fast-ssd",
    }
    assert claim["metadata"]["labels"] == {LABEL_KEY: "demo", LABEL_MANAGED: "1"}
    assert "annotations" not in claim["metadata"]
    default = workspace_claim("c", KubernetesConfig(), {})
    assert "storageClassName" not in default["spec"]
