"""Housekeeping against an in-memory engine: idle and age prune, calls in flight, workspace
retention, the warm pool, host pressure, the instance lock and the orphan reaper's proof."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor.config import Config, load_config
from stockade.supervisor.engines.backends.base import (
    LABEL_INSTANCE,
    LABEL_OWNER,
    LABEL_POOL,
    LABEL_STATE_DIR,
)
from stockade.supervisor.errors import ConfigError, HostExhausted
from stockade.supervisor.sandboxes import owner
from stockade.supervisor.sandboxes.manager import SandboxManager
from tests.unit.fakes import FakeBackend, fake_manager, invoke, quiet_housekeeping, refused_config


class GatedBackend(FakeBackend):
    """remove() waits until the test opens the gate (a removal in progress)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.removing = threading.Event()

    def remove(self, name_or_id: str) -> bool:
        self.removing.set()
        assert self.gate.wait(30)
        return super().remove(name_or_id)


def manager(
    tmp_path: Path, backend: FakeBackend, events: list[tuple[str, str, str]] | None = None,
    instance: str = "inst0001", **housekeeping: Any,
) -> SandboxManager:  # fmt: skip
    config = Config(
        state_dir=tmp_path,
        sandbox=Config().sandbox.__class__(user="1000:1000"),
        housekeeping=quiet_housekeeping(**housekeeping),
    )
    record = (lambda *event: events.append(event)) if events is not None else None
    return fake_manager(config, backend, instance_id=instance, record_event=record)


def sandbox_dir(tmp_path: Path, mgr: SandboxManager, key: str) -> Path:
    return tmp_path / "sandboxes" / mgr.layout.of(key).root.name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[housekeeping]\nidle_timeout_s = -1", "idle_timeout_s must be between 0"),
        ("[housekeeping]\nmax_age_s = nan", "max_age_s must be between 0"),
        ("[housekeeping]\nworkspace_retention_s = inf", "workspace_retention_s must be"),
        ("[housekeeping]\nshutdown_grace_s = 1e300", "shutdown_grace_s must be between"),
        ("[housekeeping]\nsweep_interval_s = 0", "sweep_interval_s must be at least"),
        ("[housekeeping]\nwarm_pool = -1", "warm_pool must be between 0 and 64"),
        ("[housekeeping]\nwarm_pool = 100000", "warm_pool must be between 0 and 64"),
        ("[housekeeping]\nmin_free_memory_mb = -5", "min_free_memory_mb must not be negative"),
        ("[housekeeping]\nmin_free_disk_mb = -1", "min_free_disk_mb must not be negative"),
        ("[housekeeping]\nreap_orphans = 1", "reap_orphans must be bool"),
        ("[housekeeping]\nwarm_pool = '3'", "warm_pool must be int"),
        ("[housekeeping]\nidle = 3", "unknown key(s) in [housekeeping]: idle"),
        ("housekeeping = 3", "[housekeeping] must be a table"),
    ],
)
def test_bad_housekeeping_config(tmp_path: Path, text: str, message: str) -> None:
    assert message in refused_config(tmp_path, text)


def test_housekeeping_defaults_and_zero_disables(tmp_path: Path) -> None:
    hk = Config().housekeeping
    assert (hk.idle_timeout_s, hk.max_age_s, hk.warm_pool) == (1800.0, 86400.0, 0)
    assert hk.reap_orphans
    assert hk.workspace_retention_s == 7 * 86400
    path = tmp_path / "c.toml"
    path.write_text(
        "[housekeeping]\nidle_timeout_s = 0\nmax_age_s = 0\nworkspace_retention_s = 0\n"
        "min_free_memory_mb = 0\nmin_free_disk_mb = 0\nshutdown_grace_s = 0\nwarm_pool = 64\n"
    )
    loaded = load_config(path).housekeeping
    assert loaded.idle_timeout_s == 0.0
    assert loaded.warm_pool == 64


async def test_idle_sandbox_loses_its_container_not_its_workspace(tmp_path: Path) -> None:
    backend, events = FakeBackend(), []
    mgr = manager(tmp_path, backend, events, idle_timeout_s=0.05)
    first = await mgr.ensure("k")
    await asyncio.sleep(0.1)
    await mgr.prune()
    assert not backend.containers
    assert (await mgr.get("k")).state.value == "ABSENT"
    folder = sandbox_dir(tmp_path, mgr, "k")
    assert (folder / "workspace").is_dir()
    assert (folder / "retired-at").exists()
    assert events
    assert events[0][:2] == ("k", "remove container")
    assert "idle for" in events[0][2]
    await invoke(mgr, "k", "exec", {}, 5, "r")
    assert backend.runs == 2
    assert first.info.id not in backend.containers
    assert not (folder / "retired-at").exists()


async def test_a_call_in_flight_keeps_its_sandbox(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = manager(tmp_path, backend, idle_timeout_s=0.05, max_age_s=0.05)
    hold = asyncio.Event()
    call = asyncio.create_task(invoke(mgr, "k", "exec", {"hold": hold}, 5, "r"))
    while not backend.containers or not mgr.registry.get("k"):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # idle and old past both limits, but busy
    assert await mgr.prune() == 0
    assert len(backend.containers) == 1
    hold.set()
    assert (await call).result is not None
    assert await mgr.prune() == 1  # once the call ended
    assert not backend.containers


async def test_a_call_during_removal_waits_and_gets_a_new_container(tmp_path: Path) -> None:
    backend = GatedBackend()
    mgr = manager(tmp_path, backend, idle_timeout_s=0.01)
    old = await mgr.ensure("k")
    await asyncio.sleep(0.05)
    backend.gate.clear()
    pruning = asyncio.create_task(mgr.prune())
    await asyncio.to_thread(backend.removing.wait, 30)
    call = asyncio.create_task(invoke(mgr, "k", "exec", {}, 5, "r"))
    await asyncio.sleep(0.05)
    assert not call.done()  # waits for the key's lock
    backend.gate.set()
    assert await pruning == 1
    assert (await call).result is not None
    new = await mgr.ensure("k")
    assert new.info.id != old.info.id
    assert backend.runs == 2


async def test_old_sandbox_is_replaced(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = manager(tmp_path, backend, idle_timeout_s=0, max_age_s=0.05)
    old = await mgr.ensure("k")
    await asyncio.sleep(0.1)
    await invoke(mgr, "k", "exec", {}, 5, "r")  # use does not make it young
    assert await mgr.prune() == 1
    assert old.info.id not in backend.containers


async def test_workspace_retention(tmp_path: Path) -> None:
    backend, events = FakeBackend(), []
    mgr = manager(tmp_path, backend, events, idle_timeout_s=0, workspace_retention_s=0.05)
    await mgr.ensure("kept")
    await mgr.ensure("gone")
    await mgr.destroy("gone", delete_workspace=False)
    assert await mgr.expire_workspaces() == 0  # not yet
    await asyncio.sleep(0.1)
    assert await mgr.expire_workspaces() == 1
    assert not sandbox_dir(tmp_path, mgr, "gone").exists()
    assert sandbox_dir(tmp_path, mgr, "kept").is_dir()  # it has a container
    assert events[-1][:2] == ("gone", "delete workspace")
    assert [i.key for i in await mgr.list()] == ["kept"]


async def test_unstamped_workspace_is_stamped_first_and_zero_keeps(tmp_path: Path) -> None:
    backend = FakeBackend()
    first = manager(tmp_path, backend, workspace_retention_s=0)
    await first.ensure("k")
    await first.destroy("k", delete_workspace=False)
    (sandbox_dir(tmp_path, first, "k") / "retired-at").unlink()
    assert await first.expire_workspaces() == 0  # 0: kept until destroyed
    await first.close()
    second = manager(tmp_path, backend, workspace_retention_s=0.05)
    await asyncio.sleep(0.1)
    assert await second.expire_workspaces() == 0  # found without a stamp: stamped now
    await asyncio.sleep(0.1)
    assert await second.expire_workspaces() == 1


async def test_warm_pool_serves_a_new_key_and_refills(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = manager(tmp_path, backend, warm_pool=1)
    await mgr.start()
    mgr.start_housekeeping()
    while len(mgr.pool.ready) < 1:
        await asyncio.sleep(0.01)
    pooled = next(iter(backend.containers.values()))
    assert LABEL_POOL in pooled.labels
    sandbox = await mgr.ensure("new")
    assert sandbox.info.id == pooled.id
    assert (await invoke(mgr, "new", "exec", {}, 5, "r")).result is not None
    while len(mgr.pool.ready) < 1:
        await asyncio.sleep(0.01)
    assert backend.runs == 2
    folder = sandbox_dir(tmp_path, mgr, "new")
    assert (folder / "key").read_text() == "new"
    assert (folder / "workspace").is_dir()
    # a key with a workspace already needs its own container on that workspace
    await mgr.destroy("new", delete_workspace=False)
    assert pooled.id not in backend.containers
    await mgr.ensure("new")
    assert backend.runs == 3
    assert len(mgr.pool.ready) == 1
    await mgr.close()
    assert [i for i in backend.containers.values() if LABEL_POOL in i.labels] == []
    assert not list((tmp_path / "sandboxes").glob("pool-*"))


async def test_pooled_sandbox_is_adopted_after_restart(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = manager(tmp_path, backend, warm_pool=1)
    await mgr.start()
    mgr.start_housekeeping()
    while len(mgr.pool.ready) < 1:
        await asyncio.sleep(0.01)
    taken = await mgr.ensure("k")
    while len(mgr.pool.ready) < 1:
        await asyncio.sleep(0.01)
    await mgr.close()
    again = manager(tmp_path, backend)
    assert await again.start() == ["k"]
    assert (await again.ensure("k")).info.id == taken.info.id
    assert list(backend.containers) == [taken.info.id]  # the unassigned one is gone


async def test_host_pressure_refuses_new_sandboxes_only(tmp_path: Path) -> None:
    backend = FakeBackend()
    first = manager(tmp_path, backend)
    await first.ensure("old")
    await first.close()
    short = manager(tmp_path, backend, min_free_memory_mb=10**9)
    await short.start()
    with pytest.raises(HostExhausted, match="min_free_memory_mb = 1000000000"):
        await short.ensure("new")
    assert (await invoke(short, "old", "exec", {}, 5, "r")).result is not None
    await short.close()
    disk = manager(tmp_path, backend, min_free_disk_mb=10**12)
    with pytest.raises(HostExhausted, match="MiB of disk free"):
        await disk.ensure("new")
    assert backend.runs == 1


async def test_one_supervisor_per_state_dir(tmp_path: Path) -> None:
    backend = FakeBackend()
    first = manager(tmp_path, backend)
    with pytest.raises(ConfigError, match="another supervisor is running"):
        manager(tmp_path, backend)
    await first.close()
    manager(tmp_path, backend)  # free again


def dead_process() -> tuple[int, int]:
    child = subprocess.Popen(["sleep", "60"])
    start = owner.start_ticks(child.pid)
    child.kill()
    child.wait()
    assert start is not None
    return child.pid, start


def labels_for(state_dir: Path, who: owner.Owner, instance: str = "deadbeef01") -> dict[str, str]:
    return {LABEL_INSTANCE: instance, LABEL_STATE_DIR: str(state_dir), LABEL_OWNER: who.label()}


def test_orphan_proof(tmp_path: Path) -> None:
    lock = owner.InstanceLock(tmp_path)
    me = owner.this_process(lock)
    pid, start = dead_process()
    gone_dir = tmp_path / "gone"
    dead = owner.Owner(me.boot_id, me.pid_ns, me.mnt_ns, pid, start, 1, 1)
    locked = owner.locked_inodes()
    assert "has ended" in str(owner.gone_because(labels_for(gone_dir, dead), me, locked))
    live = owner.Owner(me.boot_id, me.pid_ns, me.mnt_ns, me.pid, me.start_ticks, 1, 1)
    assert owner.gone_because(labels_for(gone_dir, live), me, locked) is None
    held = owner.Owner(me.boot_id, me.pid_ns, me.mnt_ns, pid, start, lock.dev, lock.ino)
    assert owner.gone_because(labels_for(gone_dir, held), me, locked) is None
    lock.release()
    assert owner.gone_because(labels_for(gone_dir, held), me, owner.locked_inodes())
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "instance-id").write_text("deadbeef01\n")
    assert owner.gone_because(labels_for(stopped, dead), me, locked) is None
    assert owner.gone_because(labels_for(stopped, dead, "other"), me, locked)
    for other in (
        owner.Owner("another-boot", me.pid_ns, me.mnt_ns, pid, start, 1, 1),
        owner.Owner(me.boot_id, me.pid_ns + 1, me.mnt_ns, pid, start, 1, 1),
        owner.Owner(me.boot_id, me.pid_ns, me.mnt_ns + 1, pid, start, 1, 1),
    ):
        assert owner.gone_because(labels_for(gone_dir, other), me, locked) is None
    for bad in (
        {},
        {LABEL_INSTANCE: "x"},
        {**labels_for(gone_dir, dead), LABEL_OWNER: "1/2"},
        {**labels_for(gone_dir, dead), LABEL_STATE_DIR: "relative/dir"},
        {**labels_for(gone_dir, dead), LABEL_OWNER: dead.label().replace("/", "/x", 1)},
    ):
        assert owner.gone_because(bad, me, locked) is None  # fmt: skip


def test_owner_label_round_trip() -> None:
    parsed = owner.Owner.parse("b/1/2/3/4/5/6")
    assert parsed == owner.Owner("b", 1, 2, 3, 4, 5, 6)
    assert parsed is not None
    assert owner.Owner.parse(parsed.label()) == parsed
    for text in ("", "b/1/2/3/4/5", "/1/2/3/4/5/6", "b/1/2/0/4/5/6", "b/1/2/3/4/5/x" * 100):
        assert owner.Owner.parse(text) is None


async def test_reaper_removes_only_provably_gone_instances(tmp_path: Path) -> None:
    backend = FakeBackend()
    events: list[tuple[str, str, str]] = []
    dead_dir, live_dir = tmp_path / "dead", tmp_path / "live"
    dead = manager(dead_dir, backend, instance="deadbeef01")
    await dead.ensure("d")
    live = manager(live_dir, backend, instance="11ve000001")
    await live.ensure("l")
    legacy = await manager(tmp_path / "legacy", backend, instance="01d0000001").ensure("x")
    backend.containers[legacy.info.id] = legacy.info.__class__(
        **{**legacy.info.__dict__, "labels": {"io.stockade.managed": "1",
                                              LABEL_INSTANCE: "01d0000001"}}
    )  # fmt: skip
    # The "dead" instance: its process must look ended and its lock free.
    pid, start = dead_process()
    me = dead.owner
    dead.owner = owner.Owner(me.boot_id, me.pid_ns, me.mnt_ns, pid, start, 1, 1)
    await dead.destroy("d", delete_workspace=True)
    await dead.ensure("d")
    await dead.close()
    (dead_dir / "instance-id").write_text("deadbeef01\n")  # as app.instance_id() keeps it
    reaper = manager(tmp_path / "reaper", backend, events, instance="4ea9e40001")
    assert await reaper.reap_orphans() == 0  # its state directory still names it
    (dead_dir / "instance-id").write_text("someone-else\n")
    assert await reaper.reap_orphans() == 1
    left = {i.labels.get(LABEL_INSTANCE) for i in backend.containers.values()}
    assert left == {"11ve000001", "01d0000001"}
    assert events[-1][:2] == ("d", "reap orphan")
