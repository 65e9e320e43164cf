"""The E2B front's process service through the real `stockade serve` on both engines, driven
by the unmodified e2b SDK (sync and async): commands.run in the foreground with on_stdout and
on_stderr streaming, env vars from create and from the call, cwd, a non-zero exit raising the
SDK's CommandExitException, a timeout, a background command killed, stdin through send_stdin
and close_stdin (one write echoed is one chunk), commands.list and connect, stream_input, a
PTY (input, resize, exit), a refused user, wrong and hostile raw requests, and the audit
record of each start."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
from typing import Any

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    PtySize,
    Sandbox,
    SandboxException,
    TimeoutException,
)

from tests.integration.e2b_kit import E2bServed

pytestmark = pytest.mark.timeout(300)


def test_run_in_the_foreground_streams_and_raises(served: E2bServed) -> None:
    sbx = Sandbox.create(timeout=120, envs={"FROM_CREATE": "made"}, **served.opts())
    try:
        out: list[str] = []
        err: list[str] = []
        result = sbx.commands.run(
            'echo "$FROM_CREATE $FROM_CALL $HOME"; echo to-err >&2; pwd; sleep 0.3; echo late',
            envs={"FROM_CALL": "called"},
            on_stdout=out.append,
            on_stderr=err.append,
        )
        assert result.exit_code == 0
        assert result.stdout == "made called /home/user\n/home/user\nlate\n"
        assert result.stderr == "to-err\n"
        assert "".join(out) == result.stdout
        assert len(out) >= 2  # streamed as produced, not at the end
        assert "".join(err) == "to-err\n"
        sbx.files.write("/home/user/sub/x.txt", "in sub\n")
        assert sbx.commands.run("cat x.txt", cwd="/home/user/sub").stdout == "in sub\n"
        assert sbx.commands.run("cat /home/user/sub/x.txt").stdout == "in sub\n"
        assert sbx.commands.run("pwd; touch made-here", cwd="/tmp").stdout == "/tmp\n"
        assert sbx.commands.run("ls /tmp/made-here").exit_code == 0
        with pytest.raises(CommandExitException) as failed:
            sbx.commands.run("echo partial; echo bad >&2; exit 3")
        assert failed.value.exit_code == 3
        assert failed.value.stdout == "partial\n"
        assert failed.value.stderr == "bad\n"
        started = time.monotonic()
        with pytest.raises(TimeoutException):
            sbx.commands.run("sleep 30", timeout=2)
        assert time.monotonic() - started < 25
        # envd ends a process at its deadline: nothing is left running
        deadline = time.monotonic() + 20
        while any("sleep 30" in " ".join(p.args) for p in sbx.commands.list()):
            assert time.monotonic() < deadline, "the timed-out command still runs"
            time.sleep(0.2)
        with served.sup.client(token=served.token) as client:
            records = [
                r for r in client.list_audit(limit=500, tool="process")
                if sbx.sandbox_id in r.sandbox_key and r.front == "e2b"
            ]  # fmt: skip
        assert any("exit 3" in r.arguments_json for r in records)
    finally:
        sbx.kill()


def test_background_stdin_list_connect_and_kill(served: E2bServed) -> None:
    sbx = Sandbox.create(timeout=120, **served.opts())
    try:
        reader = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.send_stdin(reader.pid, "line one\n")
        sbx.commands.send_stdin(reader.pid, "line two\n")
        sbx.commands.close_stdin(reader.pid)
        done = reader.wait()
        assert done.exit_code == 0
        assert done.stdout == "line one\nline two\n"

        server = sbx.commands.run("echo ready; touch up; sleep 60", background=True)
        deadline = time.monotonic() + 30
        while not sbx.files.exists("up"):
            assert time.monotonic() < deadline, "the background command never ran"
            time.sleep(0.05)
        listed = {p.pid: p for p in sbx.commands.list()}
        assert server.pid in listed
        assert listed[server.pid].cmd == "/bin/bash"
        assert listed[server.pid].args[-1] == "echo ready; touch up; sleep 60"
        again = sbx.commands.connect(server.pid)
        assert again.pid == server.pid
        assert sbx.commands.kill(server.pid) is True
        with pytest.raises(CommandExitException) as killed:
            again.wait()
        assert killed.value.exit_code == -1
        assert "ready\n" in killed.value.stdout
        assert sbx.commands.kill(server.pid) is False  # gone
        assert sbx.commands.kill(999999) is False
        assert server.pid not in {p.pid for p in sbx.commands.list()}

        # a client that goes away leaves its command running (E2B's disconnect)
        left = sbx.commands.run("sleep 60", background=True)
        left.disconnect()
        time.sleep(0.5)
        assert left.pid in {p.pid for p in sbx.commands.list()}
        assert sbx.commands.kill(left.pid) is True
    finally:
        sbx.kill()


def test_one_write_of_the_process_is_one_chunk(served: E2bServed) -> None:
    """E2B's test_send_multiline_string_to_process: `cat` echoes `Hello,\nWorld!` in one
    write, which reaches the handle as one chunk (its line and its open end together); a
    write of whole lines after it is one chunk too (issue 28)."""
    sbx = Sandbox.create(timeout=120, **served.opts())
    try:
        cat = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.send_stdin(cat.pid, "Hello,\nWorld!")
        chunks = iter(cat)
        assert next(chunks) == ("Hello,\nWorld!", None, None)
        sbx.commands.send_stdin(cat.pid, "\none\ntwo\n")
        assert next(chunks) == ("\none\ntwo\n", None, None)
        assert sbx.commands.kill(cat.pid) is True
    finally:
        sbx.kill()


async def test_commands_async(served: E2bServed) -> None:
    sbx = await AsyncSandbox.create(timeout=120, **served.opts())
    try:
        out: list[str] = []
        result = await sbx.commands.run("echo one; echo two >&2", on_stdout=out.append)
        assert (result.exit_code, result.stdout, result.stderr) == (0, "one\n", "two\n")
        assert out == ["one\n"]
        with pytest.raises(CommandExitException) as failed:
            await sbx.commands.run("exit 7")
        assert failed.value.exit_code == 7
        handle = await sbx.commands.run("sleep 60", background=True)
        assert await sbx.commands.kill(handle.pid) is True
        with pytest.raises(CommandExitException):
            await handle.wait()
    finally:
        await sbx.kill()


def test_stream_input_and_a_terminal(served: E2bServed) -> None:
    sbx = Sandbox.create(timeout=120, **served.opts())
    try:
        reader = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.stream_input(reader.pid, ["first ", b"second\n", "\u00e9t\u00e9\n"])
        sbx.commands.close_stdin(reader.pid)
        assert reader.wait().stdout == "first second\n\u00e9t\u00e9\n"

        terminal = sbx.pty.create(PtySize(rows=24, cols=80))
        sbx.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
        sbx.pty.send_stdin(terminal.pid, b"stty size; tty; echo $TERM\n")
        sbx.pty.send_stdin(terminal.pid, b"exit 4\n")
        shown: list[bytes] = []
        with pytest.raises(CommandExitException) as ended:
            terminal.wait(on_pty=shown.append)
        assert ended.value.exit_code == 4
        screen = b"".join(shown).decode()
        assert "30 100" in screen
        assert "/dev/pts/" in screen
        assert "xterm-256color" in screen
        with pytest.raises(SandboxException) as root:
            sbx.commands.run("true", user="root")
        assert "'root' is not available" in str(root.value)
    finally:
        sbx.kill()


def test_wrong_and_hostile_process_requests(served: E2bServed) -> None:
    """Raw requests the SDK would never send: each gets a Connect error, nothing breaks."""
    sbx = Sandbox.create(timeout=120, **served.opts())
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": str(sbx._envd_access_token)}
    url = f"{served.url}/process.Process/"
    try:
        with httpx.Client(headers=headers, timeout=60) as http:

            def unary(method: str, body: object, **extra: str) -> httpx.Response:
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                kind = {"content-type": "application/json", **extra}
                return http.post(url + method, content=content, headers=kind)

            def stream(method: str, message: dict[str, Any], **extra: str) -> tuple[int, list[Any]]:
                data = json.dumps(message).encode()
                body = struct.pack(">BI", 0, len(data)) + data
                reply = http.post(
                    url + method,
                    content=body,
                    headers={"content-type": "application/connect+json", **extra},
                )
                out, raw = [], reply.content
                while raw:
                    flags, size = struct.unpack(">BI", raw[:5])
                    out.append((flags, json.loads(raw[5 : 5 + size])))
                    raw = raw[5 + size :]
                return reply.status_code, out

            r = unary("SendInput", {"process": {"pid": 4242}, "input": {"stdin": "aGk="}})
            assert (r.status_code, r.json()["code"]) == (404, "not_found")
            assert unary("SendInput", b"{not json").json()["code"] == "invalid_argument"
            assert unary("SendInput", {"process": "x"}).json()["code"] == "invalid_argument"
            assert (
                unary("SendSignal", {"process": {"pid": 1}, "signal": "SIGNAL_SIGHUP"}).json()[
                    "code"
                ]
                == "invalid_argument"
            )
            r = unary("List", {}, **{"content-type": "text/plain"})
            assert r.json()["code"] == "invalid_argument"

            status, events = stream("Start", {"process": {"cmd": ""}})
            assert status == 200
            assert events[-1][0] == 2
            assert events[-1][1]["error"]["code"] == "invalid_argument"
            # a folder outside the home is a cd before the command: a missing one fails it
            status, events = stream(
                "Start", {"process": {"cmd": "/bin/true", "cwd": "/nonexistent"}, "stdin": False}
            )
            end = [e[1]["event"]["end"] for e in events if "end" in e[1].get("event", {})]
            assert end[0]["exitCode"] != 0, events
            status, events = stream(
                "Start", {"process": {"cmd": "/bin/true", "cwd": "/home/user/missing"}}
            )
            assert events[-1][1]["error"]["code"] == "invalid_argument", events

            # silence on a stream: keepalives at the interval the client asks for
            status, events = stream(
                "Start",
                {"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 2.5; echo woke"]}},
                **{"keepalive-ping-interval": "1"},
            )
            kinds = [next(iter(e[1].get("event", {"stream-end": 0}))) for e in events]
            assert kinds[0] == "start"
            assert kinds.count("keepalive") >= 1, kinds
            assert kinds[-3:] == ["data", "end", "stream-end"], kinds
            # no token, or another's: refused before anything runs
            for token in ({}, {"X-Access-Token": "x" * 43}):
                bare = {"E2b-Sandbox-Id": sbx.sandbox_id, "content-type": "application/json"}
                r = httpx.post(url + "List", content=b"{}", headers={**bare, **token})
                assert (r.status_code, r.json()["code"]) == (401, 401)

            reader = sbx.commands.run("sleep 30", background=True, stdin=True)
            huge = base64.b64encode(b"x" * (3 << 20)).decode()
            r = unary("SendInput", {"process": {"pid": reader.pid}, "input": {"stdin": huge}})
            assert r.status_code != 200
            assert "not reading its input fast enough" in r.json()["message"]
            assert sbx.commands.kill(reader.pid) is True
            assert sbx.commands.run("echo alive").stdout == "alive\n"
    finally:
        sbx.kill()


async def test_output_without_a_line_end_arrives_and_a_split_token_is_redacted(
    served: E2bServed,
) -> None:
    """A prompt (printed by printf: `read -p` prints to a terminal only) and `printf abc`
    reach on_stdout while the command still waits for its input (it would wait for ever if
    they did not: the test sends the input only after it saw them); a token written in two
    pieces with a pause between comes out redacted (issue 28). The async SDK: its handle
    reads the stream as it comes (the sync one, only in wait())."""
    token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    sbx = await AsyncSandbox.create(timeout=120, **served.opts())
    try:
        out: list[str] = []
        script = (
            'printf "name? "; read n; printf abc; read m; '
            f"printf 'token {token[:9]}'; sleep 0.5; printf '{token[9:]} done\\n'; echo \"$n$m\""
        )
        command = await sbx.commands.run(script, background=True, stdin=True, on_stdout=out.append)

        async def seen(text: str) -> None:
            deadline = time.monotonic() + 30
            while text not in "".join(out):
                assert time.monotonic() < deadline, f"{text!r} never arrived: {out}"
                await asyncio.sleep(0.01)

        await seen("name? ")
        await sbx.commands.send_stdin(command.pid, "ann\n")
        await seen("name? abc")
        await sbx.commands.send_stdin(command.pid, "bob\n")
        done = await command.wait()
        assert done.exit_code == 0
        assert token not in done.stdout
        assert token[:9] not in done.stdout
        assert done.stdout == "name? abctoken [REDACTED] done\nannbob\n"
    finally:
        await sbx.kill()
