"""Shared test set-up. Integration and security tests (tests/integration, tests/security) run
against real engines."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import settings

settings.register_profile(
    "stockade", max_examples=200, derandomize=True, deadline=None, database=None
)
settings.register_profile("thorough", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("STOCKADE_HYPOTHESIS_PROFILE", "stockade"))
"""Property tests: deterministic by default (the same examples on every run and in CI, no
timing limit on a busy machine); STOCKADE_HYPOTHESIS_PROFILE=thorough searches further."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath) or "/security/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if "tests.integration.harness" in sys.modules:
        sys.modules["tests.integration.harness"].stop_started_services()
