"""envd 0.6.2's file metadata on the E2B front (file_metadata.py): an upload's X-Metadata-*
headers checked against envd's limits before its body is read (oversized keys and maps, many
keys, encodings that are not printable ASCII, an empty key), the commands that keep them as
`user.e2b.*` extended attributes and read them back run for real on this machine's file
system (odd values and names, stale keys, a symlink, attributes a process set itself past the
budget), and the entries of Stat, ListDir and watch lookups carrying them, as the SDK parses
them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from e2b.envd.filesystem import filesystem_pb
from e2b.sandbox.filesystem.filesystem import map_entry_info
from starlette.requests import Request

from stockade.supervisor.config import Config
from stockade.supervisor.fronts.e2b import file_metadata
from stockade.supervisor.fronts.e2b.connect import ConnectError
from stockade.supervisor.fronts.e2b.envd import build_envd_app
from stockade.supervisor.fronts.e2b.envd_files import Files
from stockade.supervisor.fronts.e2b.file_metadata import MAX_BYTES, MAX_KEY_BYTES, PREFIX
from stockade.supervisor.fronts.e2b.records import ENVD_VERSION, Records
from tests.unit.fakes import e2b_context

pytestmark = pytest.mark.timeout(60)


def headers(**pairs: str) -> list[tuple[bytes, bytes]]:
    return [(b"x-metadata-" + k.encode(), v.encode()) for k, v in pairs.items()]


def refused(raw: list[tuple[bytes, bytes]]) -> str:
    with pytest.raises(ConnectError) as info:
        file_metadata.from_headers(raw)
    assert info.value.code == "invalid_argument"
    return info.value.message


def test_headers_become_metadata_lowercased_first_one_winning() -> None:
    raw = [
        (b"content-type", b"application/octet-stream"),
        (b"X-Metadata-Author", b"mish"),
        (b"x-metadata-author", b"someone else"),
        (b"x-metadata-purpose", b"a value with spaces, 'quotes' and $(no expansion)"),
        (b"x-metadata-e", b""),
    ]
    assert file_metadata.from_headers(raw) == {
        "author": "mish",
        "purpose": "a value with spaces, 'quotes' and $(no expansion)",
        "e": "",
    }
    assert file_metadata.from_headers([(b"x-other", b"\xff")]) == {}


def test_limits_are_envds_and_refused_with_a_reason() -> None:
    assert "empty" in refused([(b"x-metadata-", b"v")])
    longest = "k" * MAX_KEY_BYTES
    assert file_metadata.from_headers(headers(**{longest: "v"})) == {longest: "v"}
    assert str(MAX_KEY_BYTES) in refused(headers(**{longest + "k": "v"}))
    # the whole map: each key with its prefix, and its value, at most MAX_BYTES
    fill = MAX_BYTES - len(PREFIX) - 1
    assert file_metadata.from_headers(headers(k="v" * fill)) == {"k": "v" * fill}
    assert str(MAX_BYTES) in refused(headers(k="v" * (fill + 1)))
    many = {f"k{i}": "" for i in range(MAX_BYTES // (len(PREFIX) + 2))}
    assert str(MAX_BYTES) in refused(headers(**many))


@pytest.mark.parametrize(
    "raw",
    [
        [(b"x-metadata-k", "caf\u00e9".encode())],  # UTF-8
        [(b"x-metadata-k", "caf\u00e9".encode("latin-1"))],  # Latin-1, as HTTP carries it
        [(b"x-metadata-k", b"a\tb")],
        [(b"x-metadata-k", b"a\x7fb")],
        [(b"x-metadata-k", b"a\x00b")],
        [("x-metadata-caf\u00e9".encode(), b"v")],
        [(b"x-metadata-a b", b"v")],
    ],
)
def test_encodings_outside_printable_ascii_are_refused(raw: list[tuple[bytes, bytes]]) -> None:
    assert "printable US-ASCII" in refused(raw)


def run(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", script], cwd=cwd, capture_output=True, text=True, check=False
    )


@pytest.fixture
def xattrs(tmp_path: Path) -> Path:
    probe = tmp_path / "probe"
    probe.write_text("")
    try:
        os.setxattr(probe, PREFIX + "probe", b"1")
    except OSError as exc:
        pytest.skip(f"no user extended attributes here: {exc}")
    probe.unlink()
    return tmp_path


def test_set_replaces_and_read_returns_with_odd_values_and_names(xattrs: Path) -> None:
    odd = "a b\tc\nd"
    for name in ("f", odd):
        (xattrs / name).write_text("x")
    os.setxattr(xattrs / "f", PREFIX + "stale", b"old")
    os.setxattr(xattrs / "f", "user.other", b"not ours")
    meta = {"author": "mish", "q": 'it\'s "quoted" `and` $HOME; rm -rf /'}
    done = run(file_metadata.set_command(meta, ["./f", f"./{odd}"]), xattrs)
    assert done.returncode == 0, done.stderr
    assert os.getxattr(xattrs / "f", PREFIX + "q") == meta["q"].encode()
    assert PREFIX + "stale" not in os.listxattr(xattrs / "f")  # each write replaces them
    assert os.getxattr(xattrs / "f", "user.other") == b"not ours"  # not E2B's: left alone
    (xattrs / "link").symlink_to("f")
    (xattrs / "plain").write_text("")
    out = run(file_metadata.read_command(". -mindepth 1 -maxdepth 1") + "; echo rest", xattrs)
    found, rest = file_metadata.split_output(out.stdout)
    assert found == {"./f": meta, f"./{odd}": meta, "./link": meta}
    assert rest == "rest\n"


def test_read_cuts_what_a_process_set_past_the_budget(xattrs: Path) -> None:
    f = xattrs / "big"
    f.write_text("")
    for i in range(4):  # ext4 holds about 4 KB of attributes a file: the budget scaled down
        os.setxattr(f, f"{PREFIX}k{i}", b"v" * 700)
    os.setxattr(f, PREFIX + "a-bytes", b"\xff\xfe")
    out = run(file_metadata.read_command("./big -maxdepth 0", budget=2000), xattrs)
    found, _ = file_metadata.split_output(out.stdout)
    meta = found["./big"]
    assert meta["a-bytes"] == "\ufffd\ufffd"  # not UTF-8: replaced, as the SDK decodes
    assert sum(len(PREFIX) + len(k) + len(v) for k, v in meta.items()) <= 2000
    assert set(meta) == {"a-bytes", "k0", "k1"}  # in name order, until the budget is spent
    assert "BUDGET" not in file_metadata.read_command(".")


def test_output_without_a_metadata_line_is_taken_as_it_is() -> None:
    mark = file_metadata.MARK
    assert file_metadata.split_output("f\0f\0") == ({}, "f\0f\0")
    assert file_metadata.split_output(mark + "\nf\0") == ({}, "f\0")
    # a record cut short, or bytes that are not ASCII (not from the script): left out
    cut = mark + "./a\tk\v./b\tk\tv\v./c\tk\t\u00e9\n"
    assert file_metadata.split_output(cut + "f\0") == ({"./b": {"k": "v"}}, "f\0")


class LocalFiles(Files):
    """Files whose commands run in a local folder (standing in for /workspace) through sh,
    not the pipeline: the real scripts, parsed as the front parses them."""

    def __init__(self, root: Path) -> None:
        super().__init__(e2b_context(Config(state_dir=root), Records(None)))
        self.root = root
        self.scripts: list[str] = []

    async def _sh(self, request: Any, script: str) -> tuple[int, str, str]:
        self.scripts.append(script)
        done = run(script, self.root)
        return done.returncode, done.stdout, done.stderr


REQ = Request({"type": "http", "headers": [], "state": {}})
"""The request LocalFiles' commands come with (they do not read it)."""


def sdk(entry: dict[str, Any]) -> Any:
    return map_entry_info(filesystem_pb.EntryInfo.from_json(json.dumps(entry)))


async def test_stat_list_and_lookups_carry_metadata_as_the_sdk_reads_it(xattrs: Path) -> None:
    files = LocalFiles(xattrs)
    (xattrs / "d").mkdir()
    for name in ("with", "without"):
        (xattrs / "d" / name).write_text("x")
    await files.set_metadata(REQ, ["/home/user/d/with", "d/without"], {"tag": "listed"})
    os.removexattr(xattrs / "d" / "without", PREFIX + "tag")
    stat = (await files.stat(REQ, {"path": "d/with"}))["entry"]
    assert sdk(stat).metadata == {"tag": "listed"}
    listed = (await files.list_dir(REQ, {"path": "/home/user/d"}))["entries"]
    assert {e["name"]: sdk(e).metadata for e in listed} == {
        "with": {"tag": "listed"},
        "without": None,
    }
    home = (await files.list_dir(REQ, {"path": "/home/user", "depth": 2}))["entries"]
    assert {e["path"]: e.get("metadata") for e in home}["/home/user/d/with"] == {"tag": "listed"}
    found = await files.entries(REQ, ["/home/user/d/with", "/home/user/d/nope"])
    assert list(found) == ["/home/user/d/with"]
    assert (found["/home/user/d/with"]["metadata"], found["/home/user/d/with"]["name"]) == (
        {"tag": "listed"},
        "with",
    )
    assert sdk(found["/home/user/d/with"]).path == "/home/user/d/with"


async def upload(app: Any, raw_headers: list[tuple[bytes, bytes]]) -> tuple[int, Any, int]:
    """POST /files to the envd app: status, JSON answer, and how often the body was read."""
    record = SimpleNamespace(sandbox_id="sb1", key="e2b-sb1", tenant="acme")
    scope = {
        "type": "http",
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 3000),
        "client": ("127.0.0.1", 40000),
        "root_path": "",
        "method": "POST",
        "path": "/files",
        "raw_path": b"/files",
        "headers": [(b"content-type", b"application/octet-stream"), *raw_headers],
        "query_string": b"path=f.txt",
        "state": {"e2b_sandbox": record},
    }
    reads, sent = [0], []

    async def receive() -> dict[str, Any]:
        reads[0] += 1
        return {"type": "http.request", "body": b"data", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], json.loads(body), reads[0]


@pytest.mark.parametrize(
    "raw",
    [
        headers(**{"k" * (MAX_KEY_BYTES + 1): "v"}),
        headers(k="v" * MAX_BYTES),
        headers(**{f"k{i}": "v" for i in range(400)}),
        [(b"x-metadata-k", "\u00e9".encode())],
        [(b"x-metadata-", b"v")],
    ],
)
async def test_a_refused_map_is_400_before_the_body_is_read(
    tmp_path: Path, raw: list[tuple[bytes, bytes]]
) -> None:
    app = build_envd_app(e2b_context(Config(state_dir=tmp_path), Records(None)))
    status, answer, reads = await upload(app, raw)
    assert (status, answer["code"], reads) == (400, 400, 0)
    assert "metadata" in answer["message"]


def test_the_reported_envd_version_is_the_one_these_features_need() -> None:
    from e2b.envd import versions
    from packaging.version import Version

    assert Version(ENVD_VERSION) >= versions.ENVD_FILE_METADATA
    assert Version(ENVD_VERSION) >= versions.ENVD_VERSION_FS_EVENT_ENTRY_INFO
    assert Version(ENVD_VERSION) >= versions.ENVD_VERSION_WATCH_NETWORK_MOUNTS
    gates = [v for k, v in vars(versions).items() if k.startswith("ENVD_") and "DEBUG" not in k]
    assert Version(ENVD_VERSION) == max(gates)  # nothing the SDK gates on lies above it


def test_many_long_paths_go_in_several_commands() -> None:
    from stockade.supervisor.fronts.e2b.envd_files import BATCH_CHARS, _batches

    paths = [f"./{'d' * 250}/{i:04}" + "/x" * 1000 for i in range(300)]  # 2.3 KB each
    groups = _batches(paths)
    assert [p for g in groups for p in g] == paths
    assert all(sum(len(p) + 3 for p in g) <= BATCH_CHARS + 3 for g in groups)
    assert len(groups) > 1
    assert _batches([]) == []
    assert _batches(["x" * (BATCH_CHARS * 2)]) == [["x" * (BATCH_CHARS * 2)]]
