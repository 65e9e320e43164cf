"""Every hardening setting and limit is configurable, and what is configured is what the
sandbox gets."""

from __future__ import annotations

import pytest

from tests.integration.harness import running_supervisor

pytestmark = pytest.mark.timeout(300)

CUSTOM = """
[sandbox]
memory_mb = 256
pids = 64
nofile = 512
tmp_size_mb = 16
cpus = 0.5
[tools]
max_output_bytes = 1000
llm_max_bytes = 2000
"""


def test_custom_limits_reach_the_container(engine: str) -> None:
    with running_supervisor(engine, extra_config=CUSTOM) as sup, sup.client() as c:
        box = c.sandbox("custom")
        memory = box.exec(
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null"
            " || cat /sys/fs/cgroup/memory.max"
        )
        assert memory.stdout == f"{256 * 1024 * 1024}\n"
        pids = box.exec(
            "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max"
        )
        assert pids.stdout == "64\n"
        assert box.exec("ulimit -n").stdout == "512\n"
        assert int(box.exec("df -k --output=size /tmp | tail -1").stdout) == 16 * 1024
        quota = box.exec(
            "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us"
            " 2>/dev/null || cat /sys/fs/cgroup/cpu.max"
        ).stdout.split()
        assert int(quota[0]) * 2 == int(quota[1])
        flood = box.exec("head -c 5000 /dev/zero | tr '\\0' a")
        assert len(flood.stdout) == 1000
        assert flood.data["stdout_truncated"] is True
        assert len(box.exec("seq 1 2000").for_llm.encode()) <= 2000
