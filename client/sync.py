"""The blocking client: `Stockade(addr).sandbox("key").exec("ls")`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, BinaryIO, TypeVar

import grpc

from stockade.client import _core
from stockade.client._core import (
    ApprovalClosed,
    ApprovalRequest,
    Approvals,
    AuditRecord,
    CallContext,
    FileInfo,
    SandboxInfo,
    StreamEvent,
    ToolResult,
    ToolSpec,
)
from stockade.v1 import (
    approval_pb2,
    approval_pb2_grpc,
    audit_pb2_grpc,
    file_pb2_grpc,
    sandbox_pb2,
    sandbox_pb2_grpc,
    tool_pb2_grpc,
)

T = TypeVar("T")


class Stockade:
    """A connection to a Stockade supervisor.

    `target` is host:port or unix:/path (default: $STOCKADE_ADDR, else 127.0.0.1:50051).
    Pass `channel` to use a channel of your own (tests, TLS, interceptors)."""

    def __init__(self, target: str | None = None, *, channel: grpc.Channel | None = None) -> None:
        self.target = target or _core.default_target()
        self._own_channel = channel is None
        self._channel = channel or grpc.insecure_channel(self.target, _core.CHANNEL_OPTIONS)
        self._sandboxes = sandbox_pb2_grpc.SandboxServiceStub(self._channel)
        self._tools = tool_pb2_grpc.ToolServiceStub(self._channel)
        self._approvals = approval_pb2_grpc.ApprovalServiceStub(self._channel)
        self._audit = audit_pb2_grpc.AuditServiceStub(self._channel)
        self._files = file_pb2_grpc.FileServiceStub(self._channel)

    def __enter__(self) -> Stockade:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._own_channel:
            self._channel.close()

    def _rpc(self, method: Callable[..., T], request: Any, timeout: float | None = None) -> T:
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise _core.error_from_rpc(exc) from None

    def sandbox(self, key: str) -> Sandbox:
        return Sandbox(self, key)

    def list_sandboxes(self) -> list[SandboxInfo]:
        reply = self._rpc(self._sandboxes.ListSandboxes, sandbox_pb2.ListSandboxesRequest())
        return [_core.sandbox_from_pb(s) for s in reply.sandboxes]

    def list_tools(
        self, format: str = "json", context: CallContext | None = None
    ) -> list[ToolSpec]:
        """The tools policy allows for `context`, declared in `format` (json, openai,
        anthropic or gemini)."""
        request = _core.list_tools_request(format, context)
        reply = self._rpc(self._tools.ListTools, request)
        return [_core.tool_from_pb(t) for t in reply.tools]

    def list_approvals(self) -> Approvals:
        """Pending requests, commands approved with allow-always, approvers connected."""
        request = approval_pb2.ListApprovalsRequest()
        return _core.approvals_from_pb(self._rpc(self._approvals.ListApprovals, request))

    def watch_approvals(self, approver: str = "") -> Iterator[ApprovalRequest | ApprovalClosed]:
        """Pending requests, then each new request and each close, until you stop iterating."""
        request = approval_pb2.WatchApprovalsRequest(approver=approver)
        stream = self._approvals.WatchApprovals(request)
        try:
            for event in stream:
                yield _core.event_from_pb(event)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise _core.error_from_rpc(exc) from None
        finally:
            stream.cancel()

    def resolve_approval(self, approval_id: str, decision: str, approver: str = "") -> None:
        """decision: allow-once, allow-always or deny."""
        request = _core.resolve_request(approval_id, decision, approver)
        self._rpc(self._approvals.ResolveApproval, request)

    def list_audit(
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
        reply = self._rpc(self._audit.ListAudit, request)
        return [_core.audit_from_pb(r) for r in reply.records]

    def call(
        self,
        key: str,
        tool: str,
        arguments: dict[str, Any] | str | None = None,
        *,
        timeout: float | None = None,
        context: CallContext | None = None,
        request_id: str = "",
        deadline: float | None = None,
    ) -> ToolResult:
        """Call a tool; a tool failure is a result with is_error, not an exception.

        `timeout` (s) bounds the call on the server (a timed-out command still returns its
        partial output); `deadline` (s) is the client's own gRPC deadline: when it passes the
        call is cancelled, and so are its process and any approval request it waits on."""
        request = _core.call_request(
            key,
            tool,
            arguments,
            timeout_ms=int(timeout * 1000) if timeout else 0,
            context=context,
            request_id=request_id,
        )
        return _core.result_from_pb(self._rpc(self._tools.CallTool, request, deadline))

    def call_stream(
        self,
        key: str,
        tool: str,
        arguments: dict[str, Any] | str | None = None,
        *,
        timeout: float | None = None,
        context: CallContext | None = None,
        request_id: str = "",
        deadline: float | None = None,
    ) -> Iterator[StreamEvent]:
        """Call a tool and follow it: Started, Output chunks as they are produced,
        ApprovalPending while a human decides, and the ToolResult last. Stopping early
        (closing the iterator) cancels the call and kills its process group."""
        request = _core.call_request(
            key,
            tool,
            arguments,
            timeout_ms=int(timeout * 1000) if timeout else 0,
            context=context,
            request_id=request_id,
        )
        stream = self._tools.CallToolStream(request, timeout=deadline)
        try:
            for event in stream:
                yield _core.stream_event_from_pb(event)
        except grpc.RpcError as exc:
            raise _core.error_from_rpc(exc) from None
        finally:
            stream.cancel()

    def upload(
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
        return _core.info_from_pb(self._rpc(self._files.UploadFile, requests))

    def download(
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
            for chunk in stream:
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

    def ensure_sandbox(self, key: str) -> SandboxInfo:
        request = sandbox_pb2.EnsureSandboxRequest(key=key)
        return _core.sandbox_from_pb(self._rpc(self._sandboxes.EnsureSandbox, request))

    def get_sandbox(self, key: str) -> SandboxInfo:
        request = sandbox_pb2.GetSandboxRequest(key=key)
        return _core.sandbox_from_pb(self._rpc(self._sandboxes.GetSandbox, request))

    def destroy_sandbox(self, key: str, *, delete_workspace: bool = False) -> bool:
        request = sandbox_pb2.DestroySandboxRequest(key=key, delete_workspace=delete_workspace)
        return bool(self._rpc(self._sandboxes.DestroySandbox, request).removed)


class Sandbox:
    """One sandbox key. Helpers other than call() and exec() raise ToolError on failure."""

    def __init__(self, client: Stockade, key: str) -> None:
        self.client = client
        self.key = key

    def call(
        self, tool: str, arguments: dict[str, Any] | str | None = None, **kw: Any
    ) -> ToolResult:
        return self.client.call(self.key, tool, arguments, **kw)

    def ensure(self) -> SandboxInfo:
        return self.client.ensure_sandbox(self.key)

    def info(self) -> SandboxInfo:
        return self.client.get_sandbox(self.key)

    def destroy(self, *, delete_workspace: bool = False) -> bool:
        return self.client.destroy_sandbox(self.key, delete_workspace=delete_workspace)

    def _do(self, op: _core.Op) -> Any:
        tool, args, finish = op
        return finish(self.call(tool, args))

    def exec(
        self,
        command: str,
        *,
        timeout: float | None = None,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ToolResult:
        """Run a shell command; a non-zero exit is a result (see .exit_code), not an error."""
        return self._do(_core.exec_op(command, timeout, workdir, env))  # type: ignore[no-any-return]

    def read_file(
        self, path: str, *, start_line: int | None = None, end_line: int | None = None
    ) -> str:
        return str(self._do(_core.read_file_op(path, start_line, end_line)))

    def write_file(self, path: str, content: str) -> None:
        self._do(_core.write_file_op(path, content))

    def edit_file(self, path: str, old_text: str, new_text: str) -> None:
        self._do(_core.edit_file_op(path, old_text, new_text))

    def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        return list(self._do(_core.list_files_op(path)))

    def glob(self, pattern: str, path: str = ".") -> list[str]:
        return list(self._do(_core.glob_op(pattern, path)))

    def search(self, pattern: str, path: str = ".", **extra: Any) -> list[dict[str, Any]]:
        return list(self._do(_core.search_op(pattern, path, extra)))
