"""Key files are written and read as bytes: every character the key rules allow (keys.py:
any Unicode scalar value but NUL, at most MAX_KEY_BYTES of UTF-8) comes back byte for byte
through the key file, List and workspace expiry. Text mode read a CR as LF: the folder of
`a\\rb` named `a\\nb`, List showed a phantom ABSENT sandbox and expiry never deleted the
real one."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.supervisor.config import Config
from stockade.supervisor.keys import MAX_KEY_BYTES, sandbox_id, validate_key
from stockade.supervisor.models import SandboxState
from stockade.supervisor.sandboxes import layout
from stockade.supervisor.sandboxes.layout import Layout, paths_at, read_key, write_key
from stockade.supervisor.sandboxes.manager import SandboxManager
from tests.unit.fakes import FakeBackend, fake_manager, quiet_housekeeping

BREAKS = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
"""What some reader of text takes for a line's end (str.splitlines, universal newlines)."""


def allowed(last: int = 0x10FFFF) -> Iterator[str]:
    """Every character the key rules allow, up to `last`: all but NUL and the surrogates."""
    for point in range(1, last + 1):
        if not 0xD800 <= point <= 0xDFFF:
            yield chr(point)


def packed(chars: Iterator[str]) -> list[str]:
    """The characters in order, in as few keys of at most MAX_KEY_BYTES as they fit."""
    keys, key, size = [], [], 0
    for char in chars:
        n = len(char.encode())
        if size + n > MAX_KEY_BYTES:
            keys.append("".join(key))
            key, size = [], 0
        key.append(char)
        size += n
    return [*keys, "".join(key)]


def config(tmp_path: Path) -> Config:
    return Config(
        state_dir=tmp_path,
        sandbox=Config().sandbox.__class__(user="1000:1000"),
        housekeeping=quiet_housekeeping(workspace_retention_s=60),
    )


def workspace_only(root: Layout, key: str) -> Path:
    """The folder a destroyed sandbox leaves (its workspace kept): the key file and a stamp
    of when its container went, older than any retention."""
    paths = paths_at(root.root / sandbox_id(key))
    paths.root.mkdir(mode=0o700, parents=True)
    write_key(paths.key_file, key)
    layout.stamp(paths.retired)
    os.utime(paths.retired, (time.time() - 3600,) * 2)
    return paths.root


def test_every_allowed_character_round_trips_through_a_key_file(tmp_path: Path) -> None:
    """write_key and read_key, byte for byte, for every character: each key that packs
    them validates, and one file holding them all (a key file is the key's UTF-8 and
    nothing else: one file per key would only repeat the same codec 17,000 times)."""
    keys = packed(allowed())
    assert sum(len(k) for k in keys) == 0x10FFFF - 2048  # every scalar value but NUL
    assert all(validate_key(k) == k for k in keys)
    path = tmp_path / "key"
    for text in ("".join(keys), keys[0]):  # all of them; every ASCII one (CR, LF, ...)
        write_key(path, text)
        assert path.read_bytes() == text.encode()  # nothing added, nothing translated
        assert read_key(path) == text


async def test_every_bmp_character_is_listed_once_and_expires(tmp_path: Path) -> None:
    """Through the folders List and expiry read (Layout.folders): List shows each key once,
    as written (no phantom), and expiry deletes each: every
    character of the Basic Multilingual Plane and one of each other plane (their UTF-8 has
    no byte below 0x80, the same four-byte shape whatever the plane)."""
    planes = (chr(0x10000 * p + 0x1234) for p in range(1, 17))
    keys = packed(allowed(0xFFFF)) + packed(planes) + list(BREAKS) + ["a\rb", "a\r\nb"]
    mgr = fake_manager(config(tmp_path), FakeBackend())
    folders = [workspace_only(mgr.layout, key) for key in keys]
    listed = await mgr.list()
    assert [i.key for i in listed] == sorted(keys)
    assert {i.state for i in listed} == {SandboxState.ABSENT}
    assert await mgr.expire_workspaces() == len(keys)
    assert not any(folder.exists() for folder in folders)
    assert await mgr.list() == []


@pytest.mark.parametrize("key", ["a\rb", "a\r\nb", "\r", "a\u2028b", "a\x85b"])
async def test_a_destroyed_sandbox_of_a_line_break_key_is_itself(tmp_path: Path, key: str) -> None:
    """The reported case end to end: made, destroyed with its workspace kept, listed once
    under its own key, its workspace expired (not kept for ever by a phantom's name)."""
    mgr: SandboxManager = fake_manager(config(tmp_path), FakeBackend())
    await mgr.ensure(key)
    await mgr.destroy(key, delete_workspace=False)
    assert [(i.key, i.state) for i in await mgr.list()] == [(key, SandboxState.ABSENT)]
    retired = mgr.layout.of(key).retired
    os.utime(retired, (time.time() - 3600,) * 2)
    assert await mgr.expire_workspaces() == 1
    assert not mgr.layout.of(key).root.exists()
    assert await mgr.list() == []
