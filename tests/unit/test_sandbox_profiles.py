"""Sandbox profiles ([profiles.NAME]: image, CPUs, memory) through the real sandbox manager
with a fake engine: a container is made with its profile's image and limits, a profile asked
for re-creates a sandbox made with another (workspace kept) and is the key's from then on
(after a prune, a death, a restart), the tenant's memory quota counts each sandbox's own
memory, and wrong names and values are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.supervisor.config import Config, ProfileConfig, load_config
from stockade.supervisor.errors import ConfigError, NotFound, QuotaExceeded
from stockade.supervisor.sandboxes.manager import SandboxManager
from tests.unit.fakes import FakeBackend, fake_manager

PROFILES = {
    "big": ProfileConfig(cpus=4.0, memory_mb=4096, description="for builds"),
    "py": ProfileConfig(image="localhost/my-python:1"),
}


def manager(tmp_path: Path, backend: FakeBackend, **config: object) -> SandboxManager:
    sandbox = Config().sandbox.__class__(user="1000:1000", network="none", memory_mb=512)
    cfg = Config(state_dir=tmp_path, sandbox=sandbox, profiles=PROFILES, **config)  # type: ignore[arg-type]
    return fake_manager(cfg, backend)


def made(backend: FakeBackend, container_id: str) -> tuple[str, float, int, str]:
    spec = backend.made[container_id]
    return (
        spec.image,
        spec.nano_cpus / 1e9,
        spec.memory_bytes // (1024 * 1024),
        spec.labels.get("io.stockade.profile", ""),
    )


async def test_a_container_is_made_with_its_profile(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = manager(tmp_path, backend)
    try:
        plain = await mgr.ensure("plain")
        big = await mgr.ensure("b", profile="big")
        py = await mgr.ensure("p", profile="py")
        assert made(backend, plain.info.id) == ("img", 1.0, 512, "")
        assert made(backend, big.info.id) == ("img", 4.0, 4096, "big")
        assert made(backend, py.info.id) == ("localhost/my-python:1", 1.0, 512, "py")
        info = await mgr.get("b")
        assert (info.profile, info.cpus, info.memory_mb) == ("big", 4.0, 4096)
        assert (await mgr.get("plain")).profile == "base"
        assert (await mgr.ensure("b")) is big  # no profile asked: the running one stays
        assert (await mgr.ensure("b", profile="big")) is big
        with pytest.raises(NotFound, match="base, big, py"):
            await mgr.ensure("x", profile="huge")
        assert "x" not in mgr.registry
    finally:
        await mgr.close()


async def test_a_profile_is_the_keys_for_good(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr = manager(tmp_path, backend)
    workspace = tmp_path / "sandboxes"
    first = await mgr.ensure("k", profile="big")
    (workspace / first.sid / "workspace" / "f.txt").write_text("kept")
    await mgr.destroy("k", delete_workspace=False)  # as an idle prune leaves it
    again = await mgr.ensure("k")
    assert made(backend, again.info.id)[3] == "big"
    backend.kill(again.info.id)
    mgr.registry["k"].lost = True
    healed = await mgr.ensure("k")
    assert made(backend, healed.info.id)[3] == "big"
    other = await mgr.ensure("k", profile="base")  # another profile: re-created
    assert other.info.id != healed.info.id
    assert made(backend, other.info.id) == ("img", 1.0, 512, "")
    assert (workspace / other.sid / "workspace" / "f.txt").read_text() == "kept"
    back = await mgr.ensure("k", profile="big")
    await mgr.close()
    second = manager(tmp_path, backend)
    try:
        assert await second.start() == ["k"]  # adopted with its profile
        assert second.registry["k"].info.id == back.info.id
        assert (await second.get("k")).profile == "big"
    finally:
        await second.close()


async def test_a_container_made_with_another_profile_is_replaced_at_start(
    tmp_path: Path,
) -> None:
    backend = FakeBackend()
    mgr = manager(tmp_path, backend)
    old = await mgr.ensure("k", profile="big")
    await mgr.close()
    (tmp_path / "sandboxes" / old.sid / "profile").write_text("py\n")  # what the key keeps
    second = manager(tmp_path, backend)
    try:
        assert await second.start() == []
        assert old.info.id not in backend.containers
        [new] = backend.containers.values()
        assert made(backend, new.id)[3] == "py"
    finally:
        await second.close()


async def test_the_memory_quota_counts_each_sandboxs_own_memory(tmp_path: Path) -> None:
    backend = FakeBackend()
    tenants = {"acme": Config().tenant_limits("").__class__(max_memory_mb=5000)}
    mgr = manager(tmp_path, backend, tenants=tenants)
    try:
        await mgr.ensure("acme\0a", profile="big")  # 4096
        with pytest.raises(QuotaExceeded, match="another sandbox of 4096 MiB would make 8192"):
            await mgr.ensure("acme\0b", profile="big")
        await mgr.ensure("acme\0c")  # 512: 4608 in all
        with pytest.raises(QuotaExceeded, match="would make 5120"):
            await mgr.ensure("acme\0d")
    finally:
        await mgr.close()


@pytest.mark.parametrize(
    ("name", "values", "says"),
    [
        ("Big", {}, "a profile name"),
        ("base", {}, "not 'base'"),
        ("-x", {}, "a profile name"),
        ("x" * 65, {}, "a profile name"),
        ("ok", {"cpus": -1.0}, "cpus"),
        ("ok", {"cpus": float("nan")}, "cpus"),
        ("ok", {"memory_mb": 8}, "memory_mb"),
        ("ok", {"image": "a b"}, "image"),
        ("ok", {"bogus": 1}, "unknown key"),
    ],
)
def test_wrong_profiles_are_refused(name: str, values: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(None, {f"profiles.{name}": values})
