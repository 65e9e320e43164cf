"""The freeze of a snapshot's and a checkpoint's walk, through the container's cgroup
(sandboxes/freezer.py), on both engines: the cgroup found holds every process of the
sandbox (its init, the agent, a command's background child), the kernel reports it frozen,
a thaw lets calls run on, and a snapshot taken so records the sandbox running again after."""

from __future__ import annotations

import os
from pathlib import Path

from stockade.client import Stockade
from stockade.supervisor.sandboxes import freezer
from tests.integration.harness import inspected, process
from tests.integration.snapshot_kit import Snaps


def pids_in(folder: Path) -> set[int]:
    """Every process in the cgroup `folder` and below it."""
    found: set[int] = set()
    for where, _, files in os.walk(folder):
        if "cgroup.procs" in files:
            text = (Path(where) / "cgroup.procs").read_text()
            found.update(int(line) for line in text.split())
    return found


def pids_of(container_id: str) -> set[int]:
    """Every host process whose cgroup names the container (what its freeze must hold)."""
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/cgroup").read_text()
        except OSError:  # ended meanwhile
            continue
        if container_id in text:
            found.add(int(entry))
    return found


def test_the_freeze_holds_every_process_of_the_sandbox(
    engine: str, client: Stockade, snaps: Snaps, key: str
) -> None:
    box = client.sandbox(key)
    process(box, "start", command="sleep 600", name="sleeper")  # a background process
    container = box.info().container_id
    info = inspected(engine, container)
    cgroup = freezer.find(info.pid, info.id)
    assert cgroup is not None, f"{engine}: the sandbox's cgroup, from its init's"
    ours = pids_of(info.id)
    assert len(ours) >= 3, "init, the agent and the background process"
    assert ours <= pids_in(cgroup.folder), "the frozen folder holds each of them"
    assert not cgroup.frozen()
    try:
        assert cgroup.freeze()
        assert cgroup.frozen()
    finally:
        assert cgroup.thaw()
    assert not cgroup.frozen()
    assert box.exec("echo thawed").stdout == "thawed\n"
    taken = snaps.snapshot(key, f"{key}-frozen")
    assert taken.frozen_seconds > 0, "the snapshot froze it (through the cgroup)"
    assert not cgroup.frozen(), "and thawed it after"
    assert box.exec("echo runs").stdout == "runs\n"
