"""Shared test set-up. Integration and security tests (tests/integration, tests/security) run
against real engines."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Generator
from types import FrameType

import pytest
from hypothesis import settings

settings.register_profile(
    "stockade", max_examples=200, derandomize=True, deadline=None, database=None
)
settings.register_profile("thorough", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("STOCKADE_HYPOTHESIS_PROFILE", "stockade"))
"""Property tests: deterministic by default (the same examples on every run and in CI, no
timing limit on a busy machine); STOCKADE_HYPOTHESIS_PROFILE=thorough searches further."""


SHARDS = ("unit", "podman", "docker")
"""What `make test` runs side by side (scripts/run_tests.py), named in STOCKADE_TEST_SHARD:
`podman` and `docker` are the integration and security tests on that engine; `unit` is the
rest, with the few integration tests that take no engine (Kubernetes, PostgreSQL, both
engines at once). Unset: every test, in one process."""


def shard_of(item: pytest.Item) -> str:
    """The shard a test belongs to: its engine parameter's, else `unit`."""
    callspec = getattr(item, "callspec", None)
    engine = callspec.params.get("engine") if callspec is not None else None
    if item.get_closest_marker("integration") is not None and engine in ("podman", "docker"):
        return str(engine)
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath) or "/security/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
    shard = os.environ.get("STOCKADE_TEST_SHARD", "")
    if not shard:
        return
    if shard not in SHARDS:
        raise pytest.UsageError(f"STOCKADE_TEST_SHARD={shard!r}: one of {', '.join(SHARDS)}")
    kept = [item for item in items if shard_of(item) == shard]
    dropped = [item for item in items if shard_of(item) != shard]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    """A run ended by SIGTERM (`timeout 600 pytest ...`, a shard stopped) ends as an
    interrupted one (^C) does: the fixtures in use tear down, so the supervisors it started
    are stopped and their containers and state directories removed. Under SIGTERM's default
    action the process died at once and left them running (a hostile-agent run killed so at
    10:38 left its containers and /tmp/stk... behind). A second SIGTERM kills as before."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if "tests.integration.harness" in sys.modules:
        sys.modules["tests.integration.harness"].stop_started_services()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test that timed out (or whose call's deadline passed) reports where each supervisor
    it left running waits (observe/waits.py): a hang in CI is read from its output."""
    report = yield
    if report.when == "call" and report.failed and call.excinfo is not None:
        text = str(call.excinfo.value)
        if (
            "Timeout" in text
            or "DEADLINE_EXCEEDED" in text
            or call.excinfo.errisinstance(TimeoutError)
        ):
            harness = sys.modules.get("tests.integration.harness")
            for sup in list(getattr(harness, "RUNNING", {}).values()):
                report.sections.append(
                    (f"suspended awaits of the supervisor at {sup.target}", sup.waits())
                )
    return report
