"""The E2B front's `POST /files` (fronts/e2b/envd.py, envd_files.py): multipart and
octet-stream uploads, gzip included, their target paths, through the envd app itself, to a
sandbox that takes the bytes and keeps nothing.

An input is a request as text: its first line the query string (`path=...`), then header
lines (`name: value`) up to an empty line, then the body. The app must answer, never raise,
and never with a 5xx: nothing is a clean refusal here."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from fuzz import run
from stockade.supervisor.config import load_config
from stockade.supervisor.fronts.e2b.envd import build_envd_app
from stockade.supervisor.fronts.e2b.envd_files import SANDBOX_STATE
from stockade.supervisor.fronts.e2b.records import E2bSandbox
from stockade.supervisor.policy.limits import FairShare
from stockade.supervisor.sandboxes.agent_link import AgentReply

INSTRUMENT = ("stockade", "starlette", "python_multipart", "multipart", "email")
REFUSALS: tuple[type[BaseException], ...] = ()
MAX_UPLOAD = 64 << 20
"""What the fake sandbox takes of one upload: beyond it the upload is refused (as a full
disk would be) rather than read on."""


class _Lease:
    async def upload(
        self, path: str, tar: bool, mode: int, chunks: AsyncIterator[bytes], wide: bool = False
    ) -> AgentReply:
        size = 0
        async for data in chunks:
            size += len(data)
            if size > MAX_UPLOAD:
                return AgentReply("QUOTA_EXCEEDED", "no space left", None)
        result = {"path": path, "size": size, "sha256": "", "tar": tar}
        return AgentReply("", "", result)


class _Sandboxes:
    @contextlib.asynccontextmanager
    async def lease(self, key: str) -> AsyncIterator[_Lease]:
        yield _Lease()


_ALLOWED = SimpleNamespace(allowed=True, step="allowed", reason="")
CTX = SimpleNamespace(
    config=load_config(None),
    manager=_Sandboxes(),
    policy=SimpleNamespace(
        tools=SimpleNamespace(decide=lambda tool, context: _ALLOWED),
        honey=None,
        audit=None,
        scrubber=None,
        share=FairShare(0),
    ),
    forgetters=[],
    pausers=[],
)
APP = build_envd_app(CTX)  # type: ignore[arg-type]
SANDBOX = E2bSandbox(
    sandbox_id="fuzzsandbox000000000",
    tenant="",
    key="e2b-fuzz",
    template_id="base",
    access_token="token",
    started_at=0.0,
    end_at=0.0,
)


def parse(data: bytes) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    """The query string, the headers and the body of an input."""
    head, _, body = data.partition(b"\n\n")
    query, *lines = head.split(b"\n")
    headers = []
    for line in lines:
        name, _, value = line.partition(b":")
        headers.append((name.strip().lower(), value.strip()))
    return query, headers, body


async def _post(data: bytes) -> tuple[int, bytes]:
    query, headers, body = parse(data)
    scope: dict[str, Any] = {
        "type": "http",
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 49983),
        "client": ("127.0.0.1", 40000),
        "root_path": "",
        "method": "POST",
        "path": "/files",
        "raw_path": b"/files",
        "headers": headers,
        "query_string": query,
        "state": {SANDBOX_STATE: SANDBOX},
    }
    parts = [body[i : i + 4096] for i in range(0, len(body), 4096)] or [b""]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not parts:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": parts.pop(0), "more_body": bool(parts)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await APP(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def one(data: bytes) -> None:
    status, body = run(_post(data))
    if status >= 500:
        raise AssertionError(f"POST /files answered {status}: {body[:200]!r}")
