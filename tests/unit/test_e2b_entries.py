"""envd's file entries from find's fields, as E2B's SDKs parse them: the sandbox user is
`user`, a folder's mode is its permission bits alone, a symlink has the type of what it leads
to and its resolved absolute path (/workspace shown as /home/user)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from e2b.envd.filesystem import filesystem_pb
from e2b.sandbox.filesystem.filesystem import EntryInfo, FileType, map_entry_info

from stockade.supervisor.fronts.e2b.envd_files import _PRINT, _entries, shown_path


def fields(*parts: str) -> str:
    return "".join(p + "\0" for p in parts)


def test_a_folder_has_permission_bits_only_and_the_sandbox_user_is_user() -> None:
    out = fields("d", "d", "4096", "755", "drwxr-xr-x", "sandbox", "sandbox", "1.5", "sub", "")
    (entry,) = _entries(out, "/home/user/t")
    assert entry["mode"] == 0o755
    assert (entry["owner"], entry["group"]) == ("user", "user")
    assert entry["type"] == "FILE_TYPE_DIRECTORY"
    assert entry["path"] == "/home/user/t/sub"
    assert "symlinkTarget" not in entry


def test_other_owners_keep_their_names() -> None:
    out = fields("f", "f", "3", "644", "-rw-r--r--", "root", "nogroup", "1", "", "")
    (entry,) = _entries(out, "/home/user/f")
    assert (entry["owner"], entry["group"], entry["mode"]) == ("root", "nogroup", 0o644)


def test_a_symlink_has_its_targets_type_and_resolved_path() -> None:
    out = fields(
        "l", "f", "5", "777", "lrwxrwxrwx", "sandbox", "sandbox", "1", "l", "/workspace/d/t"
    )
    out += fields("l", "d", "1", "777", "lrwxrwxrwx", "sandbox", "sandbox", "1", "m", "/etc")
    out += fields("l", "N", "1", "777", "lrwxrwxrwx", "sandbox", "sandbox", "1", "n", "/x/nope")
    out += fields("l", "L", "1", "777", "lrwxrwxrwx", "sandbox", "sandbox", "1", "o", "")
    link, folder, dangling, loop = _entries(out, "/home/user")
    assert (link["type"], link["symlinkTarget"]) == ("FILE_TYPE_FILE", "/home/user/d/t")
    assert (folder["type"], folder["symlinkTarget"]) == ("FILE_TYPE_DIRECTORY", "/etc")
    assert (dangling["type"], dangling["symlinkTarget"]) == ("FILE_TYPE_SYMLINK", "/x/nope")
    assert loop["type"] == "FILE_TYPE_SYMLINK"
    assert "symlinkTarget" not in loop


def parsed(entry: dict[str, Any]) -> EntryInfo:
    """The entry as the e2b SDK reads it: its JSON codec, then its own mapping."""
    return map_entry_info(filesystem_pb.EntryInfo.from_json(json.dumps(entry)))


def test_the_sdk_parses_the_entries_as_envd_s() -> None:
    out = fields("l", "f", "5", "777", "lrwxrwxrwx", "sandbox", "sandbox", "1", "l", "/workspace/t")
    out += fields("d", "d", "4096", "755", "drwxr-xr-x", "sandbox", "sandbox", "1", "sub", "")
    out += fields("f", "f", "3", "644", "-rw-r--r--", "sandbox", "sandbox", "1", "f", "")
    by_name = {e["name"]: parsed(e) for e in _entries(out, "/home/user")}
    link, sub, file = by_name["l"], by_name["sub"], by_name["f"]
    assert (link.type, link.symlink_target, link.path) == (
        FileType.FILE,
        "/home/user/t",
        "/home/user/l",
    )
    assert (sub.type, sub.mode, sub.permissions) == (FileType.DIR, 0o755, "drwxr-xr-x")
    assert (sub.owner, sub.group, sub.symlink_target) == ("user", "user", None)
    assert (file.type, file.mode, file.size) == (FileType.FILE, 0o644, 3)
    assert sub.modified_time.tzinfo is not None


def test_find_prints_each_kind_of_entry_in_ten_fields(tmp_path: Path) -> None:
    """The real find and realpath over a file, a folder, links to each, to nothing and a loop,
    and names with a tab and a newline: one entry each, none split or shifted."""
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("hi")
    (tmp_path / "a\tb\nc").write_text("")
    for link, target in [("lf", "f"), ("ld", "d"), ("ln", "nowhere"), ("l1", "l2"), ("l2", "l1")]:
        (tmp_path / link).symlink_to(target)
    script = f"cd {tmp_path} && find . -mindepth 1 -maxdepth 1 {_PRINT}"
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False).stdout
    entries = {e["name"]: e for e in _entries(out, "/home/user")}
    assert set(entries) == {"d", "f", "a\tb\nc", "lf", "ld", "ln", "l1", "l2"}
    assert entries["lf"]["type"] == "FILE_TYPE_FILE"
    assert entries["lf"]["symlinkTarget"] == f"{tmp_path}/f"
    assert entries["ld"]["type"] == "FILE_TYPE_DIRECTORY"
    assert entries["ln"]["type"] == "FILE_TYPE_SYMLINK"
    assert entries["d"]["mode"] == stat_mode(tmp_path / "d")
    assert "symlinkTarget" not in entries["f"]


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def test_workspace_paths_show_as_the_home() -> None:
    assert shown_path("/workspace") == "/home/user"
    assert shown_path("/workspace/a") == "/home/user/a"
    assert shown_path("/workspaces/a") == "/workspaces/a"
    assert shown_path("/etc/hostname") == "/etc/hostname"
