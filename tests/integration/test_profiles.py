"""Sandbox profiles on real engines through the real `stockade serve`: EnsureSandbox with a
profile makes the container with the profile's memory, CPUs and image (checked from inside
its cgroup and by the engine), keeps them when the container is made again, and an E2B
templateID names a profile; an unknown one is refused on both fronts."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import Sandbox

from stockade.client import NotFound, Stockade
from stockade.supervisor.engines.image import image_ref
from tests.integration.e2b_kit import E2bServed, serving_e2b
from tests.integration.harness import engine_url

pytestmark = pytest.mark.timeout(300)
MiB = 1024 * 1024
TAGGED = "localhost/stockade-profile-test:latest"
PROFILES = f"""
[profiles.small]
cpus = 0.5
memory_mb = 256
description = "a small sandbox"
[profiles.tagged]
image = "{TAGGED}"
"""


def tag_image(engine: str) -> None:
    """The sandbox image under another name: a profile's image (one built FROM it)."""
    env = {**os.environ}
    if engine == "docker":
        env["DOCKER_HOST"] = engine_url("docker")
    subprocess.run([engine, "tag", image_ref(engine), TAGGED], env=env, check=True, timeout=60)


@pytest.fixture(scope="module")
def served(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2bServed]:
    with serving_e2b(engine, tmp_path_factory.mktemp("profiles"), PROFILES) as served:
        tag_image(engine)
        yield served


def limits(client: Stockade, key: str) -> tuple[int, float]:
    cgroup = client.inspect_isolation(key).data["inside"]["cgroup"]
    return int(cgroup["memory_bytes"]["value"]), float(cgroup["cpus"])


def test_a_profile_sets_the_containers_limits_for_good(served: E2bServed, key: str) -> None:
    with served.sup.client(token=served.token) as client:
        info = client.ensure_sandbox(key, profile="small")
        assert (info.profile, info.cpus, info.memory_mb) == ("small", 0.5, 256)
        assert limits(client, key) == (256 * MiB, pytest.approx(0.5))
        first = info.container_id
        client.destroy_sandbox(key)  # as a prune leaves it: the workspace stays
        assert client.call(key, "exec", {"command": "true"}).exit_code == 0
        again = client.get_sandbox(key)
        assert again.container_id != first
        assert (again.profile, limits(client, key)[0]) == ("small", 256 * MiB)
        base = client.ensure_sandbox(key, profile="base")
        assert base.container_id != again.container_id
        assert (base.profile, base.memory_mb) == ("base", 512)
        with pytest.raises(NotFound, match="base, small, tagged"):
            client.ensure_sandbox(key, profile="huge")


def test_a_profile_with_its_own_image(served: E2bServed, key: str) -> None:
    with served.sup.client(token=served.token) as client:
        info = client.ensure_sandbox(key, profile="tagged")
        assert (info.profile, info.image) == ("tagged", TAGGED)
        assert client.call(key, "exec", {"command": "echo from tagged"}).stdout == "from tagged\n"


def test_an_e2b_template_is_a_profile(served: E2bServed) -> None:
    opts: dict[str, Any] = served.opts()
    sbx = Sandbox.create("small", timeout=120, **opts)
    try:
        info = sbx.get_info()
        assert (info.template_id, info.memory_mb, info.cpu_count) == ("small", 256, 1)
        assert sbx.commands.run("echo ok").stdout == "ok\n"
        with served.sup.client(token=served.token) as client:
            assert limits(client, f"e2b-{sbx.sandbox_id}")[0] == 256 * MiB
    finally:
        sbx.kill()
    with pytest.raises(Exception, match="base, small, tagged"):
        Sandbox.create("python-data-science", **opts)
