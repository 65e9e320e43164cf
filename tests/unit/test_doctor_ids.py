"""`stockade doctor`'s check of whose ids sandboxes run as on the host (no engine needed)."""

from __future__ import annotations

import pytest

from stockade.supervisor.cli import doctor
from stockade.supervisor.config import AGENT_UID, Config, EngineConfig, SandboxConfig


def config(kind: str = "docker", user: str = "65532:65532") -> Config:
    return Config(engine=EngineConfig(kind=kind), sandbox=SandboxConfig(user=user))  # type: ignore[arg-type]


def test_podman_with_a_range_per_sandbox_is_fine() -> None:
    check = doctor.sandbox_ids(config("podman"), True, {1000: "alice"})
    assert (check.ok, check.warning) == (True, False)
    assert "a range of 65536 ids per sandbox" in check.detail


def test_no_user_namespace_warns_that_sandboxes_share_one_uid() -> None:
    check = doctor.sandbox_ids(config(), False, {0: "root", 1000: "alice"})
    assert (check.ok, check.warning) == (True, True)
    assert "every sandbox runs as host uid 65532 (no host account's)" in check.detail
    assert "share that uid with each other" in check.detail
    assert "userns-remap" in check.fix


def test_dockers_remap_warns_too() -> None:
    check = doctor.sandbox_ids(config(), True, {})
    assert (check.ok, check.warning) == (True, True)
    assert "one range for every container" in check.detail


@pytest.mark.parametrize("namespaced", [False, True])
def test_a_host_account_with_the_sandbox_uid_fails(namespaced: bool) -> None:
    check = doctor.sandbox_ids(config(user="1000:1000"), namespaced, {1000: "alice"})
    assert not check.ok
    assert "1000 is the host account 'alice'" in check.detail
    assert "set sandbox.user" in check.fix


def test_a_host_account_with_the_agent_uid_fails() -> None:
    check = doctor.sandbox_ids(config(), False, {AGENT_UID: "someone"})
    assert not check.ok
    assert f"{AGENT_UID} is the host account 'someone'" in check.detail
    assert "the agent's uid" in check.fix


def test_run_checks_includes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "_engine", lambda _c: doctor.Check("engine", False, "down"))
    names = [check.name for check in doctor.run_checks(config())]
    assert "sandbox ids" in names
