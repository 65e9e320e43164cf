"""Hostile file systems: links, special files, odd names and huge paths, made by code in the
sandbox, must never lead a tool, a transfer or the supervisor itself (root on the host)
outside what the sandbox can see. The host stays unchanged, nothing hangs, nothing crashes.

Non-UTF-8 names: `data_json` carries them as lone surrogates written as `\\udcXX` JSON escapes
(PEP 383, lossless: a Python client gets back the str `os.fsdecode` would give, and passing it
back as a path reaches the same file); human text (`for_llm`, messages) shows U+FFFD instead.
Transfer paths are protobuf strings, so a non-UTF-8 name travels inside a tar of its folder."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from stockade.client import Sandbox, Stockade, StockadeError, ToolResult
from tests.integration.harness import Supervisor, running_supervisor
from tests.unit.fakes import make_folder

pytestmark = pytest.mark.timeout(300)
REFUSED = ("INVALID_PATH", "FILE_NOT_FOUND")
NO_RATE_LIMIT = "[limits]\nrate_per_s = 100000.0\nburst = 100000\n"


@pytest.fixture(scope="module")
def supervisor(engine: str) -> Iterator[Supervisor]:
    """These tests make hundreds of calls per key: no rate limit."""
    with running_supervisor(engine, NO_RATE_LIMIT) as sup:
        yield sup


def sh(box: Sandbox, command: str) -> ToolResult:
    result = box.exec(command, timeout=120)
    assert result.exit_code == 0, f"{command!r}: {result.for_llm}"
    return result


def python(box: Sandbox, program: str) -> ToolResult:
    box.write_file(".attempt.py", textwrap.dedent(program))
    return sh(box, "python3 .attempt.py; rm .attempt.py")


def error(client: Stockade, key: str, tool: str, args: dict[str, object]) -> str:
    result = client.call(key, tool, args)
    assert result.is_error, f"{tool} {args}: {result.for_llm}"
    return result.error_code


def snapshot(directory: Path) -> dict[str, str]:
    """Every entry below `directory` with its type and content digest (links not followed)."""
    found = {}
    for path in sorted(directory.rglob("*")):
        if path.is_symlink():
            found[str(path)] = "link " + os.readlink(path)
        elif path.is_file():
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[str(path)] = "dir"
    return found


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host directory the sandbox cannot see (its /tmp is a tmpfs of its own)."""
    return make_folder(
        tmp_path / "host", {"canary.txt": "host secret\n", "sub/inner.txt": "inner\n"}
    )


@pytest.fixture
def deep_box(client: Stockade, key: str) -> Iterator[Sandbox]:
    """A sandbox whose workspace is deleted afterwards (deep trees outlast shutil.rmtree)."""
    box = client.sandbox(key)
    yield box
    box.destroy(delete_workspace=True)


def every_tool_refuses(client: Stockade, key: str, path: str) -> None:
    """read, write, edit, list, glob, search, apply_patch and transfers at `path` fail."""
    patch = f"*** Begin Patch\n*** Update File: {path}\n@@\n-x\n+y\n*** End Patch\n"
    add = f"*** Begin Patch\n*** Add File: {path}/new.txt\n+pwned\n*** End Patch\n"
    calls: list[tuple[str, dict[str, object]]] = [
        ("read_file", {"path": path}),
        ("write_file", {"path": path, "content": "pwned"}),
        ("write_file", {"path": f"{path}/new.txt", "content": "pwned"}),
        ("edit_file", {"path": path, "old_text": "root", "new_text": "pwned"}),
        ("list_files", {"path": path}),
        ("glob", {"pattern": "*", "path": path}),
        ("search", {"pattern": "root", "path": path}),
        ("apply_patch", {"input": patch}),
        ("apply_patch", {"input": add}),
    ]
    for tool, args in calls:
        code = error(client, key, tool, args)
        assert code in (*REFUSED, "INVALID_ARGS"), f"{tool} {args}: {code}"
    for tar in (False, True):
        with pytest.raises(StockadeError):
            client.download(key, path, io.BytesIO(), tar=tar)
    with pytest.raises(StockadeError):
        client.upload(key, path, b"pwned")
    with pytest.raises(StockadeError):
        client.upload(key, path, tar_of({"new.txt": b"pwned"}), tar=True)


def tar_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


LINKS = {
    "shadow": "/etc/shadow",
    "proc1root": "/proc/1/root",
    "selfroot": "/proc/self/root",
    "up": "../../..",
    "slash": "/",
    "etcdir": "/etc",
    "nested/up": "../../../..",
}


# --- symlinks and hardlinks ---------------------------------------------------------------


def test_links_out_of_the_workspace_are_refused_by_every_tool(
    client: Stockade, key: str, host: Path
) -> None:
    before = snapshot(host)
    box = client.sandbox(key)
    links = {**LINKS, "host": str(host / "canary.txt"), "hostdir": str(host)}
    sh(box, "mkdir nested; " + "; ".join(f"ln -s '{t}' '{n}'" for n, t in links.items()))
    for name in links:
        every_tool_refuses(client, key, name)
        every_tool_refuses(client, key, f"{name}/passwd")
    listed = {e["name"]: e for e in box.list_files()}
    assert listed["shadow"]["is_symlink"]
    assert not listed["slash"]["is_dir"]
    assert listed["shadow"]["size"] == len("/etc/shadow"), "a link is described, not followed"
    assert sorted(box.glob("**/*")) == ["nested"], "links leading out are not matched"
    assert box.search("root") == [], "search does not follow links"
    packed = io.BytesIO()
    client.download(key, ".", packed, tar=True)
    with tarfile.open(fileobj=io.BytesIO(packed.getvalue())) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers()}
    assert members["shadow"].issym()
    assert members["shadow"].linkname == "/etc/shadow"
    assert all(m.issym() or m.isdir() for m in members.values()), "no target was packed"
    assert snapshot(host) == before


def test_a_link_swapped_in_between_calls_is_refused(client: Stockade, key: str, host: Path) -> None:
    before = snapshot(host)
    box = client.sandbox(key)
    box.write_file("d/f.txt", "x\n")
    box.write_file("g.txt", "x\n")
    for target in ("/etc", str(host), "/proc/1/root/etc", "/tmp"):
        sh(box, "rm -r d g.txt")  # in two calls: the guard refuses a recursive rm of a
        # name the same command makes a symlink, whatever their order (loops could repeat it)
        sh(box, f"ln -s '{target}' d; ln -s '{target}/passwd' g.txt")
        every_tool_refuses(client, key, "g.txt")
        every_tool_refuses(client, key, "d/f.txt")
        every_tool_refuses(client, key, "d")
    assert sh(box, "ls -A /tmp").stdout == "", "nothing landed where the links led"
    assert snapshot(host) == before


def test_a_link_swapped_during_calls_never_leads_out(
    supervisor: Supervisor, client: Stockade, key: str, host: Path
) -> None:
    """A process flips `d` between a folder and a link out while calls use d/f.txt: each
    call acts inside the workspace or fails, never through the link."""
    before = snapshot(host)
    box = client.sandbox(key)
    box.write_file(
        "flip.py",
        "import os\n"
        "os.makedirs('/tmp/out', exist_ok=True)\n"
        "os.makedirs('d.dir', exist_ok=True)\n"
        "os.symlink('/tmp/out', 'd.link')\n"
        "while True:\n"
        "    for src, dst in (('d.dir', 'd'), ('d', 'd.dir'), ('d.link', 'd'), ('d', 'd.link')):\n"
        "        try:\n"
        "            os.rename(src, dst)\n"
        "        except OSError:\n"
        "            pass\n",
    )
    started = client.call(key, "process", {"action": "start", "command": "python3 flip.py"})
    assert not started.is_error, started.for_llm
    container = box.info().container_id
    try:
        lost = []
        for i in range(150):
            edit = {"path": "d/f.txt", "old_text": "\n", "new_text": "!"}
            results = [
                client.call(key, "write_file", {"path": "d/f.txt", "content": f"{i}\n"}),
                client.call(key, "edit_file", edit),
                client.call(key, "read_file", {"path": "d/f.txt"}),
            ]
            lost += [r.for_llm for r in results if r.error_code == "SANDBOX_LOST"]
            try:
                client.upload(key, "d/up.txt", b"u")
            except StockadeError as exc:
                if exc.code != "INVALID_ARGUMENT" and exc.code != "NOT_FOUND":
                    lost.append(f"upload: {exc.code} {exc}")
    finally:
        log = client.call(key, "process", {"action": "log", "id": started.data["id"]}).for_llm
        client.call(key, "process", {"action": "kill", "id": started.data["id"]})
    assert box.info().container_id == container, (lost[:3], supervisor.log()[-2000:])
    assert "Traceback" not in log, log
    assert sh(box, "ls -A /tmp/out").stdout == "", "no call wrote through the link"
    landed = sh(box, "ls -A d.dir d 2>/dev/null; true").stdout
    assert "f.txt" in landed, "calls that won the race wrote inside the workspace"
    assert snapshot(host) == before


SWAPPER = """
import ctypes, os, sys
# renameat2(RENAME_EXCHANGE): `d` always exists, a folder one moment and a link the next.
libc = ctypes.CDLL(None, use_errno=True)
while True:
    libc.renameat2(-100, b"d", -100, b"d.other", 2)
"""


@contextlib.contextmanager
def swapping(client: Stockade, key: str, box: Sandbox, target: str) -> Iterator[None]:
    """A process in the sandbox swaps the folder `d` and a link to `target`, in a loop."""
    box.write_file("swap.py", SWAPPER)
    sh(box, f"ln -s '{target}' d.other")
    started = client.call(key, "process", {"action": "start", "command": "python3 swap.py"})
    assert not started.is_error, started.for_llm
    try:
        yield
    finally:
        log = client.call(key, "process", {"action": "log", "id": started.data["id"]}).for_llm
        client.call(key, "process", {"action": "kill", "id": started.data["id"]})
        sh(box, "if [ -L d ]; then rm d; mv d.other d; else rm d.other; fi")
        assert "Traceback" not in log, log


@pytest.mark.parametrize("target", ["/etc", "/"])
def test_search_never_returns_content_from_behind_a_folder_swapped_for_a_link(
    supervisor: Supervisor, client: Stockade, key: str, target: str
) -> None:
    """ripgrep walks the workspace while `d` flips between a folder and a link to /etc or /:
    every hit is the file inside the workspace, never /etc/passwd."""
    box = client.sandbox(key)
    box.write_file("d/inside.txt", "root: inside\n")
    container = box.info().container_id
    hits, codes = 0, set()
    with swapping(client, key, box, target):
        for _ in range(40):
            for args in ({"pattern": "^root:"}, {"pattern": "^root:", "path": "d"}):
                result = client.call(key, "search", args)
                if result.is_error:
                    codes.add(result.error_code)
                    continue
                for match in result.data["matches"]:
                    assert match["text"] == "root: inside", match
                    assert match["file"] in ("d/inside.txt", "d.other/inside.txt"), match
                    hits += 1
    assert codes <= {*REFUSED, "TIMEOUT"}, codes
    assert hits > 0, "searches that won the race found the file inside"
    assert box.info().container_id == container, supervisor.log()[-2000:]


def test_apply_patch_never_writes_through_a_folder_swapped_for_a_link(
    supervisor: Supervisor, client: Stockade, key: str
) -> None:
    """Adds (in new folders too), updates, moves and deletes in `d` while it flips between a
    folder and a link to /tmp/out: nothing lands in, leaves or is read from /tmp/out."""
    box = client.sandbox(key)
    sh(box, "mkdir -p /tmp/out d && echo outside > /tmp/out/victim.txt && echo in > d/f.txt")
    container = box.info().container_id

    def patch(*sections: str) -> dict[str, object]:
        return {"input": "*** Begin Patch\n" + "".join(sections) + "*** End Patch\n"}

    applied, codes = 0, dict[str, str]()
    with swapping(client, key, box, "/tmp/out"):
        for i in range(40):
            for args in (
                patch(f"*** Add File: d/a{i}.txt\n+new\n"),
                patch(f"*** Add File: d/s{i}/deep/b.txt\n+new\n"),
                patch("*** Add File: d/victim.txt\n+inside\n"),
                patch(f"*** Update File: d/victim.txt\n*** Move to: top{i}.txt\n"),
                patch("*** Add File: d/victim.txt\n+inside\n"),
                patch("*** Delete File: d/victim.txt\n"),
                patch("*** Update File: d/f.txt\n@@\n-in\n+in\n"),
            ):
                result = client.call(key, "apply_patch", args)
                if result.is_error:
                    codes[result.error_code] = result.for_llm
                else:
                    applied += 1
    assert set(codes) <= {*REFUSED, "INVALID_ARGS"}, codes
    assert applied > 0, "patches that won the race were applied inside"
    assert sh(box, "ls -A /tmp/out").stdout == "victim.txt\n", "nothing landed or was moved"
    assert box.exec("cat /tmp/out/victim.txt").stdout == "outside\n"
    leaked = box.exec("grep -rl outside . --exclude=swap.py").stdout
    assert leaked == "", "no content from /tmp/out reached the workspace"
    assert box.info().container_id == container, supervisor.log()[-2000:]


def test_hardlinks_cannot_reach_outside_the_workspace(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    for source in ("/etc/passwd", "/run/stockade/agent.sock.frames", "/usr/bin/python3", "/tmp/x"):
        result = box.exec(f"touch /tmp/x; ln '{source}' linked")
        assert result.exit_code != 0
        assert "cross-device" in result.stderr or "not permitted" in result.stderr, result.stderr
    assert sh(box, "ls -A").stdout == ""


def test_delete_workspace_never_follows_planted_links(
    supervisor: Supervisor, client: Stockade, key: str, host: Path
) -> None:
    """The supervisor (root on the host) deletes the workspace: links to host paths, folders
    the sandbox made unreadable, FIFOs and links to its agent socket are removed, never
    followed."""
    before = snapshot(host)
    box = client.sandbox(key)
    sh(
        box,
        f"ln -s '{host}/canary.txt' file-link; ln -s '{host}' dir-link; ln -s / root; "
        f"mkdir -p locked/sub; ln -s '{host}' locked/sub/link; chmod 000 locked/sub locked; "
        "mkfifo fifo; ln -s /run/stockade/agent.sock.frames sock; ln -s ../.. up",
    )
    workspace = supervisor.workspace(key)
    assert (workspace / "dir-link").is_symlink()
    box.destroy(delete_workspace=True)
    assert not workspace.exists()
    assert not workspace.parent.exists()
    assert snapshot(host) == before
    assert Path("/etc/passwd").is_file()


def test_delete_workspace_removes_a_very_deep_tree(
    supervisor: Supervisor, client: Stockade, key: str
) -> None:
    box = client.sandbox(key)
    deep(box, 2000, "d")
    workspace = supervisor.workspace(key)
    box.destroy(delete_workspace=True)
    assert not workspace.parent.exists()
    assert box.exec("echo ok").stdout == "ok\n"


# --- special files ------------------------------------------------------------------------


SPECIAL_SETUP = (
    "mkfifo pipe; ln -s /dev/zero zero; ln -s /dev/urandom random; ln -s /dev/null null; "
    "python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")'; "
    "mkdir dir; mkfifo dir/pipe; echo needle > dir/file.txt; ln -s /dev/zero dir/zero"
)


@pytest.mark.parametrize("name", ["pipe", "sock", "zero", "random", "null", "dir/pipe"])
def test_special_files_where_a_file_is_expected(client: Stockade, key: str, name: str) -> None:
    box = client.sandbox(key)
    sh(box, SPECIAL_SETUP)
    for tool, args in [
        ("read_file", {"path": name}),
        ("edit_file", {"path": name, "old_text": "a", "new_text": "b"}),
        ("write_file", {"path": name, "content": "x"}),
        ("search", {"pattern": "x", "path": name}),
        ("list_files", {"path": name}),
    ]:
        assert error(client, key, tool, args) == "INVALID_PATH", (tool, name)
    with pytest.raises(StockadeError):
        client.download(key, name, io.BytesIO())
    with pytest.raises(StockadeError):
        client.upload(key, name, b"x")
    patch = f"*** Begin Patch\n*** Update File: {name}\n@@\n-a\n+b\n*** End Patch\n"
    assert error(client, key, "apply_patch", {"input": patch}) == "INVALID_PATH"
    assert sh(box, "test -p pipe && test -S sock && echo same").stdout == "same\n"


def test_folders_holding_special_files_are_searched_listed_and_packed(
    client: Stockade, key: str
) -> None:
    box = client.sandbox(key)
    sh(box, SPECIAL_SETUP)
    assert box.search("needle") == [{"file": "dir/file.txt", "line": 1, "text": "needle"}]
    assert box.search("needle", glob="*") == [{"file": "dir/file.txt", "line": 1, "text": "needle"}]
    names = {e["name"] for e in box.list_files()}
    assert {"pipe", "sock", "zero", "dir"} <= names
    assert "dir/file.txt" in box.glob("**/*")
    packed = io.BytesIO()
    info = client.download(key, ".", packed, tar=True)
    with tarfile.open(fileobj=io.BytesIO(packed.getvalue())) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers()}
    assert members["dir/pipe"].isfifo()
    assert members["pipe"].isfifo()
    assert members["zero"].issym()
    assert members["zero"].size == 0
    assert members["dir/file.txt"].size == len("needle\n")
    assert "sock" not in members
    assert info.size == len(packed.getvalue())


# --- odd names ----------------------------------------------------------------------------


ODD_NAMES = [
    b"new\nline",
    b"tab\tname",
    b"-rf",
    b"--help",
    b"-",
    b"cr\rname",
    b" lead space",
    b"back\\slash",
    b"quote\"'",
    b"\xc3\xbcn\xc3\xafcode",
    b"bad\xffname",
    b"half\xc3",
    b"\x80\x81",
]


def make_odd_names(box: Sandbox, folder: str = "odd") -> list[str]:
    python(
        box,
        f"""
        import os
        os.makedirs({folder!r}, exist_ok=True)
        for name in {ODD_NAMES!r}:
            with open(os.path.join({folder!r}.encode(), name), "wb") as f:
                f.write(b"needle " + name + b"\\n")
        """,
    )
    return [os.fsdecode(name) for name in ODD_NAMES]


def test_odd_names_are_listed_globbed_and_searched(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    names = make_odd_names(box)
    assert [e["name"] for e in box.list_files("odd")] == sorted(names)
    assert sorted(box.glob("*", "odd")) == sorted(f"odd/{n}" for n in names)
    found = box.search("needle", "odd")
    assert sorted(m["file"] for m in found) == sorted(f"odd/{n}" for n in names)
    listed = client.call(key, "list_files", {"path": "odd"})
    assert "bad\ufffdname" in listed.for_llm, "text shows U+FFFD for bytes that are not UTF-8"
    shown = [entry["name"] for entry in listed.data["entries"]]
    assert "bad\udcffname" in shown, "data keeps them as lone surrogates (escaped in JSON)"


def test_odd_names_read_write_and_edit(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    names = make_odd_names(box)
    for name in names:
        path = f"odd/{name}"
        content = box.read_file(path)
        assert content == "needle " + os.fsencode(name).decode(errors="replace") + "\n"
        box.write_file(path, "new\n")
        box.edit_file(path, "new", "edited")
        assert box.read_file(path) == "edited\n"
        box.write_file(f"copy/{name}", "made\n")
    assert sorted(box.glob("*", "copy")) == sorted(f"copy/{n}" for n in names)


def test_odd_names_travel_in_tar_and_in_transfers(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    names = make_odd_names(box)
    packed = io.BytesIO()
    info = client.download(key, "odd", packed, tar=True)
    assert info.files == len(names)
    with tarfile.open(fileobj=io.BytesIO(packed.getvalue()), encoding="utf-8") as tar:
        got = {m.name.removeprefix("./"): tar.extractfile(m) for m in tar.getmembers()}
        contents = {n: f.read() for n, f in got.items() if f is not None}
    assert sorted(contents) == sorted(names)
    for name, data in contents.items():
        assert data == b"needle " + os.fsencode(name) + b"\n"
    up = client.upload(key, "back", packed.getvalue(), tar=True)
    assert up.files == len(names) + 1
    assert sorted(box.glob("*", "back")) == sorted(f"back/{n}" for n in names)
    for name in names:
        if any("\udc80" <= c <= "\udcff" for c in name):
            continue  # not UTF-8: reached through the tar above
        blob = io.BytesIO()
        client.download(key, f"odd/{name}", blob)
        assert blob.getvalue() == b"needle " + name.encode() + b"\n"
        client.upload(key, f"up/{name}", b"up\n")
        assert box.read_file(f"up/{name}") == "up\n"
    with pytest.raises(StockadeError) as info_bad:
        client.download(key, "odd/bad\udcffname", io.BytesIO())
    assert "UTF-8" in str(info_bad.value)


# --- long paths and deep nesting ----------------------------------------------------------


def deep(box: Sandbox, levels: int, name: str) -> None:
    python(
        box,
        f"""
        import os
        for _ in range({levels}):
            os.mkdir({name!r})
            os.chdir({name!r})
        with open("needle.txt", "w") as f:
            f.write("needle\\n")
        """,
    )


@pytest.mark.parametrize("size", [4095, 4096, 4097, 10_000])
def test_paths_of_4096_bytes_and_more(client: Stockade, key: str, size: int) -> None:
    path = ("a/" * size)[:size].rstrip("/") + "b"
    for tool, args in [
        ("read_file", {"path": path}),
        ("write_file", {"path": path, "content": "x"}),
        ("edit_file", {"path": path, "old_text": "a", "new_text": "b"}),
        ("list_files", {"path": path}),
        ("glob", {"pattern": "*", "path": path}),
        ("search", {"pattern": "x", "path": path}),
        ("glob", {"pattern": path}),
        ("exec", {"command": "true", "workdir": path}),
    ]:
        assert error(client, key, tool, args) in REFUSED, (tool, size)
    for tar in (False, True):
        with pytest.raises(StockadeError):
            client.download(key, path, io.BytesIO(), tar=tar)
        with pytest.raises(StockadeError):
            client.upload(key, path, tar_of({"x": b"x"}) if tar else b"x", tar=tar)
    assert error(client, key, "write_file", {"path": "x" * 256, "content": "x"}) == "INVALID_PATH"
    assert client.sandbox(key).exec("ls -A").stdout == ""


def test_a_tree_deeper_than_path_max(client: Stockade, key: str, deep_box: Sandbox) -> None:
    """500 levels of 10-byte names: 5500 bytes, past PATH_MAX. Every tool answers (a result
    or a clear error), none crashes, and the sandbox keeps working."""
    box = deep_box
    deep(box, 500, "d" * 10)
    for tool, args in [
        ("list_files", {"path": "."}),
        ("glob", {"pattern": "**/*"}),
        ("glob", {"pattern": "**/needle.txt"}),
        ("search", {"pattern": "needle"}),
        ("apply_patch", {"input": "*** Begin Patch\n*** Add File: x.txt\n+x\n*** End Patch\n"}),
    ]:
        result = client.call(key, tool, args)
        assert not result.is_error or result.error_code in (*REFUSED, "INVALID_ARGS"), (
            tool,
            result.error_code,
            result.for_llm,
        )
    assert box.read_file("x.txt") == "x\n"
    packed = io.BytesIO()
    client.download(key, ".", packed, tar=True)
    with tarfile.open(fileobj=io.BytesIO(packed.getvalue())) as tar:
        longest = max(len(m.name) for m in tar.getmembers())
    assert longest > 5000, "GNU tar packs names longer than PATH_MAX"
    assert box.exec("echo ok").stdout == "ok\n"


def test_a_tree_of_2000_levels(client: Stockade, key: str, deep_box: Sandbox) -> None:
    box = deep_box
    deep(box, 2000, "d")
    for tool, args in [
        ("list_files", {"path": "."}),
        ("glob", {"pattern": "**/*"}),
        ("glob", {"pattern": "**/needle.txt"}),
        ("search", {"pattern": "needle"}),
    ]:
        result = client.call(key, tool, args)
        assert not result.is_error or result.error_code in (*REFUSED, "INVALID_ARGS"), (
            tool,
            result.error_code,
            result.for_llm,
        )
    packed = io.BytesIO()
    client.download(key, ".", packed, tar=True)
    with tarfile.open(fileobj=io.BytesIO(packed.getvalue())) as tar:
        assert any(m.name.endswith("/needle.txt") for m in tar.getmembers())


# --- stockade cp --------------------------------------------------------------------------


def cli(sup: Supervisor, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STOCKADE_ADDR": sup.target}
    cmd = [sys.executable, "-m", "stockade.supervisor.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_cp_of_a_hostile_tree_writes_only_below_its_destination(
    supervisor: Supervisor, client: Stockade, key: str, host: Path, tmp_path: Path
) -> None:
    before = snapshot(host)
    box = client.sandbox(key)
    sh(
        box,
        f"mkdir -p t/sub; echo ok > t/sub/ok.txt; ln -s '{host}/canary.txt' t/host; "
        f"ln -s '{host}' t/hostdir; ln -s ../../.. t/up; ln -s /etc/shadow t/shadow; "
        "ln -s sub/ok.txt t/inside; mkfifo t/fifo",
    )
    dest = tmp_path / "dest"
    result = cli(supervisor, "cp", "-r", f"{key}:t", str(dest))
    assert result.returncode == 0, result.stderr
    assert (dest / "sub" / "ok.txt").read_text() == "ok\n"
    assert os.readlink(dest / "inside") == "sub/ok.txt"
    for skipped in ("host", "hostdir", "up", "shadow", "fifo"):
        assert not os.path.lexists(dest / skipped)
        assert f"skipped {skipped}" in result.stderr
    assert snapshot(host) == before
