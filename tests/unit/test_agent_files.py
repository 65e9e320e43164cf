"""The agent's file tools and tools.run, called directly on a temporary workspace."""

from __future__ import annotations

import io
import os
import stat
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stockade.agent import files, tools
from stockade.agent.errors import ToolError
from tests.unit.fakes import make_folder

Tool = Callable[[Path, dict[str, Any]], Awaitable[dict[str, Any]]]
MiB = 1024 * 1024

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_folder(
        tmp_path / "ws", {"a.txt": "one\ntwo\nthree\nfour\nfive\n", "sub/b.py": "print('b')\n"}
    )


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "outside", {"secret.txt": "secret needle\n"})


async def fails(code: str, tool: Tool, root: Path, args: dict[str, Any]) -> str:
    with pytest.raises(ToolError) as info:
        await tool(root, args)
    assert info.value.code == code, info.value.message
    return info.value.message


# argument checking, shared by every tool


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "argument 'path' is required"),
        ({"path": 5}, "argument 'path' must be a string, got integer"),
        ({"path": None}, "argument 'path' must be a string, got null"),
        (
            {"path": "a.txt", "start_line": "2"},
            "argument 'start_line' must be an integer, got string",
        ),
        (
            {"path": "a.txt", "start_line": True},
            "argument 'start_line' must be an integer, got boolean",
        ),
        ({"path": "a.txt", "end_line": 2.0}, "argument 'end_line' must be an integer, got number"),
        ({"path": "a.txt", "start_line": 0}, "argument 'start_line' must be at least 1, got 0"),
        (
            {"path": "a.txt", "start_line": 3, "end_line": 2},
            "argument 'end_line' (2) must not be less than start_line (3)",
        ),
        (
            {"path": "a.txt", "lines": 2, "mode": "x"},
            "unknown argument 'lines', 'mode'; allowed: end_line, path, start_line",
        ),
    ],
)
async def test_read_file_argument_errors(ws: Path, args: dict[str, Any], message: str) -> None:
    assert await fails("INVALID_ARGS", files.read_file, ws, args) == message


async def test_unknown_tool_names_the_known_ones(ws: Path) -> None:
    with pytest.raises(ToolError) as info:
        await tools.run("rm_rf", {}, root=ws, max_output_bytes=10)
    assert info.value.code == "UNKNOWN_TOOL"
    assert "'rm_rf'" in info.value.message
    assert "read_file" in info.value.message


@pytest.mark.parametrize(("args", "kind"), [([], "array"), (None, "null"), ("x", "string")])
async def test_run_requires_an_object(ws: Path, args: object, kind: str) -> None:
    with pytest.raises(ToolError) as info:
        await tools.run("read_file", args, root=ws, max_output_bytes=10)
    assert info.value.code == "INVALID_ARGS"
    assert info.value.message == f"arguments must be an object, got {kind}"


async def test_run_dispatches_every_tool(ws: Path) -> None:
    assert set(tools.TOOLS) == {
        "exec",
        "process",
        "apply_patch",
        "read_file",
        "write_file",
        "edit_file",
        "list_files",
        "glob",
        "search",
        "session",
    }
    result = await tools.run("read_file", {"path": "sub/b.py"}, root=ws, max_output_bytes=10)
    assert result["content"] == "print('b')\n"


# read_file


async def test_read_whole_file(ws: Path) -> None:
    result = await files.read_file(ws, {"path": "a.txt"})
    assert result == {
        "path": "a.txt",
        "content": "one\ntwo\nthree\nfour\nfive\n",
        "start_line": 1,
        "end_line": 5,
        "total_lines": 5,
        "truncated": False,
        "binary": False,
    }


async def test_read_line_range_is_inclusive(ws: Path) -> None:
    result = await files.read_file(ws, {"path": "a.txt", "start_line": 2, "end_line": 3})
    assert (result["content"], result["start_line"], result["end_line"]) == ("two\nthree\n", 2, 3)


async def test_end_line_past_the_end_is_clamped(ws: Path) -> None:
    result = await files.read_file(ws, {"path": "a.txt", "start_line": 4, "end_line": 99})
    assert (result["content"], result["end_line"]) == ("four\nfive\n", 5)


async def test_start_line_past_the_end_is_refused(ws: Path) -> None:
    message = await fails("INVALID_ARGS", files.read_file, ws, {"path": "a.txt", "start_line": 6})
    assert message == "start_line 6 is past the end of 'a.txt' (5 lines)"


async def test_read_empty_file_and_last_line_without_newline(ws: Path) -> None:
    (ws / "empty").write_bytes(b"")
    (ws / "tail").write_bytes(b"x\ny")
    empty = await files.read_file(ws, {"path": "empty"})
    tail = await files.read_file(ws, {"path": "tail", "start_line": 2})
    assert (empty["content"], empty["total_lines"], empty["end_line"]) == ("", 0, 0)
    assert (tail["content"], tail["total_lines"]) == ("y", 2)


async def test_read_binary_and_invalid_utf8(ws: Path) -> None:
    (ws / "bin").write_bytes(b"ab\0cd\xff\n")
    result = await files.read_file(ws, {"path": "bin"})
    assert result["binary"] is True
    assert result["content"] == "ab\0cd\ufffd\n"


async def test_read_caps_huge_file(ws: Path) -> None:
    (ws / "big").write_bytes(b"x" * (11 * MiB))
    result = await files.read_file(ws, {"path": "big"})
    assert result["truncated"] is True
    assert len(result["content"]) == files.MAX_READ_BYTES


async def test_read_a_line_range_past_the_read_cap(ws: Path) -> None:
    """A line range beyond the first 10 MiB (the tail of a big log) is found, and the line
    count is the file's: it was the count within the first 10 MiB, and 'past the end'."""
    (ws / "big.log").write_bytes(b"x" * (11 * MiB) + b"\nsecond\nthird")
    result = await files.read_file(ws, {"path": "big.log", "start_line": 2})
    assert (result["content"], result["total_lines"], result["end_line"]) == ("second\nthird", 3, 3)
    assert result["truncated"] is False
    whole = await files.read_file(ws, {"path": "big.log"})
    assert (whole["truncated"], whole["end_line"], whole["total_lines"]) == (True, 1, 3)
    message = await fails("INVALID_ARGS", files.read_file, ws, {"path": "big.log", "start_line": 4})
    assert message == "start_line 4 is past the end of 'big.log' (3 lines)"


@settings(max_examples=300, deadline=None)
@given(
    content=st.lists(st.sampled_from([b"\n", b"a", b"bc", b"\xff", b"\n\n"]), max_size=40),
    start=st.integers(1, 12),
    length=st.one_of(st.none(), st.integers(0, 12)),
)
def test_read_lines_in_chunks_equals_splitting_the_whole_file(
    content: list[bytes], start: int, length: int | None
) -> None:
    data = b"".join(content)
    lines = data.splitlines(keepends=True)
    end = None if length is None else start + length
    wanted = b"".join(lines[start - 1 : end])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(files, "_CHUNK_BYTES", 3)
        patch.setattr(files, "MAX_READ_BYTES", 7)
        got = files._read_lines(io.BytesIO(data), start, end)
    assert (bytes(got.data), got.total, got.cut) == (wanted[:7], len(lines), len(wanted) > 7)
    if got.cut:
        assert got.last == start + len(wanted[:7].splitlines()) - 1


@pytest.mark.timeout(5)
async def test_read_fifo_is_refused_without_hanging(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    assert "FIFO" in await fails("INVALID_PATH", files.read_file, ws, {"path": "pipe"})


async def test_read_directory_is_invalid_path(ws: Path) -> None:
    await fails("INVALID_PATH", files.read_file, ws, {"path": "sub"})


async def test_read_through_symlink_to_outside_is_refused(ws: Path, outside: Path) -> None:
    (ws / "link").symlink_to(outside / "secret.txt")
    (ws / "dir").symlink_to(outside)
    await fails("INVALID_PATH", files.read_file, ws, {"path": "link"})
    await fails("INVALID_PATH", files.read_file, ws, {"path": "dir/secret.txt"})
    await fails("INVALID_PATH", files.read_file, ws, {"path": str(outside / "secret.txt")})


@pytest.mark.parametrize("tool", [files.read_file, files.write_file, files.edit_file])
async def test_a_file_path_ending_in_a_slash_is_refused(ws: Path, tool: Tool) -> None:
    (ws / "f.txt").write_text("x")
    args = {"path": "f.txt/", "content": "y", "old_text": "x", "new_text": "y"}
    args = {k: v for k, v in args.items() if k in _ARGS[tool.__name__]}
    assert "ends in '/'" in await fails("INVALID_PATH", tool, ws, args)
    await fails("INVALID_PATH", tool, ws, {**args, "path": "new/"})
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt", "f.txt", "sub"]
    assert (ws / "f.txt").read_text() == "x"


_ARGS = {
    "read_file": ("path",),
    "write_file": ("path", "content"),
    "edit_file": ("path", "old_text", "new_text"),
}


async def test_read_missing_file(ws: Path) -> None:
    await fails("FILE_NOT_FOUND", files.read_file, ws, {"path": "missing.txt"})


# write_file


async def test_write_creates_parents(ws: Path) -> None:
    result = await files.write_file(ws, {"path": "new/deep/c.txt", "content": "héllo"})
    assert result == {"path": "new/deep/c.txt", "bytes_written": 6, "created": True}
    assert (ws / "new" / "deep" / "c.txt").read_text() == "héllo"


async def test_write_new_file_gets_default_mode_and_leaves_no_temp(ws: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    await files.write_file(ws, {"path": "sub/new.txt", "content": "x"})
    assert stat.S_IMODE((ws / "sub" / "new.txt").stat().st_mode) == 0o666 & ~umask
    assert sorted(os.listdir(ws / "sub")) == ["b.py", "new.txt"]


async def test_overwrite_keeps_mode(ws: Path) -> None:
    (ws / "a.txt").chmod(0o751)
    result = await files.write_file(ws, {"path": "a.txt", "content": "new"})
    assert result["created"] is False
    assert (ws / "a.txt").read_text() == "new"
    assert stat.S_IMODE((ws / "a.txt").stat().st_mode) == 0o751


async def test_write_huge_content(ws: Path) -> None:
    result = await files.write_file(ws, {"path": "big", "content": "y" * (20 * MiB)})
    assert result["bytes_written"] == 20 * MiB
    assert (ws / "big").stat().st_size == 20 * MiB


async def test_write_through_inner_symlink_writes_the_target(ws: Path) -> None:
    (ws / "alias").symlink_to("a.txt")
    result = await files.write_file(ws, {"path": "alias", "content": "via link"})
    assert result["path"] == "a.txt"
    assert (ws / "alias").is_symlink()
    assert (ws / "a.txt").read_text() == "via link"


async def test_write_through_symlinks_leaving_root_is_refused(ws: Path, outside: Path) -> None:
    (ws / "link").symlink_to(outside / "secret.txt")
    (ws / "dir").symlink_to(outside)
    (ws / "dangling").symlink_to(outside / "planted.txt")
    for path in ("link", "dir/secret.txt", "dir/new.txt", "dangling", "../outside/x"):
        await fails("INVALID_PATH", files.write_file, ws, {"path": path, "content": "pwned"})
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "secret needle\n"


@pytest.mark.timeout(5)
async def test_write_to_fifo_or_directory_is_refused(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    await fails("INVALID_PATH", files.write_file, ws, {"path": "pipe", "content": "x"})
    await fails("INVALID_PATH", files.write_file, ws, {"path": "sub", "content": "x"})
    await fails("INVALID_PATH", files.write_file, ws, {"path": "a.txt/x", "content": "x"})


async def test_write_odd_names(ws: Path) -> None:
    await files.write_file(ws, {"path": "line\nbreak.txt", "content": "1"})
    await files.write_file(ws, {"path": "raw\udcff.txt", "content": "2"})
    assert (ws / "line\nbreak.txt").read_text() == "1"
    with open(os.fsencode(ws) + b"/raw\xff.txt") as file:
        assert file.read() == "2"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"path": "x", "content": 3}, "argument 'content' must be a string, got integer"),
        ({"path": "x"}, "argument 'content' is required"),
        (
            {"path": "x", "content": "\ud800"},
            "argument 'content' holds a lone surrogate at index 0",
        ),
        (
            {"path": "x", "content": "", "mode": 7},
            "unknown argument 'mode'; allowed: content, path",
        ),
        ({"path": "", "content": ""}, "argument 'path' must not be empty"),
    ],
)
async def test_write_argument_errors(ws: Path, args: dict[str, Any], message: str) -> None:
    assert await fails("INVALID_ARGS", files.write_file, ws, args) == message
    assert not (ws / "x").exists()


# edit_file


async def test_edit_replaces_the_one_occurrence(ws: Path) -> None:
    args = {"path": "a.txt", "old_text": "two\n", "new_text": "2\n"}
    assert await files.edit_file(ws, args) == {"path": "a.txt", "replacements": 1}
    assert (ws / "a.txt").read_text() == "one\n2\nthree\nfour\nfive\n"


async def test_edit_counts_misses_and_repeats(ws: Path) -> None:
    (ws / "a.py").write_text("x = 1\nx = 1\nx = 1\n")
    args = {"path": "a.py", "new_text": "y"}
    many = await fails("INVALID_ARGS", files.edit_file, ws, {**args, "old_text": "x = 1"})
    none = await fails("INVALID_ARGS", files.edit_file, ws, {**args, "old_text": "z"})
    assert many == "old_text found 3 times in 'a.py'; add context to make it unique"
    assert none == "old_text not found in 'a.py'"
    assert (ws / "a.py").read_text() == "x = 1\nx = 1\nx = 1\n"


async def test_edit_refuses_empty_old_text(ws: Path) -> None:
    args = {"path": "a.txt", "old_text": "", "new_text": "x"}
    assert await fails("INVALID_ARGS", files.edit_file, ws, args) == (
        "argument 'old_text' must not be empty"
    )


async def test_edit_keeps_undecodable_bytes_and_mode(ws: Path) -> None:
    (ws / "raw").write_bytes(b"\xff\xfe old \x80\n")
    (ws / "raw").chmod(0o700)
    await files.edit_file(ws, {"path": "raw", "old_text": "old", "new_text": "new"})
    assert (ws / "raw").read_bytes() == b"\xff\xfe new \x80\n"
    assert stat.S_IMODE((ws / "raw").stat().st_mode) == 0o700


async def test_edit_errors(ws: Path, outside: Path) -> None:
    (ws / "link").symlink_to(outside / "secret.txt")
    edit = {"old_text": "secret", "new_text": "x"}
    await fails("INVALID_PATH", files.edit_file, ws, {"path": "link", **edit})
    await fails("FILE_NOT_FOUND", files.edit_file, ws, {"path": "nope", **edit})
    message = await fails(
        "INVALID_ARGS", files.edit_file, ws, {"path": "a.txt", "old_text": "one", "new_text": 1}
    )
    assert message == "argument 'new_text' must be a string, got integer"
    assert (outside / "secret.txt").read_text() == "secret needle\n"


# list_files


async def test_list_sorted_entries(ws: Path) -> None:
    result = await files.list_files(ws, {})
    assert result == {
        "path": ".",
        "entries": [
            {"name": "a.txt", "is_dir": False, "size": 24, "is_symlink": False},
            {
                "name": "sub",
                "is_dir": True,
                "size": (ws / "sub").stat().st_size,
                "is_symlink": False,
            },
        ],
        "truncated": False,
    }


async def test_list_symlinks(ws: Path, outside: Path) -> None:
    (ws / "sub" / "in").symlink_to(ws / "sub")
    (ws / "sub" / "out").symlink_to(outside)
    (ws / "sub" / "gone").symlink_to("nowhere")
    entries = {e["name"]: e for e in (await files.list_files(ws, {"path": "sub"}))["entries"]}
    assert entries["in"]["is_dir"] is True
    assert entries["in"]["is_symlink"] is True
    assert entries["out"] == {
        "name": "out",
        "is_dir": False,
        "size": len(str(outside)),
        "is_symlink": True,
    }
    assert entries["gone"] == {"name": "gone", "is_dir": False, "size": 7, "is_symlink": True}


async def test_list_odd_names(ws: Path) -> None:
    (ws / "sub" / "new\nline").write_text("")
    with open(os.fsencode(ws) + b"/sub/raw\xff", "w"):
        pass
    names = [e["name"] for e in (await files.list_files(ws, {"path": "sub"}))["entries"]]
    assert names == ["b.py", "new\nline", "raw\udcff"]


async def test_list_truncates_at_cap(ws: Path) -> None:
    many = ws / "many"
    many.mkdir()
    for index in range(files.MAX_LIST_ENTRIES + 1):
        (many / f"{index:05}").touch()
    result = await files.list_files(ws, {"path": "many"})
    assert result["truncated"] is True
    assert len(result["entries"]) == files.MAX_LIST_ENTRIES
    assert result["entries"][-1]["name"] == f"{files.MAX_LIST_ENTRIES - 1:05}"


async def test_list_errors(ws: Path, outside: Path) -> None:
    (ws / "out").symlink_to(outside)
    await fails("INVALID_PATH", files.list_files, ws, {"path": "a.txt"})
    await fails("INVALID_PATH", files.list_files, ws, {"path": "out"})
    await fails("INVALID_PATH", files.list_files, ws, {"path": ".."})
    await fails("FILE_NOT_FOUND", files.list_files, ws, {"path": "nope"})


# glob


async def test_glob_double_star(ws: Path) -> None:
    (ws / "top.py").write_text("")
    (ws / "sub" / "deep").mkdir()
    (ws / "sub" / "deep" / "c.py").write_text("")
    result = await files.glob(ws, {"pattern": "**/*.py"})
    assert result == {"matches": ["sub/b.py", "sub/deep/c.py", "top.py"], "truncated": False}


async def test_glob_ending_in_double_star_lists_files_too(ws: Path) -> None:
    """As bash's globstar and glob.glob: `sub/**` is sub, and everything below it."""
    (ws / "sub" / "deep").mkdir()
    (ws / "sub" / "deep" / "c.py").write_text("")
    result = await files.glob(ws, {"pattern": "sub/**"})
    assert result["matches"] == ["sub", "sub/b.py", "sub/deep", "sub/deep/c.py"]
    everything = await files.glob(ws, {"pattern": "**"})
    assert {"a.txt", "sub/b.py", "sub/deep/c.py"} <= set(everything["matches"])


async def test_glob_under_path_reports_paths_from_root(ws: Path) -> None:
    result = await files.glob(ws, {"pattern": "*.py", "path": "sub"})
    assert result["matches"] == ["sub/b.py"]


async def test_glob_no_match_is_empty(ws: Path) -> None:
    assert await files.glob(ws, {"pattern": "*.rs"}) == {"matches": [], "truncated": False}


@pytest.mark.parametrize(
    ("pattern", "code", "expected"),
    [
        ("/etc/*", "INVALID_PATH", "pattern '/etc/*' must be relative to the workspace"),
        ("../*", "INVALID_PATH", "pattern '../*' must not contain '..'"),
        ("sub/../../*", "INVALID_PATH", "pattern 'sub/../../*' must not contain '..'"),
        ("", "INVALID_ARGS", "argument 'pattern' must not be empty"),
        ("a\0b", "INVALID_ARGS", "argument 'pattern' contains a NUL byte"),
        ("**x/*", "INVALID_ARGS", "argument 'pattern': Invalid pattern"),
    ],
)
async def test_glob_bad_patterns(ws: Path, pattern: str, code: str, expected: str) -> None:
    assert (await fails(code, files.glob, ws, {"pattern": pattern})).startswith(expected)


async def test_glob_drops_matches_outside_root(ws: Path, outside: Path) -> None:
    (ws / "out").symlink_to(outside)
    (ws / "leak.txt").symlink_to(outside / "secret.txt")
    (ws / "ok.txt").symlink_to("a.txt")
    assert (await files.glob(ws, {"pattern": "out/*"}))["matches"] == []
    assert (await files.glob(ws, {"pattern": "*.txt"}))["matches"] == ["a.txt", "ok.txt"]


async def test_glob_symlink_loop_does_not_hang(ws: Path) -> None:
    (ws / "sub" / "loop").symlink_to(ws / "sub")
    result = await files.glob(ws, {"pattern": "**/*.py"})
    assert result["matches"] == ["sub/b.py"]


async def test_glob_caps_matches(ws: Path) -> None:
    for index in range(files.MAX_GLOB_MATCHES + 5):
        (ws / "sub" / f"{index}.log").touch()
    result = await files.glob(ws, {"pattern": "sub/*.log"})
    assert result["truncated"] is True
    assert len(result["matches"]) == files.MAX_GLOB_MATCHES


# search


async def test_search_finds_lines(ws: Path) -> None:
    (ws / "sub" / "c.txt").write_text("no\nthree times three\n")
    result = await files.search(ws, {"pattern": "thr+ee"})
    assert result == {
        "matches": [
            {"file": "a.txt", "line": 3, "text": "three"},
            {"file": "sub/c.txt", "line": 2, "text": "three times three"},
        ],
        "truncated": False,
    }


async def test_search_with_glob_and_path(ws: Path) -> None:
    (ws / "sub" / "c.txt").write_text("print\n")
    by_glob = await files.search(ws, {"pattern": "print", "glob": "*.py"})
    by_path = await files.search(ws, {"pattern": "print", "path": "sub/c.txt"})
    assert [m["file"] for m in by_glob["matches"]] == ["sub/b.py"]
    assert [m["file"] for m in by_path["matches"]] == ["sub/c.txt"]


async def test_search_without_match_is_success(ws: Path) -> None:
    assert await files.search(ws, {"pattern": "zebra"}) == {"matches": [], "truncated": False}


async def test_search_pattern_starting_with_dash(ws: Path) -> None:
    (ws / "opt.txt").write_text("use --force here\n")
    result = await files.search(ws, {"pattern": "--force"})
    assert result["matches"] == [{"file": "opt.txt", "line": 1, "text": "use --force here"}]


async def test_search_skips_git_but_not_hidden_or_ignored(ws: Path) -> None:
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("needle\n")
    (ws / ".gitignore").write_text("*.log\n")
    (ws / ".hidden").write_text("needle\n")
    (ws / "x.log").write_text("needle\n")
    result = await files.search(ws, {"pattern": "needle"})
    assert [m["file"] for m in result["matches"]] == [".hidden", "x.log"]


async def test_search_does_not_follow_symlinks_out(ws: Path, outside: Path) -> None:
    (ws / "out").symlink_to(outside)
    (ws / "leak.txt").symlink_to(outside / "secret.txt")
    assert (await files.search(ws, {"pattern": "needle"}))["matches"] == []
    await fails("INVALID_PATH", files.search, ws, {"pattern": "needle", "path": "out"})


@pytest.mark.timeout(10)
async def test_search_skips_fifos_and_refuses_them_as_path(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    assert (await files.search(ws, {"pattern": "one"}))["matches"][0]["file"] == "a.txt"
    await fails("INVALID_PATH", files.search, ws, {"pattern": "x", "path": "pipe"})


async def test_search_truncates_results(ws: Path) -> None:
    (ws / "many.txt").write_text("hit\n" * 1500)
    five = await files.search(ws, {"pattern": "hit", "max_results": 5})
    exact = await files.search(ws, {"pattern": "hit", "path": "many.txt", "max_results": 1000})
    clamped = await files.search(ws, {"pattern": "hit", "max_results": 5000})
    assert (len(five["matches"]), five["truncated"]) == (5, True)
    assert [m["line"] for m in five["matches"]] == [1, 2, 3, 4, 5]
    assert (len(exact["matches"]), exact["truncated"]) == (1000, True)
    assert (len(clamped["matches"]), clamped["truncated"]) == (files.MAX_SEARCH_RESULTS, True)
    (ws / "few.txt").write_text("hat\n" * 3)
    few = await files.search(ws, {"pattern": "hat", "max_results": 3})
    assert (len(few["matches"]), few["truncated"]) == (3, False)


async def test_search_shortens_long_lines(ws: Path) -> None:
    (ws / "min.js").write_text("a" * 3 * MiB + "needle" + "b" * 100 + "\n")
    [match] = (await files.search(ws, {"pattern": "needle"}))["matches"]
    assert match["text"] == "a" * files.MAX_LINE_CHARS + " [...]"
    assert match["line"] == 1


async def test_search_drops_a_line_too_long_to_hold_and_says_so(ws: Path) -> None:
    (ws / "huge.js").write_text("a" * 9 * MiB + "needle\n")
    assert await files.search(ws, {"pattern": "needle"}) == {"matches": [], "truncated": True}


async def test_search_odd_file_names_and_bytes(ws: Path) -> None:
    with open(os.fsencode(ws) + b"/raw\xff.txt", "wb") as file:
        file.write(b"needle \xff\n")
    [match] = (await files.search(ws, {"pattern": "needle"}))["matches"]
    assert match == {"file": "raw\udcff.txt", "line": 1, "text": "needle \ufffd"}


async def test_search_redos_pattern_is_fast(ws: Path) -> None:
    (ws / "evil.txt").write_text("a" * 50_000 + "!\n")
    started = time.monotonic()
    result = await files.search(ws, {"pattern": "^(a+)+$"})
    assert result["matches"] == []
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"pattern": "("}, "regex parse error"),
        ({"pattern": "a{1000}{1000}{1000}"}, "exceeds size limit"),
        ({"pattern": "a\nb"}, "is not allowed in a regex"),
        ({"pattern": "x", "glob": "{a"}, "error parsing glob"),
        ({"pattern": "x", "max_results": 0}, "argument 'max_results' must be at least 1, got 0"),
        (
            {"pattern": "x", "max_results": "9"},
            "argument 'max_results' must be an integer, got string",
        ),
        ({"pattern": 1}, "argument 'pattern' must be a string, got integer"),
        ({"pattern": "x\0"}, "argument 'pattern' contains a NUL byte"),
        ({"pattern": "x", "regex": "y"}, "unknown argument 'regex'"),
    ],
)
async def test_search_invalid_arguments(ws: Path, args: dict[str, Any], expected: str) -> None:
    assert expected in await fails("INVALID_ARGS", files.search, ws, args)


async def test_search_timeout_kills_ripgrep(ws: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "rg.pid"
    fake = tmp_path / "fake-rg"
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 100\n")
    fake.chmod(0o755)
    with pytest.raises(ToolError) as info:
        await files.search(ws, {"pattern": "x"}, rg=str(fake), timeout=0.5)
    assert info.value.code == "TIMEOUT"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


async def test_search_without_ripgrep_is_execution_failed(ws: Path, tmp_path: Path) -> None:
    with pytest.raises(ToolError) as info:
        await files.search(ws, {"pattern": "x"}, rg=str(tmp_path / "no-rg"))
    assert info.value.code == "EXECUTION_FAILED"
    assert "cannot run ripgrep" in info.value.message
