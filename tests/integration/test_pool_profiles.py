"""The warm pool per profile on a real engine ([profiles.NAME] warm_pool beside
housekeeping.warm_pool): each profile's pool container is made with its profile, a new key
asking for a profile runs in that profile's pool container (never the base one), and a plain
new key in the base one."""

from __future__ import annotations

import re

import pytest

from stockade.supervisor.engines.backends.base import LABEL_POOL, LABEL_PROFILE
from tests.integration.harness import engine_url, instance_containers, running_supervisor
from tests.integration.test_housekeeping import FAST, wait_for

pytestmark = pytest.mark.timeout(600)
CONFIG = FAST + "warm_pool = 1\n[profiles.big]\ncpus = 2.0\nmemory_mb = 768\nwarm_pool = 1\n"


def test_each_profile_takes_from_its_own_pool(engine: str) -> None:
    with running_supervisor(engine, CONFIG) as sup:

        def pools() -> dict[str, set[str]]:
            found: dict[str, set[str]] = {"": set(), "big": set()}
            for info in instance_containers(engine, engine_url(engine), sup):
                if LABEL_POOL in info.labels and info.running:
                    found[info.labels.get(LABEL_PROFILE, "")].add(info.id)
            return found

        # ready as the supervisor says (its agent answered), not only running as the engine
        # says: a container that runs but is not ready yet is not taken (seen under load)
        for profile in ("base", "big"):
            line = re.compile(rf"warm pool: container \S+ \({profile}\) ready")
            wait_for(lambda line=line: line.search(sup.log()), f"a ready {profile} pool container")
        ready = pools()
        with sup.client() as c:
            big = c.ensure_sandbox("b", profile="big")
            assert big.container_id in ready["big"]
            assert (big.profile, big.cpus, big.memory_mb) == ("big", 2.0, 768)
            assert c.sandbox("b").exec("echo hi").stdout == "hi\n"
            plain = c.ensure_sandbox("plain")
            assert plain.container_id in ready[""]
            assert plain.profile == "base"
            wait_for(lambda: len(pools()["big"] - {big.container_id}) == 1, "the big pool's refill")
