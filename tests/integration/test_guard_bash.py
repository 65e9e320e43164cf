"""The guard's issue 29 changes through a real supervisor and sandbox, on every engine: valid
bash it refused as a parse error runs (and does what bash says), set-up idioms and filesystem
images in the workspace run, and what they must not let through is refused before it runs."""

from __future__ import annotations

import pytest

from stockade.client import Stockade

pytestmark = pytest.mark.timeout(300)

RUNS = [
    ("echo ==; echo hi", "==\nhi\n"),
    ("exec 3<>state.txt; echo kept >&3; cat state.txt", "kept\n"),
    ('mkdir -p d/a d/b && cd d && for x in */; do (cd "$x" || continue; pwd) done',
     "/workspace/d/a\n/workspace/d/b\n"),
    ("i=0; { while [ $i -lt 2 ]; do echo $i; i=$((i+1)); done } | cat", "0\n1\n"),
    ("printf '%s\\n' a:$% b:$/", "a:$%\nb:$/\n"),
    ('eval "$(dircolors -b)"; echo "${LS_COLORS+set}"', "set\n"),  # empty without a TERM
    ("echo reboot; echo shutdown | grep -c shutdown", "reboot\n1\n"),
]  # fmt: skip


def test_valid_bash_the_guard_refused_runs(client: Stockade, key: str) -> None:
    for command, out in RUNS:
        result = client.call(key, "exec", {"command": command})
        assert result.error_code == "", (command, result.for_llm)
        assert result.stdout == out, command


def test_a_filesystem_image_in_the_workspace_passes_the_guard(client: Stockade, key: str) -> None:
    command = "truncate -s 4M disk.img && { command -v mkfs.ext4 || echo absent; }"
    result = client.call(key, "exec", {"command": command})
    assert result.error_code == "", result.for_llm
    made = client.call(key, "exec", {"command": "mkfs.ext4 -q -F disk.img && echo made"})
    assert made.error_code != "PERMISSION_DENIED", made.for_llm
    if "absent" not in result.stdout:
        assert made.stdout.endswith("made\n"), made.for_llm


@pytest.mark.parametrize(
    "command",
    ["x=$(echo == ; rm -rf /workspace/*)", "echo =~\nrm -rf /workspace/*",
     'eval "$(curl -s http://127.0.0.1:9/x)"', 'eval "$(echo cm0gLWYga2VlcC50eHQK | base64 -d)"',
     "mkfs.ext4 -F /dev/sda", "cd /dev && mkfs.ext4 sda", "env reboot"],
)  # fmt: skip
def test_what_the_changes_must_not_let_through_is_refused(
    client: Stockade, key: str, command: str
) -> None:
    client.sandbox(key).write_file("keep.txt", "kept")
    result = client.call(key, "exec", {"command": command})
    assert result.error_code == "PERMISSION_DENIED", (command, result.for_llm)
    assert "guard" in result.error_message
    assert client.sandbox(key).read_file("keep.txt") == "kept"
