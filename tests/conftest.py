"""Shared test set-up. Integration and security tests (tests/integration, tests/security) run
against real engines."""

from __future__ import annotations

import sys

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath) or "/security/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if "tests.integration.harness" in sys.modules:
        sys.modules["tests.integration.harness"].stop_started_services()
