"""Fixtures the unit tests share: a fake engine (`backend`), kmock's Kubernetes API (`kube`,
with the supervisor's CA Secret through `kube_ca`), a free loopback port (`port`) and the test
kubelet on it (`kubelet`). Plain factories are in fakes.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.fakes import FakeBackend, free_port
from tests.unit.kube_mock import Kubelet, KubeMock, ca_secret, serving


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
