"""The supervisor in a container: finding its own container id, and the same-path proof over
the engine's record of its mounts (a fake engine here; the real runs are in
tests/integration/test_supervisor_image.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stockade.supervisor.config import Config, load_config
from stockade.supervisor.engines import incontainer
from stockade.supervisor.engines.backends.base import BindMount, ContainerInfo
from stockade.supervisor.errors import ConfigError
from tests.unit.fakes import FakeBackend

ID = "a6c5328b54ed676cd4689f5f96aebbf9ef226101ebcd0b301fcaadf6b0b0cfd0"
OTHER = "b" * 64
DOCKER_MOUNTINFO = (
    f"122 101 254:0 /var/lib/docker/containers/{ID}/hostname /etc/hostname rw - ext4 /dev/vda rw\n"
    f"123 101 254:0 /var/lib/docker/containers/{ID}/hosts /etc/hosts rw - ext4 /dev/vda rw\n"
    f"124 101 254:0 /srv/{OTHER} /data rw - ext4 /dev/vda rw\n"
)
PODMAN_MOUNTINFO = (
    "400 390 0:25 /containers/storage/overlay-containers/"
    f"{ID}/userdata/hostname /etc/hostname rw - tmpfs tmpfs rw\n"
)


def test_candidate_ids_from_the_engine_files_then_the_cgroup() -> None:
    assert incontainer.candidate_ids(DOCKER_MOUNTINFO, "") == [ID]
    assert incontainer.candidate_ids(PODMAN_MOUNTINFO, "") == [ID]
    cgroup = f"9:name=systemd:/docker/{OTHER}\n8:pids:/docker/{OTHER}\n"
    assert incontainer.candidate_ids(DOCKER_MOUNTINFO, cgroup) == [ID, OTHER]
    # an id-like folder name on some other mount is no evidence; nor is a longer hex run
    assert incontainer.candidate_ids(f"1 2 0:1 /x/{OTHER} /data rw - ext4 x rw\n", "") == []
    assert incontainer.candidate_ids("", f"0::/{'c' * 65}\n") == []


@pytest.mark.parametrize(
    "mounts",
    [
        [BindMount("/var/lib/stockade", "/var/lib/stockade")],
        [BindMount("/var/lib", "/var/lib")],  # a parent mounted at its own path
        [BindMount("/var/lib/stockade/", "/var/lib/stockade")],
        [BindMount("/x", "/var"), BindMount("/var/lib/stockade", "/var/lib/stockade")],
    ],
)
def test_same_path_mounts_pass(mounts: list[BindMount]) -> None:
    incontainer.check_same_path(Path("/var/lib/stockade"), mounts)


@pytest.mark.parametrize(
    ("mounts", "says"),
    [
        ([], "not mounted from the host"),
        ([BindMount("/var/run/docker.sock", "/var/run/docker.sock")], "not mounted from the host"),
        ([BindMount("/srv/st", "/var/lib/stockade")], "is /srv/st on the host"),
        ([BindMount("/srv", "/var/lib")], "is /srv/stockade on the host"),
        (
            [BindMount("/var/lib", "/var/lib"), BindMount("/srv/st", "/var/lib/stockade")],
            "is /srv/st on the host",
        ),
        (
            [
                BindMount("/var/lib/stockade", "/var/lib/stockade"),
                BindMount("/elsewhere", "/var/lib/stockade/sandboxes"),
            ],
            "/var/lib/stockade/sandboxes, inside the state directory",
        ),
        # a prefix that is not a parent folder proves nothing
        ([BindMount("/var/lib/stock", "/var/lib/stock")], "not mounted from the host"),
    ],
)
def test_mismatched_mounts_are_refused(mounts: list[BindMount], says: str) -> None:
    with pytest.raises(ConfigError, match=r"same path|not mounted") as info:
        incontainer.check_same_path(Path("/var/lib/stockade"), mounts)
    assert says in str(info.value)


def test_config_problems_name_what_cannot_work() -> None:
    assert incontainer.config_problems(load_config(overrides={"engine.kind": "docker"})) == []
    podman = load_config(overrides={"engine.kind": "podman"})
    assert "STOCKADE_ENGINE_SOCKET" in incontainer.config_problems(podman)[0]
    with_socket = load_config(
        overrides={"engine.kind": "podman", "engine.socket": "unix:///run/p.sock"}
    )
    assert incontainer.config_problems(with_socket) == []
    wide = load_config(
        overrides={
            "engine.kind": "docker",
            "sandbox.network": "egress",
            "sandbox.workspace_size_mb": 64,
            "sandbox.user_namespace": True,
        }
    )
    problems = incontainer.config_problems(wide)
    assert len(problems) == 3
    assert "egress" in problems[0]
    assert "workspace_size_mb" in problems[1]
    assert "user_namespace" in problems[2]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("true", True), ("0", False), ("no", False), ("", None), ("maybe", None)],
)
def test_declared(value: str, expected: bool | None) -> None:
    assert incontainer.declared({incontainer.ENV: value}) is expected


def test_own_mounts_takes_the_first_id_the_engine_knows() -> None:
    backend = FakeBackend()
    backend.containers[ID] = _info(ID)
    backend.container_mounts[ID] = (BindMount("/s", "/s"),)
    assert incontainer.own_mounts(backend, [OTHER, ID]) == (ID, [BindMount("/s", "/s")])
    assert incontainer.own_mounts(backend, [OTHER]) == ("", [])


def test_check_is_off_when_declared_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(incontainer.ENV, "0")
    incontainer.check(Config(), FakeBackend())  # would raise: the fake knows no container


def test_declared_container_unknown_to_the_engine_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(incontainer.ENV, "1")
    with pytest.raises(ConfigError, match="does not know this container"):
        incontainer.check(Config(), FakeBackend())


def _info(cid: str) -> ContainerInfo:

    return ContainerInfo(cid, "sup", True, "running", {}, "img")


def test_supervisor_image_context() -> None:
    from stockade.supervisor.engines import image

    dists = image.runtime_dependencies()
    assert {"grpcio", "protobuf", "docker", "podman", "pyroute2"} <= set(dists)
    assert not {"pytest", "testcontainers", "llm-sandbox"} & set(dists)
    files = image.supervisor_context_files()
    assert files["Containerfile"] == image.REPO / "Containerfile"
    # what the supervisor imports is there (the agent's protocol with it); stockade.testing
    # and caches are not
    for needed in ("supervisor/app.py", "client/__init__.py", "agent/v1/agent_pb2.py"):
        assert f"lib/stockade/{needed}" in files
    assert not [n for n in files if "/testing/" in n or "__pycache__" in n]
    assert image.content_hash(files, dists) != image.content_hash(files)
