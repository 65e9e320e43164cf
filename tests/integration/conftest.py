from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from stockade.client import Stockade
from tests.integration.harness import ENGINES, Supervisor, bring_up, running_supervisor


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
