"""E2B paths onto the workspace: the home and relative paths map in; anything that leaves the
home (absolute elsewhere, climbing with ..) is refused before any command is built."""

from __future__ import annotations

import pytest

from stockade.supervisor.fronts.e2b.connect import ConnectError
from stockade.supervisor.fronts.e2b.envd_files import workspace_path


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
