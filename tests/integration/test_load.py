"""Load: 50 keys x 200 mixed calls from concurrent clients (threads and asyncio tasks over
several channels) on one supervisor; every result is checked and none may fail. The workload
is bench.load's, which `make bench` times."""

from __future__ import annotations

import pytest

from bench.load import run_load
from stockade.supervisor.engines.backends.base import LABEL_KEY
from tests.integration.harness import (
    NO_RATE_LIMIT,
    engine_url,
    instance_containers,
    running_supervisor,
)

pytestmark = pytest.mark.timeout(900)
KEYS, CALLS = 50, 200


def test_load_50_keys_x_200_mixed_calls(engine: str) -> None:
    with running_supervisor(engine, NO_RATE_LIMIT) as sup:
        report = run_load(sup.target, keys=KEYS, calls=CALLS)
        assert report["errors"] == 0, report["first_errors"]
        assert report["calls"] == KEYS * CALLS
        assert set(report["by_tool"]) == {
            "write_file", "read_file", "edit_file", "list_files", "glob", "search", "exec"
        }  # fmt: skip
        containers = instance_containers(engine, engine_url(engine), sup)
        assert all(c.running for c in containers)
        assert sorted(c.labels[LABEL_KEY] for c in containers) == [
            f"load-{i:03}" for i in range(KEYS)
        ], "one container per key, none leaked"
        assert "Traceback" not in sup.log()
