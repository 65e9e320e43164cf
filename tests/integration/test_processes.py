"""The process tool through the real server: background processes live in the sandbox's
agent, across calls and across a supervisor restart."""

from __future__ import annotations

import time
from typing import Any

import pytest

from stockade.client import Output, Sandbox, Stockade, ToolResult
from tests.integration.harness import Supervisor, process

pytestmark = pytest.mark.timeout(300)

FETCH = (
    "python3 -c 'import urllib.request; "
    'print(urllib.request.urlopen("http://127.0.0.1:8000/index.html", timeout=5).read().decode())\''
)


def wait_until(check: Any, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def fetch(box: Sandbox) -> str:
    return box.exec(FETCH, timeout=20).stdout


def test_dev_server_outlives_calls_and_a_supervisor_restart(own_supervisor: Supervisor) -> None:
    with own_supervisor.client() as c:
        box = c.sandbox("dev")
        box.write_file("index.html", "hello from the sandbox")
        started = process(box, "start", command="python3 -m http.server 8000", name="web")
        assert (started["id"], started["name"]) == ("p1", "web")
        wait_until(lambda: fetch(box) == "hello from the sandbox\n")
        assert fetch(box) == "hello from the sandbox\n"  # another call, same server
        wait_until(lambda: "GET /index.html" in process(box, "log", id="web")["data"])
    own_supervisor.stop()
    own_supervisor.start()
    with own_supervisor.client() as c:
        box = c.sandbox("dev")
        assert fetch(box) == "hello from the sandbox\n"
        (entry,) = process(box, "list")["processes"]
        assert (entry["id"], entry["pid"], entry["state"]) == ("p1", started["pid"], "running")
        killed = process(box, "kill", id="web")
        assert (killed["signal"], killed["state"]) == ("SIGTERM", "exited")
        refused = box.exec(FETCH, timeout=20)
        assert refused.exit_code == 1
        assert "Connection refused" in refused.stderr
        assert process(box, "remove", id="p1") == {"id": "p1", "removed": True}


def test_log_write_and_kill(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    upper = "python3 -c 'import sys; print(sys.stdin.readline().upper())'"
    ident = process(box, "start", command=upper)["id"]
    written = box.call("process", {"action": "write", "id": ident, "data": "hi\n", "eof": True})
    assert written.data == {"id": ident, "written": 3, "eof": True, "pending_stdin": 0}
    assert written.for_llm == f"Wrote 3 bytes to the stdin of {ident}; stdin closed"
    wait_until(lambda: process(box, "poll", id=ident)["state"] == "exited")
    log = box.call("process", {"action": "log", "id": ident})
    assert log.data["data"] == "HI\n\n"
    assert log.for_llm.endswith("[next offset 4]")
    assert "[process exited, exit code 0]" in log.for_llm

    ticker = process(box, "start", command="while :; do echo tick; sleep 0.1; done")["id"]
    wait_until(lambda: process(box, "poll", id=ticker)["output_bytes"] >= 15)
    part = process(box, "log", id=ticker, offset=5, limit=5)
    assert (part["data"], part["next_offset"]) == ("tick\n", 10)
    assert box.exec("sleep 5", timeout=0.5).error_code == "TIMEOUT"  # its group kill
    assert process(box, "poll", id=ticker)["state"] == "running"  # does not reach a process
    killed = process(box, "kill", id=ticker, signal="KILL")
    assert (killed["state"], killed["exit_code"]) == ("exited", 137)
    listing = box.call("process", {"action": "list"})
    assert f"{ticker}  -  pid" in listing.for_llm
    assert "exited by SIGKILL, exit code 137" in listing.for_llm


def test_running_processes_are_capped(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    ids = [process(box, "start", command="sleep 1000")["id"] for _ in range(5)]
    sixth = box.call("process", {"action": "start", "command": "sleep 1000"})
    assert (sixth.is_error, sixth.error_code) == (True, "EXECUTION_FAILED")
    assert sixth.error_message == (
        "5 processes are running, the limit; kill or wait for one (process list)"
    )
    process(box, "kill", id=ids[0])
    assert process(box, "start", command="true")["id"] == "p6"
    for ident in ids[1:]:
        process(box, "kill", id=ident, signal="KILL")


def test_bad_process_calls_are_clear_errors(client: Stockade, key: str) -> None:
    box = client.sandbox(key)
    unknown = box.call("process", {"action": "poll", "id": "p9"})
    assert (unknown.error_code, unknown.error_message) == (
        "INVALID_ARGS",
        "no process 'p9' (process list shows them)",
    )
    bad_action = box.call("process", {"action": "launch"})
    assert bad_action.error_code == "INVALID_ARGS"
    assert "launch" in bad_action.error_message


def test_attach_follows_a_process_live_through_the_stream(client: Stockade, key: str) -> None:
    start = {"action": "start", "command": "for i in 1 2 3; do echo tick $i; sleep 0.3; done"}
    started = client.call(key, "process", start)
    proc_id = started.data["id"]
    text, result = "", None
    for event in client.call_stream(key, "process", {"action": "attach", "id": proc_id}):
        if isinstance(event, Output):
            text += event.text
        elif isinstance(event, ToolResult):
            result = event
    assert text == "tick 1\ntick 2\ntick 3\n"
    assert result is not None
    assert (result.data["state"], result.data["exit_code"]) == ("exited", 0)
    later = client.call_stream(key, "process", {"action": "attach", "id": proc_id, "offset": 7})
    assert "".join(e.text for e in later if isinstance(e, Output)) == "tick 2\ntick 3\n"
    unary = client.call(key, "process", {"action": "attach", "id": proc_id})
    assert unary.error_code == "INVALID_ARGS"
    assert "CallToolStream" in unary.error_message
    missing = list(client.call_stream(key, "process", {"action": "attach", "id": "p999"}))
    assert isinstance(missing[-1], ToolResult)
    assert missing[-1].error_code == "INVALID_ARGS"
