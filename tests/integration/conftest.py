"""Fixtures the integration tests share (the security tests take some, security/conftest.py):
the engine (`engine`, every one the run tests), a supervisor per module (`supervisor`, and
`sup` with the module's CONFIG, also as `policy_sup`), one per test (`own_supervisor`),
clients of them (`client`, `c`), a fresh sandbox key (`key`), the snapshot calls (`snaps`),
the E2B front (`served`) and the tests' Kubernetes cluster with the supervisor's CA (`kube`).
A module needing another kind of one of these defines its own by the same name."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.client import Stockade
from tests.integration.e2b_kit import E2bServed, serving_e2b
from tests.integration.harness import ENGINES, Supervisor, bring_up, running_supervisor
from tests.integration.kubelet import Kubelet, MockApi, cluster
from tests.integration.snapshot_kit import Snaps
from tests.unit.kube_mock import ca_secret

KUBE_NAMESPACE = "stockade"
"""The namespace of `kube` (the modules using it name it NAMESPACE)."""


@pytest.fixture(scope="session", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    name = str(request.param)
    bring_up(name)
    return name


@pytest.fixture(scope="module")
def supervisor(engine: str) -> Iterator[Supervisor]:
    with running_supervisor(engine) as sup:
        yield sup


@pytest.fixture
def client(supervisor: Supervisor) -> Iterator[Stockade]:
    with supervisor.client() as c:
        yield c


@pytest.fixture
def key() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def own_supervisor(engine: str) -> Iterator[Supervisor]:
    """A supervisor of the test's own (one it may restart, stop or break)."""
    with running_supervisor(engine) as sup:
        yield sup


@pytest.fixture(scope="module")
def sup(engine: str, request: pytest.FixtureRequest) -> Iterator[Supervisor]:
    """A supervisor with the test module's CONFIG as its extra config."""
    with running_supervisor(engine, extra_config=request.module.CONFIG) as s:
        yield s


@pytest.fixture(scope="module")
def policy_sup(sup: Supervisor) -> Supervisor:
    """`sup`, by the name of the modules that also use the default `supervisor`."""
    return sup


@pytest.fixture
def c(sup: Supervisor) -> Iterator[Stockade]:
    with sup.client() as client:
        yield client


@pytest.fixture
def snaps(supervisor: Supervisor) -> Iterator[Snaps]:
    """The snapshot calls on `supervisor`, as its client's tenant (none: no token)."""
    with Snaps(supervisor.target, supervisor.token) as s:
        yield s


@pytest.fixture(scope="module")
def served(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2bServed]:
    """The E2B front of a supervisor with no more config (e2b_kit.serving_e2b)."""
    with serving_e2b(engine, tmp_path_factory.mktemp("e2b")) as served:
        yield served


@pytest.fixture(scope="module")
def kube() -> Iterator[tuple[MockApi, Kubelet, Path]]:
    """The tests' cluster (kubelet.cluster) in namespace "stockade", holding the supervisor's
    CA Secret; the sandbox image built for the played pods."""
    bring_up("podman")  # the sandbox image
    with cluster(KUBE_NAMESPACE) as (api, kubelet, kubeconfig):
        api.request("POST", f"/api/v1/namespaces/{KUBE_NAMESPACE}/secrets", ca_secret())
        yield api, kubelet, kubeconfig
