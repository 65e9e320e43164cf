"""The E2B front's envd files through the real `stockade serve` on both engines, driven by the
unmodified e2b SDK (sync and async): files.write/read (text, bytes, 50 MiB), list, exists,
remove, rename, make_dir (already there: False), and a wrong X-Access-Token refused."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxException,
    TimeoutException,
)

from tests.integration.e2b_kit import E2bServed

pytestmark = pytest.mark.timeout(300)


def test_files_sync(served: E2bServed) -> None:
    sbx = Sandbox.create(timeout=120, **served.opts())
    try:
        info = sbx.files.write("/home/user/dir/a.txt", "hello e2b\n")
        assert info.path == "/home/user/dir/a.txt"
        assert sbx.files.read("/home/user/dir/a.txt") == "hello e2b\n"
        assert sbx.files.read("dir/a.txt") == "hello e2b\n"
        blob = bytes(range(256)) * 4
        sbx.files.write("bin.dat", blob)
        assert bytes(sbx.files.read("bin.dat", format="bytes")) == blob
        big = os.urandom(50 << 20)
        sbx.files.write("/home/user/big.bin", big)
        assert bytes(sbx.files.read("/home/user/big.bin", format="bytes")) == big
        names = {e.name: e for e in sbx.files.list("/home/user")}
        assert {"dir", "bin.dat", "big.bin"} <= set(names)
        assert names["big.bin"].size == 50 << 20
        assert names["dir"].type is not None
        assert names["dir"].type.value == "dir"
        deep = {e.path for e in sbx.files.list("/home/user", depth=2)}
        assert "/home/user/dir/a.txt" in deep
        assert sbx.files.exists("/home/user/dir/a.txt")
        assert not sbx.files.exists("/home/user/nope")
        assert sbx.files.make_dir("/home/user/new/sub") is True
        assert sbx.files.make_dir("/home/user/new/sub") is False
        moved = sbx.files.rename("/home/user/dir/a.txt", "/home/user/new/b.txt")
        assert moved.path == "/home/user/new/b.txt"
        assert not sbx.files.exists("/home/user/dir/a.txt")
        assert sbx.files.read("/home/user/new/b.txt") == "hello e2b\n"
        sbx.files.remove("/home/user/new")
        assert not sbx.files.exists("/home/user/new/b.txt")
        wrong = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": "wrong"}
        r = httpx.get(f"{served.url}/files", params={"path": "bin.dat"}, headers=wrong)
        assert r.status_code == 401
        assert r.json()["code"] == 401
        with served.sup.client(token=served.token) as client:
            mine = [r for r in client.list_audit(limit=500) if sbx.sandbox_id in r.sandbox_key]
        tools = {r.tool for r in mine if r.front == "e2b"}
        assert {"upload_file", "download_file", "exec"} <= tools
    finally:
        sbx.kill()


async def test_files_async(served: E2bServed) -> None:
    sbx = await AsyncSandbox.create(timeout=120, **served.opts())
    try:
        await sbx.files.write("/home/user/x.txt", "async text")
        assert await sbx.files.read("/home/user/x.txt") == "async text"
        assert await sbx.files.exists("x.txt")
        assert await sbx.files.make_dir("d") is True
        assert await sbx.files.make_dir("d") is False
        await sbx.files.rename("x.txt", "d/y.txt")
        assert [e.name for e in await sbx.files.list("d")] == ["y.txt"]
        await sbx.files.remove("d")
        assert not await sbx.files.exists("d/y.txt")
    finally:
        await sbx.kill()


def test_names_with_tabs_newlines_and_links(served: E2bServed) -> None:
    """Names a line-based listing would split: each is one entry, with its own path."""
    sbx = Sandbox.create(timeout=120, **served.opts())
    try:
        sbx.commands.run(
            "mkdir odd && cd odd && touch \"$(printf 'a\\tb')\" \"$(printf 'c\\nd')\" "
            "'sp ace' && ln -s /etc/hostname link && mkdir sub && touch sub/inner"
        )
        entries = {e.name: e for e in sbx.files.list("/home/user/odd")}
        assert set(entries) == {"a\tb", "c\nd", "sp ace", "link", "sub"}
        assert entries["c\nd"].path == "/home/user/odd/c\nd"
        assert entries["link"].type is not None
        assert entries["link"].type.value == "file"  # what it leads to, as envd reports
        assert entries["link"].symlink_target == "/etc/hostname"
        assert sbx.files.get_info("/home/user/odd/a\tb").name == "a\tb"
        deep = [e.path for e in sbx.files.list("/home/user/odd", depth=2)]
        assert deep == sorted(deep)
        assert "/home/user/odd/sub/inner" in deep
    finally:
        sbx.kill()


def test_entries_as_envd_reports_them(served: E2bServed) -> None:
    """As E2B's own SDK tests check them: the sandbox user is `user`, a folder's mode is its
    permission bits, a symlink has its target's type and resolved absolute path."""
    sbx = Sandbox.create(timeout=120, **served.opts())
    try:
        sbx.files.make_dir("ent")
        sbx.files.write("ent/test.txt", "Hello")
        sbx.commands.run("ln -s test.txt link && ln -s /nowhere dangling", cwd="/home/user/ent")
        folder = sbx.files.get_info("ent")
        assert (folder.mode, folder.permissions) == (0o755, "drwxr-xr-x")
        assert (folder.owner, folder.group) == ("user", "user")
        assert folder.path == "/home/user/ent"
        file = sbx.files.get_info("ent/test.txt")
        assert (file.mode, file.permissions, file.size) == (0o644, "-rw-r--r--", 5)
        assert (file.owner, file.group, file.symlink_target) == ("user", "user", None)
        link = sbx.files.get_info("ent/link")
        assert link.type is FileType.FILE
        assert link.symlink_target == "/home/user/ent/test.txt"
        listed = {e.name: e for e in sbx.files.list("ent")}
        assert listed["link"].symlink_target == "/home/user/ent/test.txt"
        assert listed["dangling"].type is FileType.SYMLINK
        assert listed["dangling"].symlink_target == "/nowhere"
    finally:
        sbx.kill()


HOSTILE_READS = (
    "/tmp/e2b/me/environ",
    "/tmp/e2b/devs/zero",
    "../../etc/hostname",
)
"""Refused: a link into /proc or /dev (the agent would open it: its own state), climbing out
of the home. A kernel file named as itself is read as a command (below)."""


def test_paths_outside_the_home(served: E2bServed) -> None:
    """As on E2B the container is the boundary: /tmp and any path the sandbox's user may
    write are reached by every file call (commands see the same files), audited as any file
    call; what the user may not write, /proc, /sys and /dev but for a read (also not through
    a link), climbing out of the home with a relative path, and another sandbox's files are
    not. A read of a kernel file gives what a command of the sandbox's user reads there
    (its own /proc/self, never the agent's), bounded (/dev/zero)."""
    sbx = Sandbox.create(timeout=120, **served.opts())
    other = Sandbox.create(timeout=120, **served.opts())
    try:
        info = sbx.files.write("/tmp/e2b/x.txt", "outside")
        assert info.path == "/tmp/e2b/x.txt"
        assert sbx.files.read("/tmp/e2b/x.txt") == "outside"
        assert sbx.commands.run("cat /tmp/e2b/x.txt").stdout == "outside"
        entry = sbx.files.get_info("/tmp/e2b/x.txt")
        assert (entry.path, entry.owner, entry.size) == ("/tmp/e2b/x.txt", "user", 7)
        assert [e.path for e in sbx.files.list("/tmp/e2b")] == ["/tmp/e2b/x.txt"]
        assert sbx.files.make_dir("/tmp/e2b/d") is True
        moved = sbx.files.rename("/tmp/e2b/x.txt", "/tmp/e2b/d/y.txt")
        assert moved.path == "/tmp/e2b/d/y.txt"
        assert sbx.files.exists("/tmp/e2b/d/y.txt")
        sbx.files.write("/tmp/e2b/d/y.txt", "replaced")
        assert sbx.files.read("/tmp/e2b/d/y.txt") == "replaced"
        assert sbx.files.read("/etc/hostname").strip()  # readable by the user: read
        with pytest.raises(SandboxException, match="/etc/passwd") as refused:
            sbx.files.write("/etc/passwd", "root::0:0::/:/bin/sh\n")  # a read-only root
        assert not isinstance(refused.value, TimeoutException)
        assert "root::0:0" not in sbx.files.read("/etc/passwd")
        sbx.commands.run("ln -s /proc/self /tmp/e2b/me && ln -s /dev /tmp/e2b/devs")
        for hostile in HOSTILE_READS:
            with pytest.raises(InvalidArgumentException):
                sbx.files.read(hostile)
        with pytest.raises(InvalidArgumentException):
            sbx.files.write("/tmp/e2b/devs/shm/planted", "x")
        for kernel in ("/proc/sys/kernel/hostname", "/dev/shm/planted", "/sys/kernel/x"):
            with pytest.raises(InvalidArgumentException):
                sbx.files.write(kernel, "x")
        boot_id = sbx.files.read("/proc/sys/kernel/random/boot_id")
        assert boot_id == sbx.commands.run("cat /proc/sys/kernel/random/boot_id").stdout
        assert (
            sbx.files.read("/sys/kernel/address_bits")
            == sbx.commands.run("cat /sys/kernel/address_bits").stdout
        )
        own = {v.split("=", 1)[0] for v in sbx.files.read("/proc/self/environ").split("\0")}
        seen = sbx.commands.run("env -0 | tr '\\0' '\\n'").stdout.split("\n")
        # the reading command's own environment (the user's, never the agent's): nothing in
        # it that the user's own command does not see too
        assert "PATH" in own
        assert own - {""} <= {v.split("=", 1)[0] for v in seen}
        assert sbx.files.read("/dev/zero") == "\0" * 65536  # endless: its first 64 KiB
        with pytest.raises(NotFoundException):
            sbx.files.read("/proc/no-such-file")
        with pytest.raises(InvalidArgumentException):
            sbx.files.read("/proc/self")  # a folder
        assert not other.files.exists("/tmp/e2b/d/y.txt")  # its own container, its own /tmp
        sbx.files.remove("/tmp/e2b")
        assert not sbx.files.exists("/tmp/e2b")
        with served.sup.client(token=served.token) as client:
            mine = [r for r in client.list_audit(limit=500) if sbx.sandbox_id in r.sandbox_key]
        paths = {json.loads(r.arguments_json).get("path") for r in mine if r.tool == "upload_file"}
        assert "/tmp/e2b/x.txt" in paths
    finally:
        sbx.kill()
        other.kill()


def test_signed_urls(served: E2bServed) -> None:
    """download_url/upload_url as the SDK signs them (no header, no token): a download and a
    multipart upload work, and the upload is audited as any file write; an expired one is
    envd's 401, an altered one 401, another tenant's signature reaches only its own
    sandbox."""
    sbx = Sandbox.create(timeout=120, secure=True, **served.opts())
    theirs = Sandbox.create(timeout=120, **served.opts(served.other))
    try:
        sbx.files.write("signed.txt", "for a signed url\n")
        with httpx.Client() as http:
            got = http.get(sbx.download_url("signed.txt", "user", 120))
            assert (got.status_code, got.text) == (200, "for a signed url\n")
            assert http.get(sbx.download_url("/home/user/signed.txt")).text == got.text
            up = http.post(sbx.upload_url("/tmp/up.txt"), files={"file": ("up.txt", b"up\n")})
            assert up.status_code == 200, up.text
            assert up.json()[0]["path"] == "/tmp/up.txt"
            assert sbx.files.read("/tmp/up.txt") == "up\n"
            expired = http.get(sbx.download_url("signed.txt", use_signature_expiration=-60))
            assert expired.status_code == 401
            assert expired.json() == {"code": 401, "message": "signature is already expired"}
            altered = sbx.download_url("signed.txt").replace("signed.txt", "other.txt")
            assert http.get(altered).json() == {"code": 401, "message": "invalid signature"}
            read_for_write = sbx.download_url("/tmp/up.txt")
            refused = http.post(read_for_write, files={"file": ("up.txt", b"evil\n")})
            assert refused.status_code == 401
            assert sbx.files.read("/tmp/up.txt") == "up\n"
            theirs.files.write("signed.txt", "theirs\n")
            assert http.get(theirs.download_url("signed.txt")).text == "theirs\n"
    finally:
        sbx.kill()
        theirs.kill()
    with served.sup.client(token=served.token) as client:
        uploads = [
            r
            for r in client.list_audit(tool="upload_file", limit=500)
            if sbx.sandbox_id in r.sandbox_key and r.front == "e2b"
        ]
    assert len(uploads) == 2  # files.write, then the signed upload
