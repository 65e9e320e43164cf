"""E2B paths onto the workspace: the home and relative paths map in; anything that leaves the
home (absolute elsewhere, climbing with ..) is refused before any command is built."""

from __future__ import annotations

import pytest

from stockade.supervisor.fronts.e2b.connect import ConnectError
from stockade.supervisor.fronts.e2b.envd_files import target_of, workspace_path


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("/home/user", "."),
        ("/home/user/", "."),
        ("~", "."),
        ("~/a/b.txt", "a/b.txt"),
        ("/home/user/a/./b/../c", "a/c"),
        ("notes.txt", "notes.txt"),
        ("/workspace/x", "x"),
        ("a b/'quoted' $(x)", "a b/'quoted' $(x)"),  # kept as a name: commands quote it
    ],
)
def test_paths_in_the_home_map_onto_the_workspace(given: str, want: str) -> None:
    assert workspace_path(given) == want


@pytest.mark.parametrize(
    "hostile",
    ["/etc/passwd", "/", "/home/user2/x", "/home/userx", "../x", "~/../../etc", "a/../../b",
     "/home/user/../../etc/shadow", "/workspace/../etc", "/proc/self/root"],
)  # fmt: skip
def test_paths_that_leave_the_home_are_refused(hostile: str) -> None:
    with pytest.raises(ConnectError) as raised:
        workspace_path(hostile)
    assert raised.value.code == "invalid_argument"


@pytest.mark.parametrize(
    ("given", "path", "shown", "wide"),
    [
        ("notes.txt", "notes.txt", "/home/user/notes.txt", False),
        ("/home/user/a", "a", "/home/user/a", False),
        ("/tmp/x", "/tmp/x", "/tmp/x", True),
        ("/etc/passwd", "/etc/passwd", "/etc/passwd", True),
        ("//tmp//./y/", "/tmp/y", "/tmp/y", True),
        ("/tmp/../home/user/b", "b", "/home/user/b", False),  # normalized into the home
        ("/home/user/../../etc/shadow", "/etc/shadow", "/etc/shadow", True),
        ("/home/userx", "/home/userx", "/home/userx", True),
        ("/", "/", "/", True),
    ],
)
def test_file_calls_reach_the_whole_container(
    given: str, path: str, shown: str, wide: bool
) -> None:
    """As on E2B, the container is the boundary: any absolute path is its own (the agent
    still resolves it as the sandbox's user, refusing /proc, /sys and /dev after links)."""
    target = target_of(given)
    assert (target.path, target.shown, target.wide) == (path, shown, wide)


@pytest.mark.parametrize(
    "hostile",
    ["/proc/self/environ", "/proc", "/sys/fs/cgroup", "/dev/zero", "/dev", "/tmp/../proc/1/root",
     "//proc/self/mem", "/dev/../dev/shm/x"],
)  # fmt: skip
def test_kernel_file_systems_are_refused(hostile: str) -> None:
    with pytest.raises(ConnectError) as raised:
        target_of(hostile)
    assert raised.value.code == "invalid_argument"


@pytest.mark.parametrize(
    ("given", "path"),
    [("/proc/sys/kernel/random/boot_id", "/proc/sys/kernel/random/boot_id"),
     ("/tmp/../proc/1/root", "/proc/1/root"), ("//proc/self/mem", "/proc/self/mem"),
     ("/dev/../dev/shm/x", "/dev/shm/x"), ("/sys", "/sys")],
)  # fmt: skip
def test_only_a_read_takes_a_kernel_file_as_a_command(given: str, path: str) -> None:
    """GET /files of a kernel file is read by a command as the sandbox's user
    (Files.kernel_read), never by the agent; every other call still refuses it."""
    target = target_of(given, kernel=True)
    assert (target.path, target.wide, target.kernel) == (path, True, True)
    assert target.quoted == path  # absolute: never taken for an option
    assert not target_of("/tmp/x", kernel=True).kernel
    assert not target_of("proc/self", kernel=True).kernel  # the home's own proc/


@pytest.mark.parametrize("climbing", ["../x", "~/../../etc", "a/../../b"])
def test_relative_paths_still_may_not_climb_out_of_the_home(climbing: str) -> None:
    """A relative path is the home's: `..` past it is refused, not taken as the root's."""
    with pytest.raises(ConnectError):
        target_of(climbing)


def test_commands_get_outside_paths_absolute_and_home_paths_relative() -> None:
    assert target_of("/tmp/a b").quoted == "'/tmp/a b'"
    assert target_of("a b").quoted == "'./a b'"
    assert target_of("/home/user").quoted == "."
