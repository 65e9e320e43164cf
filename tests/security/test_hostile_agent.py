"""The hostile agent. The agent runs as a user of its own, out of reach of the code in the
sandbox (tests/security/test_identity.py); still, that code tries to kill it, replace it, or
(had it taken it over) answer the supervisor with anything.

1. From inside, as tool calls: kill the agent, every process, PID 1; take its socket or listen
   where the supervisor connects: each is refused. Killed or frozen from outside (the host's
   root, standing in for whatever else could), the agent leaves the sandbox lost or broken: the
   supervisor stays up, reports it, and the next call recreates it with its workspace; no
   listener of the sandbox's ever hears from the supervisor.
2. An attacker speaking the agent protocol: the real `stockade serve` adopts a sandbox whose
   agent socket the test (root) replaced with a gRPC server of its own (the framed socket
   removed: calls go over gRPC to it), which answers oversized, malformed and out-of-order
   messages; the "framed-" cases put a framed socket of the attacker's beside it, which
   answers the streamed calls with the same messages as frames (and one of a length over
   the limit), as an agent of protocol 3 would; the "typed-" cases are an attacker that
   speaks protocol 4 (framed only, no gRPC socket: greeted on its framed socket, every call
   there) and answers each call with the same messages. Each: a clear error, the supervisor
   alive with bounded memory, the sandbox BROKEN, then recreated by the next call with the
   workspace intact, and the attacker never asked again."""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import socket
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import pytest

from stockade.agent.v1 import agent_pb2
from stockade.client import Output, Sandbox, Stockade, StockadeError, ToolResult
from stockade.supervisor.keys import sandbox_id
from stockade.supervisor.sandboxes.agent_frames import (
    DOWNLOAD,
    HELLO,
    INSPECT,
    UPLOAD,
    WATCH,
)
from stockade.supervisor.sandboxes.agent_frames import (
    STREAM_FLAG as STREAM,
)
from stockade.supervisor.sandboxes.agent_frames import (
    TYPED_FLAG as TYPED,
)
from stockade.supervisor.sandboxes.agent_link import PROTOCOL_VERSION
from tests.integration.harness import Supervisor, running_supervisor

pytestmark = pytest.mark.timeout(600)

MiB = 1024 * 1024
MAX_OUTPUT = MiB
CONFIG = f"[tools]\nmax_output_bytes = {MAX_OUTPUT}\n[housekeeping]\nsweep_interval_s = 3600\n"
"""Caps the attacker's cases are measured against: agent messages over 64 MiB are refused.
No sweep while the cases run: its health probes (Hello, Inspect) would add to what each
attacker hears, more the later its case runs."""
MESSAGE_LIMIT = 64 * MiB
MEMORY_SLACK = 48 * MiB
FLOOD_SLACK = 200 * MiB
"""A flood may fill the bounded queue (64 chunks of at most 1 MiB) and gRPC's windows."""
AGENT_PID = """
import os
agent = next(
    int(pid) for pid in os.listdir("/proc") if pid.isdigit()
    and open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"python3\\0-P\\0-m\\0stockade.agent")
)
"""


def python(box: Sandbox, program: str, timeout: float = 60) -> ToolResult:
    box.write_file("attempt.py", textwrap.dedent(program))
    return box.exec("python3 attempt.py", timeout=timeout)


def alive(sup: Supervisor) -> bool:
    return sup.process is not None and sup.process.poll() is None


def recreated_with_workspace(box: Sandbox, before: str) -> None:
    """The next call runs in a new container that has the old workspace."""
    assert box.read_file("keep.txt") == "kept\n"
    info = box.info()
    assert info.state == "RUNNING", info
    assert info.container_id != before
    assert box.exec("echo fine").stdout == "fine\n"


# 1. From inside the sandbox ------------------------------------------------------------------


@pytest.mark.parametrize(
    "program",
    [
        pytest.param(AGENT_PID + "os.kill(agent, 9)", id="kill-9-agent"),
        pytest.param("import os\nos.kill(-1, 9)", id="kill-9-minus-1"),
    ],
)
def test_killing_the_agent_from_inside_is_refused(
    supervisor: Supervisor, client: Stockade, key: str, program: str
) -> None:
    box = client.sandbox(key)
    box.write_file("keep.txt", "kept\n")
    before, agent = box.info().container_id, agent_host_pid(client, key)
    result = python(box, f"{program}\nprint('after the kill')")
    assert result.error_code != "SANDBOX_LOST", result.for_llm
    if "os.kill(agent" in program:
        assert "PermissionError" in result.stderr, result.for_llm
    assert agent_host_pid(client, key) == agent
    assert box.info().container_id == before
    assert box.exec("echo fine").stdout == "fine\n"
    assert alive(supervisor)


def agent_host_pid(client: Stockade, key: str) -> int:
    """The agent's pid on the host: the only child of the container's init (tini)."""
    init = client.inspect_isolation(key).outside["host_pid"]
    (child,) = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    return int(child)


def test_an_agent_killed_from_outside_loses_the_sandbox_which_comes_back(
    supervisor: Supervisor, client: Stockade, key: str
) -> None:
    box = client.sandbox(key)
    box.write_file("keep.txt", "kept\n")
    box.write_file("attempt.py", "import time\ntime.sleep(30)\n")
    before, agent = box.info().container_id, agent_host_pid(client, key)
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(box.exec, "python3 attempt.py", timeout=60)
        time.sleep(1)
        os.kill(agent, signal.SIGKILL)
        result = call.result(timeout=120)
    assert result.error_code == "SANDBOX_LOST", result.for_llm
    assert "next call recreates it" in result.error_message
    assert alive(supervisor)
    recreated_with_workspace(box, before)


def test_pid_1_cannot_be_killed(supervisor: Supervisor, client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    before = box.ensure().container_id
    box.write_file("kill-init.sh", "kill -9 1; sleep 0.5; echo still here\n")  # past the guard
    result = box.exec("sh kill-init.sh", timeout=30)
    assert result.stdout == "still here\n", result.for_llm
    assert box.info().container_id == before
    assert box.exec("echo fine").stdout == "fine\n"
    assert alive(supervisor)


TAKEOVER = """
import ctypes, errno, os, socket
def attempt(name, act):
    try:
        act()
        print(name, "ALLOWED")
    except OSError as exc:
        print(name, "denied", errno.errorcode.get(exc.errno, exc.errno))
def listen(path):
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen()
RUN = "/run/stockade"
attempt("create a file in the run dir", lambda: open(f"{RUN}/evil", "w"))
attempt("create a directory in the run dir", lambda: os.mkdir(f"{RUN}/evil.d"))
attempt("remove the agent socket", lambda: os.unlink(f"{RUN}/agent.sock"))
attempt("rename the agent socket", lambda: os.rename(f"{RUN}/agent.sock", f"{RUN}/old.sock"))
attempt("move the agent socket out", lambda: os.rename(f"{RUN}/agent.sock", "/tmp/old.sock"))
attempt("symlink in the run dir", lambda: os.symlink("/tmp/evil.sock", f"{RUN}/evil.sock"))
attempt("listen on the agent socket", lambda: listen(f"{RUN}/agent.sock"))
attempt("remove the framed socket", lambda: os.unlink(f"{RUN}/agent.sock.frames"))
attempt("rename the framed socket", lambda: os.rename(f"{RUN}/agent.sock.frames", f"{RUN}/f"))
attempt("listen on the framed socket", lambda: listen(f"{RUN}/agent.sock.frames"))
attempt("listen in the run dir", lambda: listen(f"{RUN}/new.sock"))
attempt("chmod the run dir", lambda: os.chmod(RUN, 0o777))
attempt("move the run dir", lambda: os.rename(RUN, "/tmp/run"))
libc = ctypes.CDLL(None, use_errno=True)
pidfd = libc.syscall(434, agent, 0)  # pidfd_open
stolen = [fd for fd in range(64) if pidfd >= 0 and libc.syscall(438, pidfd, fd, 0) >= 0]
print("steal the agent's descriptors", "ALLOWED" if stolen else "denied")
held = []
for fd in map(int, os.listdir("/proc/self/fd")):
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        continue
    try:
        held.append(s.getsockname())
    except OSError:
        pass
    s.detach()
print("inherit the agent's socket", "ALLOWED" if any("agent" in str(n) for n in held) else "denied")
"""


def test_the_agent_socket_cannot_be_taken_over(
    supervisor: Supervisor, client: Stockade, key: str
) -> None:
    box = client.sandbox(key)
    before = box.ensure().container_id
    result = python(box, AGENT_PID + TAKEOVER)
    lines = result.stdout.splitlines()
    assert len(lines) == 15, result.for_llm
    assert all(" denied" in line for line in lines), [x for x in lines if " denied" not in x]
    assert box.exec("echo fine").stdout == "fine\n"
    assert box.info().container_id == before
    run = supervisor.state_dir / "sandboxes" / sandbox_id(key) / "run"
    assert sorted(p.name for p in run.iterdir()) == ["agent.sock.frames"]


LISTENER = """
import os, socket, sys
for path in ("/run/stockade/agent.sock", "/workspace/agent.sock", "/tmp/agent.sock"):
    try:
        os.unlink(path)
    except OSError:
        pass
    try:
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.listen()
        break
    except OSError:
        continue
open("/workspace/listening", "w").write(path)
while True:
    conn, _ = s.accept()
    open("/workspace/heard", "a").write("a connection\\n")
"""


def test_a_frozen_agent_makes_the_sandbox_broken_and_a_listener_hears_nothing(
    supervisor: Supervisor, client: Stockade, key: str
) -> None:
    """A listener of the sandbox's own waits while the agent is frozen from outside (it cannot
    die: its container would go with it); the supervisor gives up on the agent at the command's
    timeout plus grace, reports the sandbox broken and recreates it; the listener never hears
    from it. From inside, the freeze itself is refused."""
    box = client.sandbox(key)
    box.write_file("keep.txt", "kept\n")
    box.write_file("listener.py", textwrap.dedent(LISTENER))
    started = client.call(key, "process", {"action": "start", "command": "python3 listener.py"})
    assert not started.is_error, started.for_llm
    for _ in range(100):
        if (supervisor.workspace(key) / "listening").exists():
            break
        time.sleep(0.1)
    assert (supervisor.workspace(key) / "listening").read_text() != "/run/stockade/agent.sock"
    before = box.info().container_id
    refused = python(box, AGENT_PID + "os.kill(agent, 19)  # SIGSTOP")
    assert "PermissionError" in refused.stderr, refused.for_llm
    box.write_file("attempt.py", "import time\ntime.sleep(30)\n")
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(box.exec, "python3 attempt.py", timeout=1)
        time.sleep(0.3)
        os.kill(agent_host_pid(client, key), signal.SIGSTOP)
        result = call.result(timeout=120)
    assert result.error_code == "SANDBOX_LOST", result.for_llm
    assert "did not end the command by its timeout" in result.error_message
    assert "marked broken" in result.error_message
    assert box.info().state == "BROKEN"
    assert alive(supervisor)
    recreated_with_workspace(box, before)
    assert not (supervisor.workspace(key) / "heard").exists()


# 2. An attacker speaking the agent protocol --------------------------------------------------


class Active(Protocol):
    """What an answer asks of its call: a gRPC context, or a framed connection's."""

    def is_active(self) -> bool: ...


Answer = Callable[[Active], Iterator[bytes]]


def reply(**fields: Any) -> bytes:
    return bytes(agent_pb2.InvokeResponse(**fields).SerializeToString())


def result(data: Any) -> bytes:
    return reply(result_json=data if isinstance(data, str) else json.dumps(data))


def event(**fields: Any) -> bytes:
    return bytes(agent_pb2.InvokeEvent(**fields).SerializeToString())


def started(pid: int = 7) -> bytes:
    return event(started=agent_pb2.Started(pid=pid))


def output(data: bytes, fd: int = 1) -> bytes:
    return event(output=agent_pb2.Output(fd=fd, data=data))


def done() -> bytes:
    return event(result=agent_pb2.InvokeResponse(result_json=json.dumps(EXEC_OK)))


def watch_event(**fields: Any) -> bytes:
    return bytes(agent_pb2.WatchEvent(**fields).SerializeToString())


def watch_started() -> bytes:
    return watch_event(started=agent_pb2.WatchStarted(path="."))


def watch_change(kind: int = agent_pb2.FILE_CHANGE_KIND_CREATE, name: str = "f") -> bytes:
    return watch_event(change=agent_pb2.FileChange(kind=kind, name=name))  # type: ignore[arg-type]


def nested(depth: int) -> Any:
    return [nested(depth - 1)] if depth else 0


EXEC_OK = {"exit_code": 0, "stdout": "", "stderr": "", "timed_out": False, "duration_ms": 1}


def once(message: bytes) -> Answer:
    return lambda _context: iter([message])


def seq(*messages: bytes) -> Answer:
    return lambda _context: iter(messages)


def flood_then_silence(context: Active) -> Iterator[bytes]:
    """1 MiB chunks as fast as the supervisor takes them for 3 s, then nothing, never a result."""
    yield started()
    chunk = output(b"x" * MiB)
    until = time.monotonic() + 3
    while context.is_active() and time.monotonic() < until:
        yield chunk
    while context.is_active():
        time.sleep(0.1)


UNDECODABLE = "not a valid protobuf (UTF-8) message"
TYPED_NAMES = {UPLOAD: "Upload", DOWNLOAD: "Download", WATCH: "WatchFiles"}


@dataclass(frozen=True)
class Case:
    call: str
    """exec (Invoke), stream (InvokeStream), download, upload, watch (WatchFiles) or hello."""
    answer: Answer
    expect: str
    """In the error; "" for a Hello refused, after which the call succeeds on a new container."""
    framed: bool = False
    """The stream goes to the attacker's framed socket (its Hello says protocol 3)."""
    typed: bool = False
    """The attacker speaks protocol 4: every call, Hello first, on its framed socket."""


# fmt: off
CASES = {
    "oversized": Case("exec", lambda _c: iter([result({"stdout": "x" * (MESSAGE_LIMIT + MiB)})]),
                      "RESOURCE_EXHAUSTED"),
    "not-protobuf": Case("exec", once(b"\xff\xff\xff\xff"), UNDECODABLE),
    "invalid-utf8": Case("exec", once(b"\x08\x03\x12\x02\xff\xfe"), UNDECODABLE),
    "stream-not-protobuf": Case("stream", seq(started(), b"\xff\xff\xff\xff", done()),
                                UNDECODABLE),
    "not-json": Case("exec", once(result("{'exit_code': 0")), "not JSON"),
    "json-list": Case("exec", once(result("[0]")), "not a JSON object but list"),
    "json-nan": Case("exec", once(result('{"exit_code": NaN}')), "NaN is not JSON"),
    "json-infinite": Case("exec", once(result('{"duration_ms": 1e999}')), "not finite"),
    "json-deep": Case("exec", once(result('{"a":' + "[" * 200_000 + "]" * 200_000 + "}")),
                      "nested too deeply"),
    "json-deeper-than-results": Case("exec", once(result({"a": nested(17)})), "deeper than 16"),
    "huge-exit-code": Case("exec", once(result({**EXEC_OK, "exit_code": 2**80})), "64 bits"),
    "exit-code-type": Case("exec", once(result({**EXEC_OK, "exit_code": "0"})),
                           "'exit_code' of type str"),
    "stdout-type": Case("exec", once(result({**EXEC_OK, "stdout": {"a": 1}})),
                        "'stdout' of type dict"),
    "stdout-over-cap": Case("exec", once(result({**EXEC_OK, "stdout": "x" * (MAX_OUTPUT + 1)})),
                            "over the cap"),
    "unknown-error-code": Case("exec", once(reply(error_code=99, error_message="x")),
                               "unknown error code 99"),
    "empty-reply": Case("exec", once(reply()), "neither a result nor an error"),
    "started-twice": Case("stream", seq(started(), output(b"a"), started(), done()),
                          "Started twice"),
    "bad-pid": Case("stream", seq(started(pid=2**31), done()), "Started with pid"),
    "bad-fd": Case("stream", seq(started(), output(b"a", fd=7), done()), "output for fd 7"),
    "big-chunk": Case("stream", seq(started(), output(b"a" * (2 * MiB)), done()),
                      "a chunk of 2097152 bytes"),
    "empty-event": Case("stream", seq(started(), event(), done()), "empty event"),
    "no-result": Case("stream", seq(started(), output(b"a")), "ended without a result"),
    "flood-and-never-end": Case("stream", flood_then_silence, "did not end the command"),
    "download-not-protobuf": Case("download", once(b"\x0a\x09"), UNDECODABLE),
    "download-empty-chunk": Case("download", once(b""), "empty download chunk"),
    "download-no-result": Case("download", seq(bytes(agent_pb2.DownloadChunk(data=b"a")
                                                     .SerializeToString())),
                               "download ended without a result"),
    "download-bad-size": Case("download", once(bytes(agent_pb2.DownloadChunk(
        result=agent_pb2.InvokeResponse(result_json='{"path": "x", "files": "many"}'))
        .SerializeToString())), "'files' of type str"),
    "upload-bad-size": Case("upload", once(result({"path": "x", "size": -1})),
                            "'size' out of range"),
    "watch-change-first": Case("watch", seq(watch_change()), "out of order"),
    "watch-bad-kind": Case("watch", seq(watch_started(), watch_change(kind=99)), "of kind 99"),
    "watch-long-name": Case("watch", seq(watch_started(), watch_change(name="x" * 5000)),
                            "a name of 5000 characters"),
    "watch-no-result": Case("watch", seq(watch_started()), "watch ended without a result"),
    "hello-other-protocol": Case("hello", once(b""), ""),
}
CASES.update({
    f"framed-{name}": Case("stream", case.answer, case.expect, framed=True)
    for name, case in list(CASES.items())
    # a framed stream that just ends is a connection lost (as an agent killed mid-call),
    # which the supervisor diagnoses by asking Hello again: tests/unit/test_agent_frames_stream
    if case.call == "stream" and name != "no-result"
})
CASES["framed-oversized-event"] = Case(
    "stream", seq(started(), output(b"x" * (MESSAGE_LIMIT + MiB))), "RESOURCE_EXHAUSTED", True
)
CASES.update({
    f"typed-{name}": Case(case.call, case.answer, case.expect, typed=True)
    for name, case in list(CASES.items())
    # a framed stream that just ends is a connection lost, and a watch that says nothing
    # more is one without changes yet (above)
    if not name.startswith("framed-") and not name.endswith("no-result")
})
CASES["typed-hello-not-protobuf"] = Case("hello", once(b"\xff\xff\xff\xff"), "", typed=True)
CASES["typed-hello-oversized"] = Case("hello", once(b"x" * (MESSAGE_LIMIT + MiB)), "", typed=True)
CASES["typed-oversized-event"] = Case(
    "stream", seq(started(), output(b"x" * (MESSAGE_LIMIT + MiB))), "RESOURCE_EXHAUSTED",
    typed=True,
)
# fmt: on


class FramedConnection:
    """An attacker's framed connection, active until the supervisor closes it."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn

    def is_active(self) -> bool:
        readable, _, _ = select.select([self.conn], [], [], 0)
        return not readable or self.conn.recv(1, socket.MSG_PEEK) != b""


@dataclass
class Attacker:
    """A gRPC server on the sandbox's agent socket that answers as its case says."""

    case: Case
    calls: list[str] = field(default_factory=list)
    server: grpc.Server | None = None
    framed: socket.socket | None = None

    def serve_frames(self, path: Path) -> None:
        """The framed socket: each stream request answered with the case's messages as
        frames, then silence until the supervisor closes the connection."""
        self.framed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.framed.bind(str(path))
        self.framed.listen()
        threading.Thread(target=self._accept, args=(self.framed,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # stopped
                return
            threading.Thread(target=self._frames, args=(conn,), daemon=True).start()

    def _frames(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the supervisor closed or reset it
            self._frame_calls(conn)

    def _frame_calls(self, conn: socket.socket) -> None:
        while True:
            header = conn.recv(4, socket.MSG_WAITALL)
            if len(header) < 4:
                return
            size = int.from_bytes(header, "big")
            if size & TYPED and not self.case.typed:
                return  # as an agent of protocol 3: a length over its limit, closed
            body = conn.recv(size & ~(STREAM | TYPED), socket.MSG_WAITALL)
            if size & TYPED and body[:1] == bytes([HELLO]):
                try:
                    conn.sendall(self._framed_hello(conn))
                except OSError:  # the supervisor gave up on an oversized one
                    return
                continue  # the connection serves the next call, as the agent's does
            if size & TYPED and body[:1] == bytes([INSPECT]):
                return  # the health probe's facts: unanswered, as over gRPC (no Inspect)
            name = "FramedStream" if size & STREAM else "FramedInvoke"
            if size & TYPED:
                name = f"Framed{TYPED_NAMES[body[0]]}"
            self.calls.append(name)
            try:
                if name == "FramedUpload":  # its chunks, to the empty frame
                    while chunk := int.from_bytes(conn.recv(4, socket.MSG_WAITALL), "big"):
                        conn.recv(chunk, socket.MSG_WAITALL)
                for message in self.case.answer(FramedConnection(conn)):
                    conn.sendall(len(message).to_bytes(4, "big") + message)
                while conn.recv(65536):
                    pass
            except OSError:
                pass
            return

    def _framed_hello(self, conn: socket.socket) -> bytes:
        """Hello's answer, as a frame (recorded as Hello, by _hello or here)."""
        if self.case.call == "hello" and self.case.typed:
            message = next(self.case.answer(FramedConnection(conn)))
            if message != b"":
                self.calls.append("Hello")
                return len(message).to_bytes(4, "big") + message
        message = self._hello(b"", None)
        return len(message).to_bytes(4, "big") + message

    def serve(self, socket_path: Path) -> None:
        unary = grpc.unary_unary_rpc_method_handler
        streamed = grpc.unary_stream_rpc_method_handler
        handlers = {
            "Hello": unary(self._hello),
            "Invoke": unary(self._unary("Invoke")),
            "InvokeStream": streamed(self._stream("InvokeStream")),
            "Download": streamed(self._stream("Download")),
            "WatchFiles": streamed(self._stream("WatchFiles")),
            "Upload": grpc.stream_unary_rpc_method_handler(self._upload),
        }
        generic = grpc.method_handlers_generic_handler("stockade.agent.v1.AgentService", handlers)
        limit = 256 * MiB
        options = [
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
        ]
        self.server = grpc.server(ThreadPoolExecutor(max_workers=4), options=options)
        self.server.add_generic_rpc_handlers((generic,))
        self.server.add_insecure_port(f"unix:{socket_path}")
        self.server.start()

    def _hello(self, _request: bytes, _context: grpc.ServicerContext | None) -> bytes:
        self.calls.append("Hello")
        right = PROTOCOL_VERSION  # the supervisor's; the "hello" case answers another
        version = right + 1 if self.case.call == "hello" else right
        return bytes(agent_pb2.HelloResponse(protocol_version=version).SerializeToString())

    def _unary(self, name: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def answer(_request: bytes, context: grpc.ServicerContext) -> bytes:
            self.calls.append(name)
            return next(self.case.answer(context))

        return answer

    def _stream(self, name: str) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
        def answer(_request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            self.calls.append(name)
            yield from self.case.answer(context)

        return answer

    def _upload(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        self.calls.append("Upload")
        for _ in requests:
            pass
        return next(self.case.answer(context))


@dataclass
class Hostile:
    sup: Supervisor
    keys: dict[str, tuple[str, str]]
    """Case name: (sandbox key, container id before the takeover)."""
    attackers: dict[str, Attacker]


@pytest.fixture(scope="module")
def hostile(engine: str) -> Iterator[Hostile]:
    """One sandbox per case; then, with the supervisor stopped, the test (root) replaces each
    sandbox's agent socket with an attacker; the restarted supervisor adopts them all."""
    with running_supervisor(engine, CONFIG) as sup:
        keys = {}
        with sup.client() as client:
            for name in CASES:
                key = f"hostile-{name}-{uuid.uuid4().hex[:6]}"
                box = client.sandbox(key)
                box.write_file("keep.txt", "kept\n")
                keys[name] = (key, box.info().container_id)
        sup.stop()
        attackers = {name: Attacker(case) for name, case in CASES.items()}
        for name, attacker in attackers.items():
            socket_path = sup.state_dir / "sandboxes" / sandbox_id(keys[name][0]) / "run"
            # the real agent's framed socket goes: the attacker is all the supervisor reaches
            (socket_path / "agent.sock.frames").unlink()
            if attacker.case.framed or attacker.case.typed:
                attacker.serve_frames(socket_path / "agent.sock.frames")
            if not attacker.case.typed:  # protocol 4 has no gRPC socket
                attacker.serve(socket_path / "agent.sock")
        try:
            sup.start()
            yield Hostile(sup, keys, attackers)
        finally:
            for attacker in attackers.values():
                if attacker.server is not None:
                    attacker.server.stop(None)
                if attacker.framed is not None:
                    attacker.framed.close()


def provoke(client: Stockade, key: str, case: Case, sup: Supervisor, slow: bool) -> tuple[str, int]:
    """Make the call the case answers; its error message and the supervisor's largest RSS
    seen meanwhile. `slow`: read the stream as a slow reader would."""
    if case.call in ("exec", "hello"):
        res = client.sandbox(key).exec("true", timeout=1)
        return ("" if not res.is_error else res.error_message), sup.rss_bytes()
    if case.call == "stream":
        peak = 0
        events = client.call_stream(key, "exec", {"command": "true", "timeout": 1})
        for item in events:
            if isinstance(item, Output) and slow and not peak:
                time.sleep(4)  # a slow reader: the flood must back up, not pile up
                peak = sup.rss_bytes()
            if isinstance(item, ToolResult):
                assert item.is_error
                return item.error_message, max(peak, sup.rss_bytes())
        raise AssertionError("no result")

    def watch() -> None:
        with client.watch_files(key, ".") as events:
            for _ in events:
                pass

    transfer: Callable[[], object] = (
        (lambda: client.download(key, "keep.txt", io.BytesIO()))
        if case.call == "download"
        else watch
        if case.call == "watch"
        else (lambda: client.upload(key, "up.txt", b"data"))
    )
    with pytest.raises(StockadeError) as caught:
        transfer()
    assert caught.value.code == "UNAVAILABLE", caught.value
    assert caught.value.reason == "AGENT_MISBEHAVED", caught.value
    return str(caught.value), sup.rss_bytes()


@pytest.mark.parametrize("name", CASES)
def test_an_attacker_answering_for_the_agent(hostile: Hostile, name: str) -> None:
    case, sup = CASES[name], hostile.sup
    key, before = hostile.keys[name]
    attacker = hostile.attackers[name]
    baseline = sup.rss_bytes()
    with sup.client() as client:
        box = client.sandbox(key)
        flood = name.startswith("flood")
        error, peak = provoke(client, key, case, sup, slow=flood)
        assert alive(sup)
        slack = FLOOD_SLACK if flood else MEMORY_SLACK
        assert peak - baseline < slack, (peak - baseline) / MiB
        if not case.expect:
            assert error == ""
            assert attacker.calls == ["Hello"]
            recreated_with_workspace(box, before)
            return
        assert case.expect in error, error
        assert "marked broken" in error, error
        assert "next call recreates it" in error, error
        assert box.info().state == "BROKEN"
        heard = list(attacker.calls)
        assert heard[0] == "Hello"
        # One call, never retried; besides it only Hello: the call's own readiness check may
        # greet once more before it (seen once on Podman, the channel to the agent gone
        # idle), and the framed flood's slow reader (4 s) may meet the health probe's Hello
        # after it (health.py), which over gRPC the flood clogging the channel keeps from
        # the attacker.
        [called] = [c for c in heard if c != "Hello"]
        at = heard.index(called)
        assert at in (1, 2), heard
        framed_flood = name in ("framed-flood-and-never-end", "typed-flood-and-never-end")
        after = [[], ["Hello"]] if framed_flood else [[]]
        assert heard[at + 1 :] in after, heard
        streamed = case.framed or (case.typed and case.call == "stream")
        assert (called == "FramedStream") == streamed, heard
        assert called.startswith("Framed") == (case.framed or case.typed), heard
        recreated_with_workspace(box, before)
        assert attacker.calls == heard, "the attacker was asked again"
