"""No credential leaves the supervisor: listed formats and configured secrets (plain, base64,
URL-encoded) are redacted in every field, and ordinary output is left alone."""

from __future__ import annotations

import base64
import io
import json
import threading
import time

import pytest

from stockade.client import ApprovalRequest, CallContext, Output, Started, Stockade, ToolResult
from tests.integration.harness import Supervisor

pytestmark = pytest.mark.timeout(300)
SECRET = "Zq7-hunter2-s3cr3t-9fX"
ODD_SECRET = "pä$$ w0rd/Zq7+&é!"  # non-ASCII, and characters encoders change
CONFIG = f"""
[sandbox.secrets]
API_KEY = "{SECRET}"
ODD_KEY = "{ODD_SECRET}"
[agents.asker]
approvals = "always"
[approvals]
timeout_s = 20
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


# Channels besides the tool result


def download(c: Stockade, key: str, path: str) -> bytes:
    sink = io.BytesIO()
    c.download(key, path, sink)
    return sink.getvalue()


def test_text_download_with_a_non_ascii_secret(c: Stockade, key: str) -> None:
    """Text downloads were scrubbed as Latin-1, where a UTF-8 secret's bytes never match."""
    c.sandbox(key).exec('printf "odd=%s\\nplain=%s\\n" "$ODD_KEY" "$API_KEY" > both.txt')
    data = download(c, key, "both.txt")
    assert ODD_SECRET.encode() not in data
    assert SECRET.encode() not in data
    assert data == b"odd=[REDACTED]\nplain=[REDACTED]\n"


def test_binary_download_holding_a_configured_secret_is_refused(c: Stockade, key: str) -> None:
    """A file with a NUL in its first 8 KiB passes byte-exact: unless it holds a configured
    secret, which would leave the host as it is."""
    box = c.sandbox(key)
    box.exec("head -c 3000 /dev/urandom > plain.bin; printf 'x\\0y' >> plain.bin")
    assert download(c, key, "plain.bin") == base64.b64decode(
        box.exec("base64 -w0 plain.bin").stdout
    )
    box.exec('{ printf "\\0\\1\\2"; head -c 70000 /dev/zero; echo "$API_KEY"; } > s.bin')
    with pytest.raises(Exception, match="configured secret") as info:
        download(c, key, "s.bin")
    assert SECRET not in str(info.value)


def test_error_messages_of_file_transfers(c: Stockade, key: str) -> None:
    c.sandbox(key).exec("true")
    with pytest.raises(Exception, match="REDACTED") as info:
        download(c, key, f"missing-{SECRET}.txt")
    assert SECRET not in str(info.value)


def streamed(c: Stockade, key: str, command: str) -> tuple[str, ToolResult]:
    chunks, result = streamed_chunks(c, key, command)
    return "".join(chunks), result


def streamed_chunks(c: Stockade, key: str, command: str) -> tuple[list[str], ToolResult]:
    chunks: list[str] = []
    final: list[ToolResult] = []
    for event in c.call_stream(key, "exec", {"command": command}):
        if isinstance(event, Output):
            chunks.append(event.text)
        elif isinstance(event, ToolResult):
            final.append(event)
    return chunks, final[0]


def test_streamed_one_write_is_one_chunk_and_a_token_split_by_a_pause_redacted(
    c: Stockade, key: str
) -> None:
    """StreamExec: one write of a line and an open end is one chunk (issue 28), whole lines
    written at once are one chunk, and a token written in two pieces with a pause between
    (the first piece after whole lines, in one write) comes out redacted. Coreutils' printf:
    bash's builtin writes line by line (stdout line-buffered: `Hello,\n` and `World!` are
    two writes, read as one or two as the machine's load has it)."""
    token = FORMATS["github"]
    command = (
        f"/usr/bin/printf 'Hello,\\nWorld!'; sleep 0.5; "
        f"/usr/bin/printf '\\none\\ntwo\\n'; sleep 0.5; "
        f"printf 'ok\\ntoken {token[:9]}'; sleep 0.5; printf '{token[9:]} done\\n'"
    )
    chunks, result = streamed_chunks(c, key, command)
    assert chunks[:2] == ["Hello,\nWorld!", "\none\ntwo\n"], chunks
    assert "".join(chunks[2:]) == "ok\ntoken [REDACTED] done\n", chunks
    assert_clean(result, token, token[:9])


SLOW = 'import os, sys, time\nfor ch in os.environ["{name}"]:\n'
SLOW += "    sys.{fd}.write(ch); sys.{fd}.flush(); time.sleep(0.02)\n"


@pytest.mark.parametrize("fd", ["stdout", "stderr"])
def test_streamed_secret_written_one_character_at_a_time(c: Stockade, key: str, fd: str) -> None:
    script = SLOW.format(name="API_KEY", fd=fd)
    text, result = streamed(c, key, f"python3 -c '{script}'; echo; echo done")
    assert SECRET not in text
    assert "[REDACTED]" in text
    assert_clean(result, SECRET)


def test_streamed_wrapped_base64_with_pauses_between_lines(c: Stockade, key: str) -> None:
    """`env | base64` wraps at 76 columns; the secret straddles the first break (a 40-byte
    prefix) and each line comes 0.3 s after the last, longer than the stream waits."""
    command = (
        'printf "%040d%s\\n" 0 "$API_KEY" | base64 | while read -r l; do echo "$l"; sleep 0.3; done'
    )
    text, result = streamed(c, key, command)
    plain = base64.b64decode(text.replace("\n", "").replace("[REDACTED]", ""), validate=False)
    assert SECRET.encode() not in plain
    assert "[REDACTED]" in text
    assert result.redactions >= 1


def test_the_approver_sees_no_credential(sup: Supervisor, c: Stockade, key: str) -> None:
    """WatchApprovals and ListApprovals show the command to decide on: with the credential
    in it as [REDACTED]."""
    token = FORMATS["github"]
    c.sandbox(key).exec("true")
    seen: list[str] = []

    def approve() -> None:
        with sup.client() as approver:
            for event in approver.watch_approvals("tester"):
                if isinstance(event, ApprovalRequest):
                    seen.append(json.dumps(event.__dict__, default=str))
                    listed = approver.list_approvals().pending
                    seen.append(json.dumps([p.__dict__ for p in listed], default=str))
                    approver.resolve_approval(event.id, "deny", "tester")
                    return

    watcher = threading.Thread(target=approve)
    watcher.start()
    deadline = time.monotonic() + 30
    while not c.list_approvals().approvers and time.monotonic() < deadline:
        time.sleep(0.05)
    command = f"echo {token} {SECRET}"
    result = c.call(key, "exec", {"command": command}, context=CallContext(agent_id="asker"))
    watcher.join(30)
    assert result.is_error
    assert len(seen) == 2
    for shown in seen:
        assert token not in shown
        assert SECRET not in shown
        assert "[REDACTED]" in shown


def test_audit_of_unparsable_arguments_keeps_no_part_of_a_credential(c: Stockade, key: str) -> None:
    """Arguments that are not JSON are audited as sent, cut to audit.max_arguments_bytes
    (4096): a credential across the cut must not leave a readable piece once the redactions
    before it have made the text shorter."""
    token = FORMATS["github"]
    key_block = "-----BEGIN PRIVATE KEY-----\n" + "A" * 6000 + "\n-----END PRIVATE KEY-----"
    raw = '{"command": "' + key_block + " " * (8192 - len(key_block) - 33) + token + " not json"
    result = c.call(key, "exec", raw)
    assert result.is_error
    records = [r for r in c.list_audit(sandbox_key=key) if r.request_id == result.request_id]
    assert records
    audited = records[0].arguments_json
    assert token[:12] not in audited
    assert "AAAAAAAAAA" not in audited


def test_names_process_output_and_interact(c: Stockade, key: str) -> None:
    """A file named after a secret (list_files), a background process's poll and log, and an
    Interact session that prints the secret base64-encoded in a PTY."""
    box = c.sandbox(key)
    box.exec('mkdir -p d && touch "d/$API_KEY.txt"')
    assert_clean(c.call(key, "list_files", {"path": "d"}), SECRET)
    started = c.call(key, "process", {"action": "start", "command": 'echo "$API_KEY"; sleep 1'})
    ident = started.data["id"]
    time.sleep(0.5)
    for action in ("poll", "log", "list"):
        result = c.call(key, "process", {"action": action, "id": ident})
        text = everything(result)
        assert SECRET not in text, action
    with box.interact('printf "%s" "$ODD_KEY" | base64; echo done', pty=True) as session:
        seen = session.read_until("done")
        result = session.wait()
    assert ODD_SECRET not in seen
    assert base64.b64encode(ODD_SECRET.encode()).decode()[:12] not in seen
    assert "[REDACTED]" in seen
    assert ODD_SECRET not in everything(result)


ODD_FORMS = {
    "plain": "print(s)",
    "json-ascii": "import json; print(json.dumps({'k': s}))",
    "json-slashes": "import json; print(json.dumps(s).replace('/', '\\\\/'))",
    "url-lowercase": "import urllib.parse as u, re\n"
    "print(re.sub('%..', lambda m: m[0].lower(), u.quote(s, safe='')))",
    "url-js": 'import urllib.parse as u; print(u.quote(s, safe="!\'()*~"))',
    "url-plus": "import urllib.parse as u; print(u.quote_plus(s))",
    "html": "import html; print(html.escape(s))",
    "env-base64": "import base64, os\n"
    "env = ''.join(f'{k}={v}\\n' for k, v in sorted(os.environ.items()))\n"
    "print(base64.encodebytes(env.encode()).decode())",
    "base64-offset-1": "import base64; print(base64.b64encode(b'x' + s.encode()).decode())",
    "base64-offset-2": "import base64\n"
    "print(base64.urlsafe_b64encode(b'xy' + s.encode() + b'z').decode())",
}


@pytest.mark.parametrize("form", sorted(ODD_FORMS))
def test_configured_secret_with_odd_characters_in_every_form(
    c: Stockade, key: str, form: str
) -> None:
    script = "import os; s = os.environ['ODD_KEY']\n" + ODD_FORMS[form]
    result = c.sandbox(key).exec("python3 -", stdin=script)
    assert result.exit_code == 0, result.stderr
    assert_clean(result, ODD_SECRET, SECRET)
    assert "w0rd" not in everything(result)
