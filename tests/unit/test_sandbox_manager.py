"""The sandbox manager's lifecycle rules, against an in-memory engine."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from stockade.supervisor.config import Config, SandboxConfig
from stockade.supervisor.engines.backends.base import ContainerInfo, ContainerSpec
from stockade.supervisor.engines.userns import IdMaps
from stockade.supervisor.errors import (
    InvalidRequest,
    SandboxBroken,
    SandboxLost,
    SandboxNotFound,
)
from stockade.supervisor.models import NetworkRequest
from stockade.supervisor.sandboxes.manager import SandboxManager
from tests.unit.fakes import FakeAgent, FakeBackend, fake_manager, invoke

UID = os.getuid()


def manager(
    tmp_path: Path, backend: FakeBackend, instance: str = "inst0001", network: str = "none"
) -> SandboxManager:
    sandbox = Config().sandbox.__class__(user="1000:1000", network=network)  # type: ignore[arg-type]
    return fake_manager(Config(state_dir=tmp_path, sandbox=sandbox), backend, instance_id=instance)


async def test_concurrent_first_calls_create_one_container(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend)
    await mgr.start()
    results = await asyncio.gather(*(mgr.ensure("k") for _ in range(10)))
    assert backend.runs == 1
    assert len({id(r) for r in results}) == 1


async def test_container_spec_is_hardened(tmp_path: Path, backend: FakeBackend) -> None:
    mgr = manager(tmp_path, backend)
    sandbox = await mgr.ensure("k")
    info = backend.containers[sandbox.info.id]
    assert info.labels["io.stockade.key"] == "k"
    assert info.labels["io.stockade.instance"] == "inst0001"
    assert info.name == f"stockade-inst0001-{sandbox.sid}"
    run_dir = tmp_path / "sandboxes" / sandbox.sid / "run"
    assert run_dir.stat().st_uid == 0
    assert oct(run_dir.stat().st_mode & 0o777) == "0o755"
    assert (tmp_path / "sandboxes" / sandbox.sid / "workspace").stat().st_uid == 1000


async def test_adopts_running_containers_after_restart(
    tmp_path: Path, backend: FakeBackend
) -> None:
    first = manager(tmp_path, backend)
    created = await first.ensure("k")
    await first.close()
    second = manager(tmp_path, backend)
    assert await second.start() == ["k"]
    again = await second.ensure("k")
    assert again.info.id == created.info.id
    assert backend.runs == 1


async def test_an_adopted_agent_is_used_only_after_its_handshake(
    tmp_path: Path, backend: FakeBackend
) -> None:
    """A health probe may connect an adopted container's channel before any call; the first
    call must still check the protocol (Hello), and one that fails it gets a new container."""
    first = manager(tmp_path, backend)
    created = await first.ensure("k")
    await first.close()
    second = manager(tmp_path, backend)
    assert await second.start() == ["k"]
    adopted = second.registry["k"]
    agent = adopted.agent
    assert isinstance(agent, FakeAgent)
    agent.ready = True  # connected by a probe
    backend.hello_refused = True
    with pytest.raises(SandboxBroken):  # the new container's agent refuses the same way
        await second.ensure("k")
    assert created.info.id not in backend.containers
    backend.hello_refused = False
    assert (await second.ensure("k")).info.id != created.info.id


async def test_a_container_of_another_image_is_recreated_at_start_with_its_workspace(
    tmp_path: Path, backend: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """After `stockade image build` the same reference names a new image: the container
    made from the old one is replaced when the supervisor starts, its workspace kept."""
    first = manager(tmp_path, backend)
    old = await first.ensure("k")
    (tmp_path / "sandboxes" / old.sid / "workspace" / "f.txt").write_text("kept")
    await first.close()
    backend.image_ids["img"] = "rebuilt"
    second = manager(tmp_path, backend)
    assert await second.start() == []
    assert old.info.id not in backend.containers
    [new] = backend.containers.values()
    assert (new.image_id, new.running, backend.runs) == ("rebuilt", True, 2)
    assert (await second.ensure("k")).info.id == new.id
    assert backend.runs == 2, "the next call uses the container made at start"
    assert (tmp_path / "sandboxes" / old.sid / "workspace" / "f.txt").read_text() == "kept"
    [line] = [r.getMessage() for r in caplog.records if "replacing sandbox" in r.getMessage()]
    assert "'k'" in line
    assert "processes running in it are lost" in line


async def test_a_recreated_container_keeps_its_narrowed_network(
    tmp_path: Path, backend: FakeBackend
) -> None:
    first = manager(tmp_path, backend, network="open")
    await first.ensure("k", NetworkRequest("none"))
    await first.close()
    backend.image_ids["img"] = "rebuilt"
    second = manager(tmp_path, backend, network="open")
    await second.start()
    [new] = backend.containers.values()
    assert new.image_id == "rebuilt"
    assert new.labels["io.stockade.network"] == "none"


async def test_a_narrowed_network_is_the_keys_after_a_prune_a_death_or_a_restart(
    tmp_path: Path, backend: FakeBackend
) -> None:
    """A key narrowed to `none` on an `open` supervisor never gets a wider container again:
    not when its container is pruned (no container held) and a call makes a new one, not
    when it dies, not in a new supervisor; a request may widen it again within the config."""
    mgr = manager(tmp_path, backend, network="open")
    first = await mgr.ensure("k", NetworkRequest("none"))
    assert first.network.mode == "none"
    await mgr.destroy("k", delete_workspace=False)  # as the idle prune leaves it
    assert (await mgr.ensure("k")).network.mode == "none"
    backend.kill((await mgr.ensure("k")).info.id)
    mgr.registry["k"].lost = True
    assert (await mgr.ensure("k")).network.mode == "none"
    await mgr.close()
    second = manager(tmp_path, backend, network="open")
    await second.start()
    await second.destroy("k", delete_workspace=False)
    assert (await second.ensure("k")).network.mode == "none"
    assert (await second.ensure("k", NetworkRequest("open"))).network.mode == "open"
    await second.destroy("k", delete_workspace=False)
    assert (await second.ensure("k")).network.mode == "open"
    assert (await second.ensure("other")).network.mode == "open"  # other keys: the config's
    await second.close()


async def test_a_kept_network_the_config_no_longer_allows_is_none(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend, network="open")
    await mgr.ensure("k", NetworkRequest("open"))
    await mgr.destroy("k", delete_workspace=False)
    await mgr.close()
    narrower = manager(tmp_path, backend, network="none")
    assert (await narrower.ensure("k")).network.mode == "none"
    await narrower.close()


async def test_a_container_is_adopted_when_the_image_is_missing(
    tmp_path: Path, backend: FakeBackend
) -> None:
    """No image to make a new container from: the running one is kept."""
    first = manager(tmp_path, backend)
    created = await first.ensure("k")
    await first.close()
    backend.image_ids["img"] = ""
    second = manager(tmp_path, backend)
    assert await second.start() == ["k"]
    assert (await second.ensure("k")).info.id == created.info.id


async def test_other_instances_containers_are_not_adopted(
    tmp_path: Path, backend: FakeBackend
) -> None:
    await manager(tmp_path / "a", backend, "aaaaaaaa").ensure("k")
    other = manager(tmp_path / "b", backend, "bbbbbbbb")
    assert await other.start() == []
    assert len(backend.containers) == 1


async def test_a_name_held_by_another_instance_is_never_removed(
    tmp_path: Path, backend: FakeBackend
) -> None:
    """Names carry an 8-character prefix of the instance id: two instances whose ids share
    it name their containers alike, and neither may remove the other's by name."""
    theirs = manager(tmp_path / "a", backend, "abcdef01-theirs")
    ours = manager(tmp_path / "b", backend, "abcdef01-ours")
    assert theirs.container_name("k") == ours.container_name("k")
    held = (await theirs.ensure("k")).info.id
    await ours.ensure("k")  # the fake engine allows the same name twice; a real one refuses
    mine = [
        c
        for c in backend.containers.values()
        if c.labels["io.stockade.instance"] != "abcdef01-theirs"
    ]
    assert held in backend.containers
    assert len(mine) == 1
    # destroy removes its own container by id: ours goes, theirs (same name) stays
    assert await ours.destroy("k", delete_workspace=False) == (True, False)
    assert held in backend.containers
    assert mine[0].id not in backend.containers
    # with no container of ours left, the name leads only to theirs: never removed
    assert await ours.destroy("k", delete_workspace=False) == (False, False)
    assert held in backend.containers


async def test_dead_container_is_recreated_on_next_call(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend)
    first = await mgr.ensure("k")
    backend.kill(first.info.id)
    reply = await invoke(mgr, "k", "exec", {"command": "true"}, 5, "r1")
    assert reply.result == {"exit_code": 0, "stdout": "exec", "stderr": ""}
    assert backend.runs == 2
    assert first.info.id not in backend.containers


async def test_death_during_a_call_is_sandbox_lost(tmp_path: Path, backend: FakeBackend) -> None:
    mgr = manager(tmp_path, backend)
    with pytest.raises(SandboxLost, match="exited during the call with code 137"):
        await invoke(mgr, "k", "exec", {"die": True}, 5, "r1")
    assert (await mgr.get("k")).state.value == "EXITED"
    await invoke(mgr, "k", "exec", {}, 5, "r2")
    assert backend.runs == 2


async def test_death_the_engine_notices_late_is_still_sandbox_lost(
    tmp_path: Path, backend: FakeBackend
) -> None:
    """Podman on a busy host reports a killed container as running for a while."""
    mgr = manager(tmp_path, backend)
    await mgr.ensure("k")
    backend.stale_inspects = 6
    with pytest.raises(SandboxLost, match="exited during the call"):
        await invoke(mgr, "k", "exec", {"die": True}, 5, "r1")
    assert backend.stale_inspects == 0


async def test_a_failed_call_with_a_live_agent_marks_the_sandbox_broken(
    tmp_path: Path, backend: FakeBackend
) -> None:
    """The container lives but its agent answered what the channel refused (issue 5: an
    oversized reply reports the sandbox broken and the next call recreates it)."""
    mgr = manager(tmp_path, backend)
    with pytest.raises(SandboxBroken, match="reply too large"):
        await invoke(mgr, "k", "exec", {"break": True}, 5, "r1")
    assert (await mgr.get("k")).state.value == "BROKEN"
    assert (await invoke(mgr, "k", "exec", {}, 5, "r2")).result is not None
    assert backend.runs == 2


async def test_destroy_keeps_workspace_unless_asked(tmp_path: Path, backend: FakeBackend) -> None:
    mgr = manager(tmp_path, backend)
    sandbox = await mgr.ensure("k")
    workspace = tmp_path / "sandboxes" / sandbox.sid / "workspace"
    assert await mgr.destroy("k", delete_workspace=False) == (True, False)
    assert workspace.is_dir()
    assert (await mgr.get("k")).state.value == "ABSENT"
    assert [i.key for i in await mgr.list()] == ["k"]
    assert await mgr.destroy("k", delete_workspace=True) == (False, True)
    assert not workspace.exists()
    with pytest.raises(SandboxNotFound):
        await mgr.get("k")
    with pytest.raises(SandboxNotFound):
        await mgr.destroy("k", delete_workspace=False)


async def test_bad_keys_are_refused_before_any_container(
    tmp_path: Path, backend: FakeBackend
) -> None:
    mgr = manager(tmp_path, backend)
    for key in ("", "x" * 300, "a\x00"):
        with pytest.raises(InvalidRequest):
            await mgr.ensure(key)
    assert backend.runs == 0


class SpecBackend(FakeBackend):
    """Keeps the specs it was asked to run."""

    def __init__(self, tmpfs_inodes: bool) -> None:
        super().__init__()
        self.tmpfs_inodes = tmpfs_inodes
        self.specs: list[ContainerSpec] = []

    def run(self, spec: ContainerSpec, prepare: Callable[[IdMaps], None]) -> ContainerInfo:
        self.specs.append(spec)
        return super().run(spec, prepare)


def spec_manager(tmp_path: Path, backend: SpecBackend, host_mounts: bool) -> SandboxManager:
    config = Config(state_dir=tmp_path, sandbox=SandboxConfig(runtime="runc"))
    return fake_manager(config, backend, host_mounts=host_mounts)


async def test_an_engine_with_tmpfs_inodes_caps_tmp_itself(tmp_path: Path) -> None:
    backend = SpecBackend(tmpfs_inodes=True)
    mgr = spec_manager(tmp_path, backend, host_mounts=True)
    await mgr.start()
    await mgr.ensure("k")
    spec = backend.specs[0]
    assert (spec.tmpfs, spec.tmpfs_inodes, spec.runtime) == ({"/tmp": 64 << 20}, 65536, "runc")
    assert [m.target for m in spec.mounts] == ["/workspace", "/run/stockade"]


async def test_from_a_container_tmp_stays_the_engines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tmpfs mounted in the supervisor's container would not reach the engine, which would
    bind-mount the bare directory under it: the engine's tmpfs stays, with a warning."""
    backend = SpecBackend(tmpfs_inodes=False)
    mgr = spec_manager(tmp_path, backend, host_mounts=False)
    await mgr.start()
    assert "sandbox.tmp_inodes is not enforced" in caplog.text
    await mgr.ensure("k")
    spec = backend.specs[0]
    assert spec.tmpfs == {"/tmp": 64 << 20}
    assert "/tmp" not in [m.target for m in spec.mounts]
    assert not (tmp_path / "sandboxes" / mgr.layout.of("k").root.name / "tmp").is_mount()
