"""Refused bodies audited (fronts/bodies.py BodyAudit and tell, observe/refusals.py body):
every body the E2B front (control plane, envd `/files`, Connect messages) and the MCP front
refuse before any work is one audit record per client address and window, naming the front,
the address, the path and why (never a byte of the body), with the count of the refusals it
stands for; a flood from one address is a bounded number of records."""

from __future__ import annotations

import gzip
import json
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from stockade.supervisor.config import load_config
from stockade.supervisor.fronts.e2b.records import E2bSandbox, Records, new_sandbox_id
from stockade.supervisor.fronts.e2b.server import build_app
from stockade.supervisor.observe.audit import AuditRecord
from stockade.supervisor.observe.refusals import BODY_TOOL, TOOL, Refusals
from tests.unit.fakes import Audited, e2b_context, mcp_front_in_process

SECRET = b"hunter2-never-in-the-log"
LIMIT = 8192
"""max_request_bytes of the fronts under test."""


def secret_text(n: int = 1) -> bytes:
    return b"".join(SECRET + b" %d\n" % i for i in range(n))


def truncated_gzip(text: bytes = secret_text(200)) -> bytes:
    return gzip.compress(text)[:-10]


def bomb(size: int = 64 << 20) -> bytes:
    """A gzip of `size` bytes of blank lines (a multipart body's preamble may have them, so
    it is refused by its ratio, after a few MiB of work, not by the multipart parser)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\r\n" * (1 << 19)
    return b"".join(z.compress(block) for _ in range(size >> 20)) + z.flush()


def deep_json() -> bytes:
    return b'{"a":' + b"[" * 100 + b'"' + SECRET + b'"' + b"]" * 100 + b"}"


def details(rec: AuditRecord) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(rec.arguments_json)
    return found


def holds_nothing_of_the_body(rec: AuditRecord) -> bool:
    return SECRET.decode() not in repr(rec) and "hunter2" not in repr(rec)


def bodies_of(audit: Audited) -> list[AuditRecord]:
    return [r for r in audit.records if r.tool == BODY_TOOL]


def test_a_flood_of_refused_bodies_is_bounded_with_its_count() -> None:
    audit = Audited()
    now = [0.0]
    refusals = Refusals(audit, window_s=60, clock=lambda: now[0])
    for _ in range(1000):
        refusals.body("e2b", "10.0.0.1", "/files", 413, "the request body exceeds 10 bytes")
    assert len(audit.records) == 1  # the first at once; the rest counted
    now[0] = 61
    refusals.flush()
    assert len(audit.records) == 2
    assert [details(r)["count"] for r in audit.records] == [1, 999]
    for rec in audit.records:
        assert (rec.tool, rec.front, rec.caller) == (BODY_TOOL, "e2b", "10.0.0.1")
        assert (rec.error_code, rec.is_error) == ("RESOURCE_EXHAUSTED", True)
        assert details(rec)["path"] == "/files"
        assert details(rec)["status"] == 413
        assert (
            rec.policy_step
            == "e2b: body refused (413) at /files: the request body exceeds 10 bytes"
        )
    refusals.refused("e2b", "10.0.0.1", "invalid API key")  # authentication: its own window
    refusals.body("e2b", "10.0.0.1", "/v2/sandboxes", 400, "the gzip stream is truncated")
    refusals.body("e2b", "10.0.0.1", "/files", 415, "Content-Encoding 'br' is not taken")
    refusals.body("mcp", "10.0.0.1", "/mcp", 413, "the request body exceeds 10 bytes")
    kinds = [(r.tool, r.front, details(r).get("status")) for r in audit.records[2:]]
    assert kinds == [(TOOL, "e2b", None), (BODY_TOOL, "e2b", 400), (BODY_TOOL, "mcp", 413)]
    refusals.close()
    last = audit.records[-1]  # the e2b window's count, named by its last refusal
    assert (last.front, details(last)["count"], details(last)["status"]) == ("e2b", 1, 415)
    assert (details(last)["path"], last.error_code) == ("/files", "INVALID_ARGUMENT")
    assert len(audit.records) == 6


def test_a_refused_body_never_fails_the_answer() -> None:
    class Broken:
        def record(self, rec: AuditRecord) -> None:
            raise OSError("disk full")

    Refusals(Broken()).body("e2b", "::1", "/files", 413, "too large")  # logged, answered
    Refusals(None).body("e2b", "::1", "/files", 413, "too large")  # audit off
    audit = Audited()
    Refusals(audit).body("e2b", "", "/" + "p" * 10_000, 400, "x" * 10_000)
    (rec,) = audit.records
    assert (rec.caller, len(details(rec)["path"]), len(rec.policy_step) < 500) == ("?", 200, True)


async def live_e2b(tmp_path: Path, refusals: Refusals) -> tuple[httpx.AsyncClient, dict[str, str]]:
    """A client of the E2B front's whole app (control plane and envd, auth off) telling
    `refusals`, and the headers of envd requests to a live sandbox of it."""
    settings = {"state_dir": str(tmp_path), "e2b.listen": "127.0.0.1:0", "max_request_bytes": LIMIT}
    records = Records(None)
    sid = new_sandbox_id()
    now = time.time()
    live = E2bSandbox(sid, "", f"e2b-{sid}", "base", "tok-" + sid, now, now + 300)
    await records.add(live)
    ctx = e2b_context(load_config(None, settings), records, None, refusals)
    app, _control = build_app(ctx)
    transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 40000))
    client = httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:3000")
    return client, {"E2b-Sandbox-Id": sid, "X-Access-Token": live.access_token}


MULTIPART = "multipart/form-data; boundary=b0und"
GZIP = {"content-encoding": "gzip"}
UNARY = {"content-type": "application/json"}
STREAM = {"content-type": "application/connect+json"}
STAT = "/filesystem.Filesystem/Stat"


def e2b_cases(envd: dict[str, str]) -> list[tuple[str, dict[str, str], bytes, int, int, str]]:
    """(path, headers, body, the answer's status, the audited status, a word of why)."""
    form = {**envd, "content-type": MULTIPART}
    return [
        # the control plane
        ("/v2/sandboxes", {}, secret_text(LIMIT), 413, 413, "exceeds"),
        ("/v2/sandboxes", {"content-length": str(LIMIT + 1)}, b"{}", 413, 413, "exceeds"),
        ("/v2/sandboxes", GZIP, gzip.compress(secret_text(2000)), 413, 413, "exceeds"),
        ("/v2/sandboxes", {"content-encoding": "br"}, secret_text(), 415, 415, "'br'"),
        ("/v2/sandboxes", GZIP, truncated_gzip(), 400, 400, "truncated"),
        ("/v2/sandboxes", GZIP, b"not gzip " + SECRET, 400, 400, "not valid gzip"),
        ("/v2/sandboxes", {}, deep_json(), 400, 400, "nested"),
        # envd /files (refused before a part reaches the sandbox)
        ("/files", {**form, **GZIP}, bomb(), 413, 413, "bomb"),
        ("/files", {**form, "content-encoding": "zstd"}, secret_text(), 415, 415, "'zstd'"),
        ("/files", {**form, **GZIP}, truncated_gzip(b"\r\n" * 100), 400, 400, "truncated"),
        ("/files", {**envd, "content-type": "multipart/form-data"}, SECRET, 400, 400, "boundary"),
        ("/files", form, b"--x" + SECRET + b"\r\n", 400, 400, "does not parse"),
        # envd Connect messages
        (STAT, {**envd, **UNARY}, secret_text(LIMIT), 429, 413, "exceeds"),
        (STAT, {**envd, **UNARY}, deep_json(), 400, 400, "nested"),
        (STAT, {**envd, **UNARY, **GZIP}, gzip.compress(SECRET), 501, 415, "compressed"),
        (
            "/process.Process/Start",
            {**envd, **STREAM},
            struct.pack(">BI", 0, 60_000_000) + SECRET,
            200,
            413,
            "60000000",
        ),
    ]


async def test_every_body_the_e2b_front_refuses_is_audited(tmp_path: Path) -> None:
    audit = Audited()
    refusals = Refusals(audit)
    client, envd = await live_e2b(tmp_path, refusals)
    async with client:
        for path, headers, body, status, audited, why in e2b_cases(envd):
            before = len(bodies_of(audit))
            r = await client.post(path, content=body, headers=headers)
            assert (path, why, r.status_code) == (path, why, status)
            assert SECRET not in r.content
            found = bodies_of(audit)[before:]
            assert len(found) == 1, (path, why)
            (rec,) = found
            assert (rec.front, rec.caller, details(rec)["path"]) == ("e2b", "10.1.2.3", path)
            assert (details(rec)["status"], why) == (audited, why), rec.policy_step
            assert why in rec.policy_step, rec.policy_step
            assert holds_nothing_of_the_body(rec), rec
            refusals.close()  # a new window per case: each is recorded at once


async def test_a_thousand_refused_bodies_from_one_address_are_one_record(tmp_path: Path) -> None:
    audit = Audited()
    refusals = Refusals(audit)
    client, _envd = await live_e2b(tmp_path, refusals)
    async with client:
        for _ in range(1000):
            r = await client.post("/v2/sandboxes", content=deep_json())
            assert r.status_code == 400
    (rec,) = audit.records  # the window is still open: the rest are counted, not written
    assert details(rec)["count"] == 1
    refusals.close()  # the window's end (the supervisor stops): its count
    assert [details(r)["count"] for r in audit.records] == [1, 999]
    assert all(holds_nothing_of_the_body(r) for r in audit.records)


@pytest.mark.parametrize(
    ("headers", "body", "status", "why"),
    [
        ({"content-encoding": "gzip"}, gzip.compress(SECRET), 415, "'gzip'"),
        ({}, secret_text(LIMIT), 413, "exceeds"),
        ({}, b"[" * 5000 + SECRET, 400, "not JSON"),
        ({}, b'{"jsonrpc": "2.0", ' + SECRET, 400, "not JSON"),
    ],
)
async def test_every_body_the_mcp_front_refuses_is_audited(
    tmp_path: Path, headers: dict[str, str], body: bytes, status: int, why: str
) -> None:
    audit = Audited()
    async with mcp_front_in_process(tmp_path, Refusals(audit), max_request_bytes=LIMIT) as (
        front,
        _endpoint,
    ):
        sent = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            **headers,
        }
        url = f"http://127.0.0.1:{front.port}/mcp"
        async with httpx.AsyncClient() as client:
            r = await client.post(url, content=body, headers=sent)
    assert r.status_code == status
    (rec,) = bodies_of(audit)
    assert (rec.front, rec.caller, details(rec)["path"]) == ("mcp", "127.0.0.1", "/mcp")
    assert (details(rec)["status"], why in rec.policy_step) == (status, True)
    assert holds_nothing_of_the_body(rec), rec
