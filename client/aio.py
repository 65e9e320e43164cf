"""The asyncio client: `await AsyncStockade(addr).sandbox("key").exec("ls")`."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from typing import Any, BinaryIO, TypeVar

import grpc

from stockade.client import _core, _watch
from stockade.client._core import (
    ApprovalClosed,
    ApprovalRequest,
    Approvals,
    AuditRecord,
    CallContext,
    FileInfo,
    IsolationReport,
    SandboxInfo,
    ShellSession,
    StreamEvent,
    ToolResult,
    ToolSpec,
)
from stockade.client._quarantine_calls import AsyncQuarantineCalls
from stockade.client._snapshot_calls import AsyncSnapshotCalls
from stockade.client._snapshots import Restored, SnapshotInfo
from stockade.v1 import (
    approval_pb2,
    sandbox_pb2,
)

T = TypeVar("T")


class AsyncStockade(AsyncSnapshotCalls, AsyncQuarantineCalls):
    """A connection to a Stockade supervisor.

    `target` is host:port or unix:/path (default: $STOCKADE_ADDR, else 127.0.0.1:50051).
    `token` is sent as `authorization: Bearer TOKEN` (default: $STOCKADE_TOKEN); `tls`
    makes the connection TLS (see TLS). Pass `channel` to use a channel of your own (tests,
    interceptors)."""

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        tls: _core.TLS | None = None,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        self.target = target or _core.default_target()
        self._own_channel = channel is None
        self._channel = channel or _core.aio_channel(self.target, tls)
        stubs = _core.stubs(self._channel, token)
        self._sandboxes, self._tools, self._files = stubs.sandboxes, stubs.tools, stubs.files
        self._approvals, self._audit, self._quarantine = (
            stubs.approvals,
            stubs.audit,
            stubs.quarantine,
        )

    async def __aenter__(self) -> AsyncStockade:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_channel:
            await self._channel.close()

    async def _rpc(
        self, method: Callable[..., Any], request: Any, timeout: float | None = None
    ) -> Any:
        try:
            return await method(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise _core.error_from_rpc(exc) from None

    def sandbox(self, key: str) -> AsyncSandbox:
        return AsyncSandbox(self, key)

    async def list_sandboxes(self) -> list[SandboxInfo]:
        reply = await self._rpc(self._sandboxes.ListSandboxes, sandbox_pb2.ListSandboxesRequest())
        return [_core.sandbox_from_pb(s) for s in reply.sandboxes]

    async def list_tools(
        self, format: str = "json", context: CallContext | None = None
    ) -> list[ToolSpec]:
        """The tools policy allows for `context`, declared in `format` (json, openai,
        anthropic or gemini)."""
        request = _core.list_tools_request(format, context)
        reply = await self._rpc(self._tools.ListTools, request)
        return [_core.tool_from_pb(t) for t in reply.tools]

    async def list_approvals(self) -> Approvals:
        """Pending requests, commands approved with allow-always, approvers connected."""
        request = approval_pb2.ListApprovalsRequest()
        return _core.approvals_from_pb(await self._rpc(self._approvals.ListApprovals, request))

    async def watch_approvals(
        self, approver: str = ""
    ) -> AsyncIterator[ApprovalRequest | ApprovalClosed]:
        """Pending requests, then each new request and each close, until you stop iterating."""
        request = approval_pb2.WatchApprovalsRequest(approver=approver)
        stream = self._approvals.WatchApprovals(request)
        try:
            async for event in stream:
                yield _core.event_from_pb(event)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise _core.error_from_rpc(exc) from None
        finally:
            stream.cancel()

    async def resolve_approval(self, approval_id: str, decision: str, approver: str = "") -> None:
        """decision: allow-once, allow-always or deny."""
        request = _core.resolve_request(approval_id, decision, approver)
        await self._rpc(self._approvals.ResolveApproval, request)

    async def list_audit(
        self,
        *,
        sandbox_key: str = "",
        tool: str = "",
        agent_id: str = "",
        since: datetime | None = None,
        limit: int = 100,
        errors_only: bool = False,
    ) -> list[AuditRecord]:
        """Audit records, newest first."""
        request = _core.audit_request(sandbox_key, tool, agent_id, since, limit, errors_only)
        reply = await self._rpc(self._audit.ListAudit, request)
        return [_core.audit_from_pb(r) for r in reply.records]

    async def call(
        self,
        key: str,
        tool: str,
        arguments: dict[str, Any] | str | None = None,
        *,
        timeout: float | None = None,
        context: CallContext | None = None,
        request_id: str = "",
        deadline: float | None = None,
        front: str = "",
    ) -> ToolResult:
        """Call a tool; a tool failure is a result with is_error, not an exception.

        `timeout` (s) bounds the call on the server (a timed-out command still returns its
        partial output); `deadline` (s) is the client's own gRPC deadline: when it passes the
        call is cancelled, and so are its process and any approval request it waits on.
        `front`: the front named in the call's audit record ("" or "mcp-stdio")."""
        request = _core.call_request(
            key,
            tool,
            arguments,
            timeout_ms=int(timeout * 1000) if timeout else 0,
            context=context,
            request_id=request_id,
            front=front,
        )
        return _core.result_from_pb(await self._rpc(self._tools.CallTool, request, deadline))

    async def call_stream(
        self,
        key: str,
        tool: str,
        arguments: dict[str, Any] | str | None = None,
        *,
        timeout: float | None = None,
        context: CallContext | None = None,
        request_id: str = "",
        deadline: float | None = None,
        front: str = "",
        caller_approves: bool = False,
    ) -> AsyncIterator[StreamEvent]:
        """Call a tool and follow it: Started, Output chunks as they are produced,
        ApprovalPending while a human decides, and the ToolResult last. Stopping early
        (closing the iterator) cancels the call and kills its process group.
        `caller_approves`: you resolve this call's approvals yourself (resolve_approval with
        the ApprovalPending's id), so you count as a connected approver for them."""
        request = _core.call_request(
            key,
            tool,
            arguments,
            timeout_ms=int(timeout * 1000) if timeout else 0,
            context=context,
            request_id=request_id,
            front=front,
            caller_approves=caller_approves,
        )
        stream = self._tools.CallToolStream(request, timeout=deadline)
        try:
            async for event in stream:
                yield _core.stream_event_from_pb(event)
        except grpc.RpcError as exc:
            raise _core.error_from_rpc(exc) from None
        finally:
            stream.cancel()

    async def interact(
        self,
        key: str,
        command: str | None = None,
        *,
        process: str | None = None,
        pty: bool = False,
        cols: int = 0,
        rows: int = 0,
        workdir: str = "",
        env: dict[str, str] | None = None,
        name: str = "",
        offset: int = 0,
        keep_running: bool = False,
        context: CallContext | None = None,
        request_id: str = "",
        deadline: float | None = None,
    ) -> AsyncInteraction:
        """Start `command` as a background process (on a terminal with `pty`), or attach to
        the running `process` (its id or name), and talk to it: see AsyncInteraction."""
        first = _core.interact_start(
            key, command, process, pty=pty, cols=cols, rows=rows, workdir=workdir, env=env,
            name=name, offset=offset, keep_running=keep_running, context=context,
            request_id=request_id,
        )  # fmt: skip
        call = self._tools.Interact(timeout=deadline)
        interaction = AsyncInteraction(call)
        await interaction._write(first)
        return interaction

    async def upload(
        self,
        key: str,
        path: str,
        source: _core.Source,
        *,
        tar: bool = False,
        mode: int = 0,
        context: CallContext | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> FileInfo:
        """Write `source` (a local path, bytes or a binary file) at `path` in the sandbox;
        with tar, `source` is a tar stream unpacked into the directory `path`.
        `progress(n)` is called with the size of each chunk sent."""
        requests = _core.upload_requests(key, path, source, tar, mode, context, progress)
        return _core.info_from_pb(await self._rpc(self._files.UploadFile, requests))

    async def download(
        self,
        key: str,
        path: str,
        dest: str | os.PathLike[str] | BinaryIO,
        *,
        tar: bool = False,
        context: CallContext | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> FileInfo:
        """Copy `path` from the sandbox to `dest` (a local path, written whole or not at all,
        or a binary file); with tar, the directory `path` arrives as a tar stream."""
        sink = _core.Sink(dest)
        info: FileInfo | None = None
        try:
            stream = self._files.DownloadFile(_core.download_request(key, path, tar, context))
            async for chunk in stream:
                if chunk.WhichOneof("part") == "data":
                    sink.write(chunk.data)
                    if progress is not None:
                        progress(len(chunk.data))
                else:
                    info = _core.info_from_pb(chunk.info)
        except grpc.RpcError as exc:
            raise _core.error_from_rpc(exc) from None
        finally:
            sink.finish(info is not None)
        if info is None:
            raise _core.StockadeError("the download ended without its file info")
        return info

    async def watch_files(
        self, key: str, path: str, recursive: bool = False, *, context: CallContext | None = None
    ) -> _watch.AsyncFileWatch:
        """Watch the folder `path` (with `recursive`, and every folder below it): returns once
        the watch is in place; `async for event in watch` until you close() it."""
        stream = self._files.WatchFiles(_watch.watch_request(key, path, recursive, context))
        return await _watch.AsyncFileWatch.start(stream)

    async def ensure_sandbox(
        self,
        key: str,
        *,
        network: str | None = None,
        allow: Sequence[str] | None = None,
        profile: str | None = None,
    ) -> SandboxInfo:
        """Create the key's sandbox if needed. network ("none", "egress", "open") and allow
        (egress domain patterns) may narrow the supervisor's configured network, profile
        names a sandbox profile ([profiles.NAME]; "base": the defaults); a running sandbox
        with another network or profile is re-created with the workspace kept, and both are
        the key's from then on."""
        request = _core.ensure_request(key, network, allow, profile)
        return _core.sandbox_from_pb(await self._rpc(self._sandboxes.EnsureSandbox, request))

    async def get_sandbox(self, key: str) -> SandboxInfo:
        request = sandbox_pb2.GetSandboxRequest(key=key)
        return _core.sandbox_from_pb(await self._rpc(self._sandboxes.GetSandbox, request))

    async def destroy_sandbox(self, key: str, *, delete_workspace: bool = False) -> bool:
        request = sandbox_pb2.DestroySandboxRequest(key=key, delete_workspace=delete_workspace)
        reply = await self._rpc(self._sandboxes.DestroySandbox, request)
        return bool(reply.removed)

    async def list_sessions(self, key: str) -> list[ShellSession]:
        """The sandbox's shell sessions (exec's `session`); none when it has no container."""
        request = sandbox_pb2.ListSessionsRequest(key=key)
        return _core.sessions_from_pb(await self._rpc(self._sandboxes.ListSessions, request))

    async def end_session(self, key: str, session: str) -> bool:
        """End a shell session (a later call of that name starts afresh); False: none."""
        request = sandbox_pb2.EndSessionRequest(key=key, session=session)
        return bool((await self._rpc(self._sandboxes.EndSession, request)).ended)

    async def pause_sandbox(self, key: str) -> bool:
        """Stockade.pause_sandbox."""
        request = sandbox_pb2.PauseSandboxRequest(key=key)
        return bool((await self._rpc(self._sandboxes.PauseSandbox, request)).changed)

    async def resume_sandbox(self, key: str) -> bool:
        """Stockade.resume_sandbox."""
        request = sandbox_pb2.ResumeSandboxRequest(key=key)
        return bool((await self._rpc(self._sandboxes.ResumeSandbox, request)).changed)

    async def inspect_isolation(self, key: str) -> IsolationReport:
        """Stockade.inspect_isolation."""
        request = sandbox_pb2.InspectIsolationRequest(key=key)
        reply = await self._rpc(self._sandboxes.InspectIsolation, request)
        return _core.isolation_from_pb(reply)


class AsyncInteraction:
    """A live session with a background process (ToolService.Interact), for asyncio:
    the same methods as the blocking Interaction, awaited; `async with` detaches at the end."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._input_open = True
        self._buffer = _core.OutputBuffer()
        self._ended = False

    async def __aenter__(self) -> AsyncInteraction:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def _write(self, message: Any) -> None:
        if not self._input_open:
            raise ValueError("the input side of this session is closed")
        try:
            await self._call.write(message)
        except grpc.RpcError as exc:
            raise _core.error_from_rpc(exc) from None

    async def _next(self) -> StreamEvent | None:
        if self._ended:
            return None
        try:
            message = await self._call.read()
        except grpc.RpcError as exc:
            raise _core.error_from_rpc(exc) from None
        if message is grpc.aio.EOF:
            self._ended = True
            return None
        event = _core.stream_event_from_pb(message)
        self._buffer.add(event)
        return event

    async def send(self, data: bytes | str) -> None:
        await self._write(_core.stdin_message(data))

    async def eof(self) -> None:
        await self._write(_core.eof_message())

    async def resize(self, cols: int, rows: int) -> None:
        await self._write(_core.resize_message(cols, rows))

    async def signal(self, name: str) -> None:
        await self._write(_core.signal_message(name))

    async def close_input(self) -> None:
        if self._input_open:
            self._input_open = False
            await self._call.done_writing()

    async def events(self) -> AsyncIterator[StreamEvent]:
        while (event := await self._next()) is not None:
            yield event

    async def started(self) -> _core.Started:
        while self._buffer.started is None:
            if await self._next() is None:
                raise _core.ToolError(self._require_result())
        return self._buffer.started

    async def read_until(self, marker: str) -> str:
        while (text := self._buffer.take_until(marker)) is None:
            if await self._next() is None:
                raise EOFError(f"the session ended before {marker!r}: {self._buffer.text!r}")
        return text

    async def wait(self) -> ToolResult:
        while await self._next() is not None:
            pass
        return self._require_result()

    @property
    def output(self) -> str:
        return self._buffer.take_all()

    def _require_result(self) -> ToolResult:
        if self._buffer.result is None:
            raise _core.StockadeError("the session ended without a result")
        return self._buffer.result

    def close(self) -> None:
        self._input_open = False
        self._call.cancel()


class AsyncSandbox:
    """One sandbox key. Helpers other than call() and exec() raise ToolError on failure."""

    def __init__(self, client: AsyncStockade, key: str) -> None:
        self.client = client
        self.key = key

    async def call(
        self, tool: str, arguments: dict[str, Any] | str | None = None, **kw: Any
    ) -> ToolResult:
        return await self.client.call(self.key, tool, arguments, **kw)

    async def ensure(
        self,
        *,
        network: str | None = None,
        allow: Sequence[str] | None = None,
        profile: str | None = None,
    ) -> SandboxInfo:
        return await self.client.ensure_sandbox(
            self.key, network=network, allow=allow, profile=profile
        )

    async def info(self) -> SandboxInfo:
        return await self.client.get_sandbox(self.key)

    async def isolation(self) -> IsolationReport:
        return await self.client.inspect_isolation(self.key)

    async def destroy(self, *, delete_workspace: bool = False) -> bool:
        return await self.client.destroy_sandbox(self.key, delete_workspace=delete_workspace)

    async def sessions(self) -> list[ShellSession]:
        return await self.client.list_sessions(self.key)

    async def end_session(self, session: str) -> bool:
        return await self.client.end_session(self.key, session)

    async def pause(self) -> bool:
        return await self.client.pause_sandbox(self.key)

    async def resume(self) -> bool:
        return await self.client.resume_sandbox(self.key)

    async def snapshot(self, name: str = "", *, include_tmp: bool = False) -> SnapshotInfo:
        """A snapshot of this sandbox's files (see AsyncStockade.snapshot_sandbox)."""
        return await self.client.snapshot_sandbox(self.key, name, include_tmp=include_tmp)

    async def restore(self, snapshot: str) -> Restored:
        """Replace this sandbox's files with the snapshot's; its container is re-created."""
        return await self.client.restore_sandbox(self.key, snapshot)

    async def fork(self, *new_keys: str, include_tmp: bool = False) -> list[AsyncSandbox]:
        """New sandboxes with this one's files as they are now, one per key (all new);
        handles to them on the same client."""
        forked = await self.client.fork_sandbox(self.key, new_keys, include_tmp=include_tmp)
        return [self.client.sandbox(s.key) for s in forked.sandboxes]

    async def _do(self, op: _core.Op) -> Any:
        tool, args, finish = op
        return finish(await self.call(tool, args))

    async def exec(
        self,
        command: str,
        *,
        timeout: float | None = None,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        session: str | None = None,
    ) -> ToolResult:
        """Run a shell command (`stdin`: its whole input, then closed); a non-zero exit is a
        result (see .exit_code), not an error. `session`: a shell session's name, whose
        folder, exported environment, options and aliases carry over between its calls."""
        return await self._do(_core.exec_op(command, timeout, workdir, env, stdin, session))  # type: ignore[no-any-return]

    async def interact(self, command: str | None = None, **kw: Any) -> AsyncInteraction:
        """AsyncStockade.interact for this sandbox."""
        return await self.client.interact(self.key, command, **kw)

    async def read_file(
        self, path: str, *, start_line: int | None = None, end_line: int | None = None
    ) -> str:
        return str(await self._do(_core.read_file_op(path, start_line, end_line)))

    async def write_file(self, path: str, content: str) -> None:
        await self._do(_core.write_file_op(path, content))

    async def edit_file(self, path: str, old_text: str, new_text: str) -> None:
        await self._do(_core.edit_file_op(path, old_text, new_text))

    async def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        return list(await self._do(_core.list_files_op(path)))

    async def glob(self, pattern: str, path: str = ".") -> list[str]:
        return list(await self._do(_core.glob_op(pattern, path)))

    async def search(self, pattern: str, path: str = ".", **extra: Any) -> list[dict[str, Any]]:
        return list(await self._do(_core.search_op(pattern, path, extra)))
