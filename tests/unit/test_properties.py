"""Property-based tests (hypothesis, deterministic profile in tests/conftest.py) of the
edges where arbitrary input arrives: the agent's path resolution, argument validation, and
sandbox keys."""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from stockade.agent.errors import ToolError
from stockade.agent.paths import MAX_PATH_BYTES, is_inside, resolve
from stockade.supervisor.calls.pipeline import MAX_ARGUMENT_DEPTH, parse_arguments
from stockade.supervisor.errors import InvalidRequest
from stockade.supervisor.keys import MAX_KEY_BYTES, sandbox_id, validate_key
from stockade.supervisor.tools.catalog import TOOLS, render_command
from stockade.supervisor.tools.schemas import ArgumentError, validate_arguments

# --- the agent's path resolution ---------------------------------------------------------


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace with links inside, out of it and in loops, a FIFO, and a sibling folder
    whose name starts like the workspace's ("ws-evil")."""
    base = tmp_path_factory.mktemp("props")
    root = base / "ws"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (base / "ws-evil").mkdir()
    (base / "ws-evil" / "x").write_text("x")
    for name, target in {
        "in": "sub",
        "out": "..",
        "abs": "/etc",
        "evil": "../ws-evil",
        "loop": "loop",
        "sub/up": "../..",
        "sub/deeper/back": "../../a.txt",
    }.items():
        os.symlink(target, root / name)
    os.mkfifo(root / "fifo")
    return root


COMPONENTS = st.sampled_from(
    ["a.txt", "sub", "deeper", "new", "..", ".", "", "in", "out", "abs", "evil", "loop",
     "up", "back", "fifo", "ws", "ws-evil", "x", "-rf", "a\nb", "\udcff", "é", "\x00", "*"]
)  # fmt: skip
PATHS = st.one_of(
    st.lists(COMPONENTS, max_size=8).map("/".join),
    st.text(max_size=40),
    st.text(alphabet="a/.", max_size=5000),
)


def absolute(root: Path, path: str) -> str:
    return f"{root}/{path}"


def attempt(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Exception | None]:
    """(result, None), or (None, the error) when `call` raises one of the expected errors."""
    try:
        return call(*args, **kwargs), None
    except (ToolError, ValueError) as exc:
        return None, exc


@given(path=PATHS, absolute_form=st.booleans(), must_exist=st.booleans())
@example(path="../ws-evil/x", absolute_form=False, must_exist=False)
@example(path="evil/x", absolute_form=False, must_exist=True)
@example(path="a" * (MAX_PATH_BYTES + 1), absolute_form=False, must_exist=False)
def test_any_path_resolves_inside_the_workspace_or_is_refused(
    ws: Path, path: str, absolute_form: bool, must_exist: bool
) -> None:
    user_path = absolute(ws, path) if absolute_form else path
    real, exc = attempt(resolve, ws, user_path, must_exist=must_exist)
    if exc is not None:
        assert isinstance(exc, ToolError)
        assert exc.code in ("INVALID_PATH", "FILE_NOT_FOUND", "INVALID_ARGS"), exc
        assert exc.message
        return
    root = Path(os.path.realpath(ws))
    assert is_inside(root, real), f"{user_path!r} -> {real}"
    assert os.path.realpath(real) == str(real), "the result never goes through a link"
    if must_exist:
        assert real.is_file() or real.is_dir()


@given(path=PATHS)
def test_refusals_name_the_path_and_are_stable(ws: Path, path: str) -> None:
    first, second = (attempt(resolve, ws, path, must_exist=False) for _ in range(2))
    assert first[0] == second[0]
    assert str(first[1]) == str(second[1])


# --- argument validation -----------------------------------------------------------------


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


def arguments_for(spec_name: str) -> st.SearchStrategy[dict[str, Any]]:
    names = [*TOOLS[spec_name].parameters.get("properties", {}), "bogus", "path"]
    return st.dictionaries(st.sampled_from(names) | st.text(max_size=8), JSON, max_size=6)


TOOL_AND_ARGS = st.sampled_from(sorted(TOOLS)).flatmap(
    lambda name: st.tuples(st.just(name), arguments_for(name))
)


@given(tool_and_args=TOOL_AND_ARGS)
@example(tool_and_args=("apply_patch", {"input": None, ".": None}))
def test_arbitrary_arguments_pass_or_fail_naming_a_field(
    tool_and_args: tuple[str, dict[str, Any]],
) -> None:
    name, args = tool_and_args
    schema = TOOLS[name].parameters
    _, exc = attempt(validate_arguments, schema, args)
    if exc is None:
        return
    assert isinstance(exc, ArgumentError)
    message = str(exc)
    assert message
    assert len(message) < 1000
    if exc.field:
        named = {exc.field, exc.field.split(".")[0]}  # dotted: "env.HOME"; a key may hold dots
        assert named & {*args, *schema.get("required", [])}, (exc.field, args)
        assert repr(exc.field[:100])[1:-1] in message, "the field is named (quoted, cut)"


@given(value=JSON)
def test_any_json_value_as_arguments_is_an_object_or_a_clear_error(value: Any) -> None:
    args, exc = attempt(parse_arguments, json.dumps(value))
    if exc is not None:
        assert "arguments_json" in str(exc)
        return
    assert isinstance(args, dict)
    assert args == value or (args == {} and value == {})


@given(text=st.text(max_size=200))
@example(text="[" * 100_000)
@example(text='{"a":' * 100_000)
@example(text="{" + '"a":[' * (MAX_ARGUMENT_DEPTH + 1) + "]" * (MAX_ARGUMENT_DEPTH + 1) + "}")
def test_any_text_as_arguments_is_an_object_or_a_clear_error(text: str) -> None:
    args, exc = attempt(parse_arguments, text)
    if exc is not None:
        assert "arguments_json" in str(exc)
        return
    assert isinstance(args, dict)


@given(value=JSON)
def test_rendered_custom_commands_quote_every_value(value: Any) -> None:
    assume(not isinstance(value, str) or "\x00" not in value)
    command = render_command("echo {{.v}} end", {"v": value})
    words = shlex.split(command)
    assert words[0] == "echo"
    assert words[-1] == "end"
    assert len(words) == 3


# --- sandbox keys ------------------------------------------------------------------------


def key_is_valid(key: str) -> bool:
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return 1 <= size <= MAX_KEY_BYTES and "\x00" not in key


SAFE_NAME = re.compile(r"^[0-9a-f]{16}$")


@given(key=st.text(max_size=300))
@example(key="\udcff")
@example(key="x" * MAX_KEY_BYTES)
@example(key="é" * 129)
def test_keys_are_accepted_exactly_when_valid(key: str) -> None:
    if key_is_valid(key):
        assert validate_key(key) == key
        assert SAFE_NAME.match(sandbox_id(key))
    else:
        with pytest.raises(InvalidRequest) as info:
            validate_key(key)
        assert "sandbox key" in str(info.value)


@given(raw=st.binary(max_size=300))
def test_keys_from_bytes_are_refused_unless_utf8(raw: bytes) -> None:
    """Bytes decoded as os.fsdecode does (lone surrogates for bytes that are not UTF-8):
    refused exactly when they are not UTF-8 or not a usable key."""
    key = raw.decode("utf-8", "surrogateescape")
    try:
        raw.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError:
        utf8 = False
    assert key_is_valid(key) == (utf8 and 1 <= len(raw) <= MAX_KEY_BYTES and b"\0" not in raw)
    if not key_is_valid(key):
        with pytest.raises(InvalidRequest):
            validate_key(key)


@given(keys=st.lists(st.text(min_size=1, max_size=40), min_size=2, max_size=50, unique=True))
def test_sandbox_ids_are_stable_distinct_and_safe_names(keys: list[str]) -> None:
    ids = [sandbox_id(key) for key in keys]
    assert ids == [sandbox_id(key) for key in keys]
    assert len(set(ids)) == len(keys)
    for sid in ids:
        assert SAFE_NAME.match(sid), "a file name and a container name part as is"
        assert f"stockade-0123abcd-{sid}".isascii()
