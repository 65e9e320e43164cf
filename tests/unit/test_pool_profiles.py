"""The warm pool per profile (housekeeping.warm_pool for the default one, [profiles.NAME]
warm_pool for the others), through the real sandbox manager with a fake engine: each profile's
containers are made with its image, CPUs and memory; a new key asking for a profile takes one
of that profile's (never another's), the pool refills, the profile stays the key's after a
restart, and sizes out of range are refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from stockade.supervisor.config import Config, ProfileConfig, load_config
from stockade.supervisor.engines.backends.base import LABEL_POOL
from stockade.supervisor.errors import ConfigError
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.supervisor.sandboxes.pool import profile_of
from tests.unit.fakes import FakeBackend, fake_manager, quiet_housekeeping

PROFILES = {
    "big": ProfileConfig(cpus=4.0, memory_mb=4096, warm_pool=2),
    "py": ProfileConfig(image="localhost/my-python:1"),
}


def manager(tmp_path: Path, backend: FakeBackend, warm_pool: int = 1) -> SandboxManager:
    config = Config(
        state_dir=tmp_path,
        sandbox=Config().sandbox.__class__(user="1000:1000", network="none", memory_mb=512),
        profiles=PROFILES,
        housekeeping=quiet_housekeeping(warm_pool=warm_pool),
    )
    return fake_manager(config, backend)


def pooled(mgr: SandboxManager) -> list[str]:
    return sorted(profile_of(c) or "base" for c in mgr.pool.ready)


async def filled(mgr: SandboxManager, want: list[str]) -> None:
    while pooled(mgr) != want:
        await asyncio.sleep(0.01)


def made(backend: FakeBackend, container_id: str) -> tuple[str, float, int]:
    spec = backend.made[container_id]
    return spec.image, spec.nano_cpus / 1e9, spec.memory_bytes // (1024 * 1024)


async def test_each_profile_keeps_its_own_pool(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = manager(tmp_path, backend)
    await mgr.start()
    mgr.start_housekeeping()
    try:
        await filled(mgr, ["base", "big", "big"])
        ready = {c.info.id: profile_of(c) for c in mgr.pool.ready}
        assert sorted(made(backend, i) for i in ready) == [
            ("img", 1.0, 512), ("img", 4.0, 4096), ("img", 4.0, 4096),
        ]  # fmt: skip
        big = await mgr.ensure("b", profile="big")
        assert ready.get(big.info.id) == "big"
        assert LABEL_POOL in backend.made[big.info.id].labels
        plain = await mgr.ensure("plain")
        assert ready.get(plain.info.id) == ""
        runs = backend.runs
        py = await mgr.ensure("p", profile="py")  # no pool of its own, none of another's
        assert py.info.id not in ready
        assert made(backend, py.info.id) == ("localhost/my-python:1", 1.0, 512)
        assert backend.runs == runs + 1
        await filled(mgr, ["base", "big", "big"])
        assert (await mgr.get("b")).profile == "big"
    finally:
        await mgr.close()
    again = manager(tmp_path, backend, warm_pool=0)
    assert sorted(await again.start()) == ["b", "p", "plain"]
    try:
        assert (await again.get("b")).profile == "big"  # kept in the key's folder
        assert (await again.ensure("b")).info.id == big.info.id
    finally:
        await again.close()


async def test_a_key_with_a_workspace_never_takes_a_pool_container(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = manager(tmp_path, backend, warm_pool=0)
    await mgr.start()
    mgr.start_housekeeping()
    try:
        await filled(mgr, ["big", "big"])
        first = await mgr.ensure("b", profile="big")
        await filled(mgr, ["big", "big"])
        ready = {c.info.id for c in mgr.pool.ready}
        await mgr.destroy("b", delete_workspace=False)
        again = await mgr.ensure("b", profile="big")
        assert again.info.id not in ready
        assert again.info.id != first.info.id
    finally:
        await mgr.close()


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"profiles.big": {"warm_pool": -1}}, "profiles.big.warm_pool must be between 0 and 64"),
        ({"profiles.big": {"warm_pool": 65}}, "profiles.big.warm_pool must be between 0 and 64"),
        ({"profiles.big": {"warm_pool": "2"}}, "warm_pool must be int"),
        (
            {"housekeeping": {"warm_pool": 40}, "profiles.big": {"warm_pool": 30}},
            "the warm pools keep 70 containers together",
        ),
    ],
)
def test_pool_sizes_out_of_range_are_refused(values: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(None, values)
