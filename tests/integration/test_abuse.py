"""Hostile workloads inside a sandbox: each gets a clear result, the supervisor stays
responsive with bounded memory, and the next call on the same key works."""

from __future__ import annotations

import threading

import pytest

from stockade.client import Stockade
from tests.integration.harness import Supervisor

pytestmark = pytest.mark.timeout(300)
MiB = 1024 * 1024


def assert_next_call_works(client: Stockade, key: str) -> None:
    result = client.sandbox(key).exec("echo alive; ps -e --no-headers | wc -l")
    assert result.exit_code == 0, result.for_llm
    alive, count = result.stdout.split()
    assert alive == "alive"
    assert int(count) < 10, "processes of the previous call are left behind"


def test_memory_bomb_is_killed_not_the_agent(client: Stockade, key: str) -> None:
    bomb = "python3 -c \"a = [b'x' * (50 << 20) for _ in range(100)]\""
    result = client.sandbox(key).exec(bomb, timeout=60)
    assert result.is_error
    assert result.error_code == "EXECUTION_FAILED"
    assert result.exit_code == 137
    assert result.data["oom_killed"] is True
    assert "out of memory" in result.error_message
    assert "out of memory" in result.for_llm
    assert_next_call_works(client, key)


def test_fork_bomb_is_contained(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    assert box.exec(":(){ :|:& };:").error_code == "PERMISSION_DENIED", "the guard stops it"
    # The guard is friction; the container is the boundary. A script gets past the guard:
    box.write_file("bomb.sh", ":(){ :|:& };:\n")
    result = box.exec("sh bomb.sh", timeout=5)
    assert result.error_code in ("TIMEOUT", "EXECUTION_FAILED", ""), result.for_llm
    assert_next_call_works(client, key)


def test_sleep_past_timeout_is_killed_with_its_group(client: Stockade, key: str) -> None:
    result = client.sandbox(key).exec("echo started; sleep 100 & sleep 100", timeout=1)
    assert result.is_error
    assert result.error_code == "TIMEOUT"
    assert result.data["timed_out"] is True
    assert result.stdout == "started\n"
    assert "timed out" in result.for_llm
    assert_next_call_works(client, key)


def test_output_flood_is_capped(supervisor: Supervisor, client: Stockade, key: str) -> None:
    result = client.sandbox(key).exec("yes | head -c 200M", timeout=120)
    assert result.exit_code == 0, result.for_llm
    assert result.data["stdout_truncated"] is True
    assert result.data["stdout_bytes"] == 200 * MiB
    assert len(result.stdout) == 10 * MiB
    assert result.truncated
    assert len(result.for_llm.encode()) <= 64 * 1024
    assert supervisor.rss_bytes() < 600 * MiB
    assert_next_call_works(client, key)


def test_supervisor_serves_other_keys_during_a_long_call(
    supervisor: Supervisor, client: Stockade, key: str
) -> None:
    client.sandbox(key + "-other").exec("true")
    done = threading.Event()

    def long_call() -> None:
        with supervisor.client() as c:
            c.sandbox(key).exec("sleep 8", timeout=30)
        done.set()

    worker = threading.Thread(target=long_call)
    worker.start()
    for _ in range(5):
        assert client.sandbox(key + "-other").exec("echo ok").stdout == "ok\n"
    assert not done.is_set(), "the long call ended early; this test proves nothing"
    worker.join()
    assert done.is_set()
