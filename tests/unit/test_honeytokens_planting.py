"""Planting decoys (sandboxes/decoys.py) with the in-memory engine: the agent's exec runs the
real planting script here with /bin/sh, in a folder standing for the sandbox's home and
workspace."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stockade.supervisor.config import Config, HoneytokensConfig, ProfileConfig
from stockade.supervisor.policy.honeytokens import Honeytokens
from stockade.supervisor.sandboxes.agent_link import AgentReply
from stockade.supervisor.sandboxes.manager import SandboxManager
from stockade.supervisor.sandboxes.profiles import SandboxProfile
from tests.unit.fakes import FakeAgent, FakeBackend, fake_manager

KEY = bytes(range(32))


class ShellAgent(FakeAgent):
    """exec with the planting script's variables runs it for real, in `root`/home and
    `root`/workspace."""

    root: Path

    async def invoke(
        self, tool: str, arguments: dict[str, Any], timeout: float, request_id: str
    ) -> AgentReply:
        env = arguments.get("env") or {}
        if tool != "exec" or "STK_N" not in env:
            return await super().invoke(tool, arguments, timeout, request_id)
        self.calls.append((tool, arguments))
        home, workspace = self.root / "home", self.root / "workspace"
        home.mkdir(exist_ok=True)
        workspace.mkdir(exist_ok=True)
        done = subprocess.run(
            ["/bin/sh", "-c", arguments["command"]],
            env={**env, "HOME": str(home), "PATH": os.environ["PATH"]},
            cwd=workspace,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        result = {"exit_code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
        return AgentReply("", "", result)


def make(
    tmp_path: Path, backend: FakeBackend, honey: HoneytokensConfig, **more: Any
) -> tuple[SandboxManager, Honeytokens, list[ShellAgent]]:
    sandbox = Config().sandbox.__class__(user="1000:1000")
    config = Config(state_dir=tmp_path / "state", sandbox=sandbox, honeytokens=honey, **more)
    wire = Honeytokens(KEY, lambda alarm: None)
    agents: list[ShellAgent] = []

    def connect(address: object) -> ShellAgent:
        agent = ShellAgent(backend, address)
        agent.root = tmp_path
        agents.append(agent)
        return agent

    mgr = fake_manager(config, backend, connect=connect, honeytokens=wire)
    return mgr, wire, agents


def plants(agents: list[ShellAgent]) -> int:
    return sum(1 for a in agents for tool, args in a.calls if "STK_N" in args.get("env", {}))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_files_planted_0600_and_the_variable_set(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr, wire, agents = make(tmp_path, backend, HoneytokensConfig(enabled=True))
    await mgr.start()
    sandbox = await mgr.ensure("k")
    decoys = wire.decoys("k")
    home = tmp_path / "home"
    assert (home / ".aws/credentials").read_text() == decoys.aws_file()
    assert (home / ".config/gh/hosts.yml").read_text() == decoys.gh_file()
    assert (home / ".netrc").read_text() == decoys.netrc_file()
    for name in (".aws/credentials", ".config/gh/hosts.yml", ".netrc"):
        assert mode(home / name) == 0o600
    assert mode(home / ".aws") == 0o700
    assert not (tmp_path / "workspace/.env").exists()  # workspace_env is off by default
    spec = backend.made[sandbox.info.id]
    assert spec.environment["AWS_SECRET_ACCESS_KEY"] == decoys.env
    assert sandbox.decoys_planted
    await mgr.ensure("k")
    assert plants(agents) == 1  # once per container


async def test_off_plants_nothing(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr, _, agents = make(tmp_path, backend, HoneytokensConfig())
    sandbox = await mgr.ensure("k")
    assert plants(agents) == 0
    assert "AWS_SECRET_ACCESS_KEY" not in backend.made[sandbox.info.id].environment
    assert not (tmp_path / "home").exists()


async def test_existing_files_are_never_replaced(tmp_path: Path) -> None:
    backend = FakeBackend()
    honey = HoneytokensConfig(enabled=True, workspace_env=True, kinds=("netrc",))
    mgr, wire, _ = make(tmp_path, backend, honey)
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace/.env").write_text("MINE=1\n")
    (tmp_path / "home").mkdir()
    os.symlink(tmp_path / "target", tmp_path / "home/.netrc")  # a dangling link is kept too
    sandbox = await mgr.ensure("k")
    assert (tmp_path / "workspace/.env").read_text() == "MINE=1\n"
    assert not (tmp_path / "target").exists()
    assert not (tmp_path / "home/.aws").exists()  # kind not chosen
    assert "AWS_SECRET_ACCESS_KEY" not in backend.made[sandbox.info.id].environment
    del wire


async def test_workspace_env_and_hostile_operator_paths(tmp_path: Path) -> None:
    backend = FakeBackend()
    odd = "odd $(touch PWNED) `touch PWNED2` 'q\" ;.env"
    honey = HoneytokensConfig(
        enabled=True,
        kinds=(),
        workspace_env=True,
        paths=(f"deploy/{odd}", "~/secrets/./prod.env", str(tmp_path / "abs/keys.txt")),
    )
    mgr, wire, _ = make(tmp_path, backend, honey)
    await mgr.ensure("k")
    text = wire.decoys("k").dotenv_file()
    workspace = tmp_path / "workspace"
    assert (workspace / ".env").read_text() == text
    assert (workspace / "deploy" / odd).read_text() == text
    assert (tmp_path / "home/secrets/prod.env").read_text() == text
    assert (tmp_path / "abs/keys.txt").read_text() == text
    assert not list(tmp_path.rglob("PWNED*"))  # the names were data, never shell


async def test_unwritable_path_is_logged_and_the_sandbox_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = FakeBackend()
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro/file").write_text("a file, not a folder")
    honey = HoneytokensConfig(enabled=True, kinds=(), paths=(str(tmp_path / "ro/file/x"),))
    mgr, _, _ = make(tmp_path, backend, honey)
    sandbox = await mgr.ensure("k")
    assert sandbox.decoys_planted
    assert "decoys not planted at" in caplog.text


async def test_heal_and_adoption_plant_again(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr, _, agents = make(tmp_path, backend, HoneytokensConfig(enabled=True))
    await mgr.start()
    first = await mgr.ensure("k")
    assert plants(agents) == 1
    backend.kill(first.info.id)
    first.lost = True
    second = await mgr.ensure("k")
    assert second.info.id != first.info.id
    assert plants(agents) == 2  # the new container planted (HOME is its own tmpfs)
    await mgr.close()
    again, _, agents2 = make(tmp_path, backend, HoneytokensConfig(enabled=True))
    assert await again.start() == ["k"]
    adopted = await again.ensure("k")
    assert adopted.info.id == second.info.id
    assert plants(agents2) == 1  # adopted: planted at its first call (existing files kept)


async def test_profiles_and_tenants_choose_the_sandboxes(tmp_path: Path) -> None:
    backend = FakeBackend()
    honey = HoneytokensConfig(enabled=True, profiles=("honey",), tenants=("acme",))
    mgr, _, agents = make(tmp_path, backend, honey, profiles={"honey": ProfileConfig()})
    await mgr.ensure("plain")
    await mgr.ensure("acme\0plain")
    assert plants(agents) == 0
    await mgr.ensure("other\0x", profile="honey")
    assert plants(agents) == 0
    opted = await mgr.ensure("acme\0x", profile="honey")  # the caller opts in by the profile
    assert plants(agents) == 1
    assert "AWS_SECRET_ACCESS_KEY" in backend.made[opted.info.id].environment


def test_a_pooled_container_is_not_taken_when_a_variable_is_planted(tmp_path: Path) -> None:
    backend = FakeBackend()
    mgr, _, _ = make(tmp_path, backend, HoneytokensConfig(enabled=True))
    default = mgr.profiles.default
    assert not mgr.decoys.poolable("k", default, default)
    files_only = HoneytokensConfig(enabled=True, kinds=("aws",))
    mgr2, _, _ = make(tmp_path / "two", FakeBackend(), files_only)
    assert mgr2.decoys.poolable("k", default, default)
    other = SandboxProfile("gpu", "img", 1.0, 512)
    assert not mgr2.decoys.poolable("k", other, default)
