"""Replicas of one instance (a host kind whose sandboxes any supervisor reaches: pods) share
a key's container: the first call of a key at a replica that has not seen it takes over the
container another replica made, and never makes a second one; a container it cannot use
(stopped, another key's labels, another network or profile asked for, a silent agent) is
replaced. Host kinds not shared (the local engines) keep their rule: a replica's own
container of that name is replaced."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from stockade.supervisor.config import Config
from stockade.supervisor.config.sandbox import ProfileConfig
from stockade.supervisor.config.service import StateConfig
from stockade.supervisor.engines.addresses import AgentAddress, UnixAddress
from stockade.supervisor.engines.backends.base import ContainerInfo
from stockade.supervisor.engines.hosts import LOCAL
from stockade.supervisor.errors import HostExhausted, SandboxNotFound
from stockade.supervisor.models import NetworkRequest
from stockade.supervisor.sandboxes.layout import Paths
from stockade.supervisor.sandboxes.manager import SandboxManager
from tests.unit.fakes import SHARED, FakeBackend, fake_manager


def replica(state: Path, backend: FakeBackend, network: str = "open") -> SandboxManager:
    """A supervisor of instance inst0001 with its own state directory; its agents are reached
    at the container's own address (the fake's run folder stands in for a pod's IP)."""
    sandbox = Config().sandbox.__class__(user="1000:1000", network=network)  # type: ignore[arg-type]
    config = Config(
        state_dir=state,
        sandbox=sandbox,
        profiles={"big": ProfileConfig(memory_mb=1024)},
    )

    def address_of(info: ContainerInfo, paths: Paths) -> AgentAddress:
        return UnixAddress(Path(backend.run_dirs[info.id]) / "agent.sock")

    return fake_manager(config, backend, address_of=address_of)


@pytest.fixture
def pods() -> FakeBackend:
    backend = FakeBackend()
    backend.host = SHARED
    return backend


async def test_a_replica_takes_over_the_container_another_made(
    tmp_path: Path, pods: FakeBackend
) -> None:
    one, two = replica(tmp_path / "one", pods), replica(tmp_path / "two", pods)
    made = await one.ensure("k")
    taken = await two.ensure("k")
    assert pods.runs == 1
    assert taken.info.id == made.info.id
    assert taken.greeted
    assert taken.network == made.network
    assert (await two.ensure("k")) is taken


async def test_a_stopped_container_is_replaced(tmp_path: Path, pods: FakeBackend) -> None:
    one, two = replica(tmp_path / "one", pods), replica(tmp_path / "two", pods)
    made = await one.ensure("k")
    pods.containers[made.info.id] = ContainerInfo(
        **{**made.info.__dict__, "running": False, "status": "exited"}
    )
    fresh = await two.ensure("k")
    assert pods.runs == 2
    assert fresh.info.id != made.info.id
    assert made.info.id not in pods.containers


async def test_another_network_or_profile_asked_for_is_a_new_container(
    tmp_path: Path, pods: FakeBackend
) -> None:
    one, two = replica(tmp_path / "one", pods), replica(tmp_path / "two", pods)
    await one.ensure("k")
    narrowed = await two.ensure("k", NetworkRequest(mode="none"))
    assert pods.runs == 2
    assert narrowed.network.mode == "none"
    three = replica(tmp_path / "three", pods)
    bigger = await three.ensure("k", profile="big")
    assert pods.runs == 3
    assert bigger.profile is not None
    assert bigger.profile.name == "big"
    assert len(pods.containers) == 1


async def test_a_container_labelled_for_another_key_is_not_taken(
    tmp_path: Path, pods: FakeBackend
) -> None:
    one, two = replica(tmp_path / "one", pods), replica(tmp_path / "two", pods)
    made = await one.ensure("k")
    labels = {**made.info.labels, "io.stockade.key": "other"}
    pods.containers[made.info.id] = ContainerInfo(**{**made.info.__dict__, "labels": labels})
    fresh = await two.ensure("k")
    assert fresh.info.id != made.info.id
    assert pods.runs == 2


async def test_a_silent_agent_is_replaced(tmp_path: Path, pods: FakeBackend) -> None:
    one, two = replica(tmp_path / "one", pods), replica(tmp_path / "two", pods)
    made = await one.ensure("k")
    pods.hello_refused = True
    with pytest.raises(Exception, match="did not start"):
        await two.ensure("k")  # the new one's agent is silent too
    assert made.info.id not in pods.containers


async def test_host_engines_keep_replacing(tmp_path: Path) -> None:
    backend = FakeBackend()
    one, two = replica(tmp_path / "one", backend), replica(tmp_path / "two", backend)
    made = await one.ensure("k")
    again = await two.ensure("k")
    assert backend.runs == 2
    assert again.info.id != made.info.id


async def test_a_replica_whose_sandbox_another_replaced_takes_the_new_one(
    tmp_path: Path, pods: FakeBackend
) -> None:
    """No ping-pong: one replica re-made the container (here: for another network); the other,
    finding its own gone at its next call, takes the new one rather than making a third."""
    one, two = replica(tmp_path / "one", pods), replica(tmp_path / "two", pods)
    await one.ensure("k")
    await two.ensure("k")
    remade = await two.ensure("k", NetworkRequest(mode="none"))
    assert pods.runs == 2
    held = one.registry["k"]
    held.lost = True  # what its next call's health check finds: the container is gone
    again = await one.ensure("k")
    assert again.info.id == remade.info.id
    assert pods.runs == 2


@pytest.mark.parametrize("remote", [True, False])
async def test_the_supervisors_host_room_limits_only_containers_on_it(
    tmp_path: Path, remote: bool
) -> None:
    """housekeeping.min_free_memory_mb measures the supervisor's host: it refuses new
    containers there, never a pod, which runs wherever the scheduler finds room."""
    backend = FakeBackend()
    backend.host = SHARED if remote else LOCAL
    mgr = replica(tmp_path, backend)
    hk = replace(mgr.config.housekeeping, min_free_memory_mb=1 << 30)  # a PiB: never there
    mgr.config = replace(mgr.config, housekeeping=hk)
    if remote:
        await mgr.ensure("k")
        assert backend.runs == 1
    else:
        with pytest.raises(HostExhausted):
            await mgr.ensure("k")
        assert backend.runs == 0


async def test_get_and_destroy_through_a_replica_that_never_served_the_key(
    tmp_path: Path, pods: FakeBackend
) -> None:
    one, two, three = (replica(tmp_path / n, pods) for n in ("one", "two", "three"))
    made = await one.ensure("k")
    info = await two.get("k")
    assert info.container_id == made.info.id
    assert pods.runs == 1
    assert "k" in two.registry  # held from now on, as a call would
    removed, deleted = await three.destroy("k", delete_workspace=True)
    assert (removed, deleted) == (True, True)
    assert made.info.id not in pods.containers
    with pytest.raises(SandboxNotFound):
        await three.get("k")


async def test_a_get_never_removes_a_pod_it_cannot_use(tmp_path: Path, pods: FakeBackend) -> None:
    one, two = replica(tmp_path / "one", pods), replica(tmp_path / "two", pods)
    made = await one.ensure("k")
    pods.containers[made.info.id] = ContainerInfo(
        **{**made.info.__dict__, "running": False, "status": "exited"}
    )
    with pytest.raises(SandboxNotFound):
        await two.get("k")
    assert made.info.id in pods.containers


def test_each_kubernetes_replica_is_its_own_in_the_shared_state(tmp_path: Path) -> None:
    """Replicas share the instance id (their pods' names), never their rows in the shared
    state: there, approvals, heartbeats and the quota ledger are per supervisor."""
    from stockade.supervisor.app import instance_id, replica_id
    from stockade.supervisor.config.sandbox import EngineConfig

    kube = Config(state_dir=tmp_path / "a", engine=EngineConfig(kind="kubernetes"))
    other = Config(state_dir=tmp_path / "b", engine=EngineConfig(kind="kubernetes"))
    shared = instance_id(kube.state_dir, kube)
    assert instance_id(other.state_dir, other) == shared
    assert replica_id(kube, shared) != replica_id(other, shared)
    assert replica_id(kube, shared).startswith(shared)
    host = Config(state_dir=tmp_path / "c")
    own = instance_id(host.state_dir, host)
    assert own != shared
    assert replica_id(host, own) == own


def shared(manager: SandboxManager) -> SandboxManager:
    """The replica as configured with state.url (no database is opened by these tests)."""
    manager.config = replace(manager.config, state=StateConfig(url="postgresql://db/stockade"))
    manager.housekeeping._config = manager.config
    return manager


async def test_an_idle_replica_lets_a_shared_pod_go_and_never_removes_it(
    tmp_path: Path, pods: FakeBackend
) -> None:
    """Idle in one replica's view says nothing of another's calls: with replicas (pods and
    state.url) the idle one lets go; the pod stays, and a call there takes it over again."""
    one = shared(replica(tmp_path / "one", pods))
    made = await one.ensure("k")
    made.idle_since -= 10 * one.config.housekeeping.idle_timeout_s
    assert await one.prune() == 0
    assert "k" not in one.registry
    assert made.info.id in pods.containers
    again = await one.ensure("k")
    assert again.info.id == made.info.id
    assert pods.runs == 1


async def test_a_lone_supervisor_of_pods_still_removes_idle_ones(
    tmp_path: Path, pods: FakeBackend
) -> None:
    one = replica(tmp_path / "one", pods)  # no state.url: no other replica shares its pods
    made = await one.ensure("k")
    made.idle_since -= 10 * one.config.housekeeping.idle_timeout_s
    assert await one.prune() == 1
    assert made.info.id not in pods.containers


async def test_a_replica_never_expires_a_workspace_whose_pod_runs_elsewhere(
    tmp_path: Path, pods: FakeBackend
) -> None:
    one = shared(replica(tmp_path / "one", pods))
    two = shared(replica(tmp_path / "two", pods))
    made = await one.ensure("k")
    made.idle_since -= 10 * one.config.housekeeping.idle_timeout_s
    await one.prune()  # one lets go; two serves the key
    await two.ensure("k")
    hk = replace(one.config.housekeeping, workspace_retention_s=1.0)
    one.config = replace(one.config, housekeeping=hk)
    one.housekeeping._config = one.config
    folder = one.layout.of("k")
    folder.retired.write_text("0\n")
    os.utime(folder.retired, (1, 1))
    assert await one.expire_workspaces() == 0
    assert folder.root.is_dir()
    assert made.info.id in pods.containers


async def test_a_pod_idle_at_its_agent_is_removed_by_the_replica_that_served_it_last(
    tmp_path: Path, pods: FakeBackend
) -> None:
    """The agent counts every replica's calls: when it too says nobody called for
    idle_timeout_s, the replica removes the pod instead of letting it go (its claim stays)."""
    one = shared(replica(tmp_path / "one", pods))
    made = await one.ensure("k")
    made.idle_since -= 10 * one.config.housekeeping.idle_timeout_s
    pods.agent_idle_s = one.config.housekeeping.idle_timeout_s + 1
    assert await one.prune() == 1
    assert made.info.id not in pods.containers
    assert "k" not in one.registry


async def test_a_pod_another_replica_called_lately_is_only_let_go(
    tmp_path: Path, pods: FakeBackend
) -> None:
    one = shared(replica(tmp_path / "one", pods))
    made = await one.ensure("k")
    made.idle_since -= 10 * one.config.housekeeping.idle_timeout_s
    pods.agent_idle_s = one.config.housekeeping.idle_timeout_s - 1
    assert await one.prune() == 0
    assert made.info.id in pods.containers
    assert "k" not in one.registry


async def test_a_pod_whose_agent_does_not_answer_is_only_let_go(
    tmp_path: Path, pods: FakeBackend
) -> None:
    """No answer proves nothing of the other replicas' calls: the pod is let go, never
    removed on a guess (healing and max_age_s deal with a dead one)."""
    one = shared(replica(tmp_path / "one", pods))
    made = await one.ensure("k")
    made.idle_since -= 10 * one.config.housekeeping.idle_timeout_s
    pods.agent_idle_s = None
    assert await one.prune() == 0
    assert made.info.id in pods.containers
