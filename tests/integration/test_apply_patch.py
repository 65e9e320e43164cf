"""apply_patch for real: client -> gRPC -> supervisor -> engine -> agent, on both engines."""

from __future__ import annotations

import pytest

from stockade.client import Stockade

pytestmark = pytest.mark.timeout(300)


def patch(*lines: str) -> dict[str, str]:
    return {"input": "\n".join(["*** Begin Patch", *lines, "*** End Patch"]) + "\n"}


def listing(client: Stockade, key: str) -> str:
    """Every file under /workspace with its checksum: equal listings, equal trees."""
    command = "find . -type f -print0 | sort -z | xargs -0r sha256sum; find . -type d | sort"
    return client.sandbox(key).exec(command).stdout


def test_multi_file_patch(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    box.write_file("src/app.py", "def main():\n    return 41\n\n\ndef helper():\n    return 41\n")
    box.write_file("old.txt", "bye\n")
    box.write_file("notes.md", "draft\n")
    result = client.call(
        key,
        "apply_patch",
        patch(
            "*** Add File: docs/new.md",
            "+# New",
            "*** Update File: src/app.py",
            "@@ def helper():",
            "-    return 41",
            "+    return 42",
            "*** Update File: notes.md",
            "*** Move to: docs/notes.md",
            "-draft",
            "+final",
            "*** Delete File: old.txt",
        ),
    )
    assert not result.is_error, result.error_message
    assert result.data == {
        "added": ["docs/new.md"],
        "updated": ["src/app.py"],
        "deleted": ["old.txt"],
        "moved": [{"from": "notes.md", "to": "docs/notes.md"}],
    }
    assert result.for_llm == "A docs/new.md\nM src/app.py\nD old.txt\nR notes.md -> docs/notes.md"
    assert box.read_file("docs/new.md") == "# New\n"
    assert box.read_file("src/app.py").endswith("def helper():\n    return 42\n")
    assert box.read_file("src/app.py").startswith("def main():\n    return 41\n")
    assert box.read_file("docs/notes.md") == "final\n"
    assert box.exec("ls -A").stdout.split() == ["docs", "src"]


def test_failing_patch_changes_nothing(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    box.write_file("a.txt", "one\ntwo\n")
    box.write_file("b.txt", "bee\n")
    box.write_file("c.txt", "see\n")
    before = listing(client, key)
    result = client.call(
        key,
        "apply_patch",
        patch(
            "*** Update File: a.txt",
            "-one",
            "+1",
            "*** Delete File: b.txt",
            "*** Add File: c/d.txt",
            "+d",
            "*** Update File: c.txt",
            "@@",
            "-see",
            "+sea",
            "@@",
            "-three",
        ),
    )
    assert result.is_error
    assert result.error_code == "INVALID_ARGS"
    assert result.error_message == (
        "apply_patch: hunk 2 of 'c.txt' does not match: line 'three' not found after line 1"
    )
    twice = client.call(
        key, "apply_patch", patch("*** Delete File: b.txt", "*** Delete File: b.txt")
    )
    assert twice.error_message.endswith("'b.txt' is already changed on line 2")
    assert listing(client, key) == before


def test_paths_leaving_the_workspace(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    box.exec("ln -s /etc/passwd link; ln -s /etc etc")
    before = listing(client, key)
    for directive in (
        "*** Add File: ../escape.txt",
        "*** Add File: /etc/escape.txt",
        "*** Add File: etc/escape.txt",
        "*** Delete File: link",
    ):
        body = ["+x"] if "Add" in directive else []
        result = client.call(key, "apply_patch", patch(directive, *body))
        assert result.error_code == "INVALID_PATH", result.error_message
        assert result.error_message.endswith("leaves the workspace")
    assert listing(client, key) == before
    assert box.exec("ls /escape.txt /etc/escape.txt 2>&1; true").stdout.count("No such") == 2


def test_read_only_directory_is_refused_before_anything_changes(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    box.write_file("a.txt", "one\n")
    box.write_file("ro/f.txt", "f\n")
    box.exec("chmod 555 ro")
    before = listing(client, key)
    result = client.call(
        key,
        "apply_patch",
        patch("*** Update File: a.txt", "-one", "+1", "*** Delete File: ro/f.txt"),
    )
    assert result.error_code == "PERMISSION_DENIED", result.error_message
    staged = client.call(
        key, "apply_patch", patch("*** Add File: n/new.txt", "+n", "*** Add File: ro/g.txt", "+g")
    )
    assert staged.error_code == "PERMISSION_DENIED", staged.error_message
    assert staged.error_message == "apply_patch: path 'ro/g.txt': Permission denied"
    assert listing(client, key) == before
