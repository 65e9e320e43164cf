"""envd 0.6.x through the E2B front with the unmodified e2b SDK (sync and async), on both
engines: file metadata (`metadata=` on writes, kept as `user.e2b.*` extended attributes in the
sandbox, shown by get_info, list, rename and watch entries; one a sandbox process set itself
too; cleared by a write without it; kept by a fork and a snapshot) and the watch options
`include_entry` and `allow_network_mounts`. Each limit attacked over plain HTTP: a key too
long, a map too big, many keys, bytes that are not printable ASCII, another sandbox's token."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from e2b import AsyncSandbox, FileType, Sandbox
from e2b.exceptions import InvalidArgumentException
from e2b.sandbox.filesystem.filesystem import WriteEntry
from e2b.sandbox.filesystem.watch_handle import FilesystemEvent, FilesystemEventType

from tests.integration.e2b_kit import E2bServed

pytestmark = pytest.mark.timeout(300)


def getfattr(sbx: Sandbox, path: str) -> dict[str, str]:
    """The file's user.e2b.* attributes as the sandbox itself reads them."""
    script = (
        "import json,os,sys; p=sys.argv[1]; "
        "print(json.dumps({n: os.getxattr(p, n).decode() for n in os.listxattr(p)}))"
    )
    out = sbx.commands.run(f"python3 -c '{script}' {path}").stdout
    return {k: v for k, v in json.loads(out).items() if k.startswith("user.e2b.")}


def test_metadata_is_kept_as_xattrs_and_shown_sync(served: E2bServed) -> None:
    sbx = Sandbox.create(timeout=180, **served.opts())
    try:
        meta = {"author": "mish", "purpose": "upload, with 'quotes' & $(no shell)"}
        info = sbx.files.write("m/a.txt", "content", metadata=meta)
        assert info.metadata == meta
        assert getfattr(sbx, "/home/user/m/a.txt") == {f"user.e2b.{k}": v for k, v in meta.items()}
        assert sbx.files.get_info("m/a.txt").metadata == meta
        octet = sbx.files.write("m/o.txt", "x", metadata={"k": "v"}, use_octet_stream=True)
        assert octet.metadata == {"k": "v"}
        listed = {e.name: e.metadata for e in sbx.files.list("m")}
        assert listed == {"a.txt": meta, "o.txt": {"k": "v"}}
        deep = {e.path: e.metadata for e in sbx.files.list("/home/user", depth=2)}
        assert deep["/home/user/m/a.txt"] == meta
        assert sbx.files.rename("m/a.txt", "m/b.txt").metadata == meta
        assert sbx.files.write("m/b.txt", "second").metadata is None  # a write replaces them
        assert sbx.files.get_info("m/b.txt").metadata is None
        both = sbx.files.write_files(
            [WriteEntry(path="m/1.txt", data="1"), WriteEntry(path="/tmp/2.txt", data="2")],
            metadata={"source": "suite"},
        )
        assert [i.metadata for i in both] == [{"source": "suite"}] * 2
        assert sbx.files.get_info("/tmp/2.txt").metadata == {"source": "suite"}
        # set by a process in the sandbox, out of band: shown as envd shows it
        sbx.commands.run(
            "python3 -c \"import os; os.setxattr('/home/user/m/1.txt', 'user.e2b.by', b'proc'); "
            "os.setxattr('/home/user/m/1.txt', 'user.other', b'not shown')\""
        )
        assert sbx.files.get_info("m/1.txt").metadata == {"source": "suite", "by": "proc"}
        with pytest.raises(InvalidArgumentException):
            sbx.files.write("m/bad.txt", "x", metadata={"bad key": "v"})
        assert not sbx.files.exists("m/bad.txt")
        with served.sup.client(token=served.token) as client:
            mine = [r for r in client.list_audit(limit=500) if sbx.sandbox_id in r.sandbox_key]
        setting = [r for r in mine if r.tool == "exec" and "setxattr" in r.arguments_json]
        assert setting  # the metadata is set by a call through the pipeline, audited
        assert all(r.front == "e2b" for r in setting)
    finally:
        sbx.kill()


async def test_metadata_async(served: E2bServed) -> None:
    sbx = await AsyncSandbox.create(timeout=180, **served.opts())
    try:
        info = await sbx.files.write("a.txt", "x", metadata={"stage": "one"})
        assert info.metadata == {"stage": "one"}
        assert (await sbx.files.get_info("a.txt")).metadata == {"stage": "one"}
        moved = await sbx.files.rename("a.txt", "b.txt")
        assert moved.metadata == {"stage": "one"}
        assert (await sbx.files.write("b.txt", "y")).metadata is None
        assert (await sbx.files.get_info("b.txt")).metadata is None
    finally:
        await sbx.kill()


def upload(
    served: E2bServed, sbx: Sandbox, path: str, headers: dict[str, str | bytes]
) -> httpx.Response:
    envd = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": str(sbx._envd_access_token)}
    every = {"Content-Type": "application/octet-stream", **envd, **headers}
    raw = [(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in every.items()]
    return httpx.post(
        f"{served.url}/files", params={"path": path}, content=b"data", headers=raw, timeout=60
    )


def test_limits_refuse_before_anything_is_written(served: E2bServed) -> None:
    sbx = Sandbox.create(timeout=180, **served.opts())
    other = Sandbox.create(timeout=180, **served.opts(served.other))
    try:
        attacks: dict[str, dict[str, str | bytes]] = {
            "long key": {"X-Metadata-" + "k" * 247: "v"},
            "big map": {"X-Metadata-k": "v" * 4096},
            "many keys": {f"X-Metadata-k{i:02}": "v" * 40 for i in range(80)},
            "latin-1 value": {"X-Metadata-k": "caf\xe9".encode("latin-1")},
            "utf-8 value": {"X-Metadata-k": "caf\xe9".encode()},
        }
        for name, headers in attacks.items():
            r = upload(served, sbx, f"{name}.txt", headers)
            assert r.status_code == 400, name
            assert "metadata" in r.json()["message"], name
            assert not sbx.files.exists(f"{name}.txt"), name
        # more headers than the listener takes: refused before the front sees them
        crowd = upload(served, sbx, "crowd.txt", {f"X-Metadata-k{i}": "v" for i in range(400)})
        assert crowd.status_code == 431
        assert not sbx.files.exists("crowd.txt")
        ok = upload(served, sbx, "edge.txt", {"X-Metadata-" + "k" * 246: "v"})
        assert ok.status_code == 200
        assert ok.json()[0]["metadata"] == {"k" * 246: "v"}
        # another tenant's sandbox: my sandbox's token does not open it
        envd = {"E2b-Sandbox-Id": other.sandbox_id, "X-Access-Token": str(sbx._envd_access_token)}
        r = httpx.post(
            f"{served.url}/files",
            params={"path": "planted.txt"},
            content=b"x",
            headers={"Content-Type": "application/octet-stream", "X-Metadata-k": "v", **envd},
            timeout=60,
        )
        assert r.status_code == 401
        assert not other.files.exists("planted.txt")
    finally:
        sbx.kill()
        other.kill()


def test_forks_and_snapshots_keep_metadata(served: E2bServed) -> None:
    sbx = Sandbox.create(timeout=180, **served.opts())
    try:
        sbx.files.write("kept.txt", "x", metadata={"author": "mish"})
        sbx.files.write("/tmp/t.txt", "x", metadata={"where": "tmp"})
        (fork,) = sbx.fork()
        assert isinstance(fork, Sandbox)
        try:
            assert fork.files.get_info("kept.txt").metadata == {"author": "mish"}
            assert fork.files.get_info("/tmp/t.txt").metadata == {"where": "tmp"}
        finally:
            fork.kill()
        snapshot = sbx.create_snapshot()
        try:
            made = Sandbox.create(snapshot.snapshot_id, **served.opts())
            try:
                assert made.files.get_info("kept.txt").metadata == {"author": "mish"}
            finally:
                made.kill()
        finally:
            Sandbox.delete_snapshot(snapshot.snapshot_id, **served.opts())
    finally:
        sbx.kill()


def test_watch_entries_sync(served: E2bServed) -> None:
    sbx = Sandbox.create(timeout=180, **served.opts())
    try:
        sbx.files.make_dir("w")
        sbx.files.write("w/f.txt", "one")
        handle = sbx.files.watch_dir("w", include_entry=True)
        sbx.files.write("w/f.txt", "two", metadata={"v": "2"})
        events: list[FilesystemEvent] = handle.get_new_events()
        write = next(e for e in events if e.type == FilesystemEventType.WRITE)
        assert write.entry is not None
        assert (write.entry.name, write.entry.path) == ("f.txt", "/home/user/w/f.txt")
        assert write.entry.type == FileType.FILE
        assert write.entry.metadata == {"v": "2"}
        sbx.commands.run("rm /home/user/w/f.txt")  # gone by the next poll: no entries then
        later: list[FilesystemEvent] = []
        for _ in range(100):
            if any(e.type == FilesystemEventType.REMOVE for e in events + later):
                break
            later += handle.get_new_events()
        removed = next(e for e in events + later if e.type == FilesystemEventType.REMOVE)
        assert removed.entry is None
        assert all(e.entry is None for e in later)
        handle.stop()
        plain = sbx.files.watch_dir("w", allow_network_mounts=True)
        sbx.files.write("w/g.txt", "x")
        assert any(e.name == "g.txt" and e.entry is None for e in plain.get_new_events())
        plain.stop()
    finally:
        sbx.kill()


async def test_watch_entries_async(served: E2bServed) -> None:
    sbx = await AsyncSandbox.create(timeout=180, **served.opts())
    try:
        await sbx.files.make_dir("w")
        await sbx.files.write("w/f.txt", "one")
        got: asyncio.Queue[FilesystemEvent] = asyncio.Queue()
        handle = await sbx.files.watch_dir("w", on_event=got.put_nowait, include_entry=True)
        await sbx.files.write("w/f.txt", "two", metadata={"v": "2"})
        while True:
            event = await got.get()
            if event.type == FilesystemEventType.WRITE and event.name == "f.txt":
                break
        assert event.entry is not None
        assert event.entry.path == "/home/user/w/f.txt"
        await handle.stop()
        written: asyncio.Queue[FilesystemEvent] = asyncio.Queue()
        mounts = await sbx.files.watch_dir(
            "w", on_event=written.put_nowait, allow_network_mounts=True
        )
        await sbx.files.write("w/f.txt", "three")
        while (await written.get()).type != FilesystemEventType.WRITE:
            pass
        await mounts.stop()
    finally:
        await sbx.kill()
