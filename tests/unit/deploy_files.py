"""deploy/kubernetes as the tests read it: its files, their API objects, the kustomizations,
`kubectl kustomize` (offline rendering) and the shipped stockade.toml as the supervisor loads
it in its pod."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate.utils import latest_version, major_minor

from stockade.supervisor.config import Config
from stockade.supervisor.config.loading import load_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
SECRETS = DEPLOY / "secrets"
DOC = REPO / "docs" / "kubernetes.md"
# The oldest Kubernetes the manifests are for (grpc probes, matchLabelKeys) and the newest
# the package has schemas of.
K8S_VERSIONS = ("1.30", major_minor(latest_version()))
KUSTOMIZE_KINDS = {"Kustomization"}
CLUSTER_KINDS = {"ClusterRole", "ClusterRoleBinding", "Namespace", "PersistentVolume"}


def load_yaml(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def manifests() -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every API object in the YAML files under deploy/kubernetes (kustomizations aside)."""
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in load_yaml(path):
            if doc.get("kind") not in KUSTOMIZE_KINDS:
                yield path, doc


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in manifests() if doc["kind"] == kind]


def one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [doc for doc in of_kind(kind) if doc["metadata"]["name"] == name]
    return found


def kustomization(folder: Path) -> dict[str, Any]:
    (doc,) = load_yaml(folder / "kustomization.yaml")
    assert doc["kind"] == "Kustomization"
    return doc


def generated_files(kust: dict[str, Any]) -> list[str]:
    """The files the generators read (`key=file` or `file`)."""
    entries = [*kust.get("configMapGenerator", []), *kust.get("secretGenerator", [])]
    return [item.split("=", 1)[-1] for gen in entries for item in gen.get("files", [])]


def supervisor_pod() -> dict[str, Any]:
    return one("Deployment", "stockade-supervisor")["spec"]["template"]  # type: ignore[no-any-return]


def supervisor_container() -> dict[str, Any]:
    (container,) = supervisor_pod()["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def generated_keys(generator: dict[str, Any]) -> list[str]:
    return [item.split("=", 1)[0] for item in generator["files"]]


def shipped_config() -> Config:
    """stockade.toml as the supervisor loads it, under the Deployment's environment."""
    env = {e["name"]: e["value"] for e in supervisor_container()["env"] if "value" in e}
    with pytest.MonkeyPatch.context() as patch:
        for name in ("STOCKADE_ENGINE", "STOCKADE_ENGINE_SOCKET"):  # the image sets neither
            patch.delenv(name, raising=False)
        for name, value in env.items():
            patch.setenv(name, value)
        return load_config(DEPLOY / "stockade.toml")


def kustomize(folder: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: `kubectl kustomize` renders the installation")
    done = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]
