"""[sandbox] secrets on the way to a pod (the manifests and backend tests check the pod and
its Secret): the container spec marks which environment is secret, for every kind; a name a
pod cannot carry is refused at load with engine.kind kubernetes; and the host kinds' Get still
names the key's host folder as its workspace (a pod's: test_kube_sandboxes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.supervisor.config import Config, SandboxConfig, load_config
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.sandboxes.manager import SandboxManager
from tests.unit.fakes import FakeBackend, fake_manager


def _manager(tmp_path: Path, backend: FakeBackend) -> SandboxManager:
    sandbox = SandboxConfig(user="1000:1000", secrets={"API_KEY": "sk-unit-123"})
    return fake_manager(Config(state_dir=tmp_path, sandbox=sandbox), backend)


async def test_the_spec_marks_the_secrets_and_the_host_folder_is_the_workspace(
    tmp_path: Path,
) -> None:
    backend = FakeBackend()
    mgr = _manager(tmp_path, backend)
    sandbox = await mgr.ensure("k")
    spec = backend.made[sandbox.info.id]
    assert spec.environment["API_KEY"] == "sk-unit-123"  # the host kinds pass it as it is
    assert spec.secret_names == frozenset({"API_KEY"})
    info = await mgr.get("k")
    assert info.workspace_path == str(tmp_path / "sandboxes" / sandbox.sid / "workspace")
    await mgr.close()


@pytest.mark.parametrize("name", ["1ST_KEY", "API KEY", "KEY=1", ""])
def test_a_secret_name_a_pod_cannot_have_is_refused(tmp_path: Path, name: str) -> None:
    path = tmp_path / "stockade.toml"
    path.write_text(f'[engine]\nkind = "kubernetes"\n[sandbox.secrets]\n"{name}" = "v"\n')
    with pytest.raises(ConfigError, match=r"sandbox\.secrets: .* not an environment variable"):
        load_config(path)


def test_a_usual_secret_name_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "stockade.toml"
    path.write_text('[engine]\nkind = "kubernetes"\n[sandbox]\nsecrets = {API_KEY = "v"}\n')
    assert dict(load_config(path).sandbox.secrets) == {"API_KEY": "v"}
