"""Partial views of a private key on a real sandbox, through the gRPC API: lines of its body
shown without the BEGIN and END lines by `search`, a `read_file` line range, `exec` (`sed -n`,
`grep -v BEGIN`, `head`, `tail`, `cat -n`) and streamed output never reach the client."""

from __future__ import annotations

import json
import random

import pytest

from stockade.client import Output, Stockade, ToolResult
from tests.corpora.generate import fake_key_body, fake_openssh_body, leaked

pytestmark = pytest.mark.timeout(300)
RNG = random.Random()  # a new fake key each run: nothing to remember from the last one
RSA = fake_key_body(RNG, 1170)  # last line 32 characters: too short to be taken alone
OPENSSH = fake_openssh_body(RNG, 1200)  # last line 10 characters
KEYS = {
    "rsa": ("RSA PRIVATE KEY", RSA),
    "openssh": ("OPENSSH PRIVATE KEY", OPENSSH),
}


def pem(label: str, body: list[str]) -> str:
    return f"-----BEGIN {label}-----\n" + "\n".join(body) + f"\n-----END {label}-----\n"


def everything(result: ToolResult) -> str:
    return json.dumps(result.to_dict(), ensure_ascii=False)


def assert_hidden(text: str, body: list[str]) -> None:
    shown = [line for line in body if leaked(line, text)]
    assert shown == [], f"{len(shown)} lines of the key reached the client"
    assert "[REDACTED]" in text


@pytest.fixture(params=sorted(KEYS))
def key_file(request: pytest.FixtureRequest, client: Stockade, key: str) -> list[str]:
    label, body = KEYS[request.param]
    client.sandbox(key).write_file("deploy.pem", pem(label, body))
    return body


def test_search_returns_body_lines_one_by_one(
    client: Stockade, key: str, key_file: list[str]
) -> None:
    result = client.call(key, "search", {"pattern": "^[A-Za-z0-9+/=]{20,}$", "path": "."})
    assert result.error_code in ("", None), result.for_llm
    assert len(result.data["matches"]) >= 5
    assert_hidden(everything(result), key_file)


def test_read_file_line_range(client: Stockade, key: str, key_file: list[str]) -> None:
    result = client.call(key, "read_file", {"path": "deploy.pem", "start_line": 4, "end_line": 12})
    assert_hidden(everything(result), key_file)


@pytest.mark.parametrize(
    "command",
    [
        "sed -n 5,20p deploy.pem",
        "grep -v BEGIN deploy.pem",
        "head -n 8 deploy.pem | tail -n 7",
        "tail -n 3 deploy.pem",
        "cat -n deploy.pem | sed -n 3,9p",
        "grep -n . deploy.pem | sed 1d",
    ],
)
def test_exec_partial_views(client: Stockade, key: str, key_file: list[str], command: str) -> None:
    result = client.sandbox(key).exec(command)
    assert result.exit_code == 0, result.for_llm
    assert_hidden(everything(result), key_file)


def test_streamed_lines_with_pauses(client: Stockade, key: str, key_file: list[str]) -> None:
    """Each line of the body comes 0.2 s after the last, longer than the stream waits, so
    the short last line is released apart from the line before it."""
    command = (
        'grep -v -- ----- deploy.pem | tail -n 4 | while read -r l; do echo "$l"; sleep 0.2; done'
    )
    chunks: list[str] = []
    final: list[ToolResult] = []
    for event in client.call_stream(key, "exec", {"command": command}):
        if isinstance(event, Output):
            chunks.append(event.text)
        elif isinstance(event, ToolResult):
            final.append(event)
    assert len(chunks) >= 2
    assert_hidden("".join(chunks), key_file)
    assert_hidden(everything(final[0]), key_file)


def test_ordinary_base64_and_hashes_stay(client: Stockade, key: str) -> None:
    command = (
        "printf 'hello world, an ordinary fixture' | base64; "
        "printf x | sha256sum; printf x | sha512sum; git --version; "
        "python3 -c 'import uuid; print(uuid.uuid4())'"
    )
    result = client.sandbox(key).exec(command)
    assert result.exit_code == 0, result.for_llm
    assert result.redactions == 0, result.for_llm
