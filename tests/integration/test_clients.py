"""The clients in other languages (examples/typescript, examples/go), built from proto/ and run
as subprocesses against a real supervisor on TCP, on both engines: what they print must be
what the sandbox did, and the supervisor's audit log must show their calls."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stockade.client import NotFound, Stockade
from stockade.supervisor.calls.lifecycle import LIFECYCLE_TOOLS
from tests.integration.clients_kit import build, missing, node_example
from tests.integration.harness import Supervisor, free_tcp_address, running_supervisor

ROOT = Path(__file__).resolve().parents[2]
TYPESCRIPT = ROOT / "examples" / "typescript"
GO = ROOT / "examples" / "go"
LANGUAGES = ("typescript", "go")
RUN_TIMEOUT_S = 240


@pytest.fixture(scope="session")
def typescript_example() -> list[str]:
    """tsc-compiled from the current sources (types generated from proto/ first)."""
    return node_example(TYPESCRIPT, "@grpc/grpc-js")


@pytest.fixture(scope="session")
def go_example(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Built by build.sh in GOPATH mode, its Go code generated from proto/ by protoc."""
    tools = ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc")
    absent = [t for t in tools if not shutil.which(t)]
    if absent:
        missing(f"not installed: {', '.join(absent)}")
    out = tmp_path_factory.mktemp("go-example")
    build([str(GO / "build.sh"), str(out)], GO)
    return [str(out / "stockade-example")]


@pytest.fixture(params=LANGUAGES)
def example(request: pytest.FixtureRequest) -> tuple[str, list[str]]:
    language = str(request.param)
    return language, request.getfixturevalue(f"{language}_example")


@pytest.fixture(scope="module")
def tcp_supervisor(engine: str) -> Iterator[Supervisor]:
    """On TCP (127.0.0.1), as clients elsewhere reach a supervisor, not on the unix socket
    the other integration tests use."""
    with running_supervisor(engine, listen=free_tcp_address()) as sup:
        yield sup


@pytest.fixture
def tcp_client(tcp_supervisor: Supervisor) -> Iterator[Stockade]:
    with tcp_supervisor.client() as c:
        yield c


def run(argv: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_ADDR"}
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env
    )


def test_example_runs_a_command_and_reads_a_file(
    example: tuple[str, list[str]], tcp_supervisor: Supervisor, tcp_client: Stockade, key: str
) -> None:
    language, argv = example
    key = f"{key}-ü✓"  # UTF-8 keys travel unchanged through every client
    done = run(argv, tcp_supervisor.target, key)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = done.stdout
    # `uname -n` inside the sandbox: its hostname, not this host's.
    assert "$ echo hello from $(uname -n); uname -sm\nhello from sandbox\n" in out
    assert f"{os.uname().sysname} {os.uname().machine}\nexit code 0\n" in out
    assert "streamed:\ntick 1\ntick 2\ntick 3\nexit code 0\n" in out
    content = f"written by example-{language} into {key}\n"
    assert f"wrote notes/hello.txt: {len(content.encode())} bytes\n" in out
    assert f"read notes/hello.txt: {content}" in out
    assert out.endswith("destroyed: container removed true, workspace deleted true\n")
    first = f"sandbox {key}: SANDBOX_STATE_RUNNING on {tcp_supervisor.engine} (container "
    assert out.startswith(first), out

    # The supervisor saw those calls, from this client, and they succeeded; and the
    # sandbox's making and its end, one lifecycle record each (calls/lifecycle.py).
    records = tcp_client.list_audit(sandbox_key=key)
    calls = [r for r in records if r.tool not in LIFECYCLE_TOOLS]
    assert sorted(r.tool for r in calls) == ["exec", "exec", "read_file", "write_file"]
    assert {r.agent_id for r in calls} == {f"example-{language}"}
    changes = sorted((r.tool, r.front) for r in records if r.tool in LIFECYCLE_TOOLS)
    assert changes == [("destroy_sandbox", "grpc"), ("ensure_sandbox", "grpc")]
    assert not any(r.is_error for r in records)
    # ... and it destroyed the sandbox with its workspace.
    with pytest.raises(NotFound):
        tcp_client.get_sandbox(key)
    assert not tcp_supervisor.workspace(key).exists()


def test_example_fails_on_a_tool_error(
    example: tuple[str, list[str]], tcp_supervisor: Supervisor, tcp_client: Stockade, key: str
) -> None:
    """A folder where the example writes its file: write_file's is_error result is an error
    (exit 1, the tool's error code), and the sandbox is still destroyed."""
    _language, argv = example
    assert tcp_client.sandbox(key).exec("mkdir -p notes/hello.txt").exit_code == 0
    done = run(argv, tcp_supervisor.target, key)
    assert done.returncode == 1, done.stdout
    failed = r"error: write_file failed: TOOL_ERROR_CODE_\w+: .+\n"
    assert re.fullmatch(failed, done.stderr), done.stderr
    assert "read notes/hello.txt" not in done.stdout
    assert "destroyed: container removed true" in done.stdout
    with pytest.raises(NotFound):
        tcp_client.get_sandbox(key)


@pytest.mark.parametrize(
    "bad_key",
    ["k" * 257, "é" * 129, "x" * 100_000],  # é: 129 characters, 258 bytes in UTF-8
    ids=["257-bytes", "258-bytes-utf8", "100-kb"],
)
def test_example_fails_on_a_bad_request(
    example: tuple[str, list[str]], tcp_supervisor: Supervisor, bad_key: str
) -> None:
    """A key the supervisor refuses: the gRPC status and its reason reach the user, exit 1."""
    _language, argv = example
    done = run(argv, tcp_supervisor.target, bad_key)
    assert done.returncode == 1
    assert done.stdout == ""
    assert re.fullmatch(
        r"error: EnsureSandbox: (INVALID_ARGUMENT|InvalidArgument): .+ \(INVALID_REQUEST\)\n",
        done.stderr,
    ), done.stderr


def test_example_fails_when_no_supervisor_answers(example: tuple[str, list[str]]) -> None:
    _language, argv = example
    done = run(argv, free_tcp_address(), f"nobody-{uuid.uuid4().hex[:8]}")
    assert done.returncode == 1
    assert done.stdout == ""
    assert re.match(r"error: EnsureSandbox: (UNAVAILABLE|Unavailable): ", done.stderr), done.stderr


def test_example_refuses_extra_arguments(example: tuple[str, list[str]]) -> None:
    _language, argv = example
    done = run(argv, "127.0.0.1:1", "key", "extra")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "usage: " in done.stderr


REFLECT = ROOT / "examples" / "reflection" / "reflect.py"


def reflect(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, str(REFLECT), target], *args)


def json_documents(text: str) -> list[dict[str, Any]]:
    """The JSON objects reflect.py printed one after the other."""
    decoder, documents, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        document, at = decoder.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
        documents.append(document)
    return documents


def test_reflection_lists_the_services(tcp_supervisor: Supervisor) -> None:
    """What grpcurl's `list` shows: everything is described by the server itself."""
    done = reflect(tcp_supervisor.target, "list")
    assert done.returncode == 0, done.stderr
    services = set(done.stdout.split())
    assert {
        "grpc.health.v1.Health",
        "stockade.v1.ApprovalService",
        "stockade.v1.AuditService",
        "stockade.v1.FileService",
        "stockade.v1.SandboxService",
        "stockade.v1.ToolService",
    } <= services
    done = reflect(tcp_supervisor.target, "list", "stockade.v1.ToolService")
    assert done.stdout.split() == [
        f"stockade.v1.ToolService.{m}"
        for m in ("ListTools", "CallTool", "CallToolStream", "Interact")
    ]


def test_reflection_calls_tools(tcp_supervisor: Supervisor, tcp_client: Stockade, key: str) -> None:
    """CallTool and CallToolStream with JSON requests, types learnt through reflection only."""
    target = tcp_supervisor.target
    request = {"sandbox_key": key, "tool": "exec", "arguments_json": '{"command": "echo $((6*7))"}'}
    done = reflect(target, "call", "stockade.v1.ToolService/CallTool", "-d", json.dumps(request))
    assert done.returncode == 0, done.stderr
    [result] = json_documents(done.stdout)
    assert json.loads(result["data_json"])["stdout"] == "42\n"
    assert "is_error" not in result  # false: left out, as protobuf's JSON mapping does

    request["arguments_json"] = json.dumps({"command": "echo one; echo two >&2; echo three"})
    done = reflect(
        target, "call", "stockade.v1.ToolService.CallToolStream", "-d", json.dumps(request)
    )
    assert done.returncode == 0, done.stderr
    events = json_documents(done.stdout)
    assert "result" in events[-1]
    [started] = [e["started"] for e in events if "started" in e]
    assert started["pid"] > 0
    chunks = [e["output"] for e in events if "output" in e]
    stdout = "".join(c["text"] for c in chunks if c["stream"] == "OUTPUT_STREAM_STDOUT")
    assert stdout == "one\nthree\n"
    assert "two\n" in [c["text"] for c in chunks if c["stream"] == "OUTPUT_STREAM_STDERR"]

    done = reflect(
        target,
        "call",
        "stockade.v1.SandboxService/DestroySandbox",
        "-d",
        json.dumps({"key": key, "deleteWorkspace": True}),
    )
    assert json_documents(done.stdout) == [{"removed": True, "workspace_deleted": True}]
    with pytest.raises(NotFound):
        tcp_client.get_sandbox(key)


@pytest.mark.parametrize(
    ("method", "data", "error"),
    [
        ("stockade.v1.Nope/Call", "{}", "error: the server has no service 'stockade.v1.Nope'\n"),
        (
            "stockade.v1.ToolService/Nope",
            "{}",
            "error: service 'stockade.v1.ToolService' has no method 'Nope'\n",
        ),
        ("CallTool", "{}", "error: 'CallTool' is not SERVICE/METHOD\n"),
        (
            "stockade.v1.ToolService/Interact",
            "{}",
            "takes a stream of requests: not supported here\n",
        ),
        ("stockade.v1.ToolService/CallTool", '{"bogus": 1}', 'has no field named "bogus"'),
        ("stockade.v1.ToolService/CallTool", "[1, 2", "does not fit stockade.v1.CallToolRequest"),
        (
            "stockade.v1.ToolService/CallTool",
            '{"sandbox_key": ""}',
            "error: INVALID_ARGUMENT: sandbox key is empty\n",
        ),
        ("stockade.v1.SandboxService/GetSandbox", '{"key": "x"}', "error: NOT_FOUND: "),
    ],
)
def test_reflection_reports_bad_requests(
    tcp_supervisor: Supervisor, method: str, data: str, error: str
) -> None:
    done = reflect(tcp_supervisor.target, "call", method, "-d", data)
    assert done.returncode == 1
    assert done.stdout == ""
    assert error in done.stderr
