"""deploy/kubernetes: every manifest is a valid object of the Kubernetes API (the schemas the
`kubernetes-validate` package bundles, strict: an unknown field fails), every file is applied
by its kustomization, and the security facts hold: a namespaced Role without wildcards or
pods/exec, supervisor pods under the "restricted" Pod Security profile, NetworkPolicies that
admit only the supervisors to a sandbox's agent port and let each network mode out as far as
it says. The shipped stockade.toml loads, and agrees with the manifests on every name, label
and port they share.

No cluster runs here: `kubectl kustomize` (offline) renders the installation when kubectl is
installed; the rest reads the files."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any, get_args
from urllib.parse import urlsplit

import kubernetes_validate
import pytest

from stockade.supervisor.config import Config
from stockade.supervisor.config.sandbox import NetworkMode
from stockade.supervisor.engines.backends.base import LABEL_MANAGED, LABEL_NETWORK
from tests.unit.deploy_files import (
    CLUSTER_KINDS,
    DEPLOY,
    K8S_VERSIONS,
    REPO,
    SECRETS,
    generated_files,
    generated_keys,
    kustomization,
    kustomize,
    manifests,
    of_kind,
    one,
    supervisor_container,
    supervisor_pod,
)
from tests.unit.pod_security import restricted_violations

# --- files and schemas ---------------------------------------------------------------------


def test_the_kustomization_applies_every_file_and_names_none_missing() -> None:
    kust = kustomization(DEPLOY)
    listed = set(kust["resources"]) | set(generated_files(kust))
    present = {p.name for p in DEPLOY.iterdir() if p.is_file()} - {"kustomization.yaml"}
    assert listed == present, (
        f"listed, not present: {listed - present}; not listed: {present - listed}"
    )
    # The one folder beside the files, applied on its own (never from here: applying the
    # installation again must not replace the Secrets).
    assert {p.name for p in DEPLOY.iterdir() if p.is_dir()} == {"secrets"}
    assert "secrets" not in kust["resources"]


def test_the_secrets_folder_holds_no_secret_and_ignores_the_files_it_is_made_from() -> None:
    kust = kustomization(SECRETS)
    ignored = set((SECRETS / ".gitignore").read_text().split())
    sources = set(generated_files(kust))
    assert sources <= ignored, f"not in secrets/.gitignore: {sources - ignored}"
    tracked = subprocess.run(
        ["git", "ls-files", "--", str(DEPLOY)], cwd=REPO, capture_output=True, text=True
    )
    if tracked.returncode == 0 and tracked.stdout:  # in a git checkout
        names = {Path(line).name for line in tracked.stdout.splitlines()}
        assert not names & sources, "a file Secrets are made from is committed"
    for path in DEPLOY.rglob("*"):
        if path.is_file() and path.name not in sources:
            text = path.read_text()
            assert "PRIVATE KEY" not in text, path
            assert "BEGIN CERTIFICATE" not in text, path


@pytest.mark.parametrize(
    ("path", "doc"),
    [
        pytest.param(p, d, id=f"{p.name}:{d['kind']}/{d['metadata']['name']}")
        for p, d in manifests()
    ],
)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_is_a_valid_api_object(
    path: Path, doc: dict[str, Any], version: str
) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_validation_refuses_a_misspelled_field_and_a_missing_required_one() -> None:
    deployment = copy.deepcopy(one("Deployment", "stockade-supervisor"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)
    deployment = copy.deepcopy(one("Deployment", "stockade-supervisor"))
    del deployment["spec"]["selector"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


def test_the_rendered_installation_is_valid_and_in_its_namespace(config: Config) -> None:
    rendered = kustomize(DEPLOY)
    for doc in rendered:
        kubernetes_validate.validate(doc, K8S_VERSIONS[0], strict=True)
        assert doc["kind"] not in CLUSTER_KINDS - {"Namespace"}, doc["kind"]
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == config.kubernetes.namespace, doc
    (namespace,) = [d for d in rendered if d["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == config.kubernetes.namespace
    assert kustomization(DEPLOY)["namespace"] == config.kubernetes.namespace
    (configmap,) = [d for d in rendered if d["kind"] == "ConfigMap"]
    assert configmap["data"]["stockade.toml"] == (DEPLOY / "stockade.toml").read_text()
    (deployment,) = [d for d in rendered if d["kind"] == "Deployment"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    # the hashed name: a change of stockade.toml rolls the supervisors
    assert volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"]
    assert configmap["metadata"]["name"].startswith("stockade-config-")


# --- RBAC ----------------------------------------------------------------------------------


def test_no_cluster_wide_object_but_the_namespace() -> None:
    kinds = {doc["kind"] for _, doc in manifests()}
    assert kinds & CLUSTER_KINDS == {"Namespace"}


def test_the_role_is_least_privilege(config: Config) -> None:
    (role,) = of_kind("Role")
    allowed: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert rule["apiGroups"] == [""], rule
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in rule.get(field, []), f"wildcard in {field}: {rule}"
        for resource in rule["resources"]:
            assert "/" not in resource, f"a subresource ({resource}) is granted"
            if "resourceNames" not in rule:
                allowed.setdefault(resource, set()).update(rule["verbs"])
    assert allowed == {
        "pods": {"create", "get", "list", "watch", "patch", "delete"},
        "persistentvolumeclaims": {"create", "get", "list", "patch", "delete"},
        "secrets": {"create", "delete"},
    }
    (by_name,) = [rule for rule in role["rules"] if "resourceNames" in rule]
    assert by_name == {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": [config.kubernetes.ca_secret],
        "verbs": ["get"],
    }


def test_the_role_is_bound_to_the_supervisors_account_alone(config: Config) -> None:
    (binding,) = of_kind("RoleBinding")
    (role,) = of_kind("Role")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    account = supervisor_pod()["spec"]["serviceAccountName"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": config.kubernetes.namespace}
    ]
    assert account != "default"
    # the account sandbox pods run as mounts no token unless a pod asks
    assert one("ServiceAccount", "default")["automountServiceAccountToken"] is False


# --- the supervisor pods -------------------------------------------------------------------


def test_the_supervisor_pod_is_restricted() -> None:
    assert restricted_violations(supervisor_pod()["spec"]) == []
    ctx = supervisor_container()["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    namespace = one("Namespace", "stockade")["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "restricted"


DELETE = object()
BREACHES = [
    # (where in the pod spec, the value it takes or DELETE, words of the violation)
    ("hostNetwork", True, "hostNetwork"),
    ("containers.0.securityContext.privileged", True, "privileged"),
    ("containers.0.securityContext.allowPrivilegeEscalation", DELETE, "allowPrivilegeEscalation"),
    ("containers.0.securityContext.capabilities.add", ["SYS_ADMIN"], "adds capabilities"),
    ("containers.0.securityContext.capabilities.drop", ["NET_RAW"], "drop ALL"),
    ("securityContext.runAsUser", 0, "runAsUser is 0"),
    ("containers.0.securityContext.runAsNonRoot", False, "runAsNonRoot is false"),
    ("securityContext.seccompProfile", DELETE, "seccompProfile"),
    ("containers.0.securityContext.seccompProfile", {"type": "Unconfined"}, "Unconfined"),
    ("volumes.0", {"name": "config", "hostPath": {"path": "/"}}, "hostPath"),
    ("containers.0.ports.0.hostPort", 50051, "hostPort"),
]


def changed(spec: dict[str, Any], where: str, value: object) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    *parents, leaf = where.split(".")
    node: Any = spec
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(leaf) if isinstance(node, list) else leaf
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return spec


@pytest.mark.parametrize(("where", "value", "rule"), BREACHES, ids=[b[0] for b in BREACHES])
def test_the_restricted_check_catches_each_breach(where: str, value: object, rule: str) -> None:
    found = restricted_violations(changed(supervisor_pod()["spec"], where, value))
    assert any(rule in line for line in found), found


def test_the_restricted_check_wants_run_as_non_root_somewhere() -> None:
    spec = changed(supervisor_pod()["spec"], "securityContext.runAsNonRoot", DELETE)
    assert restricted_violations(spec) == []  # the container says it too
    spec = changed(spec, "containers.0.securityContext.runAsNonRoot", DELETE)
    assert any("runAsNonRoot is not true" in line for line in restricted_violations(spec))


def test_the_supervisor_deployment_is_highly_available() -> None:
    deployment = one("Deployment", "stockade-supervisor")
    assert deployment["spec"]["replicas"] >= 2
    spec = supervisor_pod()["spec"]
    labels = supervisor_pod()["metadata"]["labels"]
    keys = {c["topologyKey"] for c in spec["topologySpreadConstraints"]}
    assert "kubernetes.io/hostname" in keys
    for constraint in spec["topologySpreadConstraints"]:
        assert constraint["labelSelector"]["matchLabels"] == labels
    (pdb,) = of_kind("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == labels
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    limits = supervisor_container()["resources"]["limits"]
    assert {"memory", "ephemeral-storage"} <= set(limits)


def test_the_probes_ask_grpc_health_on_the_served_port(config: Config) -> None:
    container = supervisor_container()
    port = int(config.listen.rpartition(":")[2])
    assert config.listen == "0.0.0.0:50051"
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["grpc"] == port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": port}, probe
    service = service_named("stockade")
    assert service["spec"]["selector"] == supervisor_pod()["metadata"]["labels"]
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(port, "grpc")]


def service_named(name: str) -> dict[str, Any]:
    (found,) = [s for s in of_kind("Service") if s["metadata"]["name"] == name]
    return found


def test_the_egress_service_leads_to_every_supervisors_egress_listener(config: Config) -> None:
    """Pods are told kubernetes.egress_proxy; it names the Service stockade-egress in the
    installation's namespace, whose port leads to the container port each supervisor serves
    kubernetes.egress_listen on; the supervisors serve nothing else there."""
    container = supervisor_container()
    ports = {p["name"]: (p["containerPort"], p["protocol"]) for p in container["ports"]}
    assert set(ports) == {"grpc", "egress"}
    listen_host, _, listen_port = config.kubernetes.egress_listen.rpartition(":")
    assert (listen_host, ports["egress"]) == ("0.0.0.0", (int(listen_port), "TCP"))
    service = service_named("stockade-egress")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == supervisor_pod()["metadata"]["labels"]
    host, _, port = config.kubernetes.egress_proxy.rpartition(":")
    assert host == f"stockade-egress.{config.kubernetes.namespace}.svc"
    assert [(p["port"], p["targetPort"], p["protocol"]) for p in service["spec"]["ports"]] == [
        (int(port), "egress", "TCP")
    ]


def test_stockade_toml_agrees_with_the_manifests(config: Config) -> None:
    assert config.engine.kind == "kubernetes"
    assert dict(config.kubernetes.supervisor_labels) == supervisor_pod()["metadata"]["labels"]
    # tokens: the file the Secret volume holds, behind authentication that is on
    assert config.auth.enabled is True
    mounts = {m["name"]: m["mountPath"] for m in supervisor_container()["volumeMounts"]}
    volumes = {v["name"]: v for v in supervisor_pod()["spec"]["volumes"]}
    (tokens_volume,) = [
        name for name, path in mounts.items() if config.auth.tokens_file.startswith(path + "/")
    ]
    secret = volumes[tokens_volume]["secret"]
    (item,) = secret["items"]
    assert config.auth.tokens_file == f"{mounts[tokens_volume]}/{item['path']}"
    assert secret["defaultMode"] & 0o027 == 0  # the supervisor refuses a tokens file others read
    made = {gen["name"]: gen for gen in kustomization(SECRETS)["secretGenerator"]}
    assert item["key"] in generated_keys(made[secret["secretName"]])
    # the database: the URL in the ConfigMap has no password; libpq takes it from the Secret
    url = urlsplit(config.state.url)
    assert url.scheme == "postgresql"
    assert url.password is None
    assert url.username
    env = {e["name"]: e for e in supervisor_container()["env"]}
    ref = env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref["key"] in generated_keys(made[ref["name"]])
    # the CA: a TLS Secret of the name the supervisors read (and the Role grants by name)
    assert made[config.kubernetes.ca_secret]["type"] == "kubernetes.io/tls"
    assert set(generated_keys(made[config.kubernetes.ca_secret])) == {"tls.crt", "tls.key"}
    assert kustomization(SECRETS)["namespace"] == config.kubernetes.namespace
    assert kustomization(SECRETS)["generatorOptions"]["disableNameSuffixHash"] is True
    # what lives only as long as the pod: the state folder and /tmp (the root is read-only)
    assert mounts["state"] == str(config.state_dir)
    assert "emptyDir" in volumes["state"]
    assert mounts["tmp"] == "/tmp"


# --- NetworkPolicies -----------------------------------------------------------------------


def selecting(labels: dict[str, str]) -> list[dict[str, Any]]:
    """The NetworkPolicies whose podSelector selects a pod with these labels."""
    found = []
    for policy in of_kind("NetworkPolicy"):
        selector = policy["spec"]["podSelector"]
        assert set(selector) <= {"matchLabels"}, "only matchLabels are evaluated here"
        if selector["matchLabels"].items() <= labels.items():
            found.append(policy)
    return found


def rules(labels: dict[str, str], direction: str) -> list[dict[str, Any]]:
    """The rules letting traffic in (ingress) or out (egress) of such a pod; isolated: some
    policy of that direction selects it (else everything would be allowed)."""
    policies = [p for p in selecting(labels) if direction.capitalize() in p["spec"]["policyTypes"]]
    assert policies, f"a pod labelled {labels} is not isolated for {direction}"
    return [rule for p in policies for rule in p["spec"].get(direction, [])]


def sandbox(mode: str) -> dict[str, str]:
    return {LABEL_MANAGED: "1", LABEL_NETWORK: mode, "io.stockade.sandbox-id": "abc123"}


def test_every_network_mode_is_covered() -> None:
    assert set(get_args(NetworkMode)) == {"none", "egress", "open"}


@pytest.mark.parametrize("mode", get_args(NetworkMode))
def test_a_sandbox_admits_only_the_supervisors_on_the_agent_port(config: Config, mode: str) -> None:
    supervisors = dict(config.kubernetes.supervisor_labels)
    assert rules(sandbox(mode), "ingress") == [
        {
            "from": [{"podSelector": {"matchLabels": supervisors}}],
            "ports": [{"protocol": "TCP", "port": config.kubernetes.agent_port}],
        }
    ]


def test_a_sandbox_of_mode_none_reaches_nothing() -> None:
    assert rules(sandbox("none"), "egress") == []
    # nor does a pod whose mode label is missing or unknown (a warm-pool pod, a typo)
    assert rules({LABEL_MANAGED: "1"}, "egress") == []
    assert rules({**sandbox("none"), LABEL_NETWORK: "Open"}, "egress") == []


def test_a_sandbox_of_mode_egress_reaches_the_proxy_alone_and_no_dns(config: Config) -> None:
    """The proxy rule admits exactly the supervisor pods (they serve the proxy: their labels
    must match the rule's selector) on the egress listener's port, which a policy sees (the
    Service forwards to it); nothing else, DNS neither (a resolver forwarding names outside is
    a way out: pods are told the Service's address)."""
    (proxy,) = rules(sandbox("egress"), "egress")
    (peer,) = proxy["to"]
    admitted = peer["podSelector"]["matchLabels"]
    assert admitted.items() <= supervisor_pod()["metadata"]["labels"].items()
    assert admitted == dict(config.kubernetes.supervisor_labels)
    assert set(peer) == {"podSelector"}  # the installation's namespace only
    listen_port = int(config.kubernetes.egress_listen.rpartition(":")[2])
    assert proxy["ports"] == [{"protocol": "TCP", "port": listen_port}]


def test_a_sandbox_of_mode_open_reaches_anywhere() -> None:
    assert rules(sandbox("open"), "egress") == [{}]


def test_the_policies_leave_the_supervisors_alone(config: Config) -> None:
    assert selecting(dict(config.kubernetes.supervisor_labels)) == []
