"""freezer.py: which cgroup a container's freeze writes, and what a freeze that cannot be
done says (the caller then uses the engine's pause). Real containers: the snapshot
integration tests, which freeze through it on both engines."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from stockade.supervisor.engines.backends.base import ContainerInfo
from stockade.supervisor.sandboxes import freezer
from stockade.supervisor.sandboxes.pausing import Pausing

ID = "93648e7e651c06de3dc40136d20cd982f2869cfb69ecbf951963ec75fc6ff983"


def proc_of(tmp_path: Path, text: str, pid: int = 4242) -> Path:
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(text)
    return proc


def folder(root: Path, relative: str, *files: str) -> Path:
    made = root / relative
    made.mkdir(parents=True)
    for name in files:
        (made / name).write_text("")
    return made


def test_v1_the_freezer_controller_s_folder_of_the_container(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    want = folder(root, f"freezer/libpod_parent/libpod-{ID}", "freezer.state")
    proc = proc_of(
        tmp_path,
        f"9:name=systemd:/libpod_parent/libpod-{ID}\n4:freezer:/libpod_parent/libpod-{ID}\n"
        f"0::/libpod_parent/libpod-{ID}\n",
    )
    assert freezer.find(4242, ID, root, proc) == freezer.Cgroup(want, False)


def test_v2_the_outermost_folder_naming_the_container(tmp_path: Path) -> None:
    """Podman with systemd: init in libpod-ID.scope/container; the scope is frozen (all of
    its processes, an exec's too)."""
    root = tmp_path / "cg"
    want = folder(root, f"machine.slice/libpod-{ID}.scope", "cgroup.freeze")
    folder(root, f"machine.slice/libpod-{ID}.scope/container", "cgroup.freeze")
    proc = proc_of(tmp_path, f"0::/machine.slice/libpod-{ID}.scope/container\n")
    assert freezer.find(4242, ID, root, proc) == freezer.Cgroup(want, True)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("0::/system.slice/sshd.service\n", "a reused pid: another process's cgroup"),
        (f"0::/machine.slice/libpod-{ID[:-1]}0.scope\n", "another container's id"),
        (f"0::/x/../libpod-{ID}.scope\n", "a path that climbs"),
        (f"0::/docker/{ID}\n", "no cgroup.freeze there (a hybrid host's v2 is elsewhere)"),
        ("garbage\n", "a line that is not a cgroup"),
    ],
)
def test_no_freezer_when_the_path_does_not_name_this_container(
    tmp_path: Path, line: str, why: str
) -> None:
    root = tmp_path / "cg"
    folder(root, "system.slice/sshd.service", "cgroup.freeze")
    folder(root, f"machine.slice/libpod-{ID[:-1]}0.scope", "cgroup.freeze")
    folder(root, f"libpod-{ID}.scope", "cgroup.freeze")
    assert freezer.find(4242, ID, root, proc_of(tmp_path, line)) is None, why


def test_no_freezer_without_a_pid_an_id_or_a_process(tmp_path: Path) -> None:
    proc = proc_of(tmp_path, f"0::/docker/{ID}\n")
    folder(tmp_path / "cg", f"docker/{ID}", "cgroup.freeze")
    assert freezer.find(4242, ID, tmp_path / "cg", proc) is not None
    assert freezer.find(0, ID, tmp_path / "cg", proc) is None, "no pid (a pod, a remote engine)"
    assert freezer.find(4242, "", tmp_path / "cg", proc) is None
    assert freezer.find(4242, ID[:8], tmp_path / "cg", proc) is None, "too short to be an id"
    assert freezer.find(4243, ID, tmp_path / "cg", proc) is None, "not in this pid namespace"


def test_a_v2_freeze_writes_and_waits_for_frozen(tmp_path: Path) -> None:
    cgroup = freezer.Cgroup(folder(tmp_path, "c", "cgroup.freeze"), True)
    (cgroup.folder / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    assert cgroup.freeze()
    assert (cgroup.folder / "cgroup.freeze").read_text() == "1"
    assert cgroup.thaw()
    assert (cgroup.folder / "cgroup.freeze").read_text() == "0"


def test_a_freeze_that_does_not_settle_is_undone(tmp_path: Path) -> None:
    """A process that does not stop within the wait (uninterruptible sleep): thawed again."""
    cgroup = freezer.Cgroup(folder(tmp_path, "c", "cgroup.freeze"), True)
    (cgroup.folder / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    assert not cgroup.freeze(wait_s=0)
    assert (cgroup.folder / "cgroup.freeze").read_text() == "0"


def test_a_v1_freeze_reads_the_state_back(tmp_path: Path) -> None:
    cgroup = freezer.Cgroup(folder(tmp_path, "c", "freezer.state"), False)
    assert cgroup.freeze(), "the fake file says FROZEN once written"
    assert cgroup.thaw()
    assert (cgroup.folder / "freezer.state").read_text() == "THAWED"


def test_a_freeze_that_cannot_be_written_says_so(tmp_path: Path) -> None:
    gone = freezer.Cgroup(tmp_path / "gone", True)
    assert not gone.freeze()
    assert not gone.thaw()


def info(paused: bool) -> ContainerInfo:
    return ContainerInfo(ID, "c", True, "running", {}, "img", pid=4242, paused=paused)


def test_a_freeze_a_killed_supervisor_left_is_thawed_when_the_sandbox_is_adopted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine says it runs, its cgroup says frozen: an interrupted capture's freeze."""
    cgroup = freezer.Cgroup(folder(tmp_path, "c", "cgroup.freeze"), True)
    (cgroup.folder / "cgroup.events").write_text("frozen 1\n")
    monkeypatch.setattr(freezer, "find", lambda pid, cid: cgroup if pid == 4242 else None)
    sandbox: Any = SimpleNamespace(key="k")
    Pausing.adopted(sandbox, info(paused=False))
    assert (cgroup.folder / "cgroup.freeze").read_text() == "0"


def test_a_running_cgroup_or_none_is_left_alone_at_adoption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cgroup = freezer.Cgroup(folder(tmp_path, "c", "cgroup.freeze"), True)
    (cgroup.folder / "cgroup.events").write_text("frozen 0\n")
    monkeypatch.setattr(freezer, "find", lambda pid, cid: cgroup)
    sandbox: Any = SimpleNamespace(key="k")
    Pausing.adopted(sandbox, info(paused=False))
    assert (cgroup.folder / "cgroup.freeze").read_text() == "", "not written"
    monkeypatch.setattr(freezer, "find", lambda pid, cid: None)
    Pausing.adopted(sandbox, info(paused=False))  # no cgroup within reach: nothing to do
