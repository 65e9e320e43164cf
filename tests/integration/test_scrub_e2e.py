"""No credential leaves the supervisor: listed formats and configured secrets (plain, base64,
URL-encoded) are redacted in every field, and ordinary output is left alone."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from stockade.client import Started, Stockade, ToolResult
from tests.integration.harness import Supervisor, running_supervisor

pytestmark = pytest.mark.timeout(300)
SECRET = "Zq7-hunter2-s3cr3t-9fX"
CONFIG = f"""
[sandbox.secrets]
API_KEY = "{SECRET}"
[limits]
max_concurrent = 1
max_queued = 0
"""
FORMATS = {
    "anthropic": "sk-ant-api03-" + "A1b2C3d4E5f6G7h8I9j0" * 3,
    "openai": "sk-proj-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2",
    "github": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "aws": "AKIA" + "Q3EXAMPLE7ZXCVB2",
    "slack": "xoxb-123456789012-1234567890123-" + "AbCdEfGhIjKlMnOpQrStUvWx",
    "stripe": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "google": "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
    + "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "url": "postgres://app:" + "Tr0ub4dor-and-3" + "@db.internal:5432/x",
}


@pytest.fixture(scope="module")
def sup(engine: str) -> Iterator[Supervisor]:
    with running_supervisor(engine, extra_config=CONFIG) as s:
        yield s


@pytest.fixture
def c(sup: Supervisor) -> Iterator[Stockade]:
    with sup.client() as client:
        yield client


def everything(result: ToolResult) -> str:
    return json.dumps(result.to_dict(), ensure_ascii=False)


def assert_clean(result: ToolResult, *secrets: str) -> None:
    text = everything(result)
    for secret in secrets:
        assert secret not in text
    assert "[REDACTED]" in text
    assert result.redactions >= 1


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_listed_formats_never_reach_the_client(c: Stockade, key: str, name: str) -> None:
    secret = FORMATS[name]
    result = c.sandbox(key).exec(f"echo 'found: {secret}'; echo '{secret}' >&2; exit 3")
    assert_clean(result, secret)
    assert result.stdout.startswith("found: ")


@pytest.mark.parametrize(
    "command",
    [
        'echo "$API_KEY"',
        'printf %s "$API_KEY" | base64',
        'printf %s "$API_KEY" | base64 | tr "+/" "-_" | tr -d =',
        "python3 -c 'import os, urllib.parse as u; print(u.quote(os.environ[\"API_KEY\"]))'",
        "env | grep API_KEY",
        'echo "$API_KEY" >&2; false',
    ],
)
def test_configured_secret_in_every_form(c: Stockade, key: str, command: str) -> None:
    result = c.sandbox(key).exec(command)
    assert_clean(result, SECRET)


def test_secret_in_error_messages_and_files(c: Stockade, key: str) -> None:
    box = c.sandbox(key)
    box.exec('echo "token=$API_KEY" > conf.env')
    result = c.call(key, "read_file", {"path": "conf.env"})
    assert_clean(result, SECRET)
    missing = c.call(key, "read_file", {"path": f"{SECRET}.txt"})
    assert missing.error_code == "FILE_NOT_FOUND"
    assert_clean(missing, SECRET)
    found = c.call(key, "search", {"pattern": "token"})
    assert_clean(found, SECRET)
    audit = json.dumps([r.__dict__ for r in c.list_audit(sandbox_key=key)], default=str)
    assert SECRET not in audit


def test_ordinary_output_is_left_alone(c: Stockade, key: str) -> None:
    ordinary = [
        "ls -la /usr/bin | head -40",
        "git --version",
        "cat /etc/os-release",
        "python3 -c 'import uuid; print(uuid.uuid4())'",
        "printf x | sha256sum",
        "ps aux",
        "git init -q r && cd r",
        "git -c user.email=dev@example.com -c user.name=dev commit -q --allow-empty -m init",
        "git log --format=%H",
    ]
    result = c.sandbox(key).exec(" && ".join(ordinary))
    assert result.exit_code == 0, result.for_llm
    assert result.redactions == 0, result.for_llm
    assert "[REDACTED]" not in everything(result)


def test_concurrency_cap_refuses_past_the_queue(sup: Supervisor, c: Stockade, key: str) -> None:
    c.sandbox(key).exec("true")
    running = threading.Event()
    results: list[ToolResult] = []

    def slow() -> None:
        with sup.client() as other:
            for event in other.call_stream(key, "exec", {"command": "sleep 3; echo slept"}):
                if isinstance(event, Started):
                    running.set()  # it holds the only slot now
                elif isinstance(event, ToolResult):
                    results.append(event)

    worker = threading.Thread(target=slow)
    worker.start()
    assert running.wait(30)
    blocked = c.sandbox(key).exec("echo second")
    worker.join()
    assert blocked.error_code == "RATE_LIMITED"
    assert "1 at once, 0 queued" in blocked.error_message
    assert results[0].stdout == "slept\n"
