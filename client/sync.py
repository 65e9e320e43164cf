"""The blocking client: `Stockade(addr).sandbox("key").exec("ls")`."""

from __future__ import annotations

import os
import queue
from collections.abc import Callable, Iterator, Sequence
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
from stockade.client._quarantine_calls import QuarantineCalls
from stockade.client._snapshot_calls import SnapshotCalls
from stockade.client._snapshots import Restored, SnapshotInfo
from stockade.v1 import (
    approval_pb2,
    sandbox_pb2,
)

T = TypeVar("T")


class Stockade(SnapshotCalls, QuarantineCalls):
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
        channel: grpc.Channel | None = None,
    ) -> None:
        self.target = target or _core.default_target()
        self._own_channel = channel is None
        self._channel = channel or _core.sync_channel(self.target, tls)
        stubs = _core.stubs(self._channel, token)
        self._sandboxes, self._tools, self._files = stubs.sandboxes, stubs.tools, stubs.files
        self._approvals, self._audit, self._quarantine = (
            stubs.approvals,
            stubs.audit,
            stubs.quarantine,
        )

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

    def interact(
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
    ) -> Interaction:
        """Start `command` as a background process (on a terminal with `pty`), or attach to
        the running `process` (its id or name), and talk to it: see Interaction."""
        first = _core.interact_start(
            key, command, process, pty=pty, cols=cols, rows=rows, workdir=workdir, env=env,
            name=name, offset=offset, keep_running=keep_running, context=context,
            request_id=request_id,
        )  # fmt: skip
        return Interaction(self._tools.Interact, first, deadline)

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

    def watch_files(
        self, key: str, path: str, recursive: bool = False, *, context: CallContext | None = None
    ) -> _watch.FileWatch:
        """Watch the folder `path` (with `recursive`, and every folder below it): returns once
        the watch is in place; iterate for events until you close() it."""
        stream = self._files.WatchFiles(_watch.watch_request(key, path, recursive, context))
        return _watch.FileWatch(stream)

    def ensure_sandbox(
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
        return _core.sandbox_from_pb(self._rpc(self._sandboxes.EnsureSandbox, request))

    def get_sandbox(self, key: str) -> SandboxInfo:
        request = sandbox_pb2.GetSandboxRequest(key=key)
        return _core.sandbox_from_pb(self._rpc(self._sandboxes.GetSandbox, request))

    def destroy_sandbox(self, key: str, *, delete_workspace: bool = False) -> bool:
        request = sandbox_pb2.DestroySandboxRequest(key=key, delete_workspace=delete_workspace)
        return bool(self._rpc(self._sandboxes.DestroySandbox, request).removed)

    def list_sessions(self, key: str) -> list[ShellSession]:
        """The sandbox's shell sessions (exec's `session`); none when it has no container."""
        request = sandbox_pb2.ListSessionsRequest(key=key)
        return _core.sessions_from_pb(self._rpc(self._sandboxes.ListSessions, request))

    def end_session(self, key: str, session: str) -> bool:
        """End a shell session (a later call of that name starts afresh); False: none."""
        request = sandbox_pb2.EndSessionRequest(key=key, session=session)
        return bool(self._rpc(self._sandboxes.EndSession, request).ended)

    def pause_sandbox(self, key: str) -> bool:
        """Freeze every process of the sandbox (no CPU, memory kept); False when it was
        paused already. NotFound when the key has no container."""
        request = sandbox_pb2.PauseSandboxRequest(key=key)
        return bool(self._rpc(self._sandboxes.PauseSandbox, request).changed)

    def resume_sandbox(self, key: str) -> bool:
        """Thaw a paused sandbox; False when it was not paused."""
        request = sandbox_pb2.ResumeSandboxRequest(key=key)
        return bool(self._rpc(self._sandboxes.ResumeSandbox, request).changed)

    def inspect_isolation(self, key: str) -> IsolationReport:
        """The sandbox's effective isolation from inside and outside; NotFound when the key
        has no container (this call never creates one)."""
        request = sandbox_pb2.InspectIsolationRequest(key=key)
        return _core.isolation_from_pb(self._rpc(self._sandboxes.InspectIsolation, request))


class Interaction:
    """A live session with a background process (ToolService.Interact).

    `send`, `eof`, `resize` and `signal` go to the process; `read_until` and `events` read
    what it prints; `wait` reads to its end and returns the result (its exit state). Leaving
    the `with` block (or `close`) detaches, killing a process this session started unless
    keep_running. Read from one thread; input may come from any."""

    def __init__(self, method: Callable[..., Any], first: Any, deadline: float | None) -> None:
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._requests.put(first)
        self._input_open = True
        self._stream = method(self._outgoing(), timeout=deadline)
        self._events = self._incoming()
        self._buffer = _core.OutputBuffer()

    def __enter__(self) -> Interaction:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _outgoing(self) -> Iterator[Any]:
        while (message := self._requests.get()) is not None:
            yield message

    def _incoming(self) -> Iterator[StreamEvent]:
        try:
            for message in self._stream:
                event = _core.stream_event_from_pb(message)
                self._buffer.add(event)
                yield event
        except grpc.RpcError as exc:
            raise _core.error_from_rpc(exc) from None

    def _put(self, message: Any) -> None:
        if not self._input_open:
            raise ValueError("the input side of this session is closed")
        self._requests.put(message)

    def send(self, data: bytes | str) -> None:
        """Bytes (or text, as UTF-8) for the process's stdin."""
        self._put(_core.stdin_message(data))

    def eof(self) -> None:
        """Close the process's stdin (on a terminal: type ^D)."""
        self._put(_core.eof_message())

    def resize(self, cols: int, rows: int) -> None:
        self._put(_core.resize_message(cols, rows))

    def signal(self, name: str) -> None:
        """Signal the process group: TERM, KILL, INT, HUP, QUIT, USR1 or USR2."""
        self._put(_core.signal_message(name))

    def close_input(self) -> None:
        """No more input; the output goes on until the process exits."""
        if self._input_open:
            self._input_open = False
            self._requests.put(None)

    def events(self) -> Iterator[StreamEvent]:
        """The events not read yet: Started, ApprovalPending, Output chunks, the result last."""
        yield from self._events

    @property
    def started(self) -> _core.Started:
        """The Started event (pid, process_id); reads until it comes."""
        while self._buffer.started is None:
            if next(self._events, None) is None:
                raise _core.ToolError(self._require_result())
        return self._buffer.started

    def read_until(self, marker: str) -> str:
        """Output up to and including `marker`, reading until it appears; EOFError if the
        process ends first."""
        while (text := self._buffer.take_until(marker)) is None:
            if next(self._events, None) is None:
                raise EOFError(f"the session ended before {marker!r}: {self._buffer.text!r}")
        return text

    def wait(self) -> ToolResult:
        """Read to the end: the result (error if the process exited non-zero)."""
        for _ in self._events:
            pass
        return self._require_result()

    @property
    def output(self) -> str:
        """Output read but not yet returned by read_until (taken by reading it)."""
        return self._buffer.take_all()

    def _require_result(self) -> ToolResult:
        if self._buffer.result is None:
            raise _core.StockadeError("the session ended without a result")
        return self._buffer.result

    def close(self) -> None:
        self.close_input()
        self._stream.cancel()


class Sandbox:
    """One sandbox key. Helpers other than call() and exec() raise ToolError on failure."""

    def __init__(self, client: Stockade, key: str) -> None:
        self.client = client
        self.key = key

    def call(
        self, tool: str, arguments: dict[str, Any] | str | None = None, **kw: Any
    ) -> ToolResult:
        return self.client.call(self.key, tool, arguments, **kw)

    def ensure(
        self,
        *,
        network: str | None = None,
        allow: Sequence[str] | None = None,
        profile: str | None = None,
    ) -> SandboxInfo:
        return self.client.ensure_sandbox(self.key, network=network, allow=allow, profile=profile)

    def info(self) -> SandboxInfo:
        return self.client.get_sandbox(self.key)

    def isolation(self) -> IsolationReport:
        return self.client.inspect_isolation(self.key)

    def destroy(self, *, delete_workspace: bool = False) -> bool:
        return self.client.destroy_sandbox(self.key, delete_workspace=delete_workspace)

    def sessions(self) -> list[ShellSession]:
        return self.client.list_sessions(self.key)

    def end_session(self, session: str) -> bool:
        return self.client.end_session(self.key, session)

    def pause(self) -> bool:
        return self.client.pause_sandbox(self.key)

    def resume(self) -> bool:
        return self.client.resume_sandbox(self.key)

    def snapshot(self, name: str = "", *, include_tmp: bool = False) -> SnapshotInfo:
        """A snapshot of this sandbox's files (see Stockade.snapshot_sandbox)."""
        return self.client.snapshot_sandbox(self.key, name, include_tmp=include_tmp)

    def restore(self, snapshot: str) -> Restored:
        """Replace this sandbox's files with the snapshot's; its container is re-created."""
        return self.client.restore_sandbox(self.key, snapshot)

    def fork(self, *new_keys: str, include_tmp: bool = False) -> list[Sandbox]:
        """New sandboxes with this one's files as they are now, one per key (all new);
        handles to them on the same client."""
        forked = self.client.fork_sandbox(self.key, new_keys, include_tmp=include_tmp)
        return [self.client.sandbox(s.key) for s in forked.sandboxes]

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
        stdin: str | None = None,
        session: str | None = None,
    ) -> ToolResult:
        """Run a shell command (`stdin`: its whole input, then closed); a non-zero exit is a
        result (see .exit_code), not an error. `session`: a shell session's name, whose
        folder, exported environment, options and aliases carry over between its calls."""
        return self._do(_core.exec_op(command, timeout, workdir, env, stdin, session))  # type: ignore[no-any-return]

    def interact(self, command: str | None = None, **kw: Any) -> Interaction:
        """Stockade.interact for this sandbox."""
        return self.client.interact(self.key, command, **kw)

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
