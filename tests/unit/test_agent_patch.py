"""The apply_patch tool, called directly on a temporary workspace: every operation, hunk
matching and its failures, all-or-nothing writes, paths, and malformed patches."""

from __future__ import annotations

import os
import resource
import signal
import stat
from pathlib import Path
from typing import Any

import pytest

from stockade.agent import patch, tools
from stockade.agent.errors import ToolError
from stockade.supervisor.tools.render import render
from tests.unit.fakes import make_folder

pytestmark = pytest.mark.timeout(60)

APP = "def main():\n    x = 1\n    return 41\n\n\ndef helper():\n    return 41\n"
TWO_CLASSES = (
    "class A:\n    def f(self):\n        return 1\nclass B:\n    def f(self):\n        return 1\n"
)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "ws", {"src/app.py": APP, "a.txt": "one\ntwo\nthree\n"})


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "outside", {"secret.txt": "secret\n"})


def wrap(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"]) + "\n"


async def apply(root: Path, text: str) -> dict[str, Any]:
    return await patch.apply_patch(root, {"input": text})


async def fails(code: str, root: Path, text: str) -> str:
    with pytest.raises(ToolError) as info:
        await apply(root, text)
    assert info.value.code == code, info.value.message
    return info.value.message


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file and directory under `root` (directories as None), with its bytes."""
    found: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        found[name] = None if path.is_dir() and not path.is_symlink() else path.read_bytes()
    return found


def result(**changes: list[Any]) -> dict[str, list[Any]]:
    return {"added": [], "updated": [], "deleted": [], "moved": [], **changes}


# every operation, table-style: (patch lines, files before, files after, result)

OPERATIONS: list[tuple[str, list[str], dict[str, str], dict[str, str | None], dict[str, Any]]] = [
    (
        "add",
        ["*** Add File: new/deep/b.py", "+x = 1", "+", "+y = 2"],
        {},
        {"new/deep/b.py": "x = 1\n\ny = 2\n"},
        result(added=["new/deep/b.py"]),
    ),
    (
        "add an empty file",
        ["*** Add File: empty.txt"],
        {},
        {"empty.txt": ""},
        result(added=["empty.txt"]),
    ),
    (
        "update, one hunk",
        ["*** Update File: a.txt", "@@", " one", "-two", "+TWO", " three"],
        {"a.txt": "one\ntwo\nthree\n"},
        {"a.txt": "one\nTWO\nthree\n"},
        result(updated=["a.txt"]),
    ),
    (
        "update, first hunk without @@",
        ["*** Update File: a.txt", " one", "-two", "+2"],
        {"a.txt": "one\ntwo\nthree\n"},
        {"a.txt": "one\n2\nthree\n"},
        result(updated=["a.txt"]),
    ),
    (
        "update, several hunks",
        ["*** Update File: f", "@@", "-a", "+A", "@@", " c", "-d", "+D", "@@", "-f", "+F"],
        {"f": "a\nb\nc\nd\ne\nf\n"},
        {"f": "A\nb\nc\nD\ne\nF\n"},
        result(updated=["f"]),
    ),
    (
        "context header picks the second of two equal blocks",
        ["*** Update File: src/app.py", "@@ def helper():", "-    return 41", "+    return 42"],
        {"src/app.py": APP},
        {"src/app.py": APP[: APP.rindex("41")] + "42\n"},
        result(updated=["src/app.py"]),
    ),
    (
        "nested context headers",
        ["*** Update File: c.py", "@@ class B:", "@@     def f(self):", "-        return 1",
         "+        return 2"],
        {"c.py": TWO_CLASSES},
        {"c.py": TWO_CLASSES[: TWO_CLASSES.rindex("1")] + "2\n"},
        result(updated=["c.py"]),
    ),
    (
        "context header that is also the first context line",
        ["*** Update File: src/app.py", "@@ def helper():", " def helper():", "-    return 41",
         "+    return 0"],
        {"src/app.py": APP},
        {"src/app.py": APP[: APP.rindex("41")] + "0\n"},
        result(updated=["src/app.py"]),
    ),
    (
        "pure addition after a header",
        ["*** Update File: a.txt", "@@ one", "+one and a half"],
        {"a.txt": "one\ntwo\nthree\n"},
        {"a.txt": "one\none and a half\ntwo\nthree\n"},
        result(updated=["a.txt"]),
    ),
    (
        "pure addition without a header appends",
        ["*** Update File: a.txt", "+four"],
        {"a.txt": "one\ntwo\nthree\n"},
        {"a.txt": "one\ntwo\nthree\nfour\n"},
        result(updated=["a.txt"]),
    ),
    (
        "end of file picks the last block",
        ["*** Update File: r", "@@", " x", "-end", "+END", "*** End of File"],
        {"r": "x\nend\nx\nend\n"},
        {"r": "x\nend\nx\nEND\n"},
        result(updated=["r"]),
    ),
    (
        "trailing whitespace differences are tolerated, file's context kept",
        ["*** Update File: w", " keep", "-old", "+new"],
        {"w": "keep   \nold\t\n"},
        {"w": "keep   \nnew\n"},
        result(updated=["w"]),
    ),
    (
        "an empty line in a hunk is an empty context line",
        ["*** Update File: e", " a", "", "-b", "+B"],
        {"e": "a\n\nb\n"},
        {"e": "a\n\nB\n"},
        result(updated=["e"]),
    ),
    (
        "CRLF file keeps CRLF, new lines too",
        ["*** Update File: win.txt", " one", "-two", "+2", "+2.5"],
        {"win.txt": "one\r\ntwo\r\nthree\r\n"},
        {"win.txt": "one\r\n2\r\n2.5\r\nthree\r\n"},
        result(updated=["win.txt"]),
    ),
    (
        "no final newline stays missing",
        ["*** Update File: t", " a", "-b", "+B", "+C"],
        {"t": "a\nb"},
        {"t": "a\nB\nC"},
        result(updated=["t"]),
    ),
    (
        "update an empty file",
        ["*** Update File: empty", "+first", "+second"],
        {"empty": ""},
        {"empty": "first\nsecond\n"},
        result(updated=["empty"]),
    ),
    (
        "delete every line",
        ["*** Update File: a.txt", "-one", "-two", "-three"],
        {"a.txt": "one\ntwo\nthree\n"},
        {"a.txt": ""},
        result(updated=["a.txt"]),
    ),
    (
        "move",
        ["*** Update File: a.txt", "*** Move to: moved/b.txt"],
        {"a.txt": "one\ntwo\nthree\n"},
        {"a.txt": None, "moved/b.txt": "one\ntwo\nthree\n"},
        result(moved=[{"from": "a.txt", "to": "moved/b.txt"}]),
    ),
    (
        "move and update",
        ["*** Update File: a.txt", "*** Move to: b.txt", "@@", "-one", "+uno"],
        {"a.txt": "one\ntwo\nthree\n"},
        {"a.txt": None, "b.txt": "uno\ntwo\nthree\n"},
        result(moved=[{"from": "a.txt", "to": "b.txt"}]),
    ),
    (
        "delete",
        ["*** Delete File: src/app.py"],
        {},
        {"src/app.py": None, "a.txt": "one\ntwo\nthree\n"},
        result(deleted=["src/app.py"]),
    ),
    (
        "several files, ./ and absolute paths inside the root",
        ["*** Add File: ./n.txt", "+n", "*** Update File: {root}/a.txt", "-one", "+1",
         "*** Delete File: src/app.py"],
        {},
        {"n.txt": "n\n", "a.txt": "1\ntwo\nthree\n", "src/app.py": None},
        result(added=["n.txt"], updated=["a.txt"], deleted=["src/app.py"]),
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("lines", "before", "after", "expected"),
    [case[1:] for case in OPERATIONS],
    ids=[case[0] for case in OPERATIONS],
)
async def test_operations(
    ws: Path,
    lines: list[str],
    before: dict[str, str],
    after: dict[str, str | None],
    expected: dict[str, Any],
) -> None:
    for name, content in before.items():
        (ws / name).write_bytes(content.encode())
    text = wrap(*(line.replace("{root}", str(ws)) for line in lines))
    assert await apply(ws, text) == expected
    for name, content in after.items():
        if content is None:
            assert not (ws / name).exists()
        else:
            assert (ws / name).read_bytes() == content.encode()
    assert not list(ws.rglob("*.stockade-tmp"))


async def test_through_tools_run(ws: Path) -> None:
    args = {"input": wrap("*** Add File: x", "+x")}
    assert await tools.run("apply_patch", args, root=ws, max_output_bytes=10) == result(added=["x"])


async def test_update_keeps_mode_and_bytes_that_are_not_utf8(ws: Path) -> None:
    script = ws / "run.sh"
    script.write_bytes(b"#!/bin/sh\necho \xff\xfe\nexit 0\n")
    script.chmod(0o750)
    await apply(ws, wrap("*** Update File: run.sh", "-exit 0", "+exit 1"))
    assert script.read_bytes() == b"#!/bin/sh\necho \xff\xfe\nexit 1\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o750


async def test_move_keeps_mode(ws: Path) -> None:
    (ws / "a.txt").chmod(0o640)
    await apply(ws, wrap("*** Update File: a.txt", "*** Move to: b.txt", "-one", "+1"))
    assert stat.S_IMODE((ws / "b.txt").stat().st_mode) == 0o640


async def test_crlf_patch_text_is_accepted(ws: Path) -> None:
    text = wrap("*** Update File: a.txt", " one", "-two", "+2").replace("\n", "\r\n")
    await apply(ws, text)
    assert (ws / "a.txt").read_text() == "one\n2\nthree\n"


async def test_blank_lines_around_the_patch_and_sections(ws: Path) -> None:
    text = "\n  \n" + wrap("*** Add File: x", "+x", "", "*** Delete File: a.txt", "") + "\n\n"
    assert await apply(ws, text) == result(added=["x"], deleted=["a.txt"])


async def test_hunks_apply_in_order_from_the_previous_end(ws: Path) -> None:
    (ws / "r").write_text("x\nx\nx\n")
    await apply(ws, wrap("*** Update File: r", "@@", "-x", "+1", "@@", "-x", "+2"))
    assert (ws / "r").read_text() == "1\n2\nx\n"


async def test_render_summarizes_the_changes(ws: Path) -> None:
    data = result(
        added=["n.py"], updated=["a.py"], deleted=["d.py"], moved=[{"from": "o", "to": "p"}]
    )
    assert render("apply_patch", data) == "A n.py\nM a.py\nD d.py\nR o -> p"
    assert render("apply_patch", result()) == "[no changes]"


# hunks that do not match


MISMATCHES = [
    (
        "wrong line, second hunk",
        ["*** Update File: src/app.py", "@@", "-def main():", "+def start():",
         "@@ def helper():", "-    return 40", "+    return 42"],
        "apply_patch: hunk 2 of 'src/app.py' does not match: "
        "line '    return 40' not found after line 5",
    ),
    (
        "partial match names the first wrong line",
        ["*** Update File: src/app.py", "@@", " def main():", "     x = 1", "-    return 40",
         "+    return 42"],
        "apply_patch: hunk 1 of 'src/app.py' does not match: "
        "expected line '    return 40' near line 3; found '    return 41'",
    ),
    (
        "block runs past the end",
        ["*** Update File: a.txt", " two", " three", "-four"],
        "apply_patch: hunk 1 of 'a.txt' does not match: "
        "expected line 'four' near line 4; found the end of the file",
    ),
    (
        "header not found",
        ["*** Update File: src/app.py", "@@ def nowhere():", "-x", "+y"],
        "apply_patch: hunk 1 of 'src/app.py' does not match: '@@ def nowhere():' not found",
    ),
    (
        "a hunk above the previous one",
        ["*** Update File: a.txt", "@@", "-three", "+3", "@@", "-one", "+1"],
        "apply_patch: hunk 2 of 'a.txt' does not match: line 'one' not found after line 3",
    ),
    (
        "leading whitespace is not tolerated",
        ["*** Update File: src/app.py", "@@", "-return 41", "+return 42"],
        "apply_patch: hunk 1 of 'src/app.py' does not match: line 'return 41' not found",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("lines", "message"), [m[1:] for m in MISMATCHES], ids=[m[0] for m in MISMATCHES]
)
async def test_mismatch_messages(ws: Path, lines: list[str], message: str) -> None:
    before = snapshot(ws)
    assert await fails("INVALID_ARGS", ws, wrap(*lines)) == message
    assert snapshot(ws) == before


async def test_long_lines_are_shortened_in_messages(ws: Path) -> None:
    message = await fails("INVALID_ARGS", ws, wrap("*** Update File: a.txt", "-" + "z" * 500))
    assert message.endswith("line '" + "z" * 200 + " [...]' not found")


async def test_mismatch_in_a_huge_repetitive_file_is_quick(ws: Path) -> None:
    (ws / "big").write_text("x\n" * 1_000_000)
    hunk = ["-x"] * 1000 + ["-y"]
    message = await fails("INVALID_ARGS", ws, wrap("*** Update File: big", *hunk))
    assert message.startswith("apply_patch: hunk 1 of 'big' does not match: expected line 'y'")


# all or nothing


async def test_third_file_failing_changes_nothing(ws: Path) -> None:
    (ws / "b.txt").write_text("bee\n")
    before = snapshot(ws)
    text = wrap(
        "*** Update File: a.txt", "-one", "+1",
        "*** Add File: new/dir/n.txt", "+n",
        "*** Delete File: b.txt",
        "*** Update File: src/app.py", "-    return 99", "+    return 0",
    )  # fmt: skip
    message = await fails("INVALID_ARGS", ws, text)
    assert message.startswith("apply_patch: hunk 1 of 'src/app.py' does not match")
    assert snapshot(ws) == before


async def test_failure_while_staging_undoes_everything_also_as_root(ws: Path) -> None:
    """A file-size limit makes the third file's temporary copy fail (EFBIG) after the first
    two were staged and a directory was made: all of that is undone."""
    before = snapshot(ws)
    text = wrap(
        "*** Update File: a.txt", "-one", "+1",
        "*** Add File: fresh/deep/n.txt", "+n",
        "*** Add File: fresh/big.txt", "+" + "x" * 200_000,
    )  # fmt: skip
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, limits[1]))
    try:
        message = await fails("EXECUTION_FAILED", ws, text)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert message == "apply_patch: path 'fresh/big.txt': File too large"
    assert snapshot(ws) == before


# files that must or must not exist, and the same file twice


@pytest.mark.parametrize(
    ("code", "lines", "message"),
    [
        (
            "INVALID_ARGS",
            ["*** Add File: a.txt", "+x"],
            "apply_patch: cannot add 'a.txt': it already exists",
        ),
        (
            "FILE_NOT_FOUND",
            ["*** Update File: missing.py", "-x"],
            "apply_patch: cannot update 'missing.py': no such file",
        ),
        (
            "FILE_NOT_FOUND",
            ["*** Delete File: missing.py"],
            "apply_patch: cannot delete 'missing.py': no such file",
        ),
        (
            "INVALID_ARGS",
            ["*** Update File: a.txt", "*** Move to: src/app.py"],
            "apply_patch: cannot move 'a.txt' to 'src/app.py': it exists",
        ),
        (
            "INVALID_PATH",
            ["*** Delete File: src"],
            "apply_patch: path 'src' is a directory, not a file",
        ),
        (
            "INVALID_ARGS",
            ["*** Update File: a.txt", "-one", "*** Delete File: ./a.txt"],
            "apply_patch: line 4 of the patch: './a.txt' is already changed on line 2",
        ),
        (
            "INVALID_ARGS",
            ["*** Add File: b.txt", "+b", "*** Update File: a.txt", "*** Move to: b.txt"],
            "apply_patch: line 4 of the patch: 'b.txt' is already changed on line 2",
        ),
    ],
)
async def test_existence_and_conflicts(ws: Path, code: str, lines: list[str], message: str) -> None:
    before = snapshot(ws)
    assert await fails(code, ws, wrap(*lines)) == message
    assert snapshot(ws) == before


async def test_move_onto_itself_is_an_update(ws: Path) -> None:
    text = wrap("*** Update File: a.txt", "*** Move to: ./a.txt", "-one", "+1")
    assert await apply(ws, text) == result(updated=["a.txt"])
    assert (ws / "a.txt").read_text() == "1\ntwo\nthree\n"


async def test_update_through_an_inner_symlink_changes_the_target(ws: Path) -> None:
    (ws / "alias").symlink_to("a.txt")
    assert await apply(ws, wrap("*** Update File: alias", "-one", "+1")) == result(
        updated=["a.txt"]
    )
    assert (ws / "alias").is_symlink()
    assert (ws / "a.txt").read_text() == "1\ntwo\nthree\n"


# paths leaving the workspace


@pytest.mark.parametrize(
    "directive",
    [
        "*** Add File: ../outside/new.txt",
        "*** Add File: {outside}/new.txt",
        "*** Add File: dir/new.txt",
        "*** Add File: dangling",
        "*** Update File: link",
        "*** Update File: ../outside/secret.txt",
        "*** Delete File: link",
        "*** Delete File: {outside}/secret.txt",
        "*** Delete File: dir/secret.txt",
    ],
)
async def test_paths_leaving_the_workspace(ws: Path, outside: Path, directive: str) -> None:
    (ws / "link").symlink_to(outside / "secret.txt")
    (ws / "dir").symlink_to(outside)
    (ws / "dangling").symlink_to(outside / "planted.txt")
    body = [] if "Delete" in directive else ["+x"] if "Add" in directive else ["-secret", "+x"]
    text = wrap("*** Add File: ok.txt", "+ok", directive.format(outside=outside), *body)
    message = await fails("INVALID_PATH", ws, text)
    assert message.startswith("apply_patch: path '")
    assert message.endswith("leaves the workspace")
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "secret\n"
    assert not (ws / "ok.txt").exists()


async def test_move_out_of_the_workspace_is_refused(ws: Path, outside: Path) -> None:
    text = wrap("*** Update File: a.txt", "*** Move to: ../outside/a.txt")
    message = await fails("INVALID_PATH", ws, text)
    assert message == "apply_patch: path '../outside/a.txt' leaves the workspace"
    assert (ws / "a.txt").exists()
    assert sorted(os.listdir(outside)) == ["secret.txt"]


async def test_dotdot_inside_the_workspace_is_refused(ws: Path) -> None:
    message = await fails("INVALID_PATH", ws, wrap("*** Delete File: src/../a.txt"))
    assert message == "apply_patch: path 'src/../a.txt' must not contain '..'"


# malformed patches


MALFORMED = [
    ("empty", "", "apply_patch: the patch is empty"),
    ("no begin", "*** Add File: x\n+x\n*** End Patch\n",
     "apply_patch: line 1 of the patch: a patch starts with '*** Begin Patch', "
     "got '*** Add File: x'"),
    ("no end", "*** Begin Patch\n*** Add File: x\n+x\n",
     "apply_patch: line 3 of the patch: a patch ends with '*** End Patch', got '+x'"),
    ("only begin", "*** Begin Patch\n",
     "apply_patch: line 1 of the patch: a patch ends with '*** End Patch', "
     "got '*** Begin Patch'"),
    ("no operations", wrap(), "apply_patch: the patch changes no file"),
    ("unknown directive first", wrap("*** Copy File: a.txt"),
     "apply_patch: line 2 of the patch: expected a file operation (*** Add File: ...), "
     "got '*** Copy File: a.txt'"),
    ("unknown directive in a hunk", wrap("*** Update File: a.txt", "-one", "*** Rename: b"),
     "apply_patch: line 4 of the patch: unknown directive '*** Rename: b'"),
    ("hunk line without prefix", wrap("*** Update File: a.txt", " one", "two"),
     "apply_patch: line 4 of the patch: hunk lines start with ' ', '-' or '+', got 'two'"),
    ("add line without +", wrap("*** Add File: n", "+a", "b"),
     "apply_patch: line 4 of the patch: every line of an added file starts with '+', got 'b'"),
    ("missing path", wrap("*** Delete File: "),
     "apply_patch: line 2 of the patch: the file path is missing"),
    ("text after delete", wrap("*** Delete File: a.txt", "-one"),
     "apply_patch: line 3 of the patch: unexpected line after '*** Delete File:': '-one'"),
    ("update without hunks", wrap("*** Update File: a.txt"),
     "apply_patch: line 2 of the patch: '*** Update File: a.txt' has no hunks"),
    ("@@ without lines", wrap("*** Update File: a.txt", "-one", "@@ two"),
     "apply_patch: line 4 of the patch: a '@@' line must be followed by hunk lines"),
    ("move not first", wrap("*** Update File: a.txt", "-one", "*** Move to: b"),
     "apply_patch: line 4 of the patch: '*** Move to:' must come right after "
     "'*** Update File:'"),
    ("end of file not last", wrap("*** Update File: a.txt", "-one", "*** End of File", "-two"),
     "apply_patch: line 4 of the patch: '*** End of File' must close the last hunk of a file"),
    ("end of file alone", wrap("*** Update File: a.txt", "*** End of File"),
     "apply_patch: line 3 of the patch: '*** End of File' must close the last hunk of a file"),
    ("empty move target", wrap("*** Update File: a.txt", "*** Move to: "),
     "apply_patch: line 3 of the patch: the path to move to is missing"),
    ("second patch glued on", wrap("*** Add File: x", "+x") + wrap("*** Add File: y", "+y"),
     "apply_patch: line 4 of the patch: every line of an added file starts with '+', "
     "got '*** End Patch'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
async def test_malformed_patches(ws: Path, text: str, message: str) -> None:
    before = snapshot(ws)
    assert await fails("INVALID_ARGS", ws, text) == message
    assert snapshot(ws) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "argument 'input' is required"),
        ({"input": 3}, "argument 'input' must be a string, got integer"),
        ({"input": "x", "patch": "y"}, "unknown argument 'patch'; allowed: input"),
    ],
)
async def test_argument_errors(ws: Path, args: dict[str, Any], message: str) -> None:
    with pytest.raises(ToolError) as info:
        await patch.apply_patch(ws, args)
    assert (info.value.code, info.value.message) == ("INVALID_ARGS", message)


async def test_huge_patch_is_refused(ws: Path) -> None:
    line = "+" + "x" * 1023
    text = wrap("*** Add File: big", *[line] * (10 * 1024 + 1))
    message = await fails("INVALID_ARGS", ws, text)
    assert message == "apply_patch: the patch is larger than 10 MiB"
    assert not (ws / "big").exists()


async def test_multibyte_text_counts_bytes_for_the_cap(ws: Path) -> None:
    text = wrap("*** Add File: big", "+" + "é" * (5 * 1024 * 1024 + 1))  # chars < cap < bytes
    assert await fails("INVALID_ARGS", ws, text) == "apply_patch: the patch is larger than 10 MiB"


async def test_patch_just_under_the_cap_is_applied(ws: Path) -> None:
    content = "x" * (patch.MAX_PATCH_BYTES - 100)
    assert await apply(ws, wrap("*** Add File: big", "+" + content)) == result(added=["big"])
    assert (ws / "big").stat().st_size == len(content) + 1


async def test_file_too_large_to_patch(ws: Path) -> None:
    (ws / "huge").write_bytes(b"x\n" * (6 * 1024 * 1024))
    message = await fails("INVALID_ARGS", ws, wrap("*** Update File: huge", "-x", "+y"))
    assert message == "apply_patch: 'huge' is too large to patch (over 10 MiB)"


async def test_lone_surrogate_is_refused(ws: Path) -> None:
    message = await fails("INVALID_ARGS", ws, wrap("*** Add File: s", "+\ud800"))
    assert message.startswith("apply_patch: argument 'input' holds a lone surrogate")
