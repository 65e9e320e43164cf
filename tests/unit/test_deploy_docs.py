"""docs/kubernetes.md's commands, run: the Secrets made as its Install section says are
ones the supervisor accepts, and its overlay replaces the image and the configuration."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from stockade.supervisor.auth import parse_tokens
from stockade.supervisor.config import Config
from tests.unit.deploy_files import (
    DEPLOY,
    DOC,
    K8S_VERSIONS,
    REPO,
    SECRETS,
    kustomize,
)


def doc_block(marker: str) -> str:
    """The first ```sh block of docs/kubernetes.md that contains marker."""
    for block in re.findall(r"```sh\n(.*?)```", DOC.read_text(), flags=re.S):
        if marker in block:
            return block  # type: ignore[no-any-return]
    raise AssertionError(f"docs/kubernetes.md has no sh block with {marker!r}")


def test_the_documented_commands_make_valid_secrets(tmp_path: Path, config: Config) -> None:
    folder = tmp_path / "secrets"
    shutil.copytree(SECRETS, folder)
    block = doc_block("openssl req")
    assert "kubectl" not in block  # made here, applied in the next step of the doc
    env = {**os.environ, "PASSWORD": "a-database-password"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    cert = x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes())
    key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.curve.name == "secp256r1"
    assert cert.public_key() == key.public_key()
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical
    assert constraints.value.ca
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert parse_tokens((folder / "tokens").read_text())  # one token the supervisor accepts
    assert (folder / "password").read_text() == "a-database-password"  # no newline
    rendered = {doc["metadata"]["name"]: doc for doc in kustomize(folder)}
    assert set(rendered) == {config.kubernetes.ca_secret, "stockade-tokens", "stockade-state"}
    for doc in rendered.values():
        kubernetes_validate.validate(doc, K8S_VERSIONS[0], strict=True)
        assert doc["metadata"]["namespace"] == config.kubernetes.namespace


def test_the_documented_overlay_replaces_the_image_and_the_configuration(tmp_path: Path) -> None:
    (block,) = re.findall(
        r"```yaml\n# my-stockade/kustomization.yaml\n(.*?)```", DOC.read_text(), flags=re.S
    )
    (tmp_path / "deploy").symlink_to(REPO / "deploy")
    overlay = tmp_path / "my-stockade"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(block)
    mine = (
        (DEPLOY / "stockade.toml")
        .read_text()
        .replace("localhost/stockade-sandbox:latest", "registry.example.com/stockade-sandbox:0.1.0")
    )
    (overlay / "stockade.toml").write_text(mine)
    rendered = kustomize(overlay)
    (deployment,) = [d for d in rendered if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/stockade-supervisor:0.1.0"
    (configmap,) = [d for d in rendered if d["kind"] == "ConfigMap"]
    assert configmap["data"]["stockade.toml"] == mine
