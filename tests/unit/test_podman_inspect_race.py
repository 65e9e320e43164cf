"""Podman 4.3 answers an inspect with a 500 while a container's main process exits under it
(CI caught it when a test killed an agent from outside): the backend asks again rather than
failing the caller's call with UNAVAILABLE."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import podman.errors
import pytest

from stockade.supervisor.engines.backends import podman as backend_module
from stockade.supervisor.engines.backends.podman import PodmanBackend
from stockade.supervisor.errors import EngineUnavailable

EXITING = "500 Server Error: Internal Server Error (read /proc/954/cgroup: no such process)"


class Containers:
    def __init__(self, failures: list[str]) -> None:
        self.failures = failures
        self.asked = 0

    def get(self, name: str) -> Any:
        self.asked += 1
        if self.failures:
            raise podman.errors.APIError(self.failures.pop(0))
        return SimpleNamespace(attrs={"Id": name, "State": {"Status": "exited"}})


def backend(
    failures: list[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[PodmanBackend, Containers]:
    monkeypatch.setattr(backend_module.time, "sleep", lambda _s: None)
    made = PodmanBackend("unix:///nonexistent/podman.sock")
    containers = Containers(failures)
    monkeypatch.setattr(made, "_client", SimpleNamespace(containers=containers))  # the SDK's
    return made, containers


def test_an_inspect_racing_an_exiting_process_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made, containers = backend([EXITING, EXITING], monkeypatch)
    assert made._attrs("abc") == {"Id": "abc", "State": {"Status": "exited"}}
    assert containers.asked == 3


def test_an_inspect_that_keeps_failing_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    made, containers = backend([EXITING] * 10, monkeypatch)
    with pytest.raises(EngineUnavailable, match="no such process"):
        made._attrs("abc")
    assert containers.asked == backend_module._INSPECT_TRIES


def test_other_engine_errors_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    made, containers = backend(["500 Server Error: something else"], monkeypatch)
    with pytest.raises(EngineUnavailable, match="something else"):
        made._attrs("abc")
    assert containers.asked == 1


def test_a_container_being_removed_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    made, _ = backend(["500 Server Error: no such container"], monkeypatch)
    assert made._attrs("abc") is None
