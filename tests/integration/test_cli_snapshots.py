"""The snapshot commands against a real supervisor, on both engines: snapshot, snapshots,
restore, fork and snapshot-rm walked end to end with `stockade exec` checking the files, and
the refusals (a bad name, an unknown snapshot, a taken name or key) as one line on stderr
with exit 2."""

from __future__ import annotations

import json

import pytest

from tests.integration.harness import Supervisor
from tests.integration.test_cli import cli

pytestmark = pytest.mark.timeout(300)


def sh(supervisor: Supervisor, key: str, script: str) -> tuple[int, str]:
    done = cli(supervisor, "exec", key, "--", "sh", "-c", script)
    return done.returncode, done.stdout


def listed(supervisor: Supervisor, key: str) -> list[dict[str, object]]:
    done = cli(supervisor, "snapshots", "--key", key, "--json")
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout)["snapshots"])


def test_snapshot_list_restore_fork_and_delete(supervisor: Supervisor, key: str) -> None:
    name = f"{key}.before"
    assert sh(supervisor, key, "mkdir -p src && echo one > src/notes.txt") == (0, "")

    taken = cli(supervisor, "snapshot", key, name)
    assert taken.returncode == 0, taken.stderr
    assert taken.stdout.startswith(f"{name}: 1 file, 4 B; frozen "), taken.stdout
    assert " read frozen)" in taken.stdout

    table = cli(supervisor, "snapshots")
    assert table.returncode == 0, table.stderr
    rows = [line.split() for line in table.stdout.splitlines()]
    assert rows[0] == ["NAME", "SOURCE", "CREATED", "FILES", "SIZE"]
    assert [row[:2] + row[-3:] for row in rows if row[0] == name] == [[name, key, "1", "4", "B"]]
    assert rows[-1][:1] == ["tenant:"]
    [info] = listed(supervisor, key)
    assert (info["name"], info["source_key"], info["files"], info["bytes"]) == (name, key, 1, 4)

    assert sh(supervisor, key, "echo two > src/notes.txt && echo new > extra.txt") == (0, "")
    restored = cli(supervisor, "restore", key, name)
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout.startswith(f"{key}: restored from {name} (1 file, 4 B); container ")
    assert sh(supervisor, key, "cat src/notes.txt; ls") == (0, "one\nsrc\n")

    assert sh(supervisor, key, "echo three > src/notes.txt") == (0, "")
    new_keys = [f"{key}-a", f"{key}-b"]
    forked = cli(supervisor, "fork", key, *new_keys)
    assert forked.returncode == 0, forked.stderr
    lines = forked.stdout.splitlines()
    assert [line.split(";")[0] for line in lines[:2]] == [
        f"{k}: forked from {key}" for k in new_keys
    ]
    assert lines[2].startswith("capture: 1 file, 6 B; frozen ")
    assert sh(supervisor, new_keys[0], "echo mine > src/notes.txt") == (0, "")
    assert sh(supervisor, new_keys[1], "cat src/notes.txt") == (0, "three\n")
    assert sh(supervisor, key, "cat src/notes.txt") == (0, "three\n")
    assert listed(supervisor, key) == [info]  # the fork's capture is not kept

    removed = cli(supervisor, "snapshot-rm", name)
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.startswith(f"{name}: deleted, ")
    assert removed.stdout.endswith(" freed\n")
    assert listed(supervisor, key) == []


def refused(supervisor: Supervisor, *args: str) -> str:
    """The one line a refused command prints, after checking it exits 2 and prints nothing
    on stdout."""
    done = cli(supervisor, *args)
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def test_bad_names_unknown_snapshots_and_taken_names_are_clear_errors(
    supervisor: Supervisor, key: str
) -> None:
    assert sh(supervisor, key, "echo x > x.txt") == (0, "")
    bad = refused(supervisor, "snapshot", key, "bad name/..")
    assert bad.startswith("stockade: INVALID_ARGUMENT: "), bad
    assert "name" in bad
    for args in (("restore", key, f"{key}.never"), ("snapshot-rm", f"{key}.never")):
        unknown = refused(supervisor, *args)
        assert unknown.startswith("stockade: NOT_FOUND: "), unknown
        assert f"{key}.never" in unknown
    name = f"{key}.once"
    assert cli(supervisor, "snapshot", key, name).returncode == 0
    again = refused(supervisor, "snapshot", key, name)
    assert again.startswith("stockade: ALREADY_EXISTS: "), again
    onto_itself = refused(supervisor, "fork", key, key)
    assert onto_itself.startswith("stockade: ALREADY_EXISTS: "), onto_itself
    assert cli(supervisor, "snapshot-rm", name).returncode == 0
