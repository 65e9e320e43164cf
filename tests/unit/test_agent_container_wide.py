"""Transfers with the container as the root (the E2B front's container_wide): a path outside
the workspace is reached, but never /proc, /sys or /dev, also not through a symlink, and `..`
is still refused; without container_wide the workspace confinement of the gRPC and MCP file
tools is what it was."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stockade.agent import paths, transfers
from stockade.agent.errors import ToolError
from stockade.agent.service import AgentService
from stockade.agent.v1 import agent_pb2
from tests.unit.fakes import make_folder

pytestmark = pytest.mark.timeout(60)
WIDE = paths.CONTAINER


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def read(root: Path, path: str) -> bytes:
    out = b""
    async for item in transfers.send(root, path, tar=False):
        if isinstance(item, bytes):
            out += item
    return out


async def test_a_path_outside_the_workspace_is_reached(tmp_path: Path) -> None:
    outside = make_folder(tmp_path / "outside")
    await transfers.receive(WIDE, f"{outside}/new/a.txt", tar=False, mode=0, chunks=chunks(b"hi"))
    assert (outside / "new" / "a.txt").read_bytes() == b"hi"
    assert await read(WIDE, f"{outside}/new/a.txt") == b"hi"


@pytest.mark.parametrize(
    "path",
    ["/proc/self/environ", "/proc/1/cmdline", "/sys/kernel/hostname", "/dev/null", "/dev/zero",
     "/dev/shm/x", "/proc"],
)  # fmt: skip
async def test_kernel_file_systems_are_refused(path: str) -> None:
    with pytest.raises(ToolError) as raised:
        await read(WIDE, path)
    assert raised.value.code == "INVALID_PATH"
    assert "/proc, /sys or /dev" in raised.value.message


async def test_a_write_into_dev_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as raised:
        await transfers.receive(WIDE, "/dev/shm/planted", tar=False, mode=0, chunks=chunks(b"x"))
    assert raised.value.code == "INVALID_PATH"
    assert not Path("/dev/shm/planted").exists()


async def test_a_symlink_into_proc_is_refused(tmp_path: Path) -> None:
    (tmp_path / "me").symlink_to("/proc/self")
    (tmp_path / "env").symlink_to("/proc/self/environ")
    for path in (f"{tmp_path}/me/environ", f"{tmp_path}/env"):
        with pytest.raises(ToolError) as raised:
            await read(WIDE, path)
        assert "/proc, /sys or /dev" in raised.value.message
    with pytest.raises(ToolError):
        await transfers.receive(WIDE, f"{tmp_path}/me/x", tar=False, mode=0, chunks=chunks(b"x"))


@pytest.mark.parametrize("path", ["/tmp/../proc/self/environ", "/etc/../dev/null", "a/../../b"])
async def test_dotdot_is_still_refused(path: str) -> None:
    with pytest.raises(ToolError) as raised:
        await read(WIDE, path)
    assert raised.value.code == "INVALID_PATH"


async def test_a_folder_swapped_for_a_link_to_proc_is_not_followed(tmp_path: Path) -> None:
    """open_dir's check after the open: the race a running command could win."""
    real = paths.resolve(WIDE, str(tmp_path / "d" / "f"), must_exist=False)
    (tmp_path / "d").symlink_to("/proc/self")
    with pytest.raises(ToolError) as raised:
        paths.open_dir(WIDE, real.parent, "d")
    assert "a folder on it became a link" in raised.value.message


def service_for(ws: Path) -> AgentService:
    return AgentService(ws, max_output_bytes=1 << 20)


async def upload(service: AgentService, path: str, wide: bool) -> Any:
    async def requests() -> AsyncIterator[Any]:
        header = agent_pb2.TransferHeader(path=path, container_wide=wide)
        yield agent_pb2.UploadChunk(header=header)
        yield agent_pb2.UploadChunk(data=b"data")

    return await service.upload(requests())


async def test_without_container_wide_the_workspace_is_the_boundary(tmp_path: Path) -> None:
    ws, outside = make_folder(tmp_path / "ws"), make_folder(tmp_path / "outside")
    service = service_for(ws)
    refused = await upload(service, f"{outside}/x", wide=False)
    assert refused.error_code == agent_pb2.AGENT_ERROR_CODE_INVALID_PATH
    assert not (outside / "x").exists()
    done = await upload(service, f"{outside}/x", wide=True)
    assert not done.error_code, done.error_message
    assert json.loads(done.result_json)["size"] == 4
    assert (outside / "x").read_bytes() == b"data"
    assert json.loads(done.result_json)["path"] == f"{outside}/x"  # absolute, not "tmp/..."
    request = agent_pb2.DownloadRequest(path=f"{outside}/x")
    got = [c async for c in service.download(request)]
    assert got[-1].result.error_code == agent_pb2.AGENT_ERROR_CODE_INVALID_PATH
    request = agent_pb2.DownloadRequest(path=f"{outside}/x", container_wide=True)
    got = [c async for c in service.download(request)]
    assert b"".join(c.data for c in got if c.HasField("data")) == b"data"
