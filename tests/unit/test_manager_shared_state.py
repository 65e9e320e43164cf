"""The sandbox manager on a shared PostgreSQL state (a real server, tests/pg.py), against
in-memory engines: two managers (two supervisors) never create one key's sandbox at once
(the state's key lock is held across the create), and each one's sandboxes count in the
other's tenant quota (admission through the ledger, its holdings published by follow)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from stockade.supervisor.config import Config, TenantConfig
from stockade.supervisor.engines.backends.base import ContainerInfo, ContainerSpec
from stockade.supervisor.engines.userns import IdMaps
from stockade.supervisor.errors import QuotaExceeded
from stockade.supervisor.keys import scope
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.supervisor.state.postgres import PostgresState
from tests.pg import PgServer, postgres_server
from tests.unit.fakes import FakeBackend, fake_manager

pytestmark = pytest.mark.timeout(120)
CREATE_S = 0.3


class SlowBackend(FakeBackend):
    """A create that takes CREATE_S, noted in a log shared by both engines."""

    def __init__(self, log: list[tuple[str, float, float]]) -> None:
        super().__init__()
        self.log = log

    def run(self, spec: ContainerSpec, prepare: Callable[[IdMaps], None]) -> ContainerInfo:
        started = time.monotonic()
        time.sleep(CREATE_S)
        info = super().run(spec, prepare)
        self.log.append((spec.labels["io.stockade.key"], started, time.monotonic()))
        return info


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    with postgres_server() as found:
        yield found


@pytest.fixture
async def states(server: PgServer) -> AsyncIterator[tuple[PostgresState, PostgresState]]:
    url = server.create_database(f"m{time.monotonic_ns()}")
    pair = PostgresState.open(url, "sup-one"), PostgresState.open(url, "sup-two")
    for state in pair:
        await state.start()
    try:
        yield pair
    finally:
        for state in pair:
            await state.close()


def manager(
    tmp_path: Path, backend: FakeBackend, state: PostgresState, name: str
) -> SandboxManager:
    sandbox = Config().sandbox.__class__(user="1000:1000", network="none")
    tenants = {"acme": TenantConfig(max_sandboxes=2)}
    config = Config(state_dir=tmp_path / name, sandbox=sandbox, tenants=tenants)
    made = fake_manager(config, backend, instance_id=name, state=state)
    state.follow(made.held)
    return made


async def test_one_keys_creates_never_overlap_across_supervisors(
    tmp_path: Path, states: tuple[PostgresState, PostgresState]
) -> None:
    log: list[tuple[str, float, float]] = []
    one = manager(tmp_path, SlowBackend(log), states[0], "sup-one")
    two = manager(tmp_path, SlowBackend(log), states[1], "sup-two")
    key, other = scope("acme", "k"), scope("acme", "other")
    await asyncio.gather(one.ensure(key), two.ensure(key), two.ensure(other))
    spans = sorted((start, end) for k, start, end in log if k == "k")
    assert len(spans) == 2
    assert spans[1][0] >= spans[0][1], "the second create of k began before the first ended"
    others = [(start, end) for k, start, end in log if k == "other"]
    assert others[0][0] < spans[0][1], "another key's create waited for k's"
    for mgr in (one, two):
        await mgr.close()


async def test_each_supervisors_sandboxes_count_in_the_others_quota(
    tmp_path: Path, states: tuple[PostgresState, PostgresState]
) -> None:
    log: list[tuple[str, float, float]] = []
    one = manager(tmp_path, SlowBackend(log), states[0], "sup-one")
    two = manager(tmp_path, SlowBackend(log), states[1], "sup-two")
    await one.ensure(scope("acme", "a"))
    await two.ensure(scope("acme", "b"))
    with pytest.raises(QuotaExceeded, match="across the supervisors"):
        await one.ensure(scope("acme", "c"))
    assert scope("acme", "c") not in one.held()
    await two.destroy(scope("acme", "b"), delete_workspace=True)
    assert two.held() == {}
    deadline = time.monotonic() + 10  # the next heartbeat publishes two's holdings
    while True:
        try:
            await one.ensure(scope("acme", "c"))
            break
        except QuotaExceeded:
            assert time.monotonic() < deadline, "b's place never came back"
            await asyncio.sleep(0.2)
    for mgr in (one, two):
        await mgr.close()
