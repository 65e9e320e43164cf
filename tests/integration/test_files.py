"""File transfer for real: large files round-trip with matching checksums through the API and
`stockade cp`, directories travel as tar, symlinks never reach host paths, policy applies, and
downloads are scrubbed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stockade.client import InvalidArgument, Stockade, StockadeError
from tests.integration.harness import Supervisor

pytestmark = pytest.mark.timeout(600)
MiB = 1024 * 1024


def random_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as out:
        for _ in range(size // MiB):
            block = os.urandom(MiB)
            digest.update(block)
            out.write(block)
    return digest.hexdigest()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            digest.update(block)
    return digest.hexdigest()


def test_512_mib_round_trip_through_the_api(client: Stockade, key: str, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    expected = random_file(source, 512 * MiB)
    sent = client.upload(key, "data/big.bin", source)
    assert (sent.size, sent.sha256, sent.path) == (512 * MiB, expected, "data/big.bin")
    inside = client.sandbox(key).exec("sha256sum data/big.bin").stdout.split()[0]
    assert inside == expected
    back = tmp_path / "back.bin"
    got = client.download(key, "data/big.bin", back)
    assert (got.size, got.sha256, got.redactions) == (512 * MiB, expected, 0)
    assert sha256(back) == expected
    client.sandbox(key).exec("rm data/big.bin")


def cli(sup: Supervisor, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STOCKADE_ADDR": sup.target}
    cmd = [sys.executable, "-m", "stockade.supervisor.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_cp_files_and_directories(
    supervisor: Supervisor, client: Stockade, key: str, tmp_path: Path
) -> None:
    source = tmp_path / "f.bin"
    expected = random_file(source, 64 * MiB)
    up = cli(supervisor, "cp", str(source), f"{key}:in/f.bin")
    assert up.returncode == 0, up.stderr
    assert expected in up.stderr
    down = cli(supervisor, "cp", f"{key}:in/f.bin", str(tmp_path / "out.bin"))
    assert down.returncode == 0, down.stderr
    assert sha256(tmp_path / "out.bin") == expected
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("A")
    (tree / "sub" / "b.txt").write_text("B")
    assert cli(supervisor, "cp", "-r", str(tree), f"{key}:proj").returncode == 0
    assert client.sandbox(key).read_file("proj/sub/b.txt") == "B"
    client.sandbox(key).write_file("proj/sub/c.txt", "C")
    result = cli(supervisor, "cp", "-r", f"{key}:proj", str(tmp_path / "copy"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "copy" / "sub" / "c.txt").read_text() == "C"
    assert (tmp_path / "copy" / "a.txt").read_text() == "A"
    wrong = cli(supervisor, "cp", str(tree), f"{key}:x")
    assert wrong.returncode == 2
    assert "use -r" in wrong.stderr


def test_symlinks_never_reach_host_paths(
    supervisor: Supervisor, client: Stockade, key: str, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    canary.write_text("host\n")
    client.sandbox(key).ensure()
    workspace = supervisor.workspace(key)
    os.symlink(canary, workspace / "to-host")
    client.sandbox(key).exec("ln -s /etc/passwd to-passwd; ln -s / to-root")
    for path in ("to-host", "to-passwd", "to-root/etc/passwd", "../x", "/etc/passwd"):
        with pytest.raises(StockadeError):
            client.download(key, path, tmp_path / "got")
        with pytest.raises(StockadeError):
            client.upload(key, path, b"pwned")
    assert canary.read_text() == "host\n"
    assert not (tmp_path / "got").exists()
    assert not list(tmp_path.glob("*.part"))
    with pytest.raises(InvalidArgument):
        client.download(key, "to-root", tmp_path / "d", tar=True)


def test_bad_tar_is_refused_and_nothing_is_lost(client: Stockade, key: str) -> None:
    client.sandbox(key).write_file("keep/k.txt", "kept")
    with pytest.raises(InvalidArgument) as info:
        client.upload(key, "keep", b"this is not a tar stream" * 100, tar=True)
    assert "could not unpack" in str(info.value)
    assert client.sandbox(key).read_file("keep/k.txt") == "kept"


CONFIG = """
[agents.reader.tools]
deny = ["write_file"]
[agents.blind.tools]
deny = ["read_file"]
"""


def test_policy_and_scrubbing_apply_to_transfers(policy_sup: Supervisor, tmp_path: Path) -> None:
    from stockade.client import CallContext

    token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    with policy_sup.client() as c:
        with pytest.raises(StockadeError) as denied:
            c.upload("k", "x.txt", b"x", context=CallContext(agent_id="reader"))
        assert denied.value.code == "PERMISSION_DENIED"
        c.upload("k", "secret.env", f"GITHUB_TOKEN={token}\nok\n".encode())
        with pytest.raises(StockadeError) as blind:
            c.download("k", "secret.env", tmp_path / "s", context=CallContext(agent_id="blind"))
        assert blind.value.code == "PERMISSION_DENIED"
        info = c.download("k", "secret.env", tmp_path / "s")
        assert info.redactions == 1
        assert (tmp_path / "s").read_text() == "GITHUB_TOKEN=[REDACTED]\nok\n"
        tools = [r.tool for r in c.list_audit(sandbox_key="k")]
        assert tools[:3] == ["download_file", "download_file", "upload_file"]


def test_raw_upload_without_a_header_is_refused(supervisor: Supervisor, key: str) -> None:
    import grpc

    from stockade.v1 import file_pb2, file_pb2_grpc

    with grpc.insecure_channel(supervisor.target) as channel:
        stub = file_pb2_grpc.FileServiceStub(channel)
        for chunks in (
            [file_pb2.FileChunk(data=b"no header first")],
            [],
            [
                file_pb2.FileChunk(header=file_pb2.FileHeader(sandbox_key=key, path="h.txt")),
                file_pb2.FileChunk(header=file_pb2.FileHeader(sandbox_key=key, path="again")),
            ],
        ):
            with pytest.raises(grpc.RpcError) as info:
                stub.UploadFile(iter(chunks), timeout=60)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "upload" in (info.value.details() or "")
        with pytest.raises(grpc.RpcError) as bad_key:
            stub.UploadFile(iter([file_pb2.FileChunk(header=file_pb2.FileHeader(path="x"))]))
        assert bad_key.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with supervisor.client() as c:
        left = c.sandbox(key).exec("ls -A").stdout
    assert left == "", "a refused upload must leave neither the file nor a temporary file"
