"""File transfer between a client and a sandbox: policy (uploads need write_file, downloads
read_file), scrubbing of text downloads (across chunk boundaries; binary files, with a NUL in
their first 8 KiB, pass byte-exact unless files.scrub_downloads = "all", or fail if they hold a
configured secret), and an audit record per transfer. The agent does the file work inside the
container."""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from stockade.supervisor import errors
from stockade.supervisor.calls.pipeline import HostPolicy
from stockade.supervisor.calls.tripwires import REFUSED
from stockade.supervisor.config import Config
from stockade.supervisor.keys import validate_scoped as validate_key
from stockade.supervisor.models import CallContext
from stockade.supervisor.observe.audit import AuditRecord
from stockade.supervisor.policy.scrub.scrubber import Scrubber
from stockade.supervisor.policy.scrub.stream import StreamScrubber
from stockade.supervisor.sandboxes.agent_link import AgentReply

SNIFF_BYTES = 8192
_FAILURES: dict[str, type[errors.StockadeError]] = {
    "FILE_NOT_FOUND": errors.NotFound,
    "PERMISSION_DENIED": errors.PolicyDenied,
}


def agent_failure(reply: AgentReply, scrubber: Scrubber | None) -> errors.StockadeError:
    """The domain error for the agent's refusal of a file operation (a transfer, a watch),
    its message scrubbed."""
    cls = _FAILURES.get(reply.error_code, errors.InvalidRequest)
    message = reply.error_message
    if scrubber is not None:
        message, _ = scrubber.scrub(message)
    return cls(message)


@dataclass(frozen=True)
class Transfer:
    sandbox_key: str
    path: str
    tar: bool
    context: CallContext
    caller: str
    mode: int = 0
    front: str = "grpc"
    """The front the transfer came in through, for its audit record."""
    container_wide: bool = False
    """The path may lead anywhere in the container, not only into the workspace (the E2B
    front's, where the container is the boundary as on E2B); the agent still refuses /proc,
    /sys and /dev."""


@dataclass(frozen=True)
class TransferInfo:
    path: str
    size: int
    sha256: str
    tar: bool
    files: int = 0
    redactions: int = 0


class TransferLease(Protocol):
    """What a transfer calls on a sandbox's lease, its arguments given by position
    (sandboxes/lease.py Lease is the real one; tests put fakes in its place)."""

    async def upload(
        self, path: str, tar: bool, mode: int, chunks: AsyncIterator[bytes], wide: bool, /
    ) -> AgentReply: ...

    def download(
        self, path: str, tar: bool, wide: bool, /
    ) -> AsyncIterator[bytes | AgentReply]: ...


class TransferSandboxes(Protocol):
    """What transfers call on the sandboxes (sandboxes/manager.py SandboxManager is the real
    one): the transfer's lease on its key's sandbox."""

    def lease(self, key: str, /) -> AbstractAsyncContextManager[TransferLease]: ...


class FileTransfers:
    def __init__(self, config: Config, sandboxes: TransferSandboxes, policy: HostPolicy) -> None:
        self._config = config
        self._sandboxes = sandboxes
        self._policy = policy

    async def upload(self, t: Transfer, chunks: AsyncIterator[bytes]) -> TransferInfo:
        self._allow(t, "write_file", "upload_file")
        started = time.monotonic()
        bad: list[errors.StockadeError] = []
        honey = self._policy.honey
        said = f"upload_file {json.dumps({'path': t.path, 'tar': t.tar})}"
        watch = honey.stream(t.sandbox_key, "upload", said) if honey is not None else None
        share = self._policy.share

        async def checked() -> AsyncIterator[bytes]:
            """The client's data; a stream that turns bad cancels the agent's upload (which
            then drops its temporary file) instead of ending it, which would commit it. An
            upload that carries a decoy does so too when on_use says quarantine."""
            try:
                async for data in chunks:
                    if watch is not None and watch.feed(data) and watch.refuse:
                        raise errors.PolicyDenied(REFUSED)
                    await share.paced(t.sandbox_key, len(data))
                    yield data
            except errors.StockadeError as exc:
                bad.append(exc)
                work.cancel()
                # never end the stream: its end commits the upload, and gRPC may send it
                # before the cancel lands; the cancelled call closes this generator instead
                await asyncio.Event().wait()

        async def send() -> AgentReply:
            async with self._sandboxes.lease(t.sandbox_key) as lease:
                return await lease.upload(t.path, t.tar, t.mode, checked(), t.container_wide)

        work = asyncio.ensure_future(send())
        try:
            reply = await work
        except asyncio.CancelledError:
            if bad:
                raise bad[0] from None
            raise
        info = _info(self._checked(reply))
        self._audit(t, "upload_file", started, info, "")
        return info

    async def download(self, t: Transfer) -> AsyncIterator[bytes | TransferInfo]:
        """Data chunks (scrubbed unless configured off), then the TransferInfo."""
        self._allow(t, "read_file", "download_file")
        started = time.monotonic()
        mode = self._config.files.scrub_downloads
        scrub = self._policy.scrubber if mode != "off" else None
        stream = _Scrubbing(scrub)
        digest, size = hashlib.sha256(), 0
        reply: AgentReply | None = None
        first, honey, share = True, self._policy.honey, self._policy.share
        said = f"download_file {json.dumps({'path': t.path, 'tar': t.tar})}"
        watch = honey.stream(t.sandbox_key, "output", said) if honey is not None else None
        async with self._sandboxes.lease(t.sandbox_key) as lease:
            async for item in lease.download(t.path, t.tar, t.container_wide):
                if isinstance(item, AgentReply):
                    reply = item
                    break
                if watch is not None:
                    watch.feed(item)
                if first and mode == "text" and not t.tar and b"\0" in item[:SNIFF_BYTES]:
                    stream = _Scrubbing(scrub, binary=True)
                first = False
                if out := stream.feed(item):
                    digest.update(out)
                    size += len(out)
                    await share.paced(t.sandbox_key, len(out))
                    yield out
        if reply is None:
            raise errors.SandboxBroken("the sandbox ended the download without a result")
        sent = self._checked(reply)
        if rest := stream.flush():
            digest.update(rest)
            size += len(rest)
            await share.paced(t.sandbox_key, len(rest))
            yield rest
        info = TransferInfo(
            path=str(sent.get("path", t.path)),
            size=size,
            sha256=digest.hexdigest(),
            tar=t.tar,
            files=int(sent.get("files", 0)),
            redactions=stream.redactions,
        )
        self._audit(t, "download_file", started, info, "")
        yield info

    def _allow(self, t: Transfer, tool: str, action: str) -> None:
        """Uploads need the write_file permission, downloads read_file."""
        validate_key(t.sandbox_key)
        decision = self._policy.tools.decide(tool, t.context)
        if not decision.allowed:
            self._audit(t, action, time.monotonic(), None, decision.step)
            message = f"file transfer needs {tool}, which is not allowed here: {decision.reason}"
            raise errors.PolicyDenied(message)

    def _checked(self, reply: AgentReply) -> dict[str, Any]:
        if reply.error_code or reply.result is None:
            raise agent_failure(reply, self._policy.scrubber)
        return reply.result

    def _audit(
        self, t: Transfer, tool: str, started: float, info: TransferInfo | None, denied: str
    ) -> None:
        audit = self._policy.audit
        if audit is None:
            return
        arguments = json.dumps({"path": t.path, "tar": t.tar}, ensure_ascii=False)
        audit.record(
            AuditRecord(
                time=time.time(),
                request_id="",
                caller=t.caller,
                sandbox_key=t.sandbox_key,
                agent_id=t.context.agent_id,
                provider=t.context.provider,
                tool=tool,
                arguments_json=arguments,
                policy_step=denied or "allowed",
                duration_ms=int((time.monotonic() - started) * 1000),
                output_bytes=info.size if info else 0,
                redactions=info.redactions if info else 0,
                error_code="PERMISSION_DENIED" if denied else "",
                is_error=bool(denied),
                front=t.front,
            )
        )


def _info(result: dict[str, Any]) -> TransferInfo:
    return TransferInfo(
        path=str(result.get("path", "")),
        size=int(result.get("size", 0)),
        sha256=str(result.get("sha256", "")),
        tar=bool(result.get("tar", False)),
        files=int(result.get("files", 0)),
    )


class _Scrubbing:
    """A download's bytes through the stream scrubber, as UTF-8 (bytes that are not UTF-8
    pass as they are, so text in other encodings stays byte-exact where nothing is redacted).

    A binary file is not changed: it is searched for the configured secrets only (formats in
    a binary are too often code, not credentials), and the download fails before any of one
    would be sent."""

    def __init__(self, scrubber: Scrubber | None, binary: bool = False) -> None:
        self._binary = binary
        if binary and scrubber is not None:
            scrubber = scrubber.secrets_only()
        self._stream = StreamScrubber(scrubber) if scrubber is not None else None
        self._decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")

    @property
    def redactions(self) -> int:
        return self._stream.redactions if self._stream is not None else 0

    def feed(self, data: bytes) -> bytes:
        if self._stream is None:
            return data
        return self._checked(self._stream.feed(self._decoder.decode(data)))

    def flush(self) -> bytes:
        if self._stream is None:
            return b""
        return self._checked(
            self._stream.feed(self._decoder.decode(b"", final=True)) + self._stream.flush()
        )

    def _checked(self, text: str) -> bytes:
        if self._binary and self.redactions:
            raise errors.PolicyDenied(
                "the file is binary and holds a configured secret: it is not sent (binary "
                'files are not changed; files.scrub_downloads = "all" would scrub it)'
            )
        return text.encode("utf-8", "surrogateescape")
