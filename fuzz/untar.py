"""The agent's upload unpacking (sandbox_image/agent/transfers.py: a tar stream unpacked by
GNU tar in the checked folder), into a fresh workspace. An input: byte 0 picks the target
folder, the rest is the stream. Clean refusal: ToolError (tar refused the archive, a path
outside). Nothing may be written outside the workspace."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fuzz import Workspace, run
from stockade.agent.errors import ToolError
from stockade.agent.transfers import receive

INSTRUMENT = ("stockade",)
REFUSALS: tuple[type[BaseException], ...] = (ToolError,)
WORKSPACE = Workspace()
FOLDERS = (".", "src", "new/folder", "a.txt", "../outside", "/workspace/x")


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 16384):
        yield data[i : i + 16384]


def one(data: bytes) -> None:
    root = WORKSPACE.fresh()
    folder = FOLDERS[data[0] % len(FOLDERS)] if data else "."
    try:
        run(receive(root, folder, tar=True, mode=0, chunks=_chunks(data[1:])))
    finally:
        WORKSPACE.check_outside()
