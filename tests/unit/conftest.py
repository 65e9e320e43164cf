"""Fixtures the unit tests share: a fake engine (`backend`), kmock's Kubernetes API (`kube`,
with the supervisor's CA Secret through `kube_ca`), a free loopback port (`port`) and the test
kubelet on it (`kubelet`), a snapshot store (`store`) and a tree to capture (`tree`), an
intercepting egress proxy (`h`), a test's state folder as fakes.STATE (`state_dir`) and the
shipped deploy config (`config`, module-scoped). Plain factories are in fakes.py."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from stockade.supervisor.config import Config
from stockade.supervisor.sandboxes import workspaces
from stockade.supervisor.sandboxes.snapshots.repository import SnapshotStore
from tests.unit.deploy_files import shipped_config
from tests.unit.fakes import STATE, FakeBackend, free_port
from tests.unit.intercept_harness import Harness, started
from tests.unit.kube_mock import Kubelet, KubeMock, ca_secret, serving
from tests.unit.snapshot_trees import make_tree


@pytest.fixture(autouse=True)
def _no_mount_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A test whose supervisor made a layered workspace (a restore, a fork: as root, the
    default) leaves it mounted, as a supervisor does when it stops: unmounted after it."""
    yield
    if os.geteuid() == 0:
        workspaces.unmount_all(tmp_path_factory.getbasetemp())


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def kube() -> Iterator[KubeMock]:
    with serving() as mock:
        yield mock


@pytest.fixture
def kube_ca(kube: KubeMock) -> KubeMock:
    """`kube` holding the supervisor's CA Secret (what pods' certificates are made from)."""
    kube.put("secret", ca_secret())
    return kube


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def kubelet(kube_ca: KubeMock, tmp_path: Path, port: int) -> Iterator[Kubelet]:
    played = Kubelet(kube_ca, tmp_path / "nodes", port)
    try:
        yield played
    finally:
        played.close()


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    """An empty snapshot store in tmp_path / "store"."""
    return SnapshotStore(tmp_path / "store")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """tmp_path / "ws" holding make_tree's tree."""
    root = tmp_path / "ws"
    root.mkdir()
    make_tree(root)
    return root


@pytest_asyncio.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    """An intercepting egress proxy started on loopback (intercept_harness.started)."""
    async for harness in started(tmp_path):
        yield harness


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """tmp_path, and STATE[-1] (fakes.py) while the test runs."""
    STATE.append(tmp_path)
    yield tmp_path
    STATE.pop()


@pytest.fixture(scope="module")
def config() -> Config:
    """The config the deploy/ manifests ship (deploy_files.shipped_config)."""
    return shipped_config()
