"""What the snapshot tests share: the snapshot RPCs through the generated stubs (raw, so a
refusal is its gRPC status), a tree's listing read from the host, and a supervisor with
bearer tokens of two tenants."""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import grpc
import pytest

from stockade.v1 import sandbox_pb2, sandbox_pb2_grpc
from tests.integration.harness import Supervisor, running_supervisor

T = TypeVar("T")


class Snaps:
    """SandboxService's snapshot calls on a channel of their own, as `token`'s tenant."""

    def __init__(self, target: str, token: str | None = None) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = sandbox_pb2_grpc.SandboxServiceStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Snaps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any, reply: type[T], timeout: float = 240.0) -> T:
        answer = getattr(self.stub, method)(request, timeout=timeout, metadata=self.metadata)
        assert isinstance(answer, reply)
        return answer

    def snapshot(
        self, key: str, name: str = "", *, include_tmp: bool = False, include_memory: bool = False
    ) -> sandbox_pb2.SnapshotInfo:
        request = sandbox_pb2.SnapshotSandboxRequest(
            key=key, name=name, include_tmp=include_tmp, include_memory=include_memory
        )
        return self._call("SnapshotSandbox", request, sandbox_pb2.SnapshotInfo)

    def list_snapshots(self, source_key: str = "") -> sandbox_pb2.ListSnapshotsResponse:
        request = sandbox_pb2.ListSnapshotsRequest(source_key=source_key)
        return self._call("ListSnapshots", request, sandbox_pb2.ListSnapshotsResponse)

    def names(self, source_key: str = "") -> list[str]:
        return [s.name for s in self.list_snapshots(source_key).snapshots]

    def delete(self, name: str) -> sandbox_pb2.DeleteSnapshotResponse:
        request = sandbox_pb2.DeleteSnapshotRequest(name=name)
        return self._call("DeleteSnapshot", request, sandbox_pb2.DeleteSnapshotResponse)

    def restore(self, key: str, snapshot: str) -> sandbox_pb2.RestoreSandboxResponse:
        request = sandbox_pb2.RestoreSandboxRequest(key=key, snapshot=snapshot)
        return self._call("RestoreSandbox", request, sandbox_pb2.RestoreSandboxResponse)

    def fork(
        self,
        source_key: str,
        new_keys: list[str],
        *,
        include_tmp: bool = False,
        include_memory: bool = False,
    ) -> sandbox_pb2.ForkSandboxResponse:
        request = sandbox_pb2.ForkSandboxRequest(
            source_key=source_key,
            new_keys=new_keys,
            include_tmp=include_tmp,
            include_memory=include_memory,
        )
        return self._call("ForkSandbox", request, sandbox_pb2.ForkSandboxResponse)

    def get(self, key: str) -> sandbox_pb2.SandboxInfo:
        request = sandbox_pb2.GetSandboxRequest(key=key)
        return self._call("GetSandbox", request, sandbox_pb2.SandboxInfo)


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    """The status code and details of a call that must fail."""
    with pytest.raises(grpc.RpcError) as failed:
        call()
    error: Any = failed.value
    return error.code(), error.details()


class Node(NamedTuple):
    """One entry of a tree as the host sees it (lstat, never following a link). Links keep
    their target (their own mode is always 0777 on Linux); hard links are not told apart
    (a restore gives back two files with the same content)."""

    kind: str  # "d", "f", "l" or "other:<octal type>"
    mode: int  # st_mode & 0o7777
    uid: int
    gid: int
    size: int
    sha256: str
    target: bytes
    mtime_ns: int


def node(path: bytes) -> Node:
    info = os.lstat(path)
    mode, ids = stat.S_IMODE(info.st_mode), (info.st_uid, info.st_gid)
    if stat.S_ISLNK(info.st_mode):
        return Node("l", mode, *ids, 0, "", os.readlink(path), info.st_mtime_ns)
    if stat.S_ISDIR(info.st_mode):
        return Node("d", mode, *ids, 0, "", b"", info.st_mtime_ns)
    if stat.S_ISREG(info.st_mode):
        digest = hashlib.sha256()
        with open(path, "rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
        return Node("f", mode, *ids, info.st_size, digest.hexdigest(), b"", info.st_mtime_ns)
    return Node(f"other:{stat.S_IFMT(info.st_mode):o}", mode, *ids, 0, "", b"", 0)


def listing(root: str | Path) -> dict[bytes, Node]:
    """Every entry below `root` (and the root itself, as b"."), by its path in bytes."""
    top = os.fsencode(root)
    out = {b".": node(top)}

    def walk(folder: bytes, rel: bytes) -> None:
        for name in sorted(os.listdir(folder)):
            path, below = os.path.join(folder, name), (rel + b"/" + name if rel else name)
            out[below] = node(path)
            if out[below].kind == "d":
                walk(path, below)

    walk(top, b"")
    return out


def differences(want: dict[bytes, Node], got: dict[bytes, Node]) -> list[str]:
    """What differs between two listings, entry by entry, for an assertion's message."""
    lines = [f"missing {p!r}: {want[p]}" for p in sorted(want.keys() - got.keys())]
    lines += [f"extra {p!r}: {got[p]}" for p in sorted(got.keys() - want.keys())]
    for path in sorted(want.keys() & got.keys()):
        if want[path] != got[path]:
            fields = [
                f"{f}: {a!r} -> {b!r}"
                for f, a, b in zip(Node._fields, want[path], got[path], strict=True)
                if a != b
            ]
            lines.append(f"changed {path!r}: {', '.join(fields)}")
    return lines


@contextmanager
def tenants_supervisor(
    engine: str, names: tuple[str, ...], extra_config: str = ""
) -> Iterator[tuple[Supervisor, dict[str, str]]]:
    """A supervisor whose callers are the tenants `names` (bearer tokens from a tokens file),
    and each tenant's token; the supervisor's client() is the first tenant's."""
    folder = Path(tempfile.mkdtemp(prefix="stksnap", dir="/tmp"))
    tokens = {name: secrets.token_hex(16) for name in names}
    path = folder / "tokens"
    path.write_text("".join(f"{token} {name}\n" for name, token in tokens.items()))
    path.chmod(0o600)
    auth = f'[auth]\ntokens_file = "{path}"\n'
    try:
        with running_supervisor(engine, extra_config, auth_config=auth) as sup:
            sup.token = tokens[names[0]]
            yield sup, tokens
    finally:
        path.unlink(missing_ok=True)
        folder.rmdir()
