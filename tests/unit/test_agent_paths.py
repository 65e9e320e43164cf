"""paths.resolve and paths.display against a real temporary workspace."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stockade.agent import paths
from stockade.agent.errors import ToolError
from stockade.agent.paths import MAX_PATH_BYTES, display, resolve
from tests.unit.fakes import make_folder


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "ws", {"a.txt": "a", "sub/b.txt": "b"})


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "outside", {"secret.txt": "secret"})


def fails(code: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ToolError) as info:
        call(*args, **kwargs)
    assert info.value.code == code, info.value.message
    return info.value.message


@pytest.mark.parametrize(
    ("user_path", "expected"),
    [("a.txt", "a.txt"), ("sub/b.txt", "sub/b.txt"), ("./sub//b.txt", "sub/b.txt"), (".", "")],
)
def test_relative_paths_resolve_inside_root(ws: Path, user_path: str, expected: str) -> None:
    assert resolve(ws, user_path) == ws / expected


def test_absolute_path_inside_root_is_accepted(ws: Path) -> None:
    assert resolve(ws, str(ws / "sub" / "b.txt")) == ws / "sub" / "b.txt"


@pytest.mark.parametrize("user_path", ["../x", "sub/../../x", "..", "/etc/passwd", "/"])
def test_paths_leaving_root_are_refused(ws: Path, user_path: str) -> None:
    message = fails("INVALID_PATH", resolve, ws, user_path, must_exist=False)
    assert message == f"path '{user_path}' leaves the workspace"


def test_dotdot_that_stays_inside_is_still_refused(ws: Path) -> None:
    message = fails("INVALID_PATH", resolve, ws, "sub/../a.txt")
    assert "must not contain '..'" in message


def test_sibling_with_root_as_string_prefix_is_outside(ws: Path) -> None:
    sibling = ws.parent / (ws.name + "2")
    sibling.mkdir()
    fails("INVALID_PATH", resolve, ws, str(sibling), must_exist=False)


def test_symlink_to_outside_file_is_refused(ws: Path, outside: Path) -> None:
    (ws / "link").symlink_to(outside / "secret.txt")
    assert "leaves the workspace" in fails("INVALID_PATH", resolve, ws, "link")


def test_file_under_symlinked_dir_is_refused_even_if_new(ws: Path, outside: Path) -> None:
    (ws / "out").symlink_to(outside)
    fails("INVALID_PATH", resolve, ws, "out/secret.txt")
    fails("INVALID_PATH", resolve, ws, "out/new/deeper.txt", must_exist=False)


def test_dangling_symlink_to_outside_is_refused(ws: Path, outside: Path) -> None:
    (ws / "dangling").symlink_to(outside / "missing.txt")
    fails("INVALID_PATH", resolve, ws, "dangling", must_exist=False)


def test_symlink_inside_root_resolves_to_its_target(ws: Path) -> None:
    (ws / "inner").symlink_to(ws / "sub")
    assert resolve(ws, "inner/b.txt") == ws / "sub" / "b.txt"


def test_root_given_through_a_symlink_works(ws: Path, tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(ws)
    assert resolve(alias, "a.txt") == ws / "a.txt"
    assert resolve(alias, str(alias / "a.txt")) == ws / "a.txt"


def test_symlink_loop_is_invalid_path(ws: Path) -> None:
    (ws / "loop").symlink_to("loop")
    fails("INVALID_PATH", resolve, ws, "loop", must_exist=False)


def test_missing_file_is_file_not_found(ws: Path) -> None:
    assert fails("FILE_NOT_FOUND", resolve, ws, "nope.txt") == "path 'nope.txt' does not exist"


def test_missing_file_is_fine_when_not_required(ws: Path) -> None:
    assert resolve(ws, "new/dir/c.txt", must_exist=False) == ws / "new" / "dir" / "c.txt"


def test_file_used_as_directory_is_invalid(ws: Path) -> None:
    fails("INVALID_PATH", resolve, ws, "a.txt/c.txt", must_exist=False)


@pytest.mark.parametrize(
    ("user_path", "kind", "expected"),
    [
        ("sub", "file", "path 'sub' is a directory, not a file"),
        ("a.txt", "dir", "path 'a.txt' is a file, not a directory"),
    ],
)
def test_wrong_kind_is_invalid_path(ws: Path, user_path: str, kind: Any, expected: str) -> None:
    assert fails("INVALID_PATH", resolve, ws, user_path, kind=kind) == expected


@pytest.mark.parametrize("kind", ["file", "any"])
def test_fifo_is_never_a_target(ws: Path, kind: Any) -> None:
    os.mkfifo(ws / "pipe")
    assert "FIFO" in fails("INVALID_PATH", resolve, ws, "pipe", kind=kind)


def test_empty_path_is_invalid_args(ws: Path) -> None:
    assert fails("INVALID_ARGS", resolve, ws, "") == "argument 'path' must not be empty"


def test_nul_byte_is_invalid_path(ws: Path) -> None:
    assert "NUL" in fails("INVALID_PATH", resolve, ws, "a.txt\0.png")


def test_argument_name_appears_in_messages(ws: Path) -> None:
    assert "'workdir'" in fails("INVALID_ARGS", resolve, ws, "", arg="workdir")


def test_overlong_path_is_refused(ws: Path) -> None:
    message = fails("INVALID_PATH", resolve, ws, "a/" * (MAX_PATH_BYTES // 2 + 1))
    assert f"the limit is {MAX_PATH_BYTES}" in message


def test_overlong_component_is_invalid_path(ws: Path) -> None:
    fails("INVALID_PATH", resolve, ws, "x" * 300, must_exist=False)


def test_lone_surrogate_that_is_no_byte_is_refused(ws: Path) -> None:
    fails("INVALID_PATH", resolve, ws, "bad\ud800name", must_exist=False)


def test_names_with_newlines_and_undecodable_bytes_resolve(ws: Path) -> None:
    raw = os.fsencode(ws) + b"/odd\nname\xff.txt"
    with open(raw, "w") as file:
        file.write("x")
    name = os.fsdecode(b"odd\nname\xff.txt")
    assert os.fsencode(resolve(ws, name)) == raw


def test_display_is_relative_to_root(ws: Path) -> None:
    assert display(ws, ws / "sub" / "b.txt") == "sub/b.txt"
    assert display(ws, ws) == "."


def test_a_link_that_cannot_be_read_is_not_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc/1/root of init, which runs as another user: readlink says EACCES."""

    def refused(_path: object) -> str:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(paths.os.path, "realpath", refused)
    assert paths.is_real_inside(tmp_path, tmp_path / "x") is False
